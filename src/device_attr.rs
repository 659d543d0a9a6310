//! Device attributes (`struct ibv_device_attr_ex`), as `ibv_query_device_ex` reports them.

use crate::sys::ibv_atomic_cap;
use std::ffi::CStr;

use crate::device::Guid;
use crate::mr::OdpCaps;
use crate::sys;

bitflags::bitflags! {
    /// Device capabilities (`enum ibv_device_cap_flags` and the 64-bit
    /// `device_cap_flags_ex` of `struct ibv_device_attr_ex`).
    #[doc(alias = "ibv_device_cap_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct DeviceCapFlags: u64 {
        /// `IBV_DEVICE_RESIZE_MAX_WR`: the send/receive queue depths of a QP can be changed (IBV_QP_CAP).
        const RESIZE_MAX_WR = sys::ibv_device_cap_flags::IBV_DEVICE_RESIZE_MAX_WR.0 as u64;
        /// `IBV_DEVICE_BAD_PKEY_CNTR`: the bad P_Key counter is supported.
        const BAD_PKEY_CNTR = sys::ibv_device_cap_flags::IBV_DEVICE_BAD_PKEY_CNTR.0 as u64;
        /// `IBV_DEVICE_BAD_QKEY_CNTR`: the bad Q_Key counter is supported.
        const BAD_QKEY_CNTR = sys::ibv_device_cap_flags::IBV_DEVICE_BAD_QKEY_CNTR.0 as u64;
        /// `IBV_DEVICE_RAW_MULTI`: raw packet multicast.
        const RAW_MULTI = sys::ibv_device_cap_flags::IBV_DEVICE_RAW_MULTI.0 as u64;
        /// `IBV_DEVICE_AUTO_PATH_MIG`: automatic path migration (IBV_QP_ALT_PATH).
        const AUTO_PATH_MIG = sys::ibv_device_cap_flags::IBV_DEVICE_AUTO_PATH_MIG.0 as u64;
        /// `IBV_DEVICE_CHANGE_PHY_PORT`: a QP's primary port can be changed in SQD->RTS.
        const CHANGE_PHY_PORT = sys::ibv_device_cap_flags::IBV_DEVICE_CHANGE_PHY_PORT.0 as u64;
        /// `IBV_DEVICE_UD_AV_PORT_ENFORCE`: UD address vectors must use the QP's port.
        const UD_AV_PORT_ENFORCE = sys::ibv_device_cap_flags::IBV_DEVICE_UD_AV_PORT_ENFORCE.0 as u64;
        /// `IBV_DEVICE_CURR_QP_STATE_MOD`: IBV_QP_CUR_STATE is honoured by modify_qp.
        const CURR_QP_STATE_MOD = sys::ibv_device_cap_flags::IBV_DEVICE_CURR_QP_STATE_MOD.0 as u64;
        /// `IBV_DEVICE_SHUTDOWN_PORT`: ports can be shut down.
        const SHUTDOWN_PORT = sys::ibv_device_cap_flags::IBV_DEVICE_SHUTDOWN_PORT.0 as u64;
        /// `IBV_DEVICE_INIT_TYPE`: InitType and InitTypeReply are supported.
        const INIT_TYPE = sys::ibv_device_cap_flags::IBV_DEVICE_INIT_TYPE.0 as u64;
        /// `IBV_DEVICE_PORT_ACTIVE_EVENT`: the IBV_EVENT_PORT_ACTIVE event is generated.
        const PORT_ACTIVE_EVENT = sys::ibv_device_cap_flags::IBV_DEVICE_PORT_ACTIVE_EVENT.0 as u64;
        /// `IBV_DEVICE_SYS_IMAGE_GUID`: the system image GUID is supported.
        const SYS_IMAGE_GUID = sys::ibv_device_cap_flags::IBV_DEVICE_SYS_IMAGE_GUID.0 as u64;
        /// `IBV_DEVICE_RC_RNR_NAK_GEN`: RNR NAKs are generated for RC QPs.
        const RC_RNR_NAK_GEN = sys::ibv_device_cap_flags::IBV_DEVICE_RC_RNR_NAK_GEN.0 as u64;
        /// `IBV_DEVICE_SRQ_RESIZE`: SRQs can be resized.
        const SRQ_RESIZE = sys::ibv_device_cap_flags::IBV_DEVICE_SRQ_RESIZE.0 as u64;
        /// `IBV_DEVICE_N_NOTIFY_CQ`: "notify when N completions" is supported.
        const N_NOTIFY_CQ = sys::ibv_device_cap_flags::IBV_DEVICE_N_NOTIFY_CQ.0 as u64;
        /// `IBV_DEVICE_MEM_WINDOW`: memory windows are supported.
        const MEM_WINDOW = sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW.0 as u64;
        /// `IBV_DEVICE_UD_IP_CSUM`: IP checksum offload on UD.
        const UD_IP_CSUM = sys::ibv_device_cap_flags::IBV_DEVICE_UD_IP_CSUM.0 as u64;
        /// `IBV_DEVICE_XRC`: XRC transport.
        const XRC = sys::ibv_device_cap_flags::IBV_DEVICE_XRC.0 as u64;
        /// `IBV_DEVICE_MEM_MGT_EXTENSIONS`: memory management extensions.
        const MEM_MGT_EXTENSIONS = sys::ibv_device_cap_flags::IBV_DEVICE_MEM_MGT_EXTENSIONS.0 as u64;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2A`: type 2A memory windows.
        const MEM_WINDOW_TYPE_2A = sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0 as u64;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`: type 2B memory windows.
        const MEM_WINDOW_TYPE_2B = sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0 as u64;
        /// `IBV_DEVICE_RC_IP_CSUM`: IP checksum offload on RC.
        const RC_IP_CSUM = sys::ibv_device_cap_flags::IBV_DEVICE_RC_IP_CSUM.0 as u64;
        /// `IBV_DEVICE_RAW_IP_CSUM`: IP checksum offload on RAW_PACKET.
        const RAW_IP_CSUM = sys::ibv_device_cap_flags::IBV_DEVICE_RAW_IP_CSUM.0 as u64;
        /// `IBV_DEVICE_MANAGED_FLOW_STEERING`: flow steering.
        const MANAGED_FLOW_STEERING = sys::ibv_device_cap_flags::IBV_DEVICE_MANAGED_FLOW_STEERING.0 as u64;
        /// `IBV_DEVICE_RAW_SCATTER_FCS`: the Ethernet FCS can be scattered on RAW_PACKET.
        const RAW_SCATTER_FCS = sys::IBV_DEVICE_RAW_SCATTER_FCS;
        /// `IBV_DEVICE_PCI_WRITE_END_PADDING`: PCI end padding.
        const PCI_WRITE_END_PADDING = sys::IBV_DEVICE_PCI_WRITE_END_PADDING;
        /// `IB_UVERBS_DEVICE_FLUSH_GLOBAL` (bit 38, Linux 6.2): RDMA FLUSH to
        /// global visibility, and regions with
        /// [`AccessFlags::FLUSH_GLOBAL`](crate::AccessFlags::FLUSH_GLOBAL).
        /// libibverbs passes the kernel's bit through and names no constant.
        const FLUSH_GLOBAL = 1 << 38;
        /// `IB_UVERBS_DEVICE_FLUSH_PERSISTENT` (bit 39, Linux 6.2): RDMA FLUSH
        /// to persistence, and regions with
        /// [`AccessFlags::FLUSH_PERSISTENT`](crate::AccessFlags::FLUSH_PERSISTENT).
        const FLUSH_PERSISTENT = 1 << 39;
        /// `IB_UVERBS_DEVICE_ATOMIC_WRITE` (bit 40, Linux 6.2): RDMA
        /// ATOMIC_WRITE ([`WrBatch::atomic_write`](crate::qp::WrBatch::atomic_write)).
        const ATOMIC_WRITE = 1 << 40;
        // Flags newer kernels report that this version does not name.
        const _ = !0;
    }
}

c_enum! {
    /// Atomic operation support (`enum ibv_atomic_cap`).
    #[doc(alias = "ibv_atomic_cap")]
    pub enum AtomicCap(ibv_atomic_cap): u32 {
        /// Atomics are not supported.
        None = IBV_ATOMIC_NONE,
        /// Atomic among this device's QPs only.
        Hca = IBV_ATOMIC_HCA,
        /// Atomic among this device and the CPU and other devices.
        Glob = IBV_ATOMIC_GLOB,
    }
}

/// Packet pacing (rate limiting) capabilities (`struct ibv_packet_pacing_caps`).
#[doc(alias = "ibv_packet_pacing_caps")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PacketPacingCaps {
    /// `qp_rate_limit_min`, in kbit/s.
    pub rate_limit_min_kbps: u32,
    /// `qp_rate_limit_max`, in kbit/s; 0 when pacing is not supported.
    pub rate_limit_max_kbps: u32,
    /// `supported_qpts`: bit `1 << IBV_QPT_x` for each QP type that can be paced.
    pub supported_qp_types: u32,
}

/// What a device can do: `struct ibv_device_attr` plus the extended fields
/// of `struct ibv_device_attr_ex`.
///
/// Limits the C struct holds as `int` are given as `u32` (a negative value,
/// which no driver reports, reads as 0).
#[doc(alias = "ibv_device_attr")]
#[doc(alias = "ibv_device_attr_ex")]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// `fw_ver`: firmware version string.
    pub fw_ver: String,
    /// `node_guid`.
    pub node_guid: Guid,
    /// `sys_image_guid`.
    pub sys_image_guid: Guid,
    /// `max_mr_size`: largest memory region, in bytes.
    pub max_mr_size: u64,
    /// `page_size_cap`: supported page sizes (bit n = 2^n bytes).
    pub page_size_cap: u64,
    /// `vendor_id` (IEEE OUI).
    pub vendor_id: u32,
    /// `vendor_part_id`.
    pub vendor_part_id: u32,
    /// `hw_ver`.
    pub hw_ver: u32,
    /// `max_qp`.
    pub max_qp: u32,
    /// `max_qp_wr`: deepest send or receive queue.
    pub max_qp_wr: u32,
    /// `device_cap_flags` | `device_cap_flags_ex`.
    pub capabilities: DeviceCapFlags,
    /// `max_sge`: scatter/gather entries per work request.
    pub max_sge: u32,
    /// `max_sge_rd`: SGEs per RDMA read.
    pub max_sge_rd: u32,
    /// `max_cq`.
    pub max_cq: u32,
    /// `max_cqe`: deepest completion queue.
    pub max_cqe: u32,
    /// `max_mr`.
    pub max_mr: u32,
    /// `max_pd`.
    pub max_pd: u32,
    /// `max_qp_rd_atom`: RDMA reads/atomics a QP can have outstanding as target
    /// (the bound of IBV_QP_MAX_DEST_RD_ATOMIC).
    pub max_qp_rd_atom: u32,
    /// `max_res_rd_atom`: total read/atomic resources as target.
    pub max_res_rd_atom: u32,
    /// `max_qp_init_rd_atom`: RDMA reads/atomics a QP can have outstanding as
    /// initiator (the bound of IBV_QP_MAX_QP_RD_ATOMIC).
    pub max_qp_init_rd_atom: u32,
    /// `atomic_cap`.
    pub atomic_cap: AtomicCap,
    /// `max_mw`: memory windows.
    pub max_mw: u32,
    /// `max_ah`: address handles.
    pub max_ah: u32,
    /// `max_srq`.
    pub max_srq: u32,
    /// `max_srq_wr`.
    pub max_srq_wr: u32,
    /// `max_srq_sge`.
    pub max_srq_sge: u32,
    /// `max_pkeys`: P_Key table size.
    pub max_pkeys: u16,
    /// `local_ca_ack_delay`.
    pub local_ca_ack_delay: u8,
    /// `phys_port_cnt` (or `phys_port_cnt_ex` where larger): ports are numbered 1..=this.
    pub phys_port_cnt: u32,
    /// `completion_timestamp_mask` (0: no completion timestamps).
    pub completion_timestamp_mask: u64,
    /// `hca_core_clock`, in kHz.
    pub hca_core_clock_khz: u64,
    /// `packet_pacing_caps`.
    pub packet_pacing: PacketPacingCaps,
    /// `raw_packet_caps` (`enum ibv_raw_packet_caps` bits).
    pub raw_packet_caps: u32,
    /// `max_dm_size`: on-device memory, in bytes.
    pub max_dm_size: u64,
    /// `odp_caps` and `xrc_odp_caps`: on-demand paging.
    pub odp: OdpCaps,
}

fn count(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

impl DeviceAttr {
    pub(crate) fn from_raw(ex: &sys::ibv_device_attr_ex) -> Self {
        let a = &ex.orig_attr;
        // SAFETY: fw_ver is a C char array; CStr::from_bytes_until_nul bounds
        // the read to the array even when no NUL is present.
        let fw =
            unsafe { std::slice::from_raw_parts(a.fw_ver.as_ptr().cast::<u8>(), a.fw_ver.len()) };
        let fw_ver = CStr::from_bytes_until_nul(fw)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| String::from_utf8_lossy(fw).into_owned());
        DeviceAttr {
            fw_ver,
            node_guid: Guid::from_be(a.node_guid),
            sys_image_guid: Guid::from_be(a.sys_image_guid),
            max_mr_size: a.max_mr_size,
            page_size_cap: a.page_size_cap,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_qp: count(a.max_qp),
            max_qp_wr: count(a.max_qp_wr),
            capabilities: DeviceCapFlags::from_bits_retain(
                u64::from(a.device_cap_flags) | ex.device_cap_flags_ex,
            ),
            max_sge: count(a.max_sge),
            max_sge_rd: count(a.max_sge_rd),
            max_cq: count(a.max_cq),
            max_cqe: count(a.max_cqe),
            max_mr: count(a.max_mr),
            max_pd: count(a.max_pd),
            max_qp_rd_atom: count(a.max_qp_rd_atom),
            max_res_rd_atom: count(a.max_res_rd_atom),
            max_qp_init_rd_atom: count(a.max_qp_init_rd_atom),
            atomic_cap: AtomicCap::from_raw(a.atomic_cap).unwrap_or(AtomicCap::None),
            max_mw: count(a.max_mw),
            max_ah: count(a.max_ah),
            max_srq: count(a.max_srq),
            max_srq_wr: count(a.max_srq_wr),
            max_srq_sge: count(a.max_srq_sge),
            max_pkeys: a.max_pkeys,
            local_ca_ack_delay: a.local_ca_ack_delay,
            phys_port_cnt: phys_port_cnt(a, ex),
            completion_timestamp_mask: ex.completion_timestamp_mask,
            hca_core_clock_khz: ex.hca_core_clock,
            packet_pacing: PacketPacingCaps {
                rate_limit_min_kbps: ex.packet_pacing_caps.qp_rate_limit_min,
                rate_limit_max_kbps: ex.packet_pacing_caps.qp_rate_limit_max,
                supported_qp_types: ex.packet_pacing_caps.supported_qpts,
            },
            raw_packet_caps: ex.raw_packet_caps,
            max_dm_size: ex.max_dm_size,
            odp: OdpCaps::from_raw(ex),
        }
    }
}

/// `phys_port_cnt`, or `phys_port_cnt_ex` where larger (rdma-core 35 and
/// later; older headers have only the 8-bit count).
fn phys_port_cnt(a: &sys::ibv_device_attr, ex: &sys::ibv_device_attr_ex) -> u32 {
    #[cfg(rdma_core_phys_port_cnt_ex)]
    return u32::from(a.phys_port_cnt).max(ex.phys_port_cnt_ex);
    #[cfg(not(rdma_core_phys_port_cnt_ex))]
    {
        let _ = ex;
        u32::from(a.phys_port_cnt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_raw_attribute_struct() {
        let mut ex = sys::ibv_device_attr_ex::default();
        for (d, s) in ex.orig_attr.fw_ver.iter_mut().zip(b"1.2.3\0") {
            *d = *s as _;
        }
        ex.orig_attr.max_qp_wr = 1024;
        ex.orig_attr.max_cq = -5;
        ex.orig_attr.phys_port_cnt = 1;
        ex.orig_attr.device_cap_flags = sys::ibv_device_cap_flags::IBV_DEVICE_RESIZE_MAX_WR.0;
        ex.device_cap_flags_ex = sys::IBV_DEVICE_RAW_SCATTER_FCS;
        ex.orig_attr.atomic_cap = sys::ibv_atomic_cap::IBV_ATOMIC_HCA;
        let a = DeviceAttr::from_raw(&ex);
        assert_eq!(a.fw_ver, "1.2.3");
        assert_eq!(a.max_qp_wr, 1024);
        assert_eq!(a.max_cq, 0);
        assert_eq!(a.phys_port_cnt, 1);
        assert_eq!(
            a.capabilities,
            DeviceCapFlags::RESIZE_MAX_WR | DeviceCapFlags::RAW_SCATTER_FCS
        );
        assert_eq!(a.atomic_cap, AtomicCap::Hca);
    }

    #[test]
    fn fw_ver_without_nul_is_bounded() {
        let mut ex = sys::ibv_device_attr_ex::default();
        for d in ex.orig_attr.fw_ver.iter_mut() {
            *d = b'x' as _;
        }
        assert_eq!(DeviceAttr::from_raw(&ex).fw_ver.len(), 64);
    }
}
