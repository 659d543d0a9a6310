//! Port attributes (`struct ibv_port_attr`), as `ibv_query_port` reports them.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

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

/// The attributes of a port that do not change while a context is open,
/// as far as [`QueuePair::modify`](crate::QueuePair::modify)'s checks are concerned.
///
/// * `pkey_tbl_len` and `gid_tbl_len`: when a device registers, its driver
///   copies the sizes its own query reports into the port's *immutable*
///   data (`ib_port_immutable`: rxe, mlx5, efa, qedr, siw, ... all fill it
///   from their `query_port`); the core sizes its GID and P_Key caches with
///   those and checks indexes against them for the device's whole life.
/// * `link_layer` comes from `rdma_port_get_link_layer`, and the
///   `IBV_QPF_GRH_REQUIRED` flag from the port's immutable core capability
///   flags (`rdma_is_grh_required`); a driver that switches a port between
///   InfiniBand and Ethernet (mlx4) re-registers the device, which ends
///   every open context.
/// * `max_mtu` is what the port's hardware (or rxe: always 4096) can carry.
///   The kernel does not promise it fixed, so it is used only to *accept*
///   a path MTU: a refusal re-reads it (see [`Context`](crate::Context)).
///
/// What does change (state, active MTU, LIDs, counters) is not here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PortFixed {
    pub pkey_tbl_len: u16,
    pub gid_tbl_len: u32,
    pub max_mtu: Mtu,
    /// The link layer is Ethernet (RoCE).
    roce: bool,
    /// Address vectors need a GRH: RoCE, or `IBV_QPF_GRH_REQUIRED`.
    grh_required: bool,
}

impl PortFixed {
    pub(crate) fn of(a: &PortAttr) -> Self {
        PortFixed {
            pkey_tbl_len: a.pkey_tbl_len,
            gid_tbl_len: a.gid_tbl_len,
            max_mtu: a.max_mtu,
            roce: a.is_roce(),
            grh_required: a.grh_required(),
        }
    }

    /// As [`PortAttr::is_roce`].
    #[inline]
    pub(crate) fn is_roce(&self) -> bool {
        self.roce
    }

    /// As [`PortAttr::grh_required`].
    #[inline]
    pub(crate) fn grh_required(&self) -> bool {
        self.grh_required
    }

    // The cache keeps a port's facts in one atomic word, so that a reader
    // takes them with one load, no lock: bits 0..32 the GID table's length,
    // 32..48 the P_Key table's, 48..51 the max MTU (`ibv_mtu`, 1..=5),
    // bit 51 RoCE, bit 52 GRH required, bit 63 "read" (0: never read).
    const READ: u64 = 1 << 63;

    fn pack(self) -> u64 {
        u64::from(self.gid_tbl_len)
            | u64::from(self.pkey_tbl_len) << 32
            | u64::from(self.max_mtu.as_raw() & 7) << 48
            | u64::from(self.roce) << 51
            | u64::from(self.grh_required) << 52
            | Self::READ
    }

    #[inline]
    fn unpack(word: u64) -> Option<Self> {
        if word & Self::READ == 0 {
            return None;
        }
        Some(PortFixed {
            gid_tbl_len: word as u32,
            pkey_tbl_len: (word >> 32) as u16,
            // Only a valid MTU is ever packed (`PortAttr` holds an `Mtu`).
            max_mtu: Mtu::from_raw(((word >> 48) & 7) as u32)?,
            roce: word & 1 << 51 != 0,
            grh_required: word & 1 << 52 != 0,
        })
    }
}

/// What the validator needs of a used GID table entry: whether a RoCE v2
/// source can reach a destination of either family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GidKind {
    /// Not RoCE v2 (InfiniBand, RoCE v1): no family constraint.
    Other,
    /// A RoCE v2 IPv4-mapped GID: it sends IPv4 packets.
    RoceV2Ipv4,
    /// Any other RoCE v2 GID: it sends IPv6 packets.
    RoceV2Ipv6,
}

impl GidKind {
    pub(crate) fn of(entry: &crate::gid::GidEntry) -> Self {
        if entry.gid_type != Some(crate::gid::GidType::RoceV2) {
            GidKind::Other
        } else if entry.gid.as_ipv6().to_ipv4_mapped().is_some() {
            GidKind::RoceV2Ipv4
        } else {
            GidKind::RoceV2Ipv6
        }
    }

    /// Whether a GRH from such an entry can reach `dgid`.
    pub(crate) fn reaches(self, dgid: crate::gid::Gid) -> bool {
        let v4 = dgid.as_ipv6().to_ipv4_mapped().is_some();
        match self {
            GidKind::Other => true,
            GidKind::RoceV2Ipv4 => v4,
            GidKind::RoceV2Ipv6 => !v4,
        }
    }

    fn encode(k: Option<Self>) -> u8 {
        match k {
            None => 0,
            Some(GidKind::Other) => 1,
            Some(GidKind::RoceV2Ipv4) => 2,
            Some(GidKind::RoceV2Ipv6) => 3,
        }
    }

    fn decode(b: u8) -> Option<Self> {
        match b {
            1 => Some(GidKind::Other),
            2 => Some(GidKind::RoceV2Ipv4),
            3 => Some(GidKind::RoceV2Ipv6),
            _ => None,
        }
    }
}

/// GID entries cached per port at most (rxe has 1024, ConnectX NICs a few
/// hundred): one byte each.
const MAX_CACHED_GIDS: usize = 1 << 16;

/// The GID [`QueuePair::local_endpoint`](crate::QueuePair::local_endpoint)
/// and [`QueuePair::connect`](crate::QueuePair::connect) use on a port that
/// needs a GRH when no GID index is given: the first RoCE v2 entry, an
/// IPv4-mapped one if there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GidPick {
    pub index: u8,
    pub gid: crate::gid::Gid,
}

impl GidPick {
    /// The pick of `port` in `table` (every used entry, as
    /// `ibv_query_gid_table` lists them), if the port has a RoCE v2 entry
    /// with an index a GRH can name (below 256).
    pub(crate) fn of(table: &[crate::gid::GidEntry], port: u8) -> Option<Self> {
        let v2 = || {
            table.iter().filter(|e| {
                e.port == u32::from(port)
                    && e.gid_type == Some(crate::gid::GidType::RoceV2)
                    && e.index <= u32::from(u8::MAX)
            })
        };
        let e = v2()
            .find(|e| e.gid.as_ipv6().to_ipv4_mapped().is_some())
            .or_else(|| v2().next())?;
        Some(GidPick {
            index: e.index as u8,
            gid: e.gid,
        })
    }

    /// Whether `entry`, freshly read at this pick's index, still holds the
    /// pick: the same GID, RoCE v2.
    pub(crate) fn holds(&self, entry: &crate::gid::GidEntry) -> bool {
        entry.gid == self.gid && entry.gid_type == Some(crate::gid::GidType::RoceV2)
    }
}

/// A known LID in [`PortSlot::lid`]: the LID in the low 16 bits.
const LID_KNOWN: u32 = 1 << 16;

/// One port's cache in a context: its [`PortFixed`] attributes once read,
/// the kind of each GID entry last seen used, the LID last read and the
/// default GID pick.
#[derive(Default)]
struct PortSlot {
    /// [`PortFixed::pack`]ed; 0 until the port is first read.
    fixed: AtomicU64,
    /// One byte per entry of the GID table (`GidKind::encode`: 0 is
    /// unknown), allocated once, when the table's length is first known.
    gids: OnceLock<Box<[AtomicU8]>>,
    /// The LID the last query of the port returned, `| LID_KNOWN`; 0 when
    /// not known (never read, or forgotten after a port event).
    lid: AtomicU32,
    /// The default GID pick, when known.
    pick: Mutex<Option<GidPick>>,
}

/// The per-port cache of a [`Context`](crate::Context): filled by the
/// first `ibv_query_port` of a port (every query refreshes it) and by GID
/// reads. Thread safe; reading it takes no lock, allocates nothing and
/// makes no call (a port's facts are one atomic word, a GID entry's one
/// byte).
pub(crate) struct PortCache {
    /// Index `port - 1`.
    slots: Box<[PortSlot]>,
}

impl PortCache {
    /// A cache for ports `1..=ports`.
    pub(crate) fn new(ports: u8) -> Self {
        PortCache {
            slots: (0..ports).map(|_| PortSlot::default()).collect(),
        }
    }

    #[inline]
    fn slot(&self, port: u8) -> Option<&PortSlot> {
        self.slots.get(usize::from(port).checked_sub(1)?)
    }

    /// The fixed attributes of `port`, if they were read (never for a port
    /// outside `1..=ports`: a hit proves that the port exists).
    #[inline]
    pub(crate) fn fixed(&self, port: u8) -> Option<PortFixed> {
        PortFixed::unpack(self.slot(port)?.fixed.load(Ordering::Acquire))
    }

    /// Records what a query of `port` returned.
    pub(crate) fn store(&self, port: u8, attr: &PortAttr) {
        let Some(slot) = self.slot(port) else { return };
        let fixed = PortFixed::of(attr);
        slot.fixed.store(fixed.pack(), Ordering::Release);
        slot.lid
            .store(u32::from(attr.lid) | LID_KNOWN, Ordering::Relaxed);
        // Entries past MAX_CACHED_GIDS are read every time.
        let len = usize::try_from(fixed.gid_tbl_len)
            .unwrap_or(0)
            .min(MAX_CACHED_GIDS);
        slot.gids
            .get_or_init(|| (0..len).map(|_| AtomicU8::new(0)).collect());
    }

    /// The kind of GID entry `index` of `port` when last seen used.
    #[inline]
    pub(crate) fn gid(&self, port: u8, index: u32) -> Option<GidKind> {
        let cell = self
            .slot(port)?
            .gids
            .get()?
            .get(usize::try_from(index).ok()?)?;
        GidKind::decode(cell.load(Ordering::Relaxed))
    }

    /// Forgets every GID entry of `port`, and its default GID pick.
    pub(crate) fn forget_gids(&self, port: u8) {
        self.set_pick(port, None);
        if let Some(g) = self.slot(port).and_then(|s| s.gids.get()) {
            g.iter().for_each(|c| c.store(0, Ordering::Relaxed));
        }
    }

    /// The LID the last query of `port` returned, unless forgotten since.
    #[inline]
    pub(crate) fn lid(&self, port: u8) -> Option<u16> {
        let word = self.slot(port)?.lid.load(Ordering::Relaxed);
        (word & LID_KNOWN != 0).then_some(word as u16)
    }

    /// Forgets the LID of `port` (after a port event): the next use reads it.
    pub(crate) fn forget_lid(&self, port: u8) {
        if let Some(slot) = self.slot(port) {
            slot.lid.store(0, Ordering::Relaxed);
        }
    }

    /// The default GID pick of `port`, if known.
    #[inline]
    pub(crate) fn pick(&self, port: u8) -> Option<GidPick> {
        *self
            .slot(port)?
            .pick
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records (or, with `None`, forgets) the default GID pick of `port`.
    pub(crate) fn set_pick(&self, port: u8, pick: Option<GidPick>) {
        if let Some(slot) = self.slot(port) {
            *slot.pick.lock().unwrap_or_else(PoisonError::into_inner) = pick;
        }
    }

    /// Records entry `index` of `port`: `None` when it was seen empty (which
    /// also forgets a default GID pick at that index).
    /// Ignored until the port's table length is known.
    pub(crate) fn store_gid(&self, port: u8, index: u32, kind: Option<GidKind>) {
        if kind.is_none() && self.pick(port).is_some_and(|p| u32::from(p.index) == index) {
            self.set_pick(port, None);
        }
        let cell = self
            .slot(port)
            .and_then(|s| s.gids.get())
            .and_then(|g| g.get(usize::try_from(index).ok()?));
        if let Some(cell) = cell {
            cell.store(GidKind::encode(kind), Ordering::Relaxed);
        }
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

    fn roce_port(gid_tbl_len: i32) -> PortAttr {
        PortAttr::from_raw(&sys::ibv_port_attr {
            state: sys::ibv_port_state::IBV_PORT_ACTIVE,
            max_mtu: sys::ibv_mtu::IBV_MTU_4096,
            active_mtu: sys::ibv_mtu::IBV_MTU_1024,
            gid_tbl_len,
            pkey_tbl_len: 64,
            link_layer: sys::IBV_LINK_LAYER_ETHERNET as u8,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn port_cache_holds_only_the_fixed_attributes() {
        let cache = PortCache::new(2);
        assert_eq!(cache.fixed(1), None);
        let mut a = roce_port(16);
        cache.store(1, &a);
        let f = cache.fixed(1).unwrap();
        assert_eq!(
            (f.pkey_tbl_len, f.gid_tbl_len, f.max_mtu),
            (64, 16, Mtu::Mtu4096)
        );
        assert!(f.is_roce() && f.grh_required());
        // What changes with the link is not kept: another active MTU or
        // state stores the same fixed part.
        a.active_mtu = Mtu::Mtu4096;
        a.state = PortState::Down;
        cache.store(1, &a);
        assert_eq!(cache.fixed(1), Some(f));
        // Ports outside 1..=2 are never cached (and never panic).
        for p in [0, 3, 255] {
            cache.store(p, &a);
            assert_eq!(cache.fixed(p), None);
            cache.store_gid(p, 0, Some(GidKind::Other));
            assert_eq!(cache.gid(p, 0), None);
        }
        assert_eq!(cache.fixed(2), None);
    }

    #[test]
    fn gid_kinds_are_cached_per_entry_and_forgotten() {
        let cache = PortCache::new(1);
        // Before the table's length is known nothing is kept.
        cache.store_gid(1, 0, Some(GidKind::RoceV2Ipv4));
        assert_eq!(cache.gid(1, 0), None);
        cache.store(1, &roce_port(4));
        cache.store_gid(1, 1, Some(GidKind::RoceV2Ipv4));
        cache.store_gid(1, 2, Some(GidKind::RoceV2Ipv6));
        cache.store_gid(1, 4, Some(GidKind::Other)); // past the table
        assert_eq!(cache.gid(1, 1), Some(GidKind::RoceV2Ipv4));
        assert_eq!(cache.gid(1, 2), Some(GidKind::RoceV2Ipv6));
        assert_eq!(cache.gid(1, 4), None);
        cache.store_gid(1, 1, None); // seen empty
        assert_eq!(cache.gid(1, 1), None);
        cache.forget_gids(1);
        assert_eq!(cache.gid(1, 2), None);
    }

    fn entry(
        index: u32,
        port: u32,
        gid_type: Option<crate::gid::GidType>,
        gid: &str,
    ) -> crate::gid::GidEntry {
        crate::gid::GidEntry {
            gid: gid.parse().unwrap(),
            index,
            port,
            gid_type,
            ndev_ifindex: 0,
        }
    }

    #[test]
    fn default_gid_pick_prefers_ipv4_mapped_roce_v2() {
        use crate::gid::GidType::{RoceV1, RoceV2};
        let table = [
            entry(0, 1, Some(RoceV1), "fe80::1"),
            entry(1, 1, Some(RoceV2), "fe80::1"),
            entry(2, 1, Some(RoceV1), "::ffff:10.0.0.1"),
            entry(3, 1, Some(RoceV2), "::ffff:10.0.0.1"),
            entry(0, 2, Some(RoceV2), "::ffff:10.0.0.2"),
            entry(300, 3, Some(RoceV2), "::ffff:10.0.0.3"),
        ];
        let pick = GidPick::of(&table, 1).unwrap();
        assert_eq!(
            (pick.index, pick.gid),
            (3, "::ffff:10.0.0.1".parse().unwrap())
        );
        assert_eq!(GidPick::of(&table[..2], 1).unwrap().index, 1);
        assert_eq!(GidPick::of(&table, 2).unwrap().index, 0);
        // No RoCE v2 entry, or none a GRH can name: no pick.
        assert_eq!(GidPick::of(&table[..1], 1), None);
        assert_eq!(GidPick::of(&table, 3), None);
        assert!(pick.holds(&table[3]));
        assert!(!pick.holds(&table[2]) && !pick.holds(&table[4]));
    }

    #[test]
    fn lid_and_pick_are_cached_and_forgotten() {
        let cache = PortCache::new(1);
        assert_eq!(cache.lid(1), None);
        let mut a = roce_port(4);
        a.lid = 0x12;
        cache.store(1, &a);
        assert_eq!(cache.lid(1), Some(0x12));
        cache.forget_lid(1);
        assert_eq!(cache.lid(1), None);
        let pick = GidPick {
            index: 1,
            gid: "::ffff:10.0.0.1".parse().unwrap(),
        };
        cache.set_pick(1, Some(pick));
        assert_eq!(cache.pick(1), Some(pick));
        // Another entry seen empty keeps it; its own entry seen empty does not.
        cache.store_gid(1, 2, None);
        assert_eq!(cache.pick(1), Some(pick));
        cache.store_gid(1, 1, None);
        assert_eq!(cache.pick(1), None);
        cache.set_pick(1, Some(pick));
        cache.forget_gids(1);
        assert_eq!(cache.pick(1), None);
        // Ports outside the cache: nothing kept, no panic.
        cache.set_pick(0, Some(pick));
        cache.forget_lid(9);
        assert_eq!((cache.pick(0), cache.lid(9)), (None, None));
    }

    #[test]
    fn gid_kind_reach() {
        let v4: crate::gid::Gid = "::ffff:10.99.0.1".parse().unwrap();
        let v6: crate::gid::Gid = "fe80::1".parse().unwrap();
        assert!(GidKind::RoceV2Ipv4.reaches(v4) && !GidKind::RoceV2Ipv4.reaches(v6));
        assert!(GidKind::RoceV2Ipv6.reaches(v6) && !GidKind::RoceV2Ipv6.reaches(v4));
        assert!(GidKind::Other.reaches(v4) && GidKind::Other.reaches(v6));
        for k in [
            None,
            Some(GidKind::Other),
            Some(GidKind::RoceV2Ipv4),
            Some(GidKind::RoceV2Ipv6),
        ] {
            assert_eq!(GidKind::decode(GidKind::encode(k)), k);
        }
        let entry = |gid_type, gid| crate::gid::GidEntry {
            gid,
            index: 0,
            port: 1,
            gid_type,
            ndev_ifindex: 0,
        };
        use crate::gid::GidType;
        assert_eq!(
            GidKind::of(&entry(Some(GidType::RoceV2), v4)),
            GidKind::RoceV2Ipv4
        );
        assert_eq!(
            GidKind::of(&entry(Some(GidType::RoceV2), v6)),
            GidKind::RoceV2Ipv6
        );
        assert_eq!(
            GidKind::of(&entry(Some(GidType::RoceV1), v4)),
            GidKind::Other
        );
        assert_eq!(GidKind::of(&entry(None, v6)), GidKind::Other);
    }
}
