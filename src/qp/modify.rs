//! `ibv_modify_qp`, checked and unchecked.

use super::attr::QpAttr;
use super::mask::QpAttrMask;
use super::validate::{validate, QpView};
use super::{QpState, QueuePair};
use crate::error::{check_rc, Result};
use crate::sys;

impl QueuePair {
    /// The state the QP is known to be in: the target of the last successful
    /// modify, or what the last [`resync`](Self::resync) read. A device can
    /// move a QP to ERR or SQE on its own; `resync` catches up with it.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The port the QP was bound to by a modify carrying `IBV_QP_PORT`.
    pub fn port(&self) -> Option<u8> {
        self.port
    }

    /// Reads the QP's state from the device and makes it the known state.
    #[doc(alias = "ibv_query_qp")]
    pub fn resync(&mut self) -> Result<QpState> {
        let (attrs, _) = self.query()?;
        self.state = attrs.state;
        if attrs.state != QpState::Reset && attrs.port_num != 0 {
            self.port = Some(attrs.port_num);
        }
        Ok(self.state)
    }

    /// Validates `attr`, then applies it with `ibv_modify_qp`.
    ///
    /// Before any call it checks, from the QP's known [`state`](Self::state):
    /// that the transition is legal for the QP's type; that the mask holds
    /// every required attribute and nothing the transition does not take,
    /// per the kernel's table ([`transition_rule`](super::transition_rule)),
    /// including the `IBV_QP_CUR_STATE` rules, attribute-only modifies
    /// (checked as a transition from the state to itself) and `IBV_QP_AV`
    /// outside INIT->RTR (for which the kernel adds `IBV_QP_PORT`); and the
    /// values against the device and port: the port exists, P_Key and GID
    /// indexes are inside their tables, the path MTU is at most the port's
    /// max MTU, rd_atomic counts are within the device's limits, address
    /// vectors carry a GRH where the port needs one, `IBV_QP_CAP` only with
    /// `IBV_DEVICE_RESIZE_MAX_WR`, `IBV_QP_ALT_PATH` only with
    /// `IBV_DEVICE_AUTO_PATH_MIG` and never on RoCE, `IBV_QP_RATE_LIMIT`
    /// only with packet pacing for RAW_PACKET.
    ///
    /// A path MTU above the port's *active* MTU is accepted, as the kernel
    /// accepts it (the active MTU can change, and the peer's may differ);
    /// on RoCE, messages are then cut into packets the link may drop.
    /// [`connect`](Self::connect) picks the active MTU.
    ///
    /// A refusal is [`Error::Modify`](crate::Error::Modify) naming the
    /// transition, the QP type and each missing or forbidden flag; nothing
    /// reaches the device. A refusal from the kernel is
    /// [`Error::Verb`](crate::Error::Verb) with its errno. Either way the
    /// known state is unchanged, as is the QP (`ibv_modify_qp` is all or
    /// nothing).
    ///
    /// ```no_run
    /// use rdma_verbs::qp::{QpAttr, QpState};
    /// use rdma_verbs::{AccessFlags, Context, QpInitAttr, QpType};
    /// let ctx = Context::open_first()?;
    /// let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(16)?;
    /// let mut qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    /// // Forgot IBV_QP_ACCESS_FLAGS:
    /// let err = qp.modify(&QpAttr::new().state(QpState::Init).pkey_index(0).port(1)).unwrap_err();
    /// assert_eq!(err.to_string(), "RC RESET->INIT is missing IBV_QP_ACCESS_FLAGS");
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify(&mut self, attr: &QpAttr) -> Result<()> {
        let view = QpView {
            ctx: self.pd().context(),
            qp_type: self.qp_type,
            state: self.state,
            port: self.port,
        };
        validate(&view, attr)?;
        self.modify_unchecked(attr)
    }

    /// Applies `attr` with `ibv_modify_qp` without any check of this crate:
    /// for experts, drivers with rules of their own, and tests of the kernel.
    ///
    /// The kernel still checks everything it checks; on success the known
    /// state follows the modify, on failure nothing changes.
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify_unchecked(&mut self, attr: &QpAttr) -> Result<()> {
        let mut raw = *attr.raw();
        // SAFETY: the QP is live; `raw` is a fully initialised attribute struct
        // that the kernel only reads the masked fields of (and may write back).
        let rc = unsafe { sys::ibv_modify_qp(self.as_ptr(), &mut raw, attr.mask().to_c()) };
        check_rc("ibv_modify_qp", rc)?;
        if let Some(to) = attr.get_state() {
            self.state = to;
            if to == QpState::Reset {
                self.port = None;
                // RESET discards outstanding requests without completions:
                // the device no longer uses their buffers, which go to
                // `take_released` for the caller.
                self.pending_mut().release_all();
            }
        }
        if let Some(p) = attr.get_port() {
            self.port = Some(p);
        } else if attr.mask().contains(QpAttrMask::AV) && self.port.is_none() {
            self.port = attr.get_av().map(|av| av.port());
        }
        Ok(())
    }
}
