//! Connecting: the endpoint record rdma-core's examples exchange, and a
//! one-call RESET -> RTS with sensible defaults.

use std::fmt;
use std::str::FromStr;

use super::attr::QpAttr;
use super::values::{
    AckTimeout, AddressVector, GlobalRoute, MinRnrTimer, Psn, QKey, QpNum, RetryCount, RnrRetry,
};
use super::{QpState, QpType, QueuePair};
use crate::error::{Error, Result};
use crate::gid::{Gid, GidType};
use crate::mr::AccessFlags;
use crate::port::Mtu;

/// Where a queue pair can be reached: LID, QP number, first PSN and GID.
///
/// Its text form is the record rdma-core's `ibv_*_pingpong` examples send
/// over TCP: `%04x:%06x:%06x:` followed by the GID's 16 bytes as 32 hex
/// digits (52 bytes with the C string's NUL).
///
/// ```
/// use rdma_verbs::qp::{Endpoint, Psn, QpNum};
/// let ep = Endpoint {
///     lid: 0,
///     qpn: QpNum::new(0x11)?,
///     psn: Psn::new(0xabcdef)?,
///     gid: "::ffff:10.99.0.1".parse().unwrap(),
/// };
/// let text = ep.to_string();
/// assert_eq!(text, "0000:000011:abcdef:00000000000000000000ffff0a630001");
/// assert_eq!(text.parse::<Endpoint>()?, ep);
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// The QP number.
    pub qpn: QpNum,
    /// The first PSN the QP sends.
    pub psn: Psn,
    /// The GID (all zero when no GRH is used).
    pub gid: Gid,
}

impl Endpoint {
    /// Length of the wire record, NUL included.
    pub const WIRE_LEN: usize = 52;

    /// The wire record: the text form and a NUL, as the C examples send it.
    pub fn to_wire(&self) -> [u8; Self::WIRE_LEN] {
        let mut out = [0u8; Self::WIRE_LEN];
        out[..Self::WIRE_LEN - 1].copy_from_slice(self.to_string().as_bytes());
        out
    }

    /// Parses a wire record: the text up to the first NUL, or all of
    /// `bytes` (the C examples' records, and CM private data with its zero
    /// padding, parse as they arrive). Refusals name `Endpoint::from_wire`.
    pub fn from_wire(bytes: &[u8]) -> Result<Self> {
        const VERB: &str = "Endpoint::from_wire";
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let text = std::str::from_utf8(&bytes[..end]).map_err(|_| bad_record(VERB, "not ASCII"))?;
        parse(VERB, text)
    }
}

#[cold]
fn bad_record(verb: &'static str, why: &str) -> Error {
    Error::invalid(verb, format!("not a LID:QPN:PSN:GID record: {why}"))
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:06x}:{:06x}:",
            self.lid,
            self.qpn.get(),
            self.psn.get()
        )?;
        for b in self.gid.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for Endpoint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        parse("Endpoint::from_str", s)
    }
}

/// Parses the text form; refusals name `verb`, the call the caller made.
fn parse(verb: &'static str, s: &str) -> Result<Endpoint> {
    let mut parts = s.trim_end_matches('\0').split(':');
    let mut field = |name, digits| {
        let p = parts.next().ok_or_else(|| bad_record(verb, name))?;
        // Hex digits only: from_str_radix would take a leading '+'.
        if p.len() != digits || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad_record(verb, name));
        }
        u64::from_str_radix(p, 16).map_err(|_| bad_record(verb, name))
    };
    let lid = field("LID", 4)? as u16;
    let qpn = QpNum::new(field("QPN", 6)? as u32)?;
    let psn = Psn::new(field("PSN", 6)? as u32)?;
    let gid_text = parts.next().ok_or_else(|| bad_record(verb, "GID"))?;
    // ASCII hex digits only, so that slicing by bytes below never cuts
    // a multi-byte character.
    if parts.next().is_some()
        || gid_text.len() != 32
        || !gid_text.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(bad_record(verb, "GID"));
    }
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&gid_text[2 * i..2 * i + 2], 16)
            .map_err(|_| bad_record(verb, "GID"))?;
    }
    Ok(Endpoint {
        lid,
        qpn,
        psn,
        gid: Gid(gid),
    })
}

/// Settings for [`QueuePair::connect`]; the defaults are those of
/// rdma-core's `ibv_rc_pingpong`, except that the path MTU follows the port.
///
/// Build it with struct update syntax:
/// `ConnectOptions { gid_index: Some(1), ..Default::default() }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// The local port (default 1).
    pub port: u8,
    /// The local GID index; `None` picks one where the port needs a GRH
    /// (RoCE): the first RoCE v2 GID, an IPv4-mapped one if there is one.
    pub gid_index: Option<u8>,
    /// The path MTU; `None` takes the port's active MTU.
    pub path_mtu: Option<Mtu>,
    /// P_Key index (default 0).
    pub pkey_index: u16,
    /// What incoming RDMA operations may do (RC/UC; default none).
    pub access: AccessFlags,
    /// Service level (default 0).
    pub sl: u8,
    /// Q_Key for UD (default 0x11111111).
    pub qkey: QKey,
    /// RC ACK timeout (default 14: about 67 ms).
    pub timeout: AckTimeout,
    /// RC retry count (default 7).
    pub retry_cnt: RetryCount,
    /// RC RNR retry (default 7: infinite).
    pub rnr_retry: RnrRetry,
    /// RC minimum RNR timer (default 12: 0.64 ms).
    pub min_rnr_timer: MinRnrTimer,
    /// RC outstanding reads/atomics as initiator (default 1).
    pub max_rd_atomic: u8,
    /// RC outstanding reads/atomics as target (default 1).
    pub max_dest_rd_atomic: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            port: 1,
            gid_index: None,
            path_mtu: None,
            pkey_index: 0,
            access: AccessFlags::empty(),
            sl: 0,
            qkey: QKey::PINGPONG,
            timeout: AckTimeout::new(14).expect("in range"),
            retry_cnt: RetryCount::new(7).expect("in range"),
            rnr_retry: RnrRetry::INFINITE,
            min_rnr_timer: MinRnrTimer::new(12).expect("in range"),
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
        }
    }
}

impl QueuePair {
    /// The local GID index and GID `opts` resolve to on this QP's device,
    /// if a GRH is used.
    ///
    /// An explicit [`ConnectOptions::gid_index`] must name a used entry of
    /// the port's table: an empty one is the error of
    /// [`Context::query_gid`](crate::Context::query_gid), naming the index
    /// and the port.
    fn local_gid(&self, opts: &ConnectOptions) -> Result<Option<(u8, Gid)>> {
        let ctx = self.pd().context();
        if let Some(i) = opts.gid_index {
            return Ok(Some((i, ctx.query_gid(opts.port, i.into())?)));
        }
        if !ctx.query_port(opts.port)?.grh_required() {
            return Ok(None);
        }
        let table = ctx.gid_table()?;
        let ours = table.iter().filter(|e| e.port == u32::from(opts.port));
        let v2: Vec<_> = ours
            .filter(|e| e.gid_type == Some(GidType::RoceV2))
            .collect();
        let pick = v2
            .iter()
            .find(|e| e.gid.as_ipv6().to_ipv4_mapped().is_some())
            .or(v2.first())
            .ok_or_else(|| {
                Error::invalid(
                    "QueuePair::connect",
                    format!(
                        "port {} needs a GRH but has no RoCE v2 GID: set ConnectOptions::gid_index",
                        opts.port
                    ),
                )
            })?;
        let index = u8::try_from(pick.index)
            .map_err(|_| Error::invalid("QueuePair::connect", "GID index above 255"))?;
        Ok(Some((index, pick.gid)))
    }

    /// The local GID index `opts` resolves to, if a GRH is used: as
    /// [`local_gid`](Self::local_gid), but an explicit
    /// [`ConnectOptions::gid_index`] is checked against the context's cache
    /// (an entry last read used is taken without a call; anything else is
    /// read, so that an empty entry is refused on what the device says).
    fn local_gid_index(&self, opts: &ConnectOptions) -> Result<Option<u8>> {
        match opts.gid_index {
            Some(i) => {
                self.pd().context().check_gid_used(opts.port, i.into())?;
                Ok(Some(i))
            }
            None => Ok(self.local_gid(opts)?.map(|(i, _)| i)),
        }
    }

    /// This QP's endpoint for `opts`, with first PSN `psn`: what to send the
    /// peer.
    ///
    /// The GID is zero when the port needs no GRH and `opts` names no GID
    /// index (InfiniBand). A [`ConnectOptions::gid_index`] that names an
    /// empty (unused) entry of the port's GID table is refused with
    /// [`Error::InvalidArgument`] naming the index and the port.
    pub fn local_endpoint(&self, opts: &ConnectOptions, psn: Psn) -> Result<Endpoint> {
        let port = self.pd().context().query_port(opts.port)?;
        let gid = self.local_gid(opts)?.map_or(Gid::ZERO, |(_, gid)| gid);
        Ok(Endpoint {
            lid: port.lid,
            qpn: self.qp_num(),
            psn,
            gid,
        })
    }

    /// Takes a QP in RESET to RTS, connected to `remote` (RC, UC), or ready
    /// to send datagrams (UD, where `remote` is not used: UD sends name
    /// their destination; [`bring_up_ud`](Self::bring_up_ud) says so without
    /// a made-up peer). `psn` is this QP's first PSN, as announced in
    /// [`local_endpoint`](Self::local_endpoint).
    ///
    /// Each step goes through [`modify`](Self::modify), so a bad setting is
    /// refused before it reaches the device; on failure the QP stays in the
    /// state the last successful step reached. A
    /// [`ConnectOptions::gid_index`] naming an empty entry of the port's GID
    /// table is refused (as in [`local_endpoint`](Self::local_endpoint))
    /// before the first step.
    pub fn connect(&mut self, opts: &ConnectOptions, psn: Psn, remote: &Endpoint) -> Result<()> {
        if self.state() != QpState::Reset {
            return Err(Error::invalid(
                "QueuePair::connect",
                format!("the QP is in {}, not RESET", self.state().short_name()),
            ));
        }
        let t = self.qp_type();
        // Resolved before the first step, so that a bad GID index (an empty
        // entry) is refused before the QP leaves RESET.
        let local_gid_index = match t {
            QpType::Rc | QpType::Uc => self.local_gid_index(opts)?,
            _ => None,
        };
        let init = QpAttr::new()
            .state(QpState::Init)
            .pkey_index(opts.pkey_index)
            .port(opts.port);
        match t {
            QpType::Ud => {
                return self.bring_up_ud_with(
                    "QueuePair::connect",
                    opts.pkey_index,
                    opts.port,
                    opts.qkey,
                    psn,
                )
            }
            QpType::Rc | QpType::Uc => self.modify(&init.access_flags(opts.access))?,
            other => {
                return Err(Error::invalid(
                    "QueuePair::connect",
                    format!("{} QPs are not connected this way", other.short_name()),
                ))
            }
        }
        // The active MTU changes with the link: read it now, unless given.
        let path_mtu = match opts.path_mtu {
            Some(mtu) => mtu,
            None => self.pd().context().query_port(opts.port)?.active_mtu,
        };
        let mut av = AddressVector::new(opts.port).dlid(remote.lid).sl(opts.sl)?;
        if let Some(i) = local_gid_index {
            av = av.global(GlobalRoute::new(remote.gid, i));
        }
        let mut rtr = QpAttr::new()
            .state(QpState::Rtr)
            .av(av)
            .path_mtu(path_mtu)
            .dest_qpn(remote.qpn)
            .rq_psn(remote.psn);
        let mut rts = QpAttr::new().state(QpState::Rts).sq_psn(psn);
        if t == QpType::Rc {
            rtr = rtr
                .max_dest_rd_atomic(opts.max_dest_rd_atomic)
                .min_rnr_timer(opts.min_rnr_timer);
            rts = rts
                .timeout(opts.timeout)
                .retry_cnt(opts.retry_cnt)
                .rnr_retry(opts.rnr_retry)
                .max_rd_atomic(opts.max_rd_atomic);
        }
        self.modify(&rtr)?;
        self.modify(&rts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_record_matches_the_c_examples() {
        // What `ibv_rc_pingpong -g 1` on rxe prints for itself: gid_to_wire_gid
        // writes the 16 bytes in order.
        let ep = Endpoint {
            lid: 0x1a,
            qpn: QpNum::new(0x0000b1).unwrap(),
            psn: Psn::new(0x5e1d2c).unwrap(),
            gid: "fe80::24:13ff:fec5:518f".parse().unwrap(),
        };
        let wire = ep.to_wire();
        assert_eq!(wire.len(), 52);
        assert_eq!(wire[51], 0);
        assert_eq!(
            &wire[..51],
            b"001a:0000b1:5e1d2c:fe80000000000000002413fffec5518f"
        );
        assert_eq!(Endpoint::from_wire(&wire).unwrap(), ep);
        assert_eq!(Endpoint::from_wire(&wire[..51]).unwrap(), ep);
    }

    #[test]
    fn malformed_records_are_refused() {
        for bad in [
            "",
            "0000:000011:abcdef",
            "000:000011:abcdef:00000000000000000000ffff0a630001",
            "0000:0000111:abcdef:00000000000000000000ffff0a630001",
            "0000:000011:abcdef:00000000000000000000ffff0a63000",
            "0000:000011:abcdef:00000000000000000000ffff0a63000g",
            "0000:000011:abcdef:00000000000000000000ffff0a630001:x",
            "zzzz:000011:abcdef:00000000000000000000ffff0a630001",
            "+000:000011:abcdef:00000000000000000000ffff0a630001",
            "0000:+00011:abcdef:00000000000000000000ffff0a630001",
            "0000:000011:abcdef:+0000000000000000000ffff0a630001",
            // 32 bytes, one character of two bytes: refused, not a panic.
            "0000:000011:abcdef:00000000000000000000ffff0a630é1",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn defaults_are_the_pingpong_ones() {
        let o = ConnectOptions::default();
        assert_eq!((o.port, o.pkey_index, o.sl), (1, 0, 0));
        assert_eq!(o.timeout.get(), 14);
        assert_eq!(
            (o.retry_cnt.get(), o.rnr_retry.get(), o.min_rnr_timer.get()),
            (7, 7, 12)
        );
        assert_eq!((o.max_rd_atomic, o.max_dest_rd_atomic), (1, 1));
        assert_eq!(o.qkey, QKey(0x1111_1111));
    }
}
