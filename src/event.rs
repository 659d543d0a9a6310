//! Asynchronous device events (`ibv_get_async_event`).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use crate::context::Context;
use crate::error::{check_rc, Result};
use crate::qp::QpNum;
use crate::sys;
use crate::sys::ibv_event_type as t;

/// An asynchronous event (`struct ibv_async_event`), with what it concerns:
/// a QP by number, a CQ or SRQ by its kernel handle, or a port.
#[doc(alias = "ibv_async_event")]
#[doc(alias = "ibv_event_type")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// `IBV_EVENT_CQ_ERR`: a CQ overran.
    CqErr {
        /// The CQ's kernel handle.
        cq_handle: u32,
    },
    /// `IBV_EVENT_QP_FATAL`: the QP went to ERR.
    QpFatal {
        /// The QP number.
        qp_num: QpNum,
    },
    /// `IBV_EVENT_QP_REQ_ERR`: invalid request on the QP.
    QpReqErr {
        /// The QP number.
        qp_num: QpNum,
    },
    /// `IBV_EVENT_QP_ACCESS_ERR`: access violation on the QP.
    QpAccessErr {
        /// The QP number.
        qp_num: QpNum,
    },
    /// `IBV_EVENT_COMM_EST`: first packet received in RTR.
    CommEst {
        /// The QP number.
        qp_num: QpNum,
    },
    /// `IBV_EVENT_SQ_DRAINED`: SQD draining finished.
    SqDrained {
        /// The QP number.
        qp_num: QpNum,
    },
    /// `IBV_EVENT_PATH_MIG`: migrated to the alternate path.
    PathMig {
        /// The QP number.
        qp_num: QpNum,
    },
    /// `IBV_EVENT_PATH_MIG_ERR`: path migration failed.
    PathMigErr {
        /// The QP number.
        qp_num: QpNum,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: an SRQ-attached QP in ERR has no more receives.
    QpLastWqeReached {
        /// The QP number.
        qp_num: QpNum,
    },
    /// `IBV_EVENT_SRQ_ERR`.
    SrqErr {
        /// The SRQ's kernel handle.
        srq_handle: u32,
    },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: fewer receives than the armed limit remain.
    SrqLimitReached {
        /// The SRQ's kernel handle.
        srq_handle: u32,
    },
    /// `IBV_EVENT_DEVICE_FATAL`.
    DeviceFatal,
    /// `IBV_EVENT_PORT_ACTIVE`, `IBV_EVENT_PORT_ERR`, `IBV_EVENT_LID_CHANGE`,
    /// `IBV_EVENT_PKEY_CHANGE`, `IBV_EVENT_SM_CHANGE`,
    /// `IBV_EVENT_CLIENT_REREGISTER`, `IBV_EVENT_GID_CHANGE`.
    Port {
        /// Which (`IBV_EVENT_PORT_ACTIVE`, ...), as the C value.
        event: u32,
        /// The port.
        port: u8,
    },
    /// Any other event (`IBV_EVENT_WQ_FATAL`, newer ones), as the C value.
    Other(u32),
}

impl Context {
    /// Waits for the next asynchronous event of the device and acknowledges it.
    ///
    /// An event that moves a QP to ERR on the device (`IBV_EVENT_QP_FATAL`,
    /// `QP_REQ_ERR`, `QP_ACCESS_ERR`, and `QP_LAST_WQE_REACHED`, which comes
    /// in ERR) updates the known [`state`](crate::QueuePair::state) of that
    /// QP, if it was created from this context (or a clone of it): before
    /// acknowledging the event, while the QP cannot be destroyed, this call
    /// reads the QP's state from the device (`ibv_query_qp`) and records it
    /// unless the QP's owner recorded a move meanwhile (the event may be
    /// read long after it was raised, after a RESET).
    ///
    /// A port event makes the context forget what it caches of the port
    /// that the event may have changed: a GID change its GID entries and
    /// default GID pick, a LID change or a port going active or down its
    /// LID (see [`Context`](crate::Context#what-a-context-caches)).
    ///
    /// Blocks unless the context's async descriptor ([`async_fd`](Self::async_fd))
    /// was made non-blocking, in which case the error's errno is `EAGAIN`
    /// when nothing is pending.
    #[doc(alias = "ibv_get_async_event")]
    #[doc(alias = "ibv_ack_async_event")]
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        let mut raw = sys::ibv_async_event::default();
        // SAFETY: the context is live; `raw` is a valid out-pointer.
        let rc = unsafe { sys::ibv_get_async_event(self.as_ptr(), &mut raw) };
        check_rc("ibv_get_async_event", rc)?;
        let e = raw.event_type;
        // SAFETY: libibverbs filled the union member that `event_type` names;
        // the QP/CQ/SRQ cannot be destroyed before the event is acknowledged
        // (its destroy waits for that), so reading its number is sound.
        let ev = unsafe {
            let el = &raw.element;
            match e {
                t::IBV_EVENT_CQ_ERR => AsyncEvent::CqErr {
                    cq_handle: (*el.cq).handle,
                },
                t::IBV_EVENT_QP_FATAL => AsyncEvent::QpFatal {
                    qp_num: QpNum::truncate((*el.qp).qp_num),
                },
                t::IBV_EVENT_QP_REQ_ERR => AsyncEvent::QpReqErr {
                    qp_num: QpNum::truncate((*el.qp).qp_num),
                },
                t::IBV_EVENT_QP_ACCESS_ERR => AsyncEvent::QpAccessErr {
                    qp_num: QpNum::truncate((*el.qp).qp_num),
                },
                t::IBV_EVENT_COMM_EST => AsyncEvent::CommEst {
                    qp_num: QpNum::truncate((*el.qp).qp_num),
                },
                t::IBV_EVENT_SQ_DRAINED => AsyncEvent::SqDrained {
                    qp_num: QpNum::truncate((*el.qp).qp_num),
                },
                t::IBV_EVENT_PATH_MIG => AsyncEvent::PathMig {
                    qp_num: QpNum::truncate((*el.qp).qp_num),
                },
                t::IBV_EVENT_PATH_MIG_ERR => AsyncEvent::PathMigErr {
                    qp_num: QpNum::truncate((*el.qp).qp_num),
                },
                t::IBV_EVENT_QP_LAST_WQE_REACHED => AsyncEvent::QpLastWqeReached {
                    qp_num: QpNum::truncate((*el.qp).qp_num),
                },
                t::IBV_EVENT_SRQ_ERR => AsyncEvent::SrqErr {
                    srq_handle: (*el.srq).handle,
                },
                t::IBV_EVENT_SRQ_LIMIT_REACHED => AsyncEvent::SrqLimitReached {
                    srq_handle: (*el.srq).handle,
                },
                t::IBV_EVENT_DEVICE_FATAL => AsyncEvent::DeviceFatal,
                t::IBV_EVENT_PORT_ACTIVE
                | t::IBV_EVENT_PORT_ERR
                | t::IBV_EVENT_LID_CHANGE
                | t::IBV_EVENT_PKEY_CHANGE
                | t::IBV_EVENT_SM_CHANGE
                | t::IBV_EVENT_CLIENT_REREGISTER
                | t::IBV_EVENT_GID_CHANGE => AsyncEvent::Port {
                    event: e,
                    port: el.port_num as u8,
                },
                other => AsyncEvent::Other(other),
            }
        };
        if matches!(
            e,
            t::IBV_EVENT_QP_FATAL
                | t::IBV_EVENT_QP_REQ_ERR
                | t::IBV_EVENT_QP_ACCESS_ERR
                | t::IBV_EVENT_QP_LAST_WQE_REACHED
        ) {
            // SAFETY: the event names a QP (its type says so) that cannot
            // be destroyed before the event is acknowledged, below.
            unsafe { self.qp_registry().device_moved(raw.element.qp) };
        }
        if let AsyncEvent::Port { event, port } = ev {
            self.port_event_seen(event, port);
        }
        // SAFETY: `raw` is the event just returned, acknowledged once.
        unsafe { sys::ibv_ack_async_event(&mut raw) };
        Ok(ev)
    }

    /// What a port event makes the context's cache forget (see
    /// [`Context`](crate::Context#what-a-context-caches)): a GID change the
    /// port's GID entries and its default GID pick; an event after which
    /// the LID may differ (`LID_CHANGE`, `PORT_ACTIVE`, `PORT_ERR`,
    /// `SM_CHANGE`, `CLIENT_REREGISTER`) the LID. The port's other cached
    /// facts are fixed while the context is open.
    fn port_event_seen(&self, event: u32, port: u8) {
        match event {
            t::IBV_EVENT_GID_CHANGE => self.forget_cached_gids(port),
            t::IBV_EVENT_LID_CHANGE
            | t::IBV_EVENT_PORT_ACTIVE
            | t::IBV_EVENT_PORT_ERR
            | t::IBV_EVENT_SM_CHANGE
            | t::IBV_EVENT_CLIENT_REREGISTER => self.port_cache().forget_lid(port),
            _ => {}
        }
    }

    /// The descriptor that becomes readable when an asynchronous event is
    /// pending (`async_fd`), for epoll or an async runtime.
    pub fn async_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while the context lives, which
        // the returned borrow of `self` guarantees.
        unsafe { BorrowedFd::borrow_raw(self.async_raw_fd()) }
    }

    fn async_raw_fd(&self) -> RawFd {
        // SAFETY: the context is live; `async_fd` is set at open.
        unsafe { (*self.as_ptr()).async_fd }
    }
}

/// Borrowing the async descriptor through the standard traits.
impl AsFd for Context {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.async_fd()
    }
}

impl AsRawFd for Context {
    fn as_raw_fd(&self) -> RawFd {
        self.async_raw_fd()
    }
}

impl crate::srq::SharedReceiveQueue {
    /// The kernel handle, which [`AsyncEvent`]s name the SRQ by.
    pub fn handle(&self) -> u32 {
        // SAFETY: the SRQ is live; `handle` is set at creation.
        unsafe { (*self.as_ptr()).handle }
    }
}

impl crate::cq::CompletionQueue {
    /// The kernel handle, which [`AsyncEvent`]s name the CQ by.
    pub fn handle(&self) -> u32 {
        // SAFETY: the CQ is live; `handle` is set at creation.
        unsafe { (*self.as_ptr()).handle }
    }
}
