//! A QP split for good: [`OwnedSendHalf`] and [`OwnedRecvHalf`], for
//! threads and tasks that outlive a borrow, and
//! [`reunite`](OwnedSendHalf::reunite) to make the QP whole again.
//!
//! Each owned half owns its queue's bookkeeping outright, moved out of the
//! QP (which keeps empty stand-ins meanwhile), and shares the QP itself
//! with the other half through their *joint*. What a half has outstanding
//! must not be freed while the QP may still use it, so a half that goes
//! (dropped, or reunited) parks its queue in the joint, and the half that
//! goes last puts both queues back into the QP: a reunite returns it, a
//! drop destroys it first and only then drops what was outstanding (as
//! dropping a whole `QueuePair` does). A half that is leaked
//! (`mem::forget`) keeps the joint, and so the QP and every request of
//! both queues, alive for good: a leak, never a free under the device.

use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, PoisonError};

use super::halves::{RecvHalf, SendHalf};
use super::queues::{RecvQueue, SendQueue};
use super::QueuePair;

/// The QP both owned halves share, and the queues of the halves gone.
struct Joint {
    qp: QueuePair,
    parked: Mutex<Parked>,
}

/// The queues of the halves that went. Should it ever be dropped holding
/// one (a joint dropped other than through [`leave`]), it leaks it rather
/// than free chunks the QP, destroyed or not, may still name.
#[derive(Default)]
struct Parked {
    send: Option<SendQueue>,
    recv: Option<RecvQueue>,
}

impl Drop for Parked {
    fn drop(&mut self) {
        std::mem::forget(self.send.take());
        std::mem::forget(self.recv.take());
    }
}

/// A half's queue on its way back.
enum Part {
    Send(Box<SendQueue>),
    Recv(Box<RecvQueue>),
}

/// A half goes: its queue is parked in the joint; the half that goes last
/// gets the QP back, whole, with both queues.
fn leave(joint: Arc<Joint>, part: Part) -> Option<QueuePair> {
    {
        // Only assignments happen under the lock: it is never poisoned by
        // this code, and a poisoned one holds nothing half-done.
        let mut parked = joint.parked.lock().unwrap_or_else(PoisonError::into_inner);
        match part {
            Part::Send(q) => parked.send = Some(*q),
            Part::Recv(q) => parked.recv = Some(*q),
        }
    }
    // Called on each of the two clones, exactly one call returns the joint.
    let Joint { mut qp, parked } = Arc::into_inner(joint)?;
    let mut parked = parked.into_inner().unwrap_or_else(PoisonError::into_inner);
    let p = qp.pending_mut();
    if let Some(q) = parked.send.take() {
        p.send = q;
    }
    if let Some(q) = parked.recv.take() {
        p.recv = q;
    }
    Some(qp)
}

/// The send queue of a QP given away by [`QueuePair::into_split`]: a
/// [`SendHalf`] that owns its share of the QP, for a thread or task of its
/// own. `Send` and `Sync`.
///
/// Dropping it parks its outstanding sends with the QP; the QP is destroyed
/// when both halves are gone, and only then are their requests' chunks
/// dropped.
///
/// ```no_run
/// # fn f(qp: rdma_verbs::QueuePair, chunk: rdma_verbs::Chunk) -> Result<(), Box<dyn std::error::Error>> {
/// use rdma_verbs::qp::{RecvWr, SendOp, SendWr};
/// let (mut tx, mut rx) = qp.into_split();
/// let sender = std::thread::spawn(move || {
///     tx.half().post_send([SendWr::new(1, SendOp::Send).sge(chunk)]).map(|()| tx)
/// });
/// rx.half().post_recv([RecvWr::new(2)])?;
/// let tx = sender.join().expect("the sender panicked")?;
/// let qp = tx.reunite(rx).map_err(|e| e.to_string())?; // whole again
/// # let _ = qp; Ok(()) }
/// ```
pub struct OwnedSendHalf {
    joint: ManuallyDrop<Arc<Joint>>,
    /// Boxed, so that a half moves as two words.
    q: ManuallyDrop<Box<SendQueue>>,
}

/// The receive queue of a QP given away by [`QueuePair::into_split`]: a
/// [`RecvHalf`] that owns its share of the QP (see [`OwnedSendHalf`]).
/// `Send` and `Sync`.
pub struct OwnedRecvHalf {
    joint: ManuallyDrop<Arc<Joint>>,
    q: ManuallyDrop<Box<RecvQueue>>,
}

/// Two owned halves of different QPs, handed back by
/// [`OwnedSendHalf::reunite`].
#[derive(Debug)]
pub struct ReuniteError {
    /// The send half, unchanged.
    pub send: OwnedSendHalf,
    /// The receive half, unchanged.
    pub recv: OwnedRecvHalf,
}

impl std::fmt::Display for ReuniteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "reunite: the send half is of QP {:#x} and the receive half of QP {:#x}, not of one QP",
            self.send.joint.qp.qp_num(),
            self.recv.joint.qp.qp_num()
        )
    }
}

impl std::error::Error for ReuniteError {}

impl QueuePair {
    /// Gives the QP's two queues away as two owned halves, for threads or
    /// tasks of their own: the same as [`split`](Self::split), except that
    /// the halves own their share of the QP (each `Send`, `'static`).
    ///
    /// [`OwnedSendHalf::reunite`] makes the QP whole again, with every
    /// request either half has outstanding; until then it cannot be
    /// modified, reset or closed. When both halves are dropped instead, the
    /// QP is destroyed, then what was outstanding is dropped.
    pub fn into_split(mut self) -> (OwnedSendHalf, OwnedRecvHalf) {
        let floor = self.recv_floor();
        let p = self.pending_mut();
        let (send_stand_in, recv_stand_in) = (p.send.stand_in(), p.recv.stand_in());
        let send = std::mem::replace(&mut p.send, send_stand_in);
        let mut recv = std::mem::replace(&mut p.recv, recv_stand_in);
        recv.facts.floor = floor;
        let joint = Arc::new(Joint {
            qp: self,
            parked: Mutex::default(),
        });
        (
            OwnedSendHalf {
                joint: ManuallyDrop::new(Arc::clone(&joint)),
                q: ManuallyDrop::new(Box::new(send)),
            },
            OwnedRecvHalf {
                joint: ManuallyDrop::new(joint),
                q: ManuallyDrop::new(Box::new(recv)),
            },
        )
    }
}

impl OwnedSendHalf {
    /// The half to post and reclaim with: [`SendHalf::post_send`],
    /// [`SendHalf::reclaim_one`], ... (a few references, made per call).
    #[inline(always)]
    pub fn half(&mut self) -> SendHalf<'_> {
        SendHalf::new(self.joint.qp.common(), &mut self.q)
    }

    /// Whether `recv` is the receive half of this half's QP.
    pub fn is_pair_of(&self, recv: &OwnedRecvHalf) -> bool {
        Arc::ptr_eq(&self.joint, &recv.joint)
    }

    /// Puts the QP back together, with every request either half has
    /// outstanding.
    ///
    /// # Errors
    /// [`ReuniteError`], with both halves unchanged, when `recv` is of
    /// another QP.
    pub fn reunite(self, recv: OwnedRecvHalf) -> Result<QueuePair, ReuniteError> {
        if !self.is_pair_of(&recv) {
            return Err(ReuniteError { send: self, recv });
        }
        let (sj, sq) = self.into_parts();
        let (rj, rq) = recv.into_parts();
        let first = leave(sj, Part::Send(sq));
        let second = leave(rj, Part::Recv(rq));
        // The two halves held the joint's only two clones, and
        // `Arc::into_inner` called on every clone returns it exactly once.
        Ok(first
            .or(second)
            .expect("the last of a QP's two halves gets its joint"))
    }

    fn into_parts(self) -> (Arc<Joint>, Box<SendQueue>) {
        let mut me = ManuallyDrop::new(self);
        let me: &mut Self = &mut me;
        // SAFETY: `me` is never dropped or used again.
        unsafe { take_fields(&mut me.joint, &mut me.q) }
    }
}

impl OwnedRecvHalf {
    /// The half to post and reclaim with: [`RecvHalf::post_recv`],
    /// [`RecvHalf::reclaim_one`], ... (a few references, made per call).
    #[inline(always)]
    pub fn half(&mut self) -> RecvHalf<'_> {
        RecvHalf::new(self.joint.qp.common(), &mut self.q)
    }

    /// Puts the QP back together: [`OwnedSendHalf::reunite`].
    ///
    /// # Errors
    /// As [`OwnedSendHalf::reunite`].
    pub fn reunite(self, send: OwnedSendHalf) -> Result<QueuePair, ReuniteError> {
        send.reunite(self)
    }

    fn into_parts(self) -> (Arc<Joint>, Box<RecvQueue>) {
        let mut me = ManuallyDrop::new(self);
        let me: &mut Self = &mut me;
        // SAFETY: `me` is never dropped or used again.
        unsafe { take_fields(&mut me.joint, &mut me.q) }
    }
}

/// An owned half's two fields, taken out (by `into_parts` or `drop`).
///
/// # Safety
/// Called once per half, whose fields are not used afterwards.
unsafe fn take_fields<Q>(
    joint: &mut ManuallyDrop<Arc<Joint>>,
    q: &mut ManuallyDrop<Box<Q>>,
) -> (Arc<Joint>, Box<Q>) {
    // SAFETY: the caller's promise: each field is taken out exactly once.
    unsafe { (ManuallyDrop::take(joint), ManuallyDrop::take(q)) }
}

impl Drop for OwnedSendHalf {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once, and the fields are not used after.
        let (joint, q) = unsafe { take_fields(&mut self.joint, &mut self.q) };
        // The last half destroys the QP, then its requests' chunks.
        drop(leave(joint, Part::Send(q)));
    }
}

impl Drop for OwnedRecvHalf {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once, and the fields are not used after.
        let (joint, q) = unsafe { take_fields(&mut self.joint, &mut self.q) };
        drop(leave(joint, Part::Recv(q)));
    }
}

/// An owned half's `Debug`: its QP's number and what it has outstanding.
fn debug_half(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    joint: &Joint,
    outstanding: usize,
) -> std::fmt::Result {
    f.debug_struct(name)
        .field("qp_num", &format_args!("{:#x}", joint.qp.qp_num()))
        .field("outstanding", &outstanding)
        .finish()
}

impl std::fmt::Debug for OwnedSendHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_half(f, "OwnedSendHalf", &self.joint, self.q.ledger.len())
    }
}

impl std::fmt::Debug for OwnedRecvHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug_half(f, "OwnedRecvHalf", &self.joint, self.q.ledger.len())
    }
}

// The owned halves go to other threads and tasks.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<OwnedSendHalf>();
    send_sync::<OwnedRecvHalf>();
};
