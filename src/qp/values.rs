//! Typed values of `struct ibv_qp_attr` fields: each type accepts exactly the
//! C field's domain and refuses the rest at construction.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::gid::Gid;
use crate::sys::ibv_mig_state;

fn out_of_range(what: &'static str, value: u64, range: &'static str) -> Error {
    Error::OutOfRange { what, value, range }
}

/// A 24-bit packet sequence number (`rq_psn`, `sq_psn`).
///
/// ```
/// use rdma_verbs::qp::Psn;
/// assert_eq!(Psn::new(0xff_ffff).unwrap().get(), 0xff_ffff);
/// assert!(Psn::new(0x100_0000).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Psn(u32);

impl Psn {
    /// The largest PSN.
    pub const MAX: u32 = 0xff_ffff;

    /// A PSN; values above 24 bits are refused (the kernel would silently mask them).
    pub fn new(psn: u32) -> Result<Self> {
        if psn <= Self::MAX {
            Ok(Psn(psn))
        } else {
            Err(out_of_range("PSN", psn.into(), "0..=0xffffff (24 bits)"))
        }
    }

    /// The low 24 bits of `value`, as rdma-core's examples make their PSNs
    /// (`lrand48() & 0xffffff`).
    pub fn truncate(value: u32) -> Self {
        Psn(value & Self::MAX)
    }

    /// The value.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// A 24-bit QP number (`dest_qp_num`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct QpNum(u32);

impl QpNum {
    /// A QP number; values above 24 bits are refused.
    pub fn new(qpn: u32) -> Result<Self> {
        if qpn <= 0xff_ffff {
            Ok(QpNum(qpn))
        } else {
            Err(out_of_range(
                "QP number",
                qpn.into(),
                "0..=0xffffff (24 bits)",
            ))
        }
    }

    /// The low 24 bits of `value`: what a 24-bit QP number field of a
    /// packet or a completion (`src_qp`) can carry.
    ///
    /// ```
    /// use rdma_verbs::qp::QpNum;
    /// assert_eq!(QpNum::truncate(0x1ab_cdef).get(), 0xab_cdef);
    /// ```
    pub fn truncate(value: u32) -> Self {
        QpNum(value & 0xff_ffff)
    }

    /// The value.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for QpNum {
    /// The number in hex, as `ibv_*_pingpong` print it (`0x0000b1`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// `{:x}`, `{:06x}`, `{:#x}`: the number, formatted as a `u32` would be.
///
/// ```
/// use rdma_verbs::qp::QpNum;
/// let q = QpNum::new(0xb1)?;
/// assert_eq!(format!("{q:x} {q:06x} {q:#X}"), "b1 0000b1 0xB1");
/// assert_eq!(u32::from(q), 0xb1);
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
impl fmt::LowerHex for QpNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// `{:X}`: as [`LowerHex`](fmt::LowerHex), upper-case.
impl fmt::UpperHex for QpNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::UpperHex::fmt(&self.0, f)
    }
}

impl From<QpNum> for u32 {
    fn from(q: QpNum) -> u32 {
        q.0
    }
}

/// A Q_Key (`qkey`, UD). Every 32-bit value is valid; keys with the top bit
/// set are *controlled* and only privileged processes may send with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QKey(pub u32);

impl QKey {
    /// The Q_Key rdma-core's `ibv_ud_pingpong` uses.
    pub const PINGPONG: QKey = QKey(0x1111_1111);
}

/// The local ACK timeout (`timeout`, `alt_timeout`): 4.096 us * 2^value,
/// 0 meaning infinite. Valid values are 0..=31.
///
/// ```
/// use rdma_verbs::qp::AckTimeout;
/// let t = AckTimeout::new(14)?; // ibv_rc_pingpong's value
/// assert_eq!(t.duration().unwrap().as_micros(), 67_108); // 4.096 us << 14
/// assert_eq!(AckTimeout::INFINITE.duration(), None);
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct AckTimeout(u8);

impl AckTimeout {
    /// Wait for ACKs forever.
    pub const INFINITE: AckTimeout = AckTimeout(0);

    /// The timeout of code `value` (0..=31).
    pub fn new(value: u8) -> Result<Self> {
        if value <= 31 {
            Ok(AckTimeout(value))
        } else {
            Err(out_of_range("ACK timeout", value.into(), "0..=31"))
        }
    }

    /// The code.
    pub fn get(self) -> u8 {
        self.0
    }

    /// The time it stands for; `None` for infinite.
    pub fn duration(self) -> Option<Duration> {
        (self.0 != 0).then(|| Duration::from_nanos(4096u64 << self.0))
    }
}

/// The transport retry count (`retry_cnt`): 0..=7.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct RetryCount(u8);

impl RetryCount {
    /// A retry count (0..=7).
    pub fn new(value: u8) -> Result<Self> {
        if value <= 7 {
            Ok(RetryCount(value))
        } else {
            Err(out_of_range("retry count", value.into(), "0..=7"))
        }
    }

    /// The count.
    pub fn get(self) -> u8 {
        self.0
    }
}

/// The RNR retry count (`rnr_retry`): 0..=6 retries, 7 retries forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct RnrRetry(u8);

impl RnrRetry {
    /// Retry forever while the peer has no receive posted.
    pub const INFINITE: RnrRetry = RnrRetry(7);

    /// An RNR retry count (0..=7, 7 = infinite).
    pub fn new(value: u8) -> Result<Self> {
        if value <= 7 {
            Ok(RnrRetry(value))
        } else {
            Err(out_of_range(
                "RNR retry count",
                value.into(),
                "0..=7 (7 = infinite)",
            ))
        }
    }

    /// The code.
    pub fn get(self) -> u8 {
        self.0
    }

    /// Whether it retries forever.
    pub fn is_infinite(self) -> bool {
        self.0 == 7
    }
}

/// The minimum RNR NAK timer (`min_rnr_timer`): one of 32 encoded durations
/// (InfiniBand spec, table 45), from 0.01 ms (1) to 655.36 ms (0).
///
/// ```
/// use rdma_verbs::qp::MinRnrTimer;
/// let t = MinRnrTimer::new(12)?; // ibv_rc_pingpong's value
/// assert_eq!(t.duration().as_micros(), 640);
/// assert_eq!(MinRnrTimer::new(0)?.duration().as_micros(), 655_360);
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MinRnrTimer(u8);

/// The durations of codes 0..=31, in microseconds.
const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

impl MinRnrTimer {
    /// The timer of code `value` (0..=31).
    pub fn new(value: u8) -> Result<Self> {
        if value <= 31 {
            Ok(MinRnrTimer(value))
        } else {
            Err(out_of_range("min RNR timer", value.into(), "0..=31"))
        }
    }

    /// The shortest code whose duration is at least `d` (code 0, 655.36 ms,
    /// for anything longer than 491.52 ms).
    pub fn at_least(d: Duration) -> Self {
        // In nanoseconds: a fraction of a microsecond past a code's time
        // needs the next code (whole microseconds would round it down).
        let ns = d.as_nanos();
        (1..32u8)
            .find(|&c| u128::from(RNR_TIMER_US[c as usize]) * 1000 >= ns)
            .map_or(MinRnrTimer(0), MinRnrTimer)
    }

    /// The code.
    pub fn get(self) -> u8 {
        self.0
    }

    /// The time it stands for.
    pub fn duration(self) -> Duration {
        Duration::from_micros(RNR_TIMER_US[self.0 as usize].into())
    }
}

c_enum! {
    /// The path migration state (`enum ibv_mig_state`).
    #[doc(alias = "ibv_mig_state")]
    pub enum PathMigState(ibv_mig_state): u32 {
        /// Migrated: the alternate path is now the primary.
        Migrated = IBV_MIG_MIGRATED,
        /// Rearm: load a new alternate path.
        Rearm = IBV_MIG_REARM,
        /// Armed: ready to migrate.
        Armed = IBV_MIG_ARMED,
    }
}

/// A send rate limit in kbit/s (`rate_limit`, RAW_PACKET with packet pacing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct RateLimit(pub u32);

/// The GRH part of an address vector (`struct ibv_global_route`): needed on
/// RoCE and on IB ports that require it, and across subnets.
#[doc(alias = "ibv_global_route")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GlobalRoute {
    dgid: Gid,
    sgid_index: u8,
    flow_label: u32,
    hop_limit: u8,
    traffic_class: u8,
}

impl GlobalRoute {
    /// A route to `dgid` from the local GID at `sgid_index`, with flow label
    /// 0, hop limit 1 (as rdma-core's examples; the kernel sets its own on
    /// RoCE) and traffic class 0.
    pub fn new(dgid: Gid, sgid_index: u8) -> Self {
        GlobalRoute {
            dgid,
            sgid_index,
            flow_label: 0,
            hop_limit: 1,
            traffic_class: 0,
        }
    }

    /// Sets the 20-bit flow label.
    pub fn flow_label(mut self, label: u32) -> Result<Self> {
        if label > 0xf_ffff {
            return Err(out_of_range(
                "flow label",
                label.into(),
                "0..=0xfffff (20 bits)",
            ));
        }
        self.flow_label = label;
        Ok(self)
    }

    /// Sets the hop limit.
    pub fn hop_limit(mut self, hops: u8) -> Self {
        self.hop_limit = hops;
        self
    }

    /// Sets the traffic class.
    pub fn traffic_class(mut self, class: u8) -> Self {
        self.traffic_class = class;
        self
    }

    /// The destination GID.
    pub fn dgid(&self) -> Gid {
        self.dgid
    }

    /// The local GID index.
    pub fn sgid_index(&self) -> u8 {
        self.sgid_index
    }
}

/// An address vector (`struct ibv_ah_attr`): where a connected QP sends, or
/// (in an address handle) where a UD send goes.
///
/// ```
/// use rdma_verbs::qp::{AddressVector, GlobalRoute};
/// // RoCE: a GRH is required; the LID is 0.
/// let av = AddressVector::new(1)
///     .global(GlobalRoute::new("::ffff:10.99.0.1".parse().unwrap(), 1));
/// assert!(av.grh().is_some());
/// ```
#[doc(alias = "ibv_ah_attr")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressVector {
    port: u8,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    grh: Option<GlobalRoute>,
}

impl AddressVector {
    /// Sends out of local port `port`, to LID 0, service level 0, at full
    /// rate, with no GRH: set [`dlid`](Self::dlid) on InfiniBand and
    /// [`global`](Self::global) on RoCE.
    pub fn new(port: u8) -> Self {
        AddressVector {
            port,
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            grh: None,
        }
    }

    /// Sets the destination LID (InfiniBand).
    pub fn dlid(mut self, lid: u16) -> Self {
        self.dlid = lid;
        self
    }

    /// Sets the service level (0..=15).
    pub fn sl(mut self, sl: u8) -> Result<Self> {
        if sl > 15 {
            return Err(out_of_range("service level", sl.into(), "0..=15"));
        }
        self.sl = sl;
        Ok(self)
    }

    /// Sets the source path bits (LMC).
    pub fn src_path_bits(mut self, bits: u8) -> Self {
        self.src_path_bits = bits;
        self
    }

    /// Sets the static rate (`enum ibv_rate` value; 0 = port rate).
    pub fn static_rate(mut self, rate: u8) -> Self {
        self.static_rate = rate;
        self
    }

    /// Adds a GRH (`is_global = 1`).
    pub fn global(mut self, grh: GlobalRoute) -> Self {
        self.grh = Some(grh);
        self
    }

    /// The local port.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The GRH, if any.
    pub fn grh(&self) -> Option<&GlobalRoute> {
        self.grh.as_ref()
    }

    /// The service level (`sl`).
    pub fn service_level(&self) -> u8 {
        self.sl
    }

    /// The source path bits (`src_path_bits`).
    pub fn path_bits(&self) -> u8 {
        self.src_path_bits
    }

    /// The static rate (`static_rate`, an `enum ibv_rate` value; 0: port rate).
    pub fn rate(&self) -> u8 {
        self.static_rate
    }

    /// The destination LID.
    pub fn dest_lid(&self) -> u16 {
        self.dlid
    }

    pub(crate) fn to_raw(self) -> crate::sys::ibv_ah_attr {
        let mut raw = crate::sys::ibv_ah_attr {
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: self.src_path_bits,
            static_rate: self.static_rate,
            is_global: 0,
            port_num: self.port,
            ..Default::default()
        };
        if let Some(g) = self.grh {
            raw.is_global = 1;
            raw.grh = crate::sys::ibv_global_route {
                dgid: g.dgid.to_raw(),
                flow_label: g.flow_label,
                sgid_index: g.sgid_index,
                hop_limit: g.hop_limit,
                traffic_class: g.traffic_class,
            };
        }
        raw
    }

    pub(crate) fn from_raw(raw: &crate::sys::ibv_ah_attr) -> Self {
        AddressVector {
            port: raw.port_num,
            dlid: raw.dlid,
            sl: raw.sl,
            src_path_bits: raw.src_path_bits,
            static_rate: raw.static_rate,
            grh: (raw.is_global != 0).then(|| GlobalRoute {
                dgid: Gid::from_raw(&raw.grh.dgid),
                sgid_index: raw.grh.sgid_index,
                flow_label: raw.grh.flow_label,
                hop_limit: raw.grh.hop_limit,
                traffic_class: raw.grh.traffic_class,
            }),
        }
    }
}

/// An alternate path for automatic path migration (`alt_ah_attr`,
/// `alt_pkey_index`, `alt_port_num`, `alt_timeout`): always set together.
/// InfiniBand only: the kernel refuses it on RoCE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AltPath {
    /// `alt_ah_attr`.
    pub av: AddressVector,
    /// `alt_pkey_index`.
    pub pkey_index: u16,
    /// `alt_port_num`.
    pub port: u8,
    /// `alt_timeout`.
    pub timeout: AckTimeout,
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_enforced() {
        assert!(Psn::new(0).is_ok() && Psn::new(0xff_ffff).is_ok());
        assert!(matches!(
            Psn::new(1 << 24),
            Err(Error::OutOfRange { what: "PSN", .. })
        ));
        assert_eq!(Psn::truncate(0x1ab_cdef).get(), 0xab_cdef);
        assert!(QpNum::new(0xff_ffff).is_ok() && QpNum::new(1 << 24).is_err());
        assert!(AckTimeout::new(31).is_ok() && AckTimeout::new(32).is_err());
        assert!(RetryCount::new(7).is_ok() && RetryCount::new(8).is_err());
        assert!(RnrRetry::new(7).unwrap().is_infinite() && RnrRetry::new(8).is_err());
        assert!(MinRnrTimer::new(31).is_ok() && MinRnrTimer::new(32).is_err());
        let dgid = Gid::ZERO;
        assert!(GlobalRoute::new(dgid, 0).flow_label(0xf_ffff).is_ok());
        assert!(GlobalRoute::new(dgid, 0).flow_label(0x10_0000).is_err());
        assert!(AddressVector::new(1).sl(15).is_ok() && AddressVector::new(1).sl(16).is_err());
        let e = AckTimeout::new(40).unwrap_err().to_string();
        assert!(
            e.contains("ACK timeout") && e.contains("40") && e.contains("0..=31"),
            "{e}"
        );
    }

    #[test]
    fn timer_durations() {
        assert_eq!(
            AckTimeout::new(1).unwrap().duration(),
            Some(Duration::from_nanos(8192))
        );
        assert_eq!(
            MinRnrTimer::new(1).unwrap().duration(),
            Duration::from_micros(10)
        );
        assert_eq!(
            MinRnrTimer::new(31).unwrap().duration(),
            Duration::from_micros(491_520)
        );
        // strictly increasing from code 1 to 31, code 0 the longest
        for c in 2..32u8 {
            assert!(MinRnrTimer(c).duration() > MinRnrTimer(c - 1).duration());
        }
        assert!(MinRnrTimer(0).duration() > MinRnrTimer(31).duration());
        assert_eq!(MinRnrTimer::at_least(Duration::from_micros(600)).get(), 12);
        assert_eq!(MinRnrTimer::at_least(Duration::from_secs(1)).get(), 0);
    }

    #[test]
    fn address_vector_round_trips() {
        let av = AddressVector::new(1).dlid(7).sl(3).unwrap().global(
            GlobalRoute::new("fe80::1".parse().unwrap(), 2)
                .hop_limit(64)
                .traffic_class(5),
        );
        let raw = av.to_raw();
        assert_eq!(
            (raw.is_global, raw.port_num, raw.dlid, raw.sl),
            (1, 1, 7, 3)
        );
        assert_eq!(raw.grh.sgid_index, 2);
        assert_eq!(AddressVector::from_raw(&raw), av);
        let plain = AddressVector::new(2).dlid(9);
        assert_eq!(plain.to_raw().is_global, 0);
        assert_eq!(AddressVector::from_raw(&plain.to_raw()), plain);
    }

    #[test]
    fn mig_state_round_trips() {
        for s in PathMigState::ALL {
            assert_eq!(PathMigState::from_raw(s.as_raw()), Some(*s));
        }
    }

    /// Property tests (proptest, with shrinking): every range-checked
    /// constructor accepts exactly its domain, keeps the value, and names
    /// the value it refuses.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn refused(e: Error, name: &str, v: u64) -> bool {
            matches!(e, Error::OutOfRange { what, value, .. } if what == name && value == v)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]

            #[test]
            fn psn_and_qp_num_are_24_bits(x in any::<u32>()) {
                let fits = x <= 0xff_ffff;
                match Psn::new(x) {
                    Ok(p) => prop_assert!(fits && p.get() == x),
                    Err(e) => prop_assert!(!fits && refused(e, "PSN", x.into())),
                }
                match QpNum::new(x) {
                    Ok(q) => prop_assert!(fits && q.get() == x),
                    Err(e) => prop_assert!(!fits && refused(e, "QP number", x.into())),
                }
                let t = Psn::truncate(x);
                prop_assert_eq!(t.get(), x & 0xff_ffff);
                prop_assert_eq!(Psn::new(t.get()).ok(), Some(t));
            }

            #[test]
            fn small_codes_accept_exactly_their_range(x in any::<u8>()) {
                match AckTimeout::new(x) {
                    Ok(t) => {
                        prop_assert!(x <= 31 && t.get() == x);
                        let want = (x != 0).then(|| Duration::from_nanos(4096u64 << x));
                        prop_assert_eq!(t.duration(), want);
                    }
                    Err(e) => prop_assert!(x > 31 && refused(e, "ACK timeout", x.into())),
                }
                match RetryCount::new(x) {
                    Ok(c) => prop_assert!(x <= 7 && c.get() == x),
                    Err(e) => prop_assert!(x > 7 && refused(e, "retry count", x.into())),
                }
                match RnrRetry::new(x) {
                    Ok(c) => prop_assert!(x <= 7 && c.get() == x && c.is_infinite() == (x == 7)),
                    Err(e) => prop_assert!(x > 7 && refused(e, "RNR retry count", x.into())),
                }
                match MinRnrTimer::new(x) {
                    Ok(t) => {
                        prop_assert!(x <= 31 && t.get() == x);
                        prop_assert_eq!(t.duration(), Duration::from_micros(RNR_TIMER_US[x as usize].into()));
                    }
                    Err(e) => prop_assert!(x > 31 && refused(e, "min RNR timer", x.into())),
                }
                match AddressVector::new(1).sl(x) {
                    Ok(av) => prop_assert!(x <= 15 && av.service_level() == x),
                    Err(e) => prop_assert!(x > 15 && refused(e, "service level", x.into())),
                }
            }

            #[test]
            fn flow_label_is_20_bits(x in any::<u32>()) {
                match GlobalRoute::new(Gid::ZERO, 0).flow_label(x) {
                    Ok(g) => prop_assert!(x <= 0xf_ffff && g.flow_label == x),
                    Err(e) => prop_assert!(x > 0xf_ffff && refused(e, "flow label", x.into())),
                }
            }

            /// `at_least(d)` is the shortest code lasting at least `d`
            /// (code 0, the longest, past 491.52 ms), for whole
            /// microseconds (fractions of one: see
            /// `min_rnr_timer_at_least_with_nanoseconds`).
            #[test]
            fn min_rnr_timer_at_least_is_the_shortest_long_enough_code(us in 0u64..1_000_000) {
                let d = Duration::from_micros(us);
                let c = MinRnrTimer::at_least(d);
                if c.get() == 0 {
                    prop_assert!(us > 491_520);
                } else {
                    prop_assert!(c.duration() >= d);
                    let shorter = (1..c.get()).any(|k| MinRnrTimer(k).duration() >= d);
                    prop_assert!(!shorter, "code {} is not the shortest for {:?}", c.get(), d);
                }
            }

            #[test]
            fn address_vectors_round_trip_through_c(
                port in any::<u8>(), dlid in any::<u16>(), sl in 0u8..=15, bits in any::<u8>(),
                rate in any::<u8>(), grh in proptest::option::of((any::<[u8; 16]>(), any::<u8>(),
                    0u32..=0xf_ffff, any::<u8>(), any::<u8>()))
            ) {
                let mut av = AddressVector::new(port).dlid(dlid).sl(sl).unwrap()
                    .src_path_bits(bits).static_rate(rate);
                if let Some((gid, idx, fl, hops, tc)) = grh {
                    let g = GlobalRoute::new(std::net::Ipv6Addr::from(gid).into(), idx)
                        .flow_label(fl).unwrap().hop_limit(hops).traffic_class(tc);
                    av = av.global(g);
                }
                prop_assert_eq!(AddressVector::from_raw(&av.to_raw()), av);
            }
        }

        /// A duration a fraction of a microsecond past a code's gets the
        /// next code, never that shorter one (`at_least` read whole
        /// microseconds and failed this: code 1, 10 us + 1 ns, gave code 1).
        /// Random durations almost never land there, so this draws them
        /// just past each code's duration.
        #[test]
        fn min_rnr_timer_at_least_with_nanoseconds() {
            proptest!(|(code in 1usize..32, extra_ns in 0u64..1000)| {
                let d = Duration::from_micros(RNR_TIMER_US[code].into())
                    + Duration::from_nanos(extra_ns);
                let c = MinRnrTimer::at_least(d);
                prop_assert!(c.get() == 0 || c.duration() >= d, "{:?} -> code {}", d, c.get());
            });
        }
    }
}
