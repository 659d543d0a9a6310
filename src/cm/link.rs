//! The tie between a QP made by `rdma_create_qp` and its CM id.
//!
//! librdmacm keeps the QP's pointer in the id (`id->qp`) and uses it while
//! it processes events (a reject moves the QP to ERR inside
//! `rdma_get_cm_event`) and in `rdma_accept`/`rdma_disconnect`. The QP and
//! the id are separate objects here, dropped in any order, so whichever
//! goes first clears `id->qp` under the channel's lock, the lock every such
//! librdmacm call runs under: the id never points at a destroyed QP.
//!
//! The QP's known state is shared by the [`QueuePair`] and the id (one
//! cell, the QP's, which its error completions and fatal events update
//! too): the CM's moves are read from the device and stored while the lock
//! is held, and [`QueuePair::state`] reads them.
//!
//! [`QueuePair`]: crate::QueuePair
//! [`QueuePair::state`]: crate::QueuePair::state

use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use std::sync::Arc;

use super::channel::ChannelInner;
use crate::qp::{Known, QpState};
use crate::sys;

/// What the QP and the id share.
pub(crate) struct LinkShared {
    chan: Arc<ChannelInner>,
    /// The id, while it points at the QP; null once either let go.
    /// Written only with the channel's lock held.
    id: AtomicPtr<sys::rdma_cm_id>,
    /// The QP (valid while `id` is not null: the QP clears `id` before it
    /// is destroyed).
    qp: NonNull<sys::ibv_qp>,
    /// The QP's known state (the QP's own cell).
    known: Arc<Known>,
    /// 0 for none.
    port: AtomicU8,
}

// SAFETY: the raw pointers are only dereferenced with the channel's lock
// held (see `refresh` and `detach`), while both objects are alive (each
// clears `id` under that lock before going away); the rest is atomics.
unsafe impl Send for LinkShared {}
// SAFETY: as above.
unsafe impl Sync for LinkShared {}

impl LinkShared {
    /// Reads the QP's state from the device into the shared known state.
    /// Call with the channel's lock held.
    pub(crate) fn refresh(&self) {
        if self.id.load(Ordering::Acquire).is_null() {
            return;
        }
        let mut port = None;
        // What is read stands unless the QP's owner recorded a move while
        // the query ran (as for a fatal event: see `qp/known.rs`).
        self.known.follow_device(|| {
            let mut attr = sys::ibv_qp_attr::default();
            let mut init = sys::ibv_qp_init_attr::default();
            // SAFETY: `id` is not null, so the QP is alive (it clears `id`
            // under the lock the caller holds before being destroyed); the
            // structs are valid out-parameters.
            let rc = unsafe {
                sys::ibv_query_qp(
                    self.qp.as_ptr(),
                    &mut attr,
                    sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32
                        | sys::ibv_qp_attr_mask::IBV_QP_PORT.0 as i32,
                    &mut init,
                )
            };
            (rc == 0).then(|| {
                let state = QpState::from_raw(attr.qp_state).unwrap_or(QpState::Unknown);
                port = Some((state != QpState::Reset).then_some(attr.port_num));
                state
            })
        });
        if let Some(port) = port {
            self.set_port(port);
        }
        // A failed query leaves the last known state; the QP's own `resync`
        // reports the failure to whoever asks.
    }

    /// Records a move librdmacm made (it succeeded) while the QP lives.
    /// Call with the channel's lock held.
    pub(crate) fn moved(&self, state: QpState) {
        if !self.id.load(Ordering::Acquire).is_null() {
            self.set_state(state);
        }
    }

    fn set_state(&self, state: QpState) {
        self.known.set(state);
    }

    fn set_port(&self, port: Option<u8>) {
        self.port.store(port.unwrap_or(0), Ordering::Release);
    }

    /// The id lets go of the QP (`id->qp = NULL`). Call with the channel's
    /// lock held.
    pub(crate) fn detach_locked(&self) {
        let id = self.id.swap(null_mut(), Ordering::AcqRel);
        if !id.is_null() {
            // SAFETY: a non-null `id` is alive (the id clears it under the
            // lock the caller holds before it is destroyed); the caller's
            // lock keeps librdmacm from reading `qp` meanwhile.
            unsafe { (*id).qp = null_mut() };
        }
    }
}

/// The QP's end of the tie, held by the [`QueuePair`](crate::QueuePair).
/// Dropping it (before the QP is destroyed) makes the id let go of the QP.
pub(crate) struct QpLink {
    shared: Arc<LinkShared>,
}

impl QpLink {
    /// Ties `qp` to `id`, whose `qp` field points at it, sharing the QP's
    /// known state `known`.
    pub(crate) fn new(
        chan: Arc<ChannelInner>,
        id: NonNull<sys::rdma_cm_id>,
        qp: NonNull<sys::ibv_qp>,
        known: Arc<Known>,
    ) -> (Self, Arc<LinkShared>) {
        let shared = Arc::new(LinkShared {
            chan,
            id: AtomicPtr::new(id.as_ptr()),
            qp,
            known,
            port: AtomicU8::new(0),
        });
        (
            QpLink {
                shared: shared.clone(),
            },
            shared,
        )
    }

    pub(crate) fn port(&self) -> Option<u8> {
        match self.shared.port.load(Ordering::Acquire) {
            0 => None,
            p => Some(p),
        }
    }

    /// Stores `state`, and `port` when given (`Some(None)`: no port).
    pub(crate) fn set(&self, state: QpState, port: Option<Option<u8>>) {
        self.shared.set_state(state);
        self.set_port(port);
    }

    /// Stores `port` when given (`Some(None)`: no port); the state is the
    /// QP's own cell, which the QP sets itself.
    pub(crate) fn set_port(&self, port: Option<Option<u8>>) {
        if let Some(port) = port {
            self.shared.set_port(port);
        }
    }
}

impl Drop for QpLink {
    fn drop(&mut self) {
        let _guard = self.shared.chan.lock();
        self.shared.detach_locked();
    }
}
