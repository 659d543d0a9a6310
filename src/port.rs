//! Port attributes (`struct ibv_port_attr`), as `ibv_query_port` reports them.

use crate::error::{Error, Result};
use crate::sys;
use crate::sys::{ibv_mtu, ibv_port_state};

c_enum! {
    /// A path or port MTU (`enum ibv_mtu`).
    #[doc(alias = "ibv_mtu")]
    pub enum Mtu(ibv_mtu): u32 {
        /// 256 bytes.
        Mtu256 = IBV_MTU_256,
        /// 512 bytes.
        Mtu512 = IBV_MTU_512,
        /// 1024 bytes.
        Mtu1024 = IBV_MTU_1024,
        /// 2048 bytes.
        Mtu2048 = IBV_MTU_2048,
        /// 4096 bytes.
        Mtu4096 = IBV_MTU_4096,
    }
}

impl Mtu {
    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        128 << self.as_raw()
    }

    /// The MTU of exactly `bytes` bytes (256, 512, 1024, 2048 or 4096).
    pub fn from_bytes(bytes: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|m| m.bytes() == bytes)
    }
}

c_enum! {
    /// The logical state of a port (`enum ibv_port_state`).
    #[doc(alias = "ibv_port_state")]
    pub enum PortState(ibv_port_state): u32 {
        /// Reserved.
        Nop = IBV_PORT_NOP,
        /// The link is down.
        Down = IBV_PORT_DOWN,
        /// The link is up, the subnet manager has not configured it yet.
        Init = IBV_PORT_INIT,
        /// Configured, not yet active.
        Armed = IBV_PORT_ARMED,
        /// Active: traffic can flow.
        Active = IBV_PORT_ACTIVE,
        /// Active, deferring (error recovery).
        ActiveDefer = IBV_PORT_ACTIVE_DEFER,
    }
}

c_enum! {
    /// The link layer of a port (`IBV_LINK_LAYER_*`).
    pub enum LinkLayer(link_layer): u32 {
        /// Not reported (old kernels; means InfiniBand).
        Unspecified = IBV_LINK_LAYER_UNSPECIFIED,
        /// InfiniBand.
        InfiniBand = IBV_LINK_LAYER_INFINIBAND,
        /// Ethernet: RoCE (and rxe). Address vectors need a GRH.
        Ethernet = IBV_LINK_LAYER_ETHERNET,
    }
}

/// The anonymous C enum of `IBV_LINK_LAYER_*`.
mod link_layer {
    pub(super) use crate::sys::{
        IBV_LINK_LAYER_ETHERNET, IBV_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_UNSPECIFIED,
    };
}

bitflags::bitflags! {
    /// Port capabilities (`enum ibv_port_cap_flags`, the `port_cap_flags` field).
    #[doc(alias = "ibv_port_cap_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct PortCapFlags: u32 {
        /// `IBV_PORT_SM`: a subnet manager runs on this port.
        const SM = sys::ibv_port_cap_flags::IBV_PORT_SM.0;
        /// `IBV_PORT_NOTICE_SUP`.
        const NOTICE_SUP = sys::ibv_port_cap_flags::IBV_PORT_NOTICE_SUP.0;
        /// `IBV_PORT_TRAP_SUP`.
        const TRAP_SUP = sys::ibv_port_cap_flags::IBV_PORT_TRAP_SUP.0;
        /// `IBV_PORT_OPT_IPD_SUP`.
        const OPT_IPD_SUP = sys::ibv_port_cap_flags::IBV_PORT_OPT_IPD_SUP.0;
        /// `IBV_PORT_AUTO_MIGR_SUP`: automatic path migration.
        const AUTO_MIGR_SUP = sys::ibv_port_cap_flags::IBV_PORT_AUTO_MIGR_SUP.0;
        /// `IBV_PORT_SL_MAP_SUP`.
        const SL_MAP_SUP = sys::ibv_port_cap_flags::IBV_PORT_SL_MAP_SUP.0;
        /// `IBV_PORT_MKEY_NVRAM`.
        const MKEY_NVRAM = sys::ibv_port_cap_flags::IBV_PORT_MKEY_NVRAM.0;
        /// `IBV_PORT_PKEY_NVRAM`.
        const PKEY_NVRAM = sys::ibv_port_cap_flags::IBV_PORT_PKEY_NVRAM.0;
        /// `IBV_PORT_LED_INFO_SUP`.
        const LED_INFO_SUP = sys::ibv_port_cap_flags::IBV_PORT_LED_INFO_SUP.0;
        /// `IBV_PORT_SYS_IMAGE_GUID_SUP`.
        const SYS_IMAGE_GUID_SUP = sys::ibv_port_cap_flags::IBV_PORT_SYS_IMAGE_GUID_SUP.0;
        /// `IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP`.
        const PKEY_SW_EXT_PORT_TRAP_SUP = sys::ibv_port_cap_flags::IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP.0;
        /// `IBV_PORT_EXTENDED_SPEEDS_SUP`.
        const EXTENDED_SPEEDS_SUP = sys::ibv_port_cap_flags::IBV_PORT_EXTENDED_SPEEDS_SUP.0;
        /// `IBV_PORT_CAP_MASK2_SUP`: `port_cap_flags2` is valid.
        const CAP_MASK2_SUP = sys::ibv_port_cap_flags::IBV_PORT_CAP_MASK2_SUP.0;
        /// `IBV_PORT_CM_SUP`: the connection manager is supported.
        const CM_SUP = sys::ibv_port_cap_flags::IBV_PORT_CM_SUP.0;
        /// `IBV_PORT_SNMP_TUNNEL_SUP`.
        const SNMP_TUNNEL_SUP = sys::ibv_port_cap_flags::IBV_PORT_SNMP_TUNNEL_SUP.0;
        /// `IBV_PORT_REINIT_SUP`.
        const REINIT_SUP = sys::ibv_port_cap_flags::IBV_PORT_REINIT_SUP.0;
        /// `IBV_PORT_DEVICE_MGMT_SUP`.
        const DEVICE_MGMT_SUP = sys::ibv_port_cap_flags::IBV_PORT_DEVICE_MGMT_SUP.0;
        /// `IBV_PORT_VENDOR_CLASS_SUP`.
        const VENDOR_CLASS_SUP = sys::ibv_port_cap_flags::IBV_PORT_VENDOR_CLASS_SUP.0;
        /// `IBV_PORT_DR_NOTICE_SUP`.
        const DR_NOTICE_SUP = sys::ibv_port_cap_flags::IBV_PORT_DR_NOTICE_SUP.0;
        /// `IBV_PORT_CAP_MASK_NOTICE_SUP`.
        const CAP_MASK_NOTICE_SUP = sys::ibv_port_cap_flags::IBV_PORT_CAP_MASK_NOTICE_SUP.0;
        /// `IBV_PORT_BOOT_MGMT_SUP`.
        const BOOT_MGMT_SUP = sys::ibv_port_cap_flags::IBV_PORT_BOOT_MGMT_SUP.0;
        /// `IBV_PORT_LINK_LATENCY_SUP`.
        const LINK_LATENCY_SUP = sys::ibv_port_cap_flags::IBV_PORT_LINK_LATENCY_SUP.0;
        /// `IBV_PORT_CLIENT_REG_SUP`.
        const CLIENT_REG_SUP = sys::ibv_port_cap_flags::IBV_PORT_CLIENT_REG_SUP.0;
        /// `IBV_PORT_IP_BASED_GIDS`: GIDs are derived from IP addresses (RoCE).
        const IP_BASED_GIDS = sys::ibv_port_cap_flags::IBV_PORT_IP_BASED_GIDS.0;
        // Flags newer kernels report that this version does not name.
        const _ = !0;
    }
}

bitflags::bitflags! {
    /// The `flags` field of `struct ibv_port_attr`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct PortFlags: u8 {
        /// `IBV_QPF_GRH_REQUIRED`: address vectors on this port must carry a GRH.
        #[doc(alias = "IBV_QPF_GRH_REQUIRED")]
        const GRH_REQUIRED = sys::RDMA_VERBS_IBV_QPF_GRH_REQUIRED as u8;
        // Flags newer kernels report that this version does not name.
        const _ = !0;
    }
}

/// The attributes of one port (`struct ibv_port_attr`).
#[doc(alias = "ibv_port_attr")]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// `state`: the logical port state.
    pub state: PortState,
    /// `max_mtu`: the largest MTU the port supports (the bound of IBV_QP_PATH_MTU).
    pub max_mtu: Mtu,
    /// `active_mtu`: the MTU currently in use on the link.
    pub active_mtu: Mtu,
    /// `gid_tbl_len`: size of the GID table.
    pub gid_tbl_len: u32,
    /// `port_cap_flags`.
    pub port_cap_flags: PortCapFlags,
    /// `max_msg_sz`: largest message, in bytes.
    pub max_msg_sz: u32,
    /// `bad_pkey_cntr`.
    pub bad_pkey_cntr: u32,
    /// `qkey_viol_cntr`.
    pub qkey_viol_cntr: u32,
    /// `pkey_tbl_len`: size of the P_Key table.
    pub pkey_tbl_len: u16,
    /// `lid`: the port's base LID (0 on RoCE).
    pub lid: u16,
    /// `sm_lid`: the subnet manager's LID.
    pub sm_lid: u16,
    /// `lmc`: LID mask control.
    pub lmc: u8,
    /// `max_vl_num`.
    pub max_vl_num: u8,
    /// `sm_sl`.
    pub sm_sl: u8,
    /// `subnet_timeout`.
    pub subnet_timeout: u8,
    /// `init_type_reply`.
    pub init_type_reply: u8,
    /// `active_width` (IB encoding: 1 = 1x, 2 = 4x, 4 = 8x, 8 = 12x, 16 = 2x).
    pub active_width: u8,
    /// `active_speed` (IB encoding).
    pub active_speed: u8,
    /// `phys_state` (5 = LinkUp).
    pub phys_state: u8,
    /// `link_layer`.
    pub link_layer: LinkLayer,
    /// `flags`.
    pub flags: PortFlags,
    /// `port_cap_flags2` (`enum ibv_port_cap_flags2` bits).
    pub port_cap_flags2: u16,
}

impl PortAttr {
    pub(crate) fn from_raw(a: &sys::ibv_port_attr) -> Result<Self> {
        const VERB: &str = "ibv_query_port";
        let bad = |field, value: u32| Error::Unexpected {
            verb: VERB,
            field,
            value: value.into(),
        };
        Ok(PortAttr {
            state: PortState::from_raw(a.state).ok_or_else(|| bad("state", a.state))?,
            max_mtu: Mtu::from_raw(a.max_mtu).ok_or_else(|| bad("max_mtu", a.max_mtu))?,
            active_mtu: Mtu::from_raw(a.active_mtu)
                .ok_or_else(|| bad("active_mtu", a.active_mtu))?,
            gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
            port_cap_flags: PortCapFlags::from_bits_retain(a.port_cap_flags),
            max_msg_sz: a.max_msg_sz,
            bad_pkey_cntr: a.bad_pkey_cntr,
            qkey_viol_cntr: a.qkey_viol_cntr,
            pkey_tbl_len: a.pkey_tbl_len,
            lid: a.lid,
            sm_lid: a.sm_lid,
            lmc: a.lmc,
            max_vl_num: a.max_vl_num,
            sm_sl: a.sm_sl,
            subnet_timeout: a.subnet_timeout,
            init_type_reply: a.init_type_reply,
            active_width: a.active_width,
            active_speed: a.active_speed,
            phys_state: a.phys_state,
            link_layer: LinkLayer::from_raw(a.link_layer.into())
                .ok_or_else(|| bad("link_layer", a.link_layer.into()))?,
            flags: PortFlags::from_bits_retain(a.flags),
            port_cap_flags2: a.port_cap_flags2,
        })
    }

    /// Whether the port is RoCE (Ethernet link layer).
    pub fn is_roce(&self) -> bool {
        self.link_layer == LinkLayer::Ethernet
    }

    /// Whether address vectors on this port must carry a GRH (`is_global`):
    /// always on RoCE, and on IB ports flagged `IBV_QPF_GRH_REQUIRED`.
    pub fn grh_required(&self) -> bool {
        self.is_roce() || self.flags.contains(PortFlags::GRH_REQUIRED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_bytes() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        for m in Mtu::ALL {
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(*m));
            assert_eq!(Mtu::from_raw(m.as_raw()), Some(*m));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::from_raw(0), None);
        assert_eq!(Mtu::from_raw(6), None);
    }

    #[test]
    fn decodes_a_roce_port() {
        let raw = sys::ibv_port_attr {
            state: sys::ibv_port_state::IBV_PORT_ACTIVE,
            max_mtu: sys::ibv_mtu::IBV_MTU_4096,
            active_mtu: sys::ibv_mtu::IBV_MTU_1024,
            gid_tbl_len: 1024,
            pkey_tbl_len: 64,
            link_layer: sys::IBV_LINK_LAYER_ETHERNET as u8,
            ..Default::default()
        };
        let p = PortAttr::from_raw(&raw).unwrap();
        assert_eq!(p.state, PortState::Active);
        assert_eq!(p.active_mtu, Mtu::Mtu1024);
        assert!(p.is_roce());
        assert!(p.grh_required());
    }

    #[test]
    fn grh_required_flag_on_ib() {
        let raw = sys::ibv_port_attr {
            state: sys::ibv_port_state::IBV_PORT_ACTIVE,
            max_mtu: sys::ibv_mtu::IBV_MTU_4096,
            active_mtu: sys::ibv_mtu::IBV_MTU_4096,
            link_layer: sys::IBV_LINK_LAYER_INFINIBAND as u8,
            ..Default::default()
        };
        assert!(!PortAttr::from_raw(&raw).unwrap().grh_required());
        let raw = sys::ibv_port_attr { flags: 1, ..raw };
        assert!(PortAttr::from_raw(&raw).unwrap().grh_required());
    }

    #[test]
    fn unknown_mtu_is_a_typed_error() {
        let raw = sys::ibv_port_attr {
            state: sys::ibv_port_state::IBV_PORT_ACTIVE,
            max_mtu: 9,
            active_mtu: sys::ibv_mtu::IBV_MTU_1024,
            ..Default::default()
        };
        let e = PortAttr::from_raw(&raw).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Unexpected {
                    field: "max_mtu",
                    value: 9,
                    ..
                }
            ),
            "{e}"
        );
    }
}
