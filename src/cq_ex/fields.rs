//! The completion fields, at the type level: the markers [`On`] and
//! [`Off`], the sets ([`Fields`], [`FieldSet`], [`NoFields`],
//! [`StandardFields`]) with their `wc_flags`, and per field its trait
//! ([`WithByteLen`], ...) and its [`CqExBuilder`] method.

use std::marker::PhantomData;

use super::CqExBuilder;
use crate::sys::ibv_create_cq_wc_flags as wcf;
// What the docs link to.
#[cfg(doc)]
use super::PolledWc;

mod sealed {
    /// Keeps the field markers and sets to this crate's types.
    pub trait Sealed {}
}

/// A field the CQ was created with (type-level `true`).
#[doc(alias = "ibv_create_cq_wc_flags")]
#[derive(Debug)]
pub enum On {}
/// A field the CQ was created without (type-level `false`).
#[doc(alias = "ibv_create_cq_wc_flags")]
#[derive(Debug)]
pub enum Off {}

/// [`On`] or [`Off`]. Sealed.
#[doc(alias = "ibv_create_cq_wc_flags")]
pub trait Flag: sealed::Sealed + 'static {
    /// Whether the field is asked for.
    const ON: bool;
}
impl sealed::Sealed for On {}
impl sealed::Sealed for Off {}
impl Flag for On {
    const ON: bool = true;
}
impl Flag for Off {
    const ON: bool = false;
}

/// A set of completion fields: one [`On`]/[`Off`] per field, in the order
/// of `enum ibv_create_cq_wc_flags`: byte_len, imm, qp_num, src_qp, slid,
/// sl, dlid_path_bits, completion timestamp, completion wallclock, cvlan,
/// flow_tag. Only a type; never made.
///
/// Spelled out it is long; [`CqExBuilder`]'s methods build it, and
/// [`NoFields`] and [`StandardFields`] name the common sets.
#[doc(alias = "ibv_create_cq_wc_flags")]
pub struct Fields<B, I, Q, S, L, SL, D, T, W, V, FT> {
    _never: std::convert::Infallible,
    #[allow(clippy::type_complexity)]
    _set: PhantomData<fn() -> (B, I, Q, S, L, SL, D, T, W, V, FT)>,
}

/// No optional field: `wc_flags` 0.
#[doc(alias = "ibv_create_cq_wc_flags")]
pub type NoFields = Fields<Off, Off, Off, Off, Off, Off, Off, Off, Off, Off, Off>;

/// The fields of `IBV_WC_STANDARD_FLAGS`: byte_len, imm, qp_num, src_qp,
/// slid, sl and dlid_path_bits.
#[doc(alias = "IBV_WC_STANDARD_FLAGS")]
pub type StandardFields = Fields<On, On, On, On, On, On, On, Off, Off, Off, Off>;

/// A set of completion fields ([`Fields`]), with its `wc_flags`. Sealed.
#[doc(alias = "ibv_create_cq_wc_flags")]
pub trait FieldSet: sealed::Sealed + 'static {
    /// byte_len.
    type ByteLen: Flag;
    /// imm_data / invalidated_rkey.
    type Imm: Flag;
    /// qp_num.
    type QpNum: Flag;
    /// src_qp.
    type SrcQp: Flag;
    /// slid.
    type Slid: Flag;
    /// sl.
    type Sl: Flag;
    /// dlid_path_bits.
    type DlidPathBits: Flag;
    /// The completion timestamp.
    type CompletionTimestamp: Flag;
    /// The completion wallclock timestamp.
    type CompletionWallclock: Flag;
    /// cvlan.
    type Cvlan: Flag;
    /// flow_tag.
    type FlowTag: Flag;
    /// The `wc_flags` of `ibv_create_cq_ex` for this set.
    const WC_FLAGS: u64;
}

/// `bit` when `F` is [`On`], else 0.
const fn bit<F: Flag>(bit: wcf) -> u64 {
    if F::ON {
        bit.0 as u64
    } else {
        0
    }
}

impl<B, I, Q, S, L, SL, D, T, W, V, FT> sealed::Sealed
    for Fields<B, I, Q, S, L, SL, D, T, W, V, FT>
{
}

impl<B, I, Q, S, L, SL, D, T, W, V, FT> FieldSet for Fields<B, I, Q, S, L, SL, D, T, W, V, FT>
where
    B: Flag,
    I: Flag,
    Q: Flag,
    S: Flag,
    L: Flag,
    SL: Flag,
    D: Flag,
    T: Flag,
    W: Flag,
    V: Flag,
    FT: Flag,
{
    type ByteLen = B;
    type Imm = I;
    type QpNum = Q;
    type SrcQp = S;
    type Slid = L;
    type Sl = SL;
    type DlidPathBits = D;
    type CompletionTimestamp = T;
    type CompletionWallclock = W;
    type Cvlan = V;
    type FlowTag = FT;
    const WC_FLAGS: u64 = bit::<B>(wcf::IBV_WC_EX_WITH_BYTE_LEN)
        | bit::<I>(wcf::IBV_WC_EX_WITH_IMM)
        | bit::<Q>(wcf::IBV_WC_EX_WITH_QP_NUM)
        | bit::<S>(wcf::IBV_WC_EX_WITH_SRC_QP)
        | bit::<L>(wcf::IBV_WC_EX_WITH_SLID)
        | bit::<SL>(wcf::IBV_WC_EX_WITH_SL)
        | bit::<D>(wcf::IBV_WC_EX_WITH_DLID_PATH_BITS)
        | bit::<T>(wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
        | bit::<W>(wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
        | bit::<V>(wcf::IBV_WC_EX_WITH_CVLAN)
        | bit::<FT>(wcf::IBV_WC_EX_WITH_FLOW_TAG);
}

/// Declares, per field: its trait (implemented by every set that has the
/// field) and its builder method (the same set with the field turned on).
macro_rules! cq_fields {
    ($(
        $(#[$tdoc:meta])*
        trait $tr:ident = $assoc:ident;
        $(#[$mdoc:meta])*
        fn $method:ident -> [$($p:ty),+];
    )+) => {
        $(
            $(#[$tdoc])*
            pub trait $tr: FieldSet {}
            impl<F: FieldSet<$assoc = On>> $tr for F {}
        )+

        impl<'a, F: FieldSet> CqExBuilder<'a, F> {
            $(
                $(#[$mdoc])*
                pub fn $method(self) -> CqExBuilder<'a, Fields<$($p),+>> {
                    self.retype()
                }
            )+
        }
    };
}

cq_fields! {
    /// Sets with byte_len ([`PolledWc::byte_len`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithByteLen = ByteLen;
    /// Asks for `byte_len` (`IBV_WC_EX_WITH_BYTE_LEN`).
    #[doc(alias = "IBV_WC_EX_WITH_BYTE_LEN")]
    fn byte_len -> [On, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with the immediate data / invalidated rkey
    /// ([`PolledWc::imm_data`], [`PolledWc::invalidated_rkey`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithImm = Imm;
    /// Asks for the immediate data and the invalidated rkey, which share
    /// the field (`IBV_WC_EX_WITH_IMM`).
    #[doc(alias = "IBV_WC_EX_WITH_IMM")]
    fn imm -> [F::ByteLen, On, F::QpNum, F::SrcQp, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with qp_num ([`PolledWc::qp_num`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithQpNum = QpNum;
    /// Asks for the local QP number (`IBV_WC_EX_WITH_QP_NUM`); with it,
    /// [`QueuePair::reclaim`](crate::QueuePair::reclaim) also checks the
    /// completion is the QP's own.
    #[doc(alias = "IBV_WC_EX_WITH_QP_NUM")]
    fn qp_num -> [F::ByteLen, F::Imm, On, F::SrcQp, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with src_qp ([`PolledWc::src_qp`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithSrcQp = SrcQp;
    /// Asks for the sender's QP number (`IBV_WC_EX_WITH_SRC_QP`).
    #[doc(alias = "IBV_WC_EX_WITH_SRC_QP")]
    fn src_qp -> [F::ByteLen, F::Imm, F::QpNum, On, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with slid ([`PolledWc::slid`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithSlid = Slid;
    /// Asks for the sender's LID (`IBV_WC_EX_WITH_SLID`).
    #[doc(alias = "IBV_WC_EX_WITH_SLID")]
    fn slid -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, On, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with sl ([`PolledWc::sl`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithSl = Sl;
    /// Asks for the service level (`IBV_WC_EX_WITH_SL`).
    #[doc(alias = "IBV_WC_EX_WITH_SL")]
    fn sl -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, On, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with dlid_path_bits ([`PolledWc::dlid_path_bits`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithDlidPathBits = DlidPathBits;
    /// Asks for the destination LID path bits (`IBV_WC_EX_WITH_DLID_PATH_BITS`).
    #[doc(alias = "IBV_WC_EX_WITH_DLID_PATH_BITS")]
    fn dlid_path_bits -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl, On,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with the completion timestamp ([`PolledWc::completion_ts`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithCompletionTimestamp = CompletionTimestamp;
    /// Asks for the device's completion timestamp
    /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`); needs a device with a
    /// non-zero `completion_timestamp_mask`.
    #[doc(alias = "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP")]
    fn completion_timestamp -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl,
        F::DlidPathBits, On, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with the wallclock timestamp ([`PolledWc::completion_wallclock_ns`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithCompletionWallclock = CompletionWallclock;
    /// Asks for the completion time in wallclock nanoseconds
    /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`); needs a device with
    /// a `completion_timestamp_mask` and an `hca_core_clock`.
    #[doc(alias = "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK")]
    fn completion_wallclock -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl,
        F::DlidPathBits, F::CompletionTimestamp, On, F::Cvlan, F::FlowTag];

    /// Sets with cvlan ([`PolledWc::cvlan`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithCvlan = Cvlan;
    /// Asks for the customer VLAN (`IBV_WC_EX_WITH_CVLAN`).
    #[doc(alias = "IBV_WC_EX_WITH_CVLAN")]
    fn cvlan -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, On, F::FlowTag];

    /// Sets with flow_tag ([`PolledWc::flow_tag`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithFlowTag = FlowTag;
    /// Asks for the flow tag (`IBV_WC_EX_WITH_FLOW_TAG`).
    #[doc(alias = "IBV_WC_EX_WITH_FLOW_TAG")]
    fn flow_tag -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, On];
}

/// Whether set `F` has the field of `flag`.
#[inline]
pub(super) const fn has<F: FieldSet>(flag: wcf) -> bool {
    F::WC_FLAGS & flag.0 as u64 != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys;

    #[test]
    fn the_standard_set_is_ibv_wc_standard_flags() {
        assert_eq!(
            StandardFields::WC_FLAGS,
            u64::from(sys::IBV_WC_STANDARD_FLAGS)
        );
        assert_eq!(NoFields::WC_FLAGS, 0);
    }

    #[test]
    fn each_field_sets_its_own_bit() {
        type B<F> = fn(CqExBuilder<'static, NoFields>) -> CqExBuilder<'static, F>;
        // Each builder method, by the bit it must add to an empty set.
        fn check<F: FieldSet>(_: B<F>, bit: wcf) {
            assert_eq!(F::WC_FLAGS, u64::from(bit.0), "{:#x}", bit.0);
        }
        check(CqExBuilder::byte_len, wcf::IBV_WC_EX_WITH_BYTE_LEN);
        check(CqExBuilder::imm, wcf::IBV_WC_EX_WITH_IMM);
        check(CqExBuilder::qp_num, wcf::IBV_WC_EX_WITH_QP_NUM);
        check(CqExBuilder::src_qp, wcf::IBV_WC_EX_WITH_SRC_QP);
        check(CqExBuilder::slid, wcf::IBV_WC_EX_WITH_SLID);
        check(CqExBuilder::sl, wcf::IBV_WC_EX_WITH_SL);
        check(
            CqExBuilder::dlid_path_bits,
            wcf::IBV_WC_EX_WITH_DLID_PATH_BITS,
        );
        check(
            CqExBuilder::completion_timestamp,
            wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
        );
        check(
            CqExBuilder::completion_wallclock,
            wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
        );
        check(CqExBuilder::cvlan, wcf::IBV_WC_EX_WITH_CVLAN);
        check(CqExBuilder::flow_tag, wcf::IBV_WC_EX_WITH_FLOW_TAG);
    }

    #[test]
    fn fields_accumulate_and_repeat_harmlessly() {
        type Two = Fields<On, Off, On, Off, Off, Off, Off, Off, Off, Off, Off>;
        assert_eq!(
            Two::WC_FLAGS,
            u64::from((wcf::IBV_WC_EX_WITH_BYTE_LEN | wcf::IBV_WC_EX_WITH_QP_NUM).0)
        );
        fn builder_types<'a>(b: CqExBuilder<'a, NoFields>) -> CqExBuilder<'a, Two> {
            b.qp_num().byte_len().qp_num()
        }
        let _ = builder_types;
        type All = Fields<On, On, On, On, On, On, On, On, On, On, On>;
        fn everything<'a>(b: CqExBuilder<'a, NoFields>) -> CqExBuilder<'a, All> {
            b.flow_tag()
                .cvlan()
                .completion_wallclock()
                .completion_timestamp()
                .standard()
        }
        let _ = everything;
        assert_eq!(All::WC_FLAGS, 0b1011_1111_1111);
    }
}
