//! The typed builders against the transition table.

use super::super::mask::QpAttrMask as M;
use super::super::table::transition_rule;
use super::super::validate::check_transition;
use super::*;

/// Each typed constructor sets exactly the required attributes of its
/// transition, per the table.
#[test]
fn constructors_set_exactly_the_required_attributes() {
    fn check<T: Transport, B: Modify<T>>(b: B, to: QpState) {
        let from = B::FROM.unwrap();
        let rule = transition_rule(T::QP_TYPE, from, to).unwrap();
        assert_eq!(
            b.into_attr().mask() - M::STATE,
            rule.required,
            "{} {}->{}",
            T::QP_TYPE.short_name(),
            from.short_name(),
            to.short_name()
        );
    }
    let av = AddressVector::new(1);
    let psn = Psn::new(1).unwrap();
    let qpn = QpNum::new(1).unwrap();
    let mrt = MinRnrTimer::new(12).unwrap();
    use QpState::*;
    check::<Rc, _>(ResetToInit::<Rc>::new(0, 1, AccessFlags::empty()), Init);
    check::<Uc, _>(ResetToInit::<Uc>::new(0, 1, AccessFlags::empty()), Init);
    check::<Ud, _>(ResetToInit::<Ud>::new(0, 1, QKey(1)), Init);
    check::<RawPacket, _>(ResetToInit::<RawPacket>::new(1), Init);
    check::<Rc, _>(
        InitToRtr::<Rc>::new(av, Mtu::Mtu1024, qpn, psn, 1, mrt),
        Rtr,
    );
    check::<Uc, _>(InitToRtr::<Uc>::new(av, Mtu::Mtu1024, qpn, psn), Rtr);
    check::<Ud, _>(InitToRtr::<Ud>::new(), Rtr);
    check::<RawPacket, _>(InitToRtr::<RawPacket>::new(), Rtr);
    let t = AckTimeout::new(14).unwrap();
    let r = RetryCount::new(7).unwrap();
    check::<Rc, _>(RtrToRts::<Rc>::new(t, r, RnrRetry::INFINITE, psn, 1), Rts);
    check::<Uc, _>(RtrToRts::<Uc>::new(psn), Rts);
    check::<Ud, _>(RtrToRts::<Ud>::new(psn), Rts);
    check::<RawPacket, _>(RtrToRts::<RawPacket>::new(), Rts);
    for (to, from) in [
        (Init, Init),
        (Rts, Rts),
        (Sqd, Rts),
        (Sqd, Sqd),
        (Rts, Sqd),
        (Rts, Sqe),
    ] {
        assert!(transition_rule(QpType::Rc, from, to)
            .unwrap()
            .required
            .is_empty());
    }
}

/// A value for each optional setter's type.
pub(super) trait Sample {
    fn sample() -> Self;
}
macro_rules! sample {
    ($($t:ty => $v:expr,)+) => {$(
        impl Sample for $t {
            fn sample() -> Self {
                $v
            }
        }
    )+};
}
sample! {
    u8 => 1,
    u16 => 0,
    bool => true,
    AccessFlags => AccessFlags::REMOTE_WRITE,
    QKey => QKey(7),
    QpState => QpState::Reset,
    MinRnrTimer => MinRnrTimer::new(12).unwrap(),
    PathMigState => PathMigState::Armed,
    RateLimit => RateLimit(1000),
    AddressVector => AddressVector::new(1),
    AckTimeout => AckTimeout::new(14).unwrap(),
    RetryCount => RetryCount::new(7).unwrap(),
    RnrRetry => RnrRetry::INFINITE,
    AltPath => AltPath {
        av: AddressVector::new(1),
        pkey_index: 0,
        port: 1,
        timeout: AckTimeout::INFINITE,
    },
}

/// `Qp::apply` skips the table part of the checks for a builder with a
/// from-state: every such builder, with no optional attribute and with
/// all of them (`IBV_QP_CUR_STATE` naming the from-state), passes
/// `check_transition` to its to-state. Any other set of its options
/// lies between the two masks, which the table accepts exactly when
/// they hold its required attributes and only allowed ones, so it
/// passes too.
#[test]
fn every_typed_transition_passes_the_table() {
    fn passes<T: Transport, B: Modify<T>>(b: B) {
        let from = B::FROM.unwrap();
        let mut attr = b.into_attr();
        if attr.get_cur_state().is_some() {
            attr = attr.cur_state(from);
        }
        assert_eq!(
            check_transition(T::QP_TYPE, from, &attr),
            Ok(B::TO),
            "{} {} with {:?}",
            T::QP_TYPE.short_name(),
            B::NAME,
            attr.mask()
        );
    }
    macro_rules! both {
        ($($t:ty: $b:expr;)+) => {$(
            passes::<$t, _>($b);
            passes::<$t, _>($b.every_option());
        )+};
    }
    macro_rules! plain {
        ($($b:ident<$t:ty>,)+) => {$( passes::<$t, _>($b::<$t>::new()); )+};
    }
    let av = AddressVector::new(1);
    let psn = Psn::new(1).unwrap();
    let qpn = QpNum::new(1).unwrap();
    let mrt = MinRnrTimer::new(12).unwrap();
    let t = AckTimeout::new(14).unwrap();
    let r = RetryCount::new(7).unwrap();
    let acc = AccessFlags::empty();
    plain! {
        InitToRtr<RawPacket>, RtsToSqd<RawPacket>, SqdToSqd<RawPacket>,
        SqdToRts<RawPacket>, SqeToRts<Rc>, SqeToRts<RawPacket>, InitToInit<RawPacket>,
    }
    passes::<Rc, _>(ResetToInit::<Rc>::new(0, 1, acc));
    passes::<Uc, _>(ResetToInit::<Uc>::new(0, 1, acc));
    passes::<Ud, _>(ResetToInit::<Ud>::new(0, 1, QKey(1)));
    passes::<RawPacket, _>(ResetToInit::<RawPacket>::new(1));
    both! {
        Rc: InitToInit::<Rc>::new();
        Uc: InitToInit::<Uc>::new();
        Ud: InitToInit::<Ud>::new();
        Rc: InitToRtr::<Rc>::new(av, Mtu::Mtu1024, qpn, psn, 1, mrt);
        Uc: InitToRtr::<Uc>::new(av, Mtu::Mtu1024, qpn, psn);
        Ud: InitToRtr::<Ud>::new();
        Rc: RtrToRts::<Rc>::new(t, r, RnrRetry::INFINITE, psn, 1);
        Uc: RtrToRts::<Uc>::new(psn);
        Ud: RtrToRts::<Ud>::new(psn);
        RawPacket: RtrToRts::<RawPacket>::new();
        Rc: RtsToRts::<Rc>::new();
        Uc: RtsToRts::<Uc>::new();
        Ud: RtsToRts::<Ud>::new();
        RawPacket: RtsToRts::<RawPacket>::new();
        Rc: RtsToSqd::<Rc>::new();
        Uc: RtsToSqd::<Uc>::new();
        Ud: RtsToSqd::<Ud>::new();
        Rc: SqdToSqd::<Rc>::new();
        Uc: SqdToSqd::<Uc>::new();
        Ud: SqdToSqd::<Ud>::new();
        Rc: SqdToRts::<Rc>::new();
        Uc: SqdToRts::<Uc>::new();
        Ud: SqdToRts::<Ud>::new();
        Uc: SqeToRts::<Uc>::new();
        Ud: SqeToRts::<Ud>::new();
    }
}

/// Every optional setter is allowed by the table (so a typed modify can
/// never be refused for a forbidden attribute).
#[test]
fn optional_setters_are_allowed_by_the_table() {
    fn allowed<T: Transport, B: Modify<T>>(b: B, to: QpState) {
        let from = B::FROM.unwrap();
        let rule = transition_rule(T::QP_TYPE, from, to).unwrap();
        let extra = b.into_attr().mask() - M::STATE - rule.required;
        assert!(
            (extra - rule.optional).is_empty(),
            "{} {}->{} offers {}",
            T::QP_TYPE.short_name(),
            from.short_name(),
            to.short_name(),
            extra - rule.optional
        );
    }
    let av = AddressVector::new(1);
    let alt = AltPath {
        av,
        pkey_index: 0,
        port: 1,
        timeout: AckTimeout::INFINITE,
    };
    let mrt = MinRnrTimer::new(1).unwrap();
    let acc = AccessFlags::empty();
    let pm = PathMigState::Armed;
    use QpState::*;
    allowed::<Rc, _>(
        InitToInit::<Rc>::new()
            .pkey_index(0)
            .port(1)
            .access_flags(acc),
        Init,
    );
    allowed::<Ud, _>(
        InitToInit::<Ud>::new().pkey_index(0).port(1).qkey(QKey(1)),
        Init,
    );
    let qpn = QpNum::new(1).unwrap();
    let psn = Psn::new(1).unwrap();
    allowed::<Rc, _>(
        InitToRtr::<Rc>::new(av, Mtu::Mtu256, qpn, psn, 1, mrt)
            .alt_path(alt)
            .access_flags(acc)
            .pkey_index(0),
        Rtr,
    );
    allowed::<Ud, _>(InitToRtr::<Ud>::new().pkey_index(0).qkey(QKey(1)), Rtr);
    let t = AckTimeout::new(1).unwrap();
    let r = RetryCount::new(1).unwrap();
    allowed::<Rc, _>(
        RtrToRts::<Rc>::new(t, r, RnrRetry::INFINITE, psn, 1)
            .cur_state(Rtr)
            .alt_path(alt)
            .access_flags(acc)
            .min_rnr_timer(mrt)
            .path_mig_state(pm),
        Rts,
    );
    allowed::<Uc, _>(
        RtrToRts::<Uc>::new(psn)
            .cur_state(Rtr)
            .alt_path(alt)
            .access_flags(acc)
            .path_mig_state(pm),
        Rts,
    );
    allowed::<Ud, _>(RtrToRts::<Ud>::new(psn).cur_state(Rtr).qkey(QKey(1)), Rts);
    allowed::<RawPacket, _>(RtrToRts::<RawPacket>::new().rate_limit(RateLimit(1)), Rts);
    allowed::<Rc, _>(
        RtsToRts::<Rc>::new()
            .cur_state(Rts)
            .access_flags(acc)
            .alt_path(alt)
            .path_mig_state(pm)
            .min_rnr_timer(mrt),
        Rts,
    );
    allowed::<Ud, _>(RtsToRts::<Ud>::new().cur_state(Rts).qkey(QKey(1)), Rts);
    allowed::<Rc, _>(RtsToSqd::<Rc>::new().en_sqd_async_notify(true), Sqd);
    allowed::<Rc, _>(
        SqdToSqd::<Rc>::new()
            .port(1)
            .av(av)
            .timeout(t)
            .retry_cnt(r)
            .rnr_retry(RnrRetry::INFINITE)
            .max_rd_atomic(1)
            .max_dest_rd_atomic(1)
            .alt_path(alt)
            .access_flags(acc)
            .pkey_index(0)
            .min_rnr_timer(mrt)
            .path_mig_state(pm),
        Sqd,
    );
    allowed::<Uc, _>(
        SqdToSqd::<Uc>::new()
            .alt_path(alt)
            .access_flags(acc)
            .pkey_index(0)
            .path_mig_state(pm),
        Sqd,
    );
    allowed::<Ud, _>(SqdToSqd::<Ud>::new().pkey_index(0).qkey(QKey(1)), Sqd);
    allowed::<Rc, _>(
        SqdToRts::<Rc>::new()
            .cur_state(Sqd)
            .alt_path(alt)
            .access_flags(acc)
            .min_rnr_timer(mrt)
            .path_mig_state(pm),
        Rts,
    );
    allowed::<Ud, _>(SqdToRts::<Ud>::new().cur_state(Sqd).qkey(QKey(1)), Rts);
    allowed::<Uc, _>(SqeToRts::<Uc>::new().cur_state(Sqe).access_flags(acc), Rts);
    allowed::<Ud, _>(SqeToRts::<Ud>::new().cur_state(Sqe).qkey(QKey(1)), Rts);
}
