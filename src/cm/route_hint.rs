//! Why the connection manager found no route, in words: the address it was
//! given is not on an RDMA device's network interface (127.0.0.1, a plain
//! Ethernet card's address), and which addresses of this machine are.

use std::net::{IpAddr, SocketAddr};

use crate::error::Error;
use crate::gid::GidType;
use crate::DeviceList;

/// The error for `rdma_resolve_route` failing with `ENODEV` on an id whose
/// route starts at `from`: no RDMA device has that address.
#[cold]
pub(super) fn no_rdma_device_has(from: Option<SocketAddr>, errno: i32) -> Error {
    Error::NoRdmaAddress {
        verb: "rdma_resolve_route",
        errno,
        addr: from.map(|a| a.ip()),
        usable: rdma_addresses(),
    }
}

/// This machine's IP addresses that an RDMA device answers to, each as
/// "ADDRESS (DEVICE port N)": the addresses behind the devices' RoCE GIDs
/// (an IPv4 address, or an IPv6 one that is not link-local), each once.
/// InfiniBand ports have no such GIDs: their IPoIB interfaces' addresses
/// are not listed.
#[cold]
pub(crate) fn rdma_addresses() -> Vec<String> {
    let mut out: Vec<(IpAddr, String)> = Vec::new();
    let Ok(list) = DeviceList::new() else {
        return Vec::new();
    };
    for dev in list.iter() {
        let Ok(table) = dev.open().and_then(|ctx| ctx.gid_table()) else {
            continue;
        };
        for e in table {
            if !matches!(e.gid_type, Some(GidType::RoceV1 | GidType::RoceV2)) {
                continue;
            }
            let v6 = e.gid.as_ipv6();
            let ip = match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None if v6.segments()[0] & 0xffc0 == 0xfe80 || v6.is_unspecified() => continue,
                None => IpAddr::V6(v6),
            };
            if !out.iter().any(|(seen, _)| *seen == ip) {
                out.push((ip, format!("{ip} ({} port {})", dev.name(), e.port)));
            }
        }
    }
    out.into_iter().map(|(_, s)| s).collect()
}
