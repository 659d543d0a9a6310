//! GIDs (`union ibv_gid`) and GID table entries (`struct ibv_gid_entry`).

use crate::sys::ibv_gid_type;
use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;

use crate::sys;

/// A 128-bit Global Identifier (`union ibv_gid`), in network byte order.
///
/// On RoCE a GID is an IPv6 address (IPv4 addresses as `::ffff:a.b.c.d`), so
/// it displays and parses as one.
///
/// ```
/// use rdma_verbs::Gid;
/// let gid: Gid = "::ffff:10.99.0.1".parse()?;
/// assert_eq!(gid.to_string(), "::ffff:10.99.0.1");
/// assert_eq!(gid.as_ipv6().to_ipv4_mapped(), Some([10, 99, 0, 1].into()));
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
#[doc(alias = "ibv_gid")]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (an unused table entry).
    pub const ZERO: Gid = Gid([0; 16]);

    /// The GID as an IPv6 address.
    pub fn as_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The upper 64 bits (`global.subnet_prefix`), in host order.
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.0[..8].try_into().expect("8 bytes"))
    }

    /// The lower 64 bits (`global.interface_id`), in host order.
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.0[8..].try_into().expect("8 bytes"))
    }

    /// Whether every byte is zero.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    pub(crate) fn from_raw(raw: &sys::ibv_gid) -> Self {
        // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
        Gid(unsafe { raw.raw })
    }

    pub(crate) fn to_raw(self) -> sys::ibv_gid {
        sys::ibv_gid { raw: self.0 }
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Self {
        Gid(a.octets())
    }
}

impl From<Gid> for Ipv6Addr {
    fn from(g: Gid) -> Self {
        g.as_ipv6()
    }
}

impl FromStr for Gid {
    type Err = std::net::AddrParseError;
    /// Parses the IPv6 text form.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<Ipv6Addr>().map(Gid::from)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.as_ipv6(), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

c_enum! {
    /// The protocol a GID is used with (`enum ibv_gid_type`).
    #[doc(alias = "ibv_gid_type")]
    pub enum GidType(ibv_gid_type): u32 {
        /// InfiniBand.
        Ib = IBV_GID_TYPE_IB,
        /// RoCE v1 (Ethernet, EtherType 0x8915).
        RoceV1 = IBV_GID_TYPE_ROCE_V1,
        /// RoCE v2 (UDP port 4791): routable.
        RoceV2 = IBV_GID_TYPE_ROCE_V2,
    }
}

/// One valid entry of a port's GID table (`struct ibv_gid_entry`).
#[doc(alias = "ibv_gid_entry")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GidEntry {
    /// `gid`.
    pub gid: Gid,
    /// `gid_index`: the index to use as `sgid_index`.
    pub index: u32,
    /// `port_num`.
    pub port: u32,
    /// `gid_type`; `None` for a type this crate does not know.
    pub gid_type: Option<GidType>,
    /// `ndev_ifindex`: the network interface behind the GID (RoCE), or 0.
    pub ndev_ifindex: u32,
}

impl GidEntry {
    pub(crate) fn from_raw(e: &sys::ibv_gid_entry) -> Self {
        GidEntry {
            gid: Gid::from_raw(&e.gid),
            index: e.gid_index,
            port: e.port_num,
            gid_type: GidType::from_raw(e.gid_type),
            ndev_ifindex: e.ndev_ifindex,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_and_text() {
        let g: Gid = "fe80::1:2".parse().unwrap();
        assert_eq!(g.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(g.interface_id(), 0x0000_0000_0001_0002);
        assert_eq!(g.to_string(), "fe80::1:2");
        assert!(!g.is_zero());
        assert!(Gid::ZERO.is_zero());
        assert!("not a gid".parse::<Gid>().is_err());
    }

    #[test]
    fn raw_round_trip() {
        let g: Gid = "::ffff:10.99.0.1".parse().unwrap();
        assert_eq!(Gid::from_raw(&g.to_raw()), g);
    }

    #[test]
    fn entry_decodes_type() {
        let g: Gid = "::ffff:10.99.0.1".parse().unwrap();
        let raw = sys::ibv_gid_entry {
            gid: g.to_raw(),
            gid_index: 1,
            port_num: 1,
            gid_type: sys::ibv_gid_type::IBV_GID_TYPE_ROCE_V2,
            ndev_ifindex: 7,
        };
        let e = GidEntry::from_raw(&raw);
        assert_eq!(e.gid, g);
        assert_eq!(e.gid_type, Some(GidType::RoceV2));
        assert_eq!((e.index, e.port, e.ndev_ifindex), (1, 1, 7));
    }
}
