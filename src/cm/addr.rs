//! Port spaces and socket addresses in librdmacm's C form.

use std::mem::size_of;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::qp::QpType;
use crate::sys;

use sys::rdma_port_space as ps;
c_enum! {
    /// The port space of a CM id (`enum rdma_port_space`): which transport
    /// its connections use and which service ids its ports map to.
    #[doc(alias = "rdma_port_space")]
    pub enum PortSpace(ps): u32 {
        /// Reliable connections (RC QPs), like TCP.
        Tcp = RDMA_PS_TCP,
        /// Unreliable datagrams (UD QPs), like UDP; multicast needs it.
        Udp = RDMA_PS_UDP,
        /// UD QPs in the IPoIB port space.
        Ipoib = RDMA_PS_IPOIB,
        /// InfiniBand service ids; RC QPs.
        Ib = RDMA_PS_IB,
    }
}

impl PortSpace {
    /// The QP type `rdma_create_id` gives ids of this port space:
    /// UD for [`Udp`](Self::Udp) and [`Ipoib`](Self::Ipoib), RC otherwise.
    pub fn qp_type(self) -> QpType {
        match self {
            PortSpace::Udp | PortSpace::Ipoib => QpType::Ud,
            PortSpace::Tcp | PortSpace::Ib => QpType::Rc,
        }
    }

    /// Whether ids of this port space make connections (not datagrams).
    pub fn is_connected(self) -> bool {
        self.qp_type() != QpType::Ud
    }
}

/// A `struct sockaddr_in` or `sockaddr_in6`, big enough for either.
#[repr(C)]
pub(crate) union RawAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
    any: libc::sockaddr,
}

impl RawAddr {
    pub(crate) fn new(addr: SocketAddr) -> Self {
        match addr {
            SocketAddr::V4(a) => RawAddr {
                v4: libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                },
            },
            SocketAddr::V6(a) => RawAddr {
                v6: libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo().to_be(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                },
            },
        }
    }

    /// The pointer librdmacm takes (`struct sockaddr *`).
    pub(crate) fn as_ptr(&mut self) -> *mut sys::sockaddr {
        (self as *mut RawAddr).cast()
    }
}

/// Reads a socket address that librdmacm wrote (`route.addr.src_addr`, ...);
/// `None` for an unset one (family 0) or a family other than IPv4/IPv6.
///
/// # Safety
/// `ptr` points to readable memory at least as large as a `sockaddr_in6`
/// (librdmacm's address fields are `sockaddr_storage`-sized unions).
pub(crate) unsafe fn read_sockaddr(ptr: *const sys::sockaddr) -> Option<SocketAddr> {
    const _: () = assert!(size_of::<libc::sockaddr_in6>() >= size_of::<libc::sockaddr_in>());
    // SAFETY: the caller's promise: at least a sockaddr_in6 is readable;
    // `read_unaligned` takes no alignment for granted.
    let family = unsafe { std::ptr::read_unaligned(ptr.cast::<libc::sockaddr>()) }.sa_family;
    match i32::from(family) {
        libc::AF_INET => {
            // SAFETY: as above; the family says it is a sockaddr_in.
            let a = unsafe { std::ptr::read_unaligned(ptr.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above; the family says it is a sockaddr_in6.
            let a = unsafe { std::ptr::read_unaligned(ptr.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                u32::from_be(a.sin6_flowinfo),
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_through_c() {
        for s in ["10.99.0.1:7471", "[fe80::1]:18515", "0.0.0.0:0"] {
            let a: SocketAddr = s.parse().unwrap();
            let mut raw = RawAddr::new(a);
            // SAFETY: `raw` is a sockaddr_in6-sized union.
            assert_eq!(unsafe { read_sockaddr(raw.as_ptr()) }, Some(a));
        }
        // SAFETY: an all-zero union is a valid, unset address.
        let mut zero: RawAddr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { read_sockaddr(zero.as_ptr()) }, None);
    }

    #[test]
    fn port_spaces_map_to_qp_types() {
        assert_eq!(PortSpace::Tcp.qp_type(), QpType::Rc);
        assert_eq!(PortSpace::Udp.qp_type(), QpType::Ud);
        assert!(!PortSpace::Ipoib.is_connected());
        assert_eq!(PortSpace::Tcp.as_raw(), 0x0106);
    }
}
