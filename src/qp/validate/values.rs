//! The value part of the checks: ports, table indexes, MTU, rd_atomic
//! limits, GRHs and source GIDs, alternate paths and rate limits, against
//! the device and the context's per-port cache.

use std::cell::Cell;

use super::{ModifyError, QpView};
use crate::context::Context;
use crate::device_attr::DeviceCapFlags;
use crate::error::table_of;
use crate::port::{GidKind, PortFixed};
use crate::qp::attr::QpAttr;
use crate::qp::mask::QpAttrMask as M;
use crate::qp::{QpState, QpType};

/// Where the value checks read port attributes and GID entries from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Read {
    /// The context's cache, reading (and filling it) only what it lacks.
    Cached,
    /// The device: every port looked at is queried once, every GID entry
    /// read (both refresh the cache).
    Fresh,
}

/// The source GID entry a GRH names must exist (the kernel: ENODATA), and
/// on RoCE v2 be of the destination's family: an IPv4-mapped GID sends
/// IPv4 packets, any other IPv6 (the kernel: EINVAL). The caller checked
/// the index against the port's table (no second port query here).
///
/// With [`Read::Cached`], an entry last seen used and of a fitting kind is
/// accepted without a call (the kernel judges the entry anyway); anything
/// else reads the entry, so a refusal always rests on a fresh read.
fn check_sgid(
    ctx: &Context,
    port: u8,
    g: &crate::qp::values::GlobalRoute,
    read: Read,
) -> Result<(), String> {
    const VERB: &str = "ibv_query_gid_ex";
    let index = g.sgid_index();
    if read == Read::Cached
        && ctx
            .cached_gid(port, index.into())
            .is_some_and(|kind| kind.reaches(g.dgid()))
    {
        return Ok(());
    }
    let entry = ctx
        .raw_gid_entry(VERB, port, index.into())
        .map(|raw| crate::gid::GidEntry::from_raw(&raw))
        .map_err(|e| match e {
            crate::Error::InvalidArgument { reason, .. } => format!("sgid_index {index}: {reason}"),
            other => format!("sgid_index {index}: cannot read the GID entry: {other}"),
        })?;
    if !GidKind::of(&entry).reaches(g.dgid()) {
        let v4 = |gid: crate::gid::Gid| gid.as_ipv6().to_ipv4_mapped().is_some();
        let family = |ipv4: bool| if ipv4 { "IPv4" } else { "IPv6" };
        return Err(format!(
            "sgid_index {index} is the RoCE v2 {} GID {}, which cannot reach the {} dgid {}: \
             pick a source GID of the same family",
            family(v4(entry.gid)),
            entry.gid,
            family(v4(g.dgid())),
            g.dgid()
        ));
    }
    Ok(())
}

/// The facts of `port` from the device (or, with [`Read::Cached`], from
/// the cache when it has them): the slow part of the value checks' port
/// lookups. `queried` has a bit per port already queried by this round of
/// [`Read::Fresh`] checks, which then reads the cache.
#[cold]
fn port_read(
    ctx: &Context,
    port: u8,
    read: Read,
    queried: &Cell<[u64; 4]>,
) -> Result<PortFixed, String> {
    if let Some(reason) = ctx.port_problem(port) {
        return Err(reason);
    }
    let (word, bit) = (usize::from(port / 64), 1u64 << (port % 64));
    let mut seen = queried.get();
    let fresh = read == Read::Fresh && seen[word] & bit == 0;
    let pa = ctx
        .port_fixed(port, fresh)
        .map_err(|e| format!("cannot query port {port}: {e}"))?;
    seen[word] |= bit;
    queried.set(seen);
    Ok(pa)
}

/// The value checks, reading port attributes and GID entries as `read`
/// says. Allocates nothing unless it refuses.
pub(super) fn check_values(
    qp: &QpView<'_>,
    attr: &QpAttr,
    from: QpState,
    to: QpState,
    read: Read,
) -> Result<(), ModifyError> {
    let value_err = |attr: M, reason: String| ModifyError::Value {
        qp_type: qp.qp_type,
        from,
        to,
        attr,
        reason,
    };
    let ctx = qp.ctx;
    let dev = ctx.attr();
    let mask = attr.mask();
    let raw = attr.raw();

    // Several checks look at the same port. With Read::Cached a port's
    // facts are one load from the context's cache (a hit also proves that
    // the port exists); only a port never read goes to `port_read`. With
    // Read::Fresh each port is queried once (a bit per port number), after
    // which the cache holds what the query returned.
    let queried = Cell::new([0u64; 4]);
    let port_attr = |flag: M, port: u8| -> Result<PortFixed, ModifyError> {
        if read == Read::Cached {
            if let Some(f) = ctx.cached_port(port) {
                return Ok(f);
            }
        }
        port_read(ctx, port, read, &queried).map_err(|reason| value_err(flag, reason))
    };
    // The port the QP uses after this modify.
    let port = attr.get_port().or(qp.port);

    if let Some(p) = attr.get_port() {
        port_attr(M::PORT, p)?;
    }
    if mask.contains(M::PKEY_INDEX) {
        if let Some(p) = port {
            let len = port_attr(M::PKEY_INDEX, p)?.pkey_tbl_len;
            if raw.pkey_index >= len {
                return Err(value_err(
                    M::PKEY_INDEX,
                    format!(
                        "P_Key index {} is outside port {p}'s {}",
                        raw.pkey_index,
                        table_of(len)
                    ),
                ));
            }
        }
    }
    if let Some(mtu) = attr.get_path_mtu() {
        if let Some(p) = port {
            let pa = port_attr(M::PATH_MTU, p)?;
            // Above the active MTU is allowed, as the kernel allows it: see
            // the `QueuePair::modify` docs.
            if mtu > pa.max_mtu {
                return Err(value_err(
                    M::PATH_MTU,
                    format!(
                        "{} bytes is above port {p}'s max MTU of {}",
                        mtu.bytes(),
                        pa.max_mtu.bytes()
                    ),
                ));
            }
        }
    } else if mask.contains(M::PATH_MTU) {
        return Err(value_err(
            M::PATH_MTU,
            format!("{} is not an MTU", raw.path_mtu),
        ));
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC) && u32::from(raw.max_rd_atomic) > dev.max_qp_init_rd_atom
    {
        return Err(value_err(
            M::MAX_QP_RD_ATOMIC,
            format!(
                "{} is above the device's max_qp_init_rd_atom of {}",
                raw.max_rd_atomic, dev.max_qp_init_rd_atom
            ),
        ));
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC)
        && u32::from(raw.max_dest_rd_atomic) > dev.max_qp_rd_atom
    {
        return Err(value_err(
            M::MAX_DEST_RD_ATOMIC,
            format!(
                "{} is above the device's max_qp_rd_atom of {}",
                raw.max_dest_rd_atomic, dev.max_qp_rd_atom
            ),
        ));
    }
    let check_av = |flag: M,
                    av: &crate::qp::values::AddressVector|
     -> Result<PortFixed, ModifyError> {
        let pa = port_attr(flag, av.port())?;
        match av.grh() {
            None if pa.grh_required() => Err(value_err(
                flag,
                format!(
                    "port {} {}: the address vector needs a GRH (AddressVector::global)",
                    av.port(),
                    if pa.is_roce() {
                        "is RoCE"
                    } else {
                        "requires a GRH (IBV_QPF_GRH_REQUIRED)"
                    }
                ),
            )),
            Some(g) if u32::from(g.sgid_index()) >= pa.gid_tbl_len => Err(value_err(
                flag,
                format!(
                    "sgid_index {} is outside port {}'s GID {}",
                    g.sgid_index(),
                    av.port(),
                    table_of(pa.gid_tbl_len)
                ),
            )),
            Some(g) => {
                check_sgid(ctx, av.port(), g, read).map_err(|reason| value_err(flag, reason))?;
                Ok(pa)
            }
            None => Ok(pa),
        }
    };
    if let Some(av) = attr.get_av() {
        check_av(M::AV, &av)?;
        if from == QpState::Init && to == QpState::Rtr {
            if let Some(p) = port {
                if av.port() != p {
                    return Err(value_err(
                        M::AV,
                        format!(
                            "the address vector's port {} is not the QP's port {p}",
                            av.port()
                        ),
                    ));
                }
            }
        }
    }
    if let Some(alt) = attr.get_alt_path() {
        if !dev.capabilities.contains(DeviceCapFlags::AUTO_PATH_MIG) {
            return Err(value_err(
                M::ALT_PATH,
                format!(
                    "{} has no automatic path migration (IBV_DEVICE_AUTO_PATH_MIG)",
                    ctx.name()
                ),
            ));
        }
        let alt_pa = check_av(M::ALT_PATH, &alt.av)?;
        let primary_roce = match port {
            Some(p) => port_attr(M::ALT_PATH, p)?.is_roce(),
            None => false,
        };
        if alt_pa.is_roce() || primary_roce {
            return Err(value_err(
                M::ALT_PATH,
                "alternate paths are InfiniBand-only: the kernel refuses them on RoCE ports".into(),
            ));
        }
        if alt.port != alt.av.port() {
            return Err(value_err(
                M::ALT_PATH,
                format!(
                    "alt_port_num {} differs from the alternate AV's port {}",
                    alt.port,
                    alt.av.port()
                ),
            ));
        }
        let len = port_attr(M::ALT_PATH, alt.port)?.pkey_tbl_len;
        if alt.pkey_index >= len {
            return Err(value_err(
                M::ALT_PATH,
                format!(
                    "alt_pkey_index {} is outside port {}'s {}",
                    alt.pkey_index,
                    alt.port,
                    table_of(len)
                ),
            ));
        }
    }
    if mask.contains(M::RATE_LIMIT) {
        let pacing = dev.packet_pacing;
        let raw_bit = 1u32 << QpType::RawPacket.as_raw();
        if pacing.supported_qp_types & raw_bit == 0 || pacing.rate_limit_max_kbps == 0 {
            return Err(value_err(
                M::RATE_LIMIT,
                format!("{} has no packet pacing for RAW_PACKET QPs", ctx.name()),
            ));
        }
        let r = raw.rate_limit;
        if r != 0 && !(pacing.rate_limit_min_kbps..=pacing.rate_limit_max_kbps).contains(&r) {
            return Err(value_err(
                M::RATE_LIMIT,
                format!(
                    "{r} kbit/s is outside the device's {}..={} kbit/s",
                    pacing.rate_limit_min_kbps, pacing.rate_limit_max_kbps
                ),
            ));
        }
    }
    Ok(())
}
