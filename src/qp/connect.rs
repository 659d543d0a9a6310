//! Connecting: the endpoint record rdma-core's examples exchange, and a
//! one-call RESET -> RTS with sensible defaults.

use std::fmt;
use std::str::FromStr;

use super::attr::QpAttr;
use super::values::{
    AckTimeout, AddressVector, GlobalRoute, MinRnrTimer, Psn, QKey, QpNum, RetryCount, RnrRetry,
};
use super::{QpState, QpType, QueuePair};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::gid::{Gid, GidEntry};
use crate::mr::AccessFlags;
use crate::port::{GidPick, Mtu};

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
    /// The path MTU; `None` takes the port's active MTU, read at each
    /// [`QueuePair::connect`] (one `ibv_query_port`: it changes with the
    /// link, and no event reports a change on RoCE).
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

/// Whether [`Context::default_gid`] checks a cached pick against the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Re-read the one entry the pick names (`ibv_query_gid_ex`): what is
    /// handed to a peer.
    Entry,
    /// Take the cached pick as it is (what the device judges again).
    Cached,
}

impl Context {
    /// The GID [`ConnectOptions::gid_index`]` = None` stands for on `port`:
    /// `None` when the port needs no GRH (a fact fixed while the context
    /// is open, from the cache), else the cached pick (checked as `check`
    /// says) or, when there is none or it no longer holds, a new pick made
    /// from the whole table ([`gid_table`](Self::gid_table), which caches it).
    fn default_gid(&self, port: u8, check: Check) -> Result<Option<GidPick>> {
        if !self.port_fixed(port, false)?.grh_required() {
            return Ok(None);
        }
        if let Some(pick) = self.port_cache().pick(port) {
            if check == Check::Cached {
                return Ok(Some(pick));
            }
            // Emptied, reused or unreadable: pick again from the table,
            // whose read has the last word.
            if let Ok(raw) = self.raw_gid_entry("ibv_query_gid_ex", port, pick.index.into()) {
                if pick.holds(&GidEntry::from_raw(&raw)) {
                    return Ok(Some(pick));
                }
            }
        }
        self.pick_default_gid(port)
    }

    /// The default GID pick of `port` from a fresh read of the GID table;
    /// a port without a RoCE v2 GID is refused after reading the port again.
    #[cold]
    fn pick_default_gid(&self, port: u8) -> Result<Option<GidPick>> {
        let table = self.gid_table()?;
        if let Some(pick) = GidPick::of(&table, port) {
            return Ok(Some(pick));
        }
        if !self.port_fixed(port, true)?.grh_required() {
            return Ok(None);
        }
        Err(Error::invalid(
            "QueuePair::connect",
            format!(
                "port {port} needs a GRH but has no RoCE v2 GID at an index below 256: \
                 set ConnectOptions::gid_index"
            ),
        ))
    }

    /// The LID of `port` for an endpoint: 0 on RoCE (which has no LIDs;
    /// the link layer is fixed while the context is open), else the LID the
    /// last [`query_port`](Self::query_port) read, unless a port event
    /// read since made the context forget it; otherwise read now.
    fn endpoint_lid(&self, port: u8) -> Result<u16> {
        if self.port_fixed(port, false)?.is_roce() {
            return Ok(0);
        }
        match self.port_cache().lid(port) {
            Some(lid) => Ok(lid),
            None => self.query_port(port).map(|a| a.lid),
        }
    }
}

impl QueuePair {
    /// The local GID index `opts` resolves to, if a GRH is used: an
    /// explicit [`ConnectOptions::gid_index`] is checked against the
    /// context's cache (an entry last read used is taken without a call;
    /// anything else is read, so that an empty entry is refused on what
    /// the device says); none takes the context's default pick as cached
    /// (the one [`local_endpoint`](Self::local_endpoint) last checked; the
    /// kernel judges the entry again at RTR, and a refusal is then checked
    /// again on fresh data, see [`modify`](Self::modify)).
    fn local_gid_index(&self, opts: &ConnectOptions) -> Result<Option<u8>> {
        let ctx = self.pd().context();
        match opts.gid_index {
            Some(i) => {
                ctx.check_gid_used(opts.port, i.into())?;
                Ok(Some(i))
            }
            None => Ok(ctx.default_gid(opts.port, Check::Entry)?.map(|p| p.index)),
        }
    }

    /// This QP's endpoint for `opts`, with first PSN `psn`: what to send the
    /// peer.
    ///
    /// The GID is zero when the port needs no GRH and `opts` names no GID
    /// index (InfiniBand). A [`ConnectOptions::gid_index`] that names an
    /// empty (unused) entry of the port's GID table is refused with
    /// [`Error::InvalidArgument`] naming the index and the port.
    ///
    /// One kernel call where a GID is used, none otherwise (see
    /// [`Context`](crate::Context#what-a-context-caches)): the GID entry
    /// handed out is read now (`ibv_query_gid_ex`), the named one or the
    /// context's default pick, which is picked again from the whole table
    /// if that entry no longer holds it, so that no GID that has left the
    /// table is handed to a peer. The LID is 0 on RoCE, and on InfiniBand
    /// the one the context last read (see there for what refreshes it).
    #[doc(alias = "ibv_query_gid_ex")]
    pub fn local_endpoint(&self, opts: &ConnectOptions, psn: Psn) -> Result<Endpoint> {
        let ctx = self.pd().context();
        let gid = match opts.gid_index {
            Some(i) => ctx.query_gid(opts.port, i.into())?,
            None => ctx
                .default_gid(opts.port, Check::Entry)?
                .map_or(Gid::ZERO, |p| p.gid),
        };
        Ok(Endpoint {
            lid: ctx.endpoint_lid(opts.port)?,
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
    ///
    /// Kernel calls: the three `ibv_modify_qp`, plus one `ibv_query_port`
    /// for the active MTU when [`ConnectOptions::path_mtu`] is `None`.
    /// The GID index comes from the context's cache without a call: an
    /// explicit one last read used, or the default pick (see
    /// [`Context`](crate::Context#what-a-context-caches)), as
    /// [`local_endpoint`](Self::local_endpoint) last checked it; only a
    /// cold cache, or an explicit entry not known used, is read.
    #[doc(alias = "ibv_modify_qp")]
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
