//! Typed transitions: builders whose constructors take exactly the required
//! attributes of one transition for one transport, and whose setters offer
//! exactly the optional ones.
//!
//! ```no_run
//! use rdma_verbs::qp::*;
//! use rdma_verbs::{AccessFlags, Context, Mtu};
//!
//! let ctx = Context::open_first()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64)?;
//! let mut qp = Qp::<Rc>::new(&pd, &cq, &cq, QpCaps::default())?;
//! qp.apply(ResetToInit::<Rc>::new(0, 1, AccessFlags::REMOTE_WRITE))?;
//! # let (av, remote_qpn, remote_psn, my_psn) = (AddressVector::new(1), QpNum::new(1)?, Psn::new(0)?, Psn::new(0)?);
//! qp.apply(
//!     InitToRtr::<Rc>::new(av, Mtu::Mtu1024, remote_qpn, remote_psn, 1, MinRnrTimer::new(12)?)
//!         .pkey_index(0), // optional for RC INIT->RTR
//! )?;
//! qp.apply(RtrToRts::<Rc>::new(
//!     AckTimeout::new(14)?,
//!     RetryCount::new(7)?,
//!     RnrRetry::INFINITE,
//!     my_psn,
//!     1,
//! ))?;
//! # Ok::<(), rdma_verbs::Error>(())
//! ```
//!
//! What does not compile: leaving out a required attribute (the constructor
//! takes it), setting one the transition does not take (there is no
//! setter), and applying a builder of one transport to a QP of another
//! (`Qp<Ud>` takes only `Modify<Ud>` builders):
//!
//! ```compile_fail
//! # use rdma_verbs::qp::*;
//! # fn f(qp: &mut Qp<Ud>) -> rdma_verbs::Result<()> {
//! qp.apply(ResetToInit::<Rc>::new(0, 1, rdma_verbs::AccessFlags::empty()))?;
//! # Ok(()) }
//! ```
//!
//! # Why the state is not a type parameter
//!
//! The transport is a type parameter of [`Qp`], because it never changes.
//! The state is not: the device changes it on its own (a fatal error moves
//! a QP to ERR, a send error a UC/UD QP to SQE, draining ends SQD), so a
//! `Qp<Rc, Rts>` would often be a lie, and every recovery path (any state to
//! ERR or RESET, ERR to RESET to INIT again) would need a way out of the
//! type system anyway. Instead each builder names its from-state, and
//! [`Qp::apply`] checks it against the state the QP is known to be in
//! ([`QueuePair::state`], kept by every modify and refreshed by
//! [`QueuePair::resync`]) before the call, with the same validation as the
//! dynamic path.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use super::attr::QpAttr;
use super::validate::ModifyError;
use super::values::{
    AckTimeout, AddressVector, AltPath, MinRnrTimer, PathMigState, Psn, QKey, QpNum, RateLimit,
    RetryCount, RnrRetry,
};
use super::{QpCaps, QpInitAttr, QpState, QpType, QueuePair};
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::mr::AccessFlags;
use crate::pd::ProtectionDomain;
use crate::port::Mtu;

mod sealed {
    pub trait Sealed {}
    /// A builder's attributes, borrowed: [`Qp::apply`](super::Qp::apply)
    /// validates and applies them in place rather than moving them out
    /// (a copy of a 150-byte `ibv_qp_attr` per modify).
    pub trait AttrRef {
        fn attr_ref(&self) -> &super::QpAttr;
        /// The attributes of a builder [`Qp::apply`](super::Qp::apply)
        /// owns: handed to `ibv_modify_qp` as they are, not copied.
        fn attr_mut(&mut self) -> &mut super::QpAttr;
    }
}

/// A transport type usable as [`Qp`]'s type parameter.
pub trait Transport: sealed::Sealed + Send + Sync + 'static {
    /// The C QP type.
    const QP_TYPE: QpType;
}

macro_rules! transports {
    ($($(#[$m:meta])* $name:ident = $t:ident,)+) => {$(
        $(#[$m])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl Transport for $name {
            const QP_TYPE: QpType = QpType::$t;
        }
    )+};
}

transports! {
    /// Reliable Connected (`IBV_QPT_RC`).
    Rc = Rc,
    /// Unreliable Connected (`IBV_QPT_UC`).
    Uc = Uc,
    /// Unreliable Datagram (`IBV_QPT_UD`).
    Ud = Ud,
    /// Raw Ethernet packets (`IBV_QPT_RAW_PACKET`).
    RawPacket = RawPacket,
}

/// A queue pair whose transport is part of its type.
///
/// It dereferences to [`QueuePair`] for everything else (queries, the
/// dynamic [`QueuePair::modify`], ...).
///
/// The transport is a type parameter because it never changes. The state
/// is not: the device changes it on its own (a fatal error moves a QP to
/// ERR, a send error moves UC/UD to SQE, draining ends SQD), so a
/// `Qp<Rc, Rts>` would often be a lie, and every recovery path (any state to
/// ERR or RESET, then up again) would need a way out of the type system.
/// Instead each builder names its from-state and [`apply`](Self::apply)
/// checks it against the known state before the call.
pub struct Qp<T: Transport> {
    qp: QueuePair,
    _t: PhantomData<fn() -> T>,
}

impl<T: Transport> Qp<T> {
    /// Creates a QP of transport `T` in `pd`.
    #[doc(alias = "ibv_create_qp")]
    pub fn new(
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
    ) -> Result<Self> {
        let qp = pd.create_qp(&QpInitAttr::new(T::QP_TYPE, send_cq, recv_cq).caps(caps))?;
        Ok(Qp {
            qp,
            _t: PhantomData,
        })
    }

    /// Types a dynamic QP; gives it back when its type is not `T`.
    // The QP comes back by value so that nothing is lost; boxing it would
    // only move the size to the heap on a path that is not hot.
    #[allow(clippy::result_large_err)]
    pub fn from_dynamic(qp: QueuePair) -> Result<Self, (QueuePair, Error)> {
        if qp.qp_type() == T::QP_TYPE {
            Ok(Qp {
                qp,
                _t: PhantomData,
            })
        } else {
            let e = Error::invalid(
                "Qp::from_dynamic",
                format!(
                    "the QP is {}, not {}",
                    qp.qp_type().short_name(),
                    T::QP_TYPE.short_name()
                ),
            );
            Err((qp, e))
        }
    }

    /// The dynamic QP.
    pub fn into_dynamic(self) -> QueuePair {
        self.qp
    }

    /// Applies one typed transition, after checking that the QP is known to
    /// be in the builder's from-state and validating as
    /// [`QueuePair::modify`] does.
    ///
    /// A builder with a from-state skips the table part of the checks: its
    /// constructor sets exactly the attributes the kernel's table requires
    /// of its transition and its setters only ones the table allows (the
    /// tests of this module check every builder, with none and with every
    /// optional attribute, against [`check_transition`](super::check_transition)),
    /// so only `IBV_QP_CUR_STATE` and the values are checked.
    #[doc(alias = "ibv_modify_qp")]
    pub fn apply<B: Modify<T>>(&mut self, mut transition: B) -> Result<()> {
        match B::FROM {
            Some(expected) => {
                let known = self.qp.state();
                if known != expected {
                    return Err(ModifyError::UnexpectedState {
                        transition: B::NAME,
                        expected,
                        known,
                    }
                    .into());
                }
                // The builder is ours: the call takes its attributes in
                // place.
                self.qp
                    .modify_typed(sealed::AttrRef::attr_mut(&mut transition), B::TO)
            }
            None => self.qp.modify(sealed::AttrRef::attr_ref(&transition)),
        }
    }

    /// Applies `to_sqd` (RTS -> SQD) and waits until the send queue has
    /// drained ([`QueuePair::wait_sq_drained`]), after which SQD -> SQD and
    /// SQD -> RTS are accepted. On a timeout the QP stays in SQD.
    ///
    /// ```no_run
    /// # fn f(rc: &mut rdma_verbs::qp::Qp<rdma_verbs::qp::Rc>) -> rdma_verbs::Result<()> {
    /// use rdma_verbs::qp::{Rc, RtsToSqd, SqdToRts};
    /// rc.enter_sqd(RtsToSqd::<Rc>::new(), std::time::Duration::from_secs(5))?;
    /// rc.apply(SqdToRts::<Rc>::new())?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_modify_qp")]
    pub fn enter_sqd(&mut self, to_sqd: RtsToSqd<T>, timeout: std::time::Duration) -> Result<()>
    where
        RtsToSqd<T>: Modify<T>,
    {
        self.apply(to_sqd)?;
        self.qp.wait_sq_drained(timeout)
    }
}

impl<T: Transport> Deref for Qp<T> {
    type Target = QueuePair;
    fn deref(&self) -> &QueuePair {
        &self.qp
    }
}

impl<T: Transport> DerefMut for Qp<T> {
    fn deref_mut(&mut self) -> &mut QueuePair {
        &mut self.qp
    }
}

impl<T: Transport> std::fmt::Debug for Qp<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.qp.fmt(f)
    }
}

/// A typed transition that can be applied to a [`Qp<T>`].
pub trait Modify<T: Transport>: sealed::Sealed + sealed::AttrRef {
    /// The state the QP must be in; `None` for transitions from any state.
    const FROM: Option<QpState>;
    /// The state the QP is in after it.
    const TO: QpState;
    /// The builder's name, for messages.
    const NAME: &'static str;
    /// The attributes of the modify.
    fn into_attr(self) -> QpAttr;
}

macro_rules! builders {
    ($($(#[$m:meta])* $name:ident: $from:expr => $to:ident,)+) => {$(
        $(#[$m])*
        #[must_use = "a transition does nothing until it is applied with Qp::apply"]
        #[derive(Debug, Clone, Copy)]
        pub struct $name<T: Transport> {
            attr: QpAttr,
            _t: PhantomData<fn() -> T>,
        }
        impl<T: Transport> sealed::Sealed for $name<T> {}
        impl<T: Transport> sealed::AttrRef for $name<T> {
            #[inline]
            fn attr_ref(&self) -> &QpAttr {
                &self.attr
            }
            #[inline]
            fn attr_mut(&mut self) -> &mut QpAttr {
                &mut self.attr
            }
        }
        impl<T: Transport> Modify<T> for $name<T> {
            const FROM: Option<QpState> = $from;
            const TO: QpState = QpState::$to;
            const NAME: &'static str = stringify!($name);
            fn into_attr(self) -> QpAttr {
                self.attr
            }
        }
        impl<T: Transport> $name<T> {
            fn with(f: impl FnOnce(QpAttr) -> QpAttr) -> Self {
                $name { attr: f(QpAttr::new().state(QpState::$to)), _t: PhantomData }
            }
            /// The attributes this transition will apply.
            pub fn attr(&self) -> &QpAttr {
                &self.attr
            }
        }
    )+};
}

builders! {
    /// RESET -> INIT.
    ResetToInit: Some(QpState::Reset) => Init,
    /// INIT -> INIT: change attributes while in INIT.
    InitToInit: Some(QpState::Init) => Init,
    /// INIT -> RTR (Ready To Receive).
    InitToRtr: Some(QpState::Init) => Rtr,
    /// RTR -> RTS (Ready To Send).
    RtrToRts: Some(QpState::Rtr) => Rts,
    /// RTS -> RTS: change attributes while sending.
    RtsToRts: Some(QpState::Rts) => Rts,
    /// RTS -> SQD: drain the send queue.
    RtsToSqd: Some(QpState::Rts) => Sqd,
    /// SQD -> SQD: change path attributes while drained.
    SqdToSqd: Some(QpState::Sqd) => Sqd,
    /// SQD -> RTS: resume sending. Fails with EINVAL until draining has ended.
    SqdToRts: Some(QpState::Sqd) => Rts,
    /// SQE -> RTS: recover from a send queue error (UC, UD).
    SqeToRts: Some(QpState::Sqe) => Rts,
    /// Any state -> ERR: flush all outstanding work requests.
    ToErr: None => Err,
    /// Any state -> RESET.
    ToReset: None => Reset,
}

/// Constructors that take no attributes.
macro_rules! plain_new {
    ($($name:ident<$($t:ident),+>;)+) => {$($(
        impl $name<$t> {
            /// The transition with only `IBV_QP_STATE`.
            pub fn new() -> Self {
                Self::with(|a| a)
            }
        }
        impl Default for $name<$t> {
            fn default() -> Self {
                Self::new()
            }
        }
    )+)+};
}

plain_new! {
    InitToInit<Rc, Uc, Ud, RawPacket>;
    InitToRtr<Ud, RawPacket>;
    RtrToRts<RawPacket>;
    RtsToRts<Rc, Uc, Ud, RawPacket>;
    RtsToSqd<Rc, Uc, Ud, RawPacket>;
    SqdToSqd<Rc, Uc, Ud, RawPacket>;
    SqdToRts<Rc, Uc, Ud, RawPacket>;
    SqeToRts<Rc, Uc, Ud, RawPacket>;
}

impl<T: Transport> ToErr<T> {
    /// Any state -> ERR.
    pub fn new() -> Self {
        Self::with(|a| a)
    }
}

impl<T: Transport> Default for ToErr<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Transport> ToReset<T> {
    /// Any state -> RESET.
    pub fn new() -> Self {
        Self::with(|a| a)
    }
}

impl<T: Transport> Default for ToReset<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Optional setters: each sets one attribute the transition allows.
macro_rules! optional {
    ($name:ident<$t:ident> { $($set:ident($ty:ty)),* $(,)? }) => {
        impl $name<$t> {
            $(
                #[doc = concat!("Optional: sets `", stringify!($set), "` (see [`QpAttr::", stringify!($set), "`]).")]
                pub fn $set(mut self, value: $ty) -> Self {
                    self.attr = self.attr.$set(value);
                    self
                }
            )*
            /// Every optional attribute set (for the tests).
            #[cfg(test)]
            fn every_option(self) -> Self {
                self$(.$set(<$ty as tests::Sample>::sample()))*
            }
        }
    };
}

// RESET -> INIT: required only.
impl ResetToInit<Rc> {
    /// RC RESET->INIT takes P_Key index, port and access flags.
    pub fn new(pkey_index: u16, port: u8, access: AccessFlags) -> Self {
        Self::with(|a| a.pkey_index(pkey_index).port(port).access_flags(access))
    }
}
impl ResetToInit<Uc> {
    /// UC RESET->INIT takes P_Key index, port and access flags.
    pub fn new(pkey_index: u16, port: u8, access: AccessFlags) -> Self {
        Self::with(|a| a.pkey_index(pkey_index).port(port).access_flags(access))
    }
}
impl ResetToInit<Ud> {
    /// UD RESET->INIT takes P_Key index, port and Q_Key.
    pub fn new(pkey_index: u16, port: u8, qkey: QKey) -> Self {
        Self::with(|a| a.pkey_index(pkey_index).port(port).qkey(qkey))
    }
}
impl ResetToInit<RawPacket> {
    /// RAW_PACKET RESET->INIT takes the port.
    pub fn new(port: u8) -> Self {
        Self::with(|a| a.port(port))
    }
}

// INIT -> INIT: optional only.
optional!(InitToInit<Rc> { pkey_index(u16), port(u8), access_flags(AccessFlags) });
optional!(InitToInit<Uc> { pkey_index(u16), port(u8), access_flags(AccessFlags) });
optional!(InitToInit<Ud> { pkey_index(u16), port(u8), qkey(QKey) });

// INIT -> RTR.
impl InitToRtr<Rc> {
    /// RC INIT->RTR takes the path, the remote QP and its first PSN, and the
    /// responder resources.
    pub fn new(
        av: AddressVector,
        path_mtu: Mtu,
        dest_qpn: QpNum,
        rq_psn: Psn,
        max_dest_rd_atomic: u8,
        min_rnr_timer: MinRnrTimer,
    ) -> Self {
        Self::with(|a| {
            a.av(av)
                .path_mtu(path_mtu)
                .dest_qpn(dest_qpn)
                .rq_psn(rq_psn)
                .max_dest_rd_atomic(max_dest_rd_atomic)
                .min_rnr_timer(min_rnr_timer)
        })
    }
}
impl InitToRtr<Uc> {
    /// UC INIT->RTR takes the path, the remote QP and its first PSN.
    pub fn new(av: AddressVector, path_mtu: Mtu, dest_qpn: QpNum, rq_psn: Psn) -> Self {
        Self::with(|a| {
            a.av(av)
                .path_mtu(path_mtu)
                .dest_qpn(dest_qpn)
                .rq_psn(rq_psn)
        })
    }
}
optional!(InitToRtr<Rc> { alt_path(AltPath), access_flags(AccessFlags), pkey_index(u16) });
optional!(InitToRtr<Uc> { alt_path(AltPath), access_flags(AccessFlags), pkey_index(u16) });
optional!(InitToRtr<Ud> { pkey_index(u16), qkey(QKey) });

// RTR -> RTS.
impl RtrToRts<Rc> {
    /// RC RTR->RTS takes the ACK timeout, the retry counts, the first PSN and
    /// the initiator resources.
    pub fn new(
        timeout: AckTimeout,
        retry_cnt: RetryCount,
        rnr_retry: RnrRetry,
        sq_psn: Psn,
        max_rd_atomic: u8,
    ) -> Self {
        Self::with(|a| {
            a.timeout(timeout)
                .retry_cnt(retry_cnt)
                .rnr_retry(rnr_retry)
                .sq_psn(sq_psn)
                .max_rd_atomic(max_rd_atomic)
        })
    }
}
impl RtrToRts<Uc> {
    /// UC RTR->RTS takes the first PSN.
    pub fn new(sq_psn: Psn) -> Self {
        Self::with(|a| a.sq_psn(sq_psn))
    }
}
impl RtrToRts<Ud> {
    /// UD RTR->RTS takes the first PSN.
    pub fn new(sq_psn: Psn) -> Self {
        Self::with(|a| a.sq_psn(sq_psn))
    }
}
optional!(RtrToRts<Rc> {
    cur_state(QpState),
    alt_path(AltPath),
    access_flags(AccessFlags),
    min_rnr_timer(MinRnrTimer),
    path_mig_state(PathMigState),
});
optional!(RtrToRts<Uc> {
    cur_state(QpState),
    alt_path(AltPath),
    access_flags(AccessFlags),
    path_mig_state(PathMigState),
});
optional!(RtrToRts<Ud> { cur_state(QpState), qkey(QKey) });
optional!(RtrToRts<RawPacket> { rate_limit(RateLimit) });

// RTS -> RTS.
optional!(RtsToRts<Rc> {
    cur_state(QpState),
    access_flags(AccessFlags),
    alt_path(AltPath),
    path_mig_state(PathMigState),
    min_rnr_timer(MinRnrTimer),
});
optional!(RtsToRts<Uc> {
    cur_state(QpState),
    access_flags(AccessFlags),
    alt_path(AltPath),
    path_mig_state(PathMigState),
});
optional!(RtsToRts<Ud> { cur_state(QpState), qkey(QKey) });
optional!(RtsToRts<RawPacket> { rate_limit(RateLimit) });

// RTS -> SQD.
optional!(RtsToSqd<Rc> { en_sqd_async_notify(bool) });
optional!(RtsToSqd<Uc> { en_sqd_async_notify(bool) });
optional!(RtsToSqd<Ud> { en_sqd_async_notify(bool) });

// SQD -> SQD. (UC: the table lists IBV_QP_AV, but outside INIT->RTR the
// kernel adds IBV_QP_PORT to a modify with AV, which UC SQD->SQD does not
// take, so the kernel refuses it: no `av` setter for UC.)
optional!(SqdToSqd<Rc> {
    port(u8),
    av(AddressVector),
    timeout(AckTimeout),
    retry_cnt(RetryCount),
    rnr_retry(RnrRetry),
    max_rd_atomic(u8),
    max_dest_rd_atomic(u8),
    alt_path(AltPath),
    access_flags(AccessFlags),
    pkey_index(u16),
    min_rnr_timer(MinRnrTimer),
    path_mig_state(PathMigState),
});
optional!(SqdToSqd<Uc> {
    alt_path(AltPath),
    access_flags(AccessFlags),
    pkey_index(u16),
    path_mig_state(PathMigState),
});
optional!(SqdToSqd<Ud> { pkey_index(u16), qkey(QKey) });

// SQD -> RTS.
optional!(SqdToRts<Rc> {
    cur_state(QpState),
    alt_path(AltPath),
    access_flags(AccessFlags),
    min_rnr_timer(MinRnrTimer),
    path_mig_state(PathMigState),
});
optional!(SqdToRts<Uc> {
    cur_state(QpState),
    alt_path(AltPath),
    access_flags(AccessFlags),
    path_mig_state(PathMigState),
});
optional!(SqdToRts<Ud> { cur_state(QpState), qkey(QKey) });

// SQE -> RTS.
optional!(SqeToRts<Uc> { cur_state(QpState), access_flags(AccessFlags) });
optional!(SqeToRts<Ud> { cur_state(QpState), qkey(QKey) });

#[cfg(test)]
mod tests;
