//! Bringing up the connectionless transports: UD and RAW_PACKET QPs go
//! from RESET to RTS without a peer (a UD send names its destination in
//! each work request; a raw packet carries its own headers), so they need
//! no [`Endpoint`](super::Endpoint) to "connect" to.

use super::attr::QpAttr;
use super::typed::{InitToRtr, Qp, RawPacket, ResetToInit, RtrToRts, Ud};
use super::validate::ModifyError;
use super::values::{Psn, QKey};
use super::{QpState, QpType, QueuePair};
use crate::error::{Error, Result};

impl QueuePair {
    /// Takes a UD QP from RESET to RTS: RESET->INIT with P_Key index 0,
    /// `port` and `qkey`, INIT->RTR, and RTR->RTS with first PSN `sq_psn`.
    ///
    /// Each step goes through [`modify`](Self::modify), so a bad value (a
    /// port the device does not have) is refused before it reaches the
    /// device; on failure the QP stays in the state the last successful
    /// step reached. Refused before any step: a QP of another type than UD
    /// ([`Error::WrongQpType`]: RC and UC QPs need a peer, see
    /// [`connect`](Self::connect)), and a QP not known to be in RESET
    /// ([`ModifyError::UnexpectedState`]). For another P_Key index, use
    /// [`modify`](Self::modify) or the typed builders.
    ///
    /// The Q_Key is the one a sender must name ([`SendWr::ud`](super::SendWr::ud))
    /// for a datagram to be accepted here.
    ///
    /// ```no_run
    /// use rdma_verbs::qp::{Psn, QKey};
    /// use rdma_verbs::{Context, QpInitAttr, QpState, QpType};
    /// let ctx = Context::open_first()?;
    /// let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(16)?;
    /// let mut qp = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq))?;
    /// qp.bring_up_ud(1, QKey::PINGPONG, Psn::new(0)?)?;
    /// assert_eq!(qp.state(), QpState::Rts);
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    #[doc(alias = "ibv_modify_qp")]
    pub fn bring_up_ud(&mut self, port: u8, qkey: QKey, sq_psn: Psn) -> Result<()> {
        self.bring_up_ud_with("QueuePair::bring_up_ud", 0, port, qkey, sq_psn)
    }

    /// [`bring_up_ud`](Self::bring_up_ud) with a P_Key index, for
    /// [`connect`](Self::connect) (which names itself in errors as `what`).
    pub(crate) fn bring_up_ud_with(
        &mut self,
        what: &'static str,
        pkey_index: u16,
        port: u8,
        qkey: QKey,
        sq_psn: Psn,
    ) -> Result<()> {
        self.expect_fresh(what, QpType::Ud)?;
        let init = QpAttr::new()
            .state(QpState::Init)
            .pkey_index(pkey_index)
            .port(port)
            .qkey(qkey);
        self.modify(&init)?;
        self.modify(&QpAttr::new().state(QpState::Rtr))?;
        self.modify(&QpAttr::new().state(QpState::Rts).sq_psn(sq_psn))
    }

    /// Takes a RAW_PACKET QP from RESET to RTS: RESET->INIT with `port`,
    /// INIT->RTR, RTR->RTS, each through [`modify`](Self::modify).
    ///
    /// Refused before any step: a QP of another type
    /// ([`Error::WrongQpType`]), and one not known to be in RESET
    /// ([`ModifyError::UnexpectedState`]).
    #[doc(alias = "ibv_modify_qp")]
    pub fn bring_up_raw_packet(&mut self, port: u8) -> Result<()> {
        self.expect_fresh("QueuePair::bring_up_raw_packet", QpType::RawPacket)?;
        self.modify(&QpAttr::new().state(QpState::Init).port(port))?;
        self.modify(&QpAttr::new().state(QpState::Rtr))?;
        self.modify(&QpAttr::new().state(QpState::Rts))
    }

    /// Checks that the QP is of type `takes` and known to be in RESET.
    fn expect_fresh(&self, operation: &'static str, takes: QpType) -> Result<()> {
        if self.qp_type() != takes {
            return Err(Error::WrongQpType {
                operation,
                qp_type: self.qp_type(),
                takes: takes.short_name(),
            });
        }
        let known = self.state();
        if known != QpState::Reset {
            return Err(ModifyError::UnexpectedState {
                transition: operation,
                expected: QpState::Reset,
                known,
            }
            .into());
        }
        Ok(())
    }
}

impl Qp<Ud> {
    /// Takes the QP from RESET to RTS with the typed builders:
    /// [`ResetToInit::<Ud>`] (P_Key index 0, `port`, `qkey`),
    /// [`InitToRtr::<Ud>`] and [`RtrToRts::<Ud>`] (`sq_psn`), each checked
    /// by [`apply`](Qp::apply) against the known state. As
    /// [`QueuePair::bring_up_ud`], on failure the QP stays where the last
    /// successful step left it.
    ///
    /// ```no_run
    /// use rdma_verbs::qp::{Psn, QKey, Qp, QpCaps, Ud};
    /// let ctx = rdma_verbs::Context::open_first()?;
    /// let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16)?);
    /// let mut ud = Qp::<Ud>::new(&pd, &cq, &cq, QpCaps::default())?;
    /// ud.bring_up(1, QKey::PINGPONG, Psn::new(0)?)?;
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    #[doc(alias = "ibv_modify_qp")]
    pub fn bring_up(&mut self, port: u8, qkey: QKey, sq_psn: Psn) -> Result<()> {
        self.apply(ResetToInit::<Ud>::new(0, port, qkey))?;
        self.apply(InitToRtr::<Ud>::new())?;
        self.apply(RtrToRts::<Ud>::new(sq_psn))
    }
}

impl Qp<RawPacket> {
    /// Takes the QP from RESET to RTS with the typed builders:
    /// [`ResetToInit::<RawPacket>`] (`port`), [`InitToRtr::<RawPacket>`]
    /// and [`RtrToRts::<RawPacket>`].
    #[doc(alias = "ibv_modify_qp")]
    pub fn bring_up(&mut self, port: u8) -> Result<()> {
        self.apply(ResetToInit::<RawPacket>::new(port))?;
        self.apply(InitToRtr::<RawPacket>::new())?;
        self.apply(RtrToRts::<RawPacket>::new())
    }
}
