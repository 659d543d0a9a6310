//! The data path: posting work requests to a QP's queues, the ledger that
//! owns what each outstanding request names, and getting requests back
//! from their completions.
//!
//! The QP object and its state machine live in [`crate::qp`]; this layer
//! reads the QP's known state and handle through `QpCommon`
//! (`halves.rs`) and keeps its bookkeeping in the QP's `Pending`
//! (`queues.rs`). The SRQ, memory windows and extended CQs use it through
//! the crate-internal items below. Its public types are re-exported by
//! [`crate::qp`], where users name them.
//!
//! | file | what it holds |
//! |---|---|
//! | `post.rs` | the safe path's guarantees (module docs), `post_send`, `post_recv`, the checks per request (with the facts found at creation), refusals |
//! | `post/recv.rs` | the receive checks and the one-request receive |
//! | `halves.rs` | [`SendHalf`], [`RecvHalf`]: the one implementation of posting and reclaiming; the trace of one send |
//! | `split.rs` | owned halves and `reunite` |
//! | `queues.rs` | `Pending`: the send queue's and the receive queue's bookkeeping |
//! | `chain.rs` | the one post loop, its undo, and the refusals of a call (`refuse`, `refused_entry`) |
//! | `entries.rs` | what a request owns while posted (`Loan`) |
//! | `ledger.rs` | tags and the table of outstanding requests |
//! | `request.rs` | [`SendWr`], [`RecvWr`] |
//! | `completed.rs` | [`Completed`], [`Completion`], [`PostError`] |
//! | `reclaim.rs` | `reclaim`, `reset`, `close_and_reclaim` |
//! | `template.rs`, `pin.rs` | [`SendTemplate`] and what keeps its source unwritable |
//! | `recv_buffers.rs` | [`RecvBuffers`] pools |
//! | `ex.rs` | QPs made with `send_ops` and [`WrBatch`] |

//!
//! # The ways into a ledger
//!
//! Every request enters its ledger through `Ledger::insert` (`ledger.rs`),
//! which finds the slot and the stamp (or `insert_made`, the same for a
//! constant payload, written straight into the slot: measured, 10
//! instructions less per request of a template stream and 15 per pool
//! round trip); a send that lends something beside
//! its entries (a UD destination's handle, a memory-window loan) through
//! `lend_side` (`post.rs`), which records [`Loan::Side`](entries::Loan)
//! there and the loan in the side table.
//!
//! A request a ledger cannot take is refused by one function,
//! `Ledger::refusal`: no room for the call's requests is
//! [`Error::QueueFull`](crate::Error::QueueFull) (naming the queue, the
//! requests, the room and what is outstanding), room but no stamp left
//! [`Error::TagsExhausted`](crate::Error::TagsExhausted). Every way in
//! refuses through it, after taking its own requests back out (so the
//! counts are the caller's), and every request taken back out before it
//! reached a device (a refused call's, a panicking iterator's, an aborted
//! batch's) leaves through one function, `Ledger::undo_last` (which
//! `pop_newest` calls for a batch's newest), newest first; its stamp may
//! then be issued again. What differs between the
//! ways is how the raw request is built and what a call does with the
//! requests it takes back:
//!
//! | ledger | inserted by | used by | the undo of a refused call |
//! |---|---|---|---|
//! | send | `lend_send` (`post.rs`) inside `post_chain` (`chain.rs`) | `post_send`, `SendHalf::post_send` | `Chain`'s undo |
//! | send | `post_template`'s closure inside `post_chain` | `post_template` | `Chain`'s undo |
//! | send | `post_template_one` | `post_template_one` | none: one request (the fallback `post_template_refused` posts through `post_template`) |
//! | send | `lend_send` | `WrBatch::post` | none: one request; `WrBatch::abort` takes back the batch's |
//! | send | `SendQueue::lend_window` (`queues.rs`) | `bind_mw`, `invalidate_mw`, `WrBatch::bind_mw`, `WrBatch::local_inv` | none: one request (the window's bookkeeping restored) |
//! | receive | `post_recv_chain` (`post/recv.rs`) inside `post_chain` | `post_recv`, `RecvHalf::post_recv`, `SharedReceiveQueue::post_recv` | `Chain`'s undo |
//! | receive | `RecvHalf::post_recv_one` | `post_recv_one` | none: one request (the fallback `post_recv_refused` posts through `post_recv`) |
//! | receive | `RecvBuffers::post_up_to` | `RecvBuffers::post` | `undo_post` (`recv_buffers.rs`) |
//!
//! The one-request ways (`post_recv_one`, `post_template_one`) and the
//! pool's are fast paths that skip the chain: folding them into it
//! measured 2 to 35 instructions more per request (`guide::performance`).
//! The one-request ways build no refusal of their own: anything but the
//! common case goes to the plural call, which refuses it with the reason.

//! # The optional layers, and what they leave in the core
//!
//! * **Batches** ([`WrBatch`], `ex.rs`) leave nothing: a batch's hold on
//!   the provider's send-queue lock is a bit of the known state's word,
//!   which every send post reads anyway.
//! * **Templates** ([`SendTemplate`], `template.rs`, `pin.rs`) leave the
//!   send queue's `pins` and one test per send completion
//!   (`!pins.is_empty()`: 4 instructions a round trip, callgrind's line
//!   counts). A template dropped while requests from it are outstanding
//!   hands its source to the QP's pin, and the completion that ends them
//!   lets go of it at once (the device test
//!   `templates::a_template_source_stays_with_the_qp_until_its_requests_end`).
//!   Tried instead: a handle per request (an `Arc` count per post and per completion, about
//!   15 instructions a round trip, the cost 1331df5 took off the pools),
//!   and letting go at the next post or template call (which breaks that
//!   promise).
//! * **Receive pools** ([`RecvBuffers`], `recv_buffers.rs`) leave the
//!   receive queue's `pools`, the inert [`Loan::Pooled`](entries::Loan)
//!   record and one test of it per receive completion (2 instructions): a
//!   pool dropped while its buffers are posted keeps its region through
//!   the QP's pin until the last of them ends, whichever way it ends
//!   (`reclaim`, RESET; the device test
//!   `recv_buffers::a_qp_holds_a_pools_region_exactly_while_a_buffer_is_posted`).
//! * `Ledger::insert_made` writes the constant payload of both in place;
//!   the plain path never calls it.

mod chain;
mod completed;
mod entries;
mod ex;
mod halves;
mod ledger;
mod pin;
mod post;
mod queues;
mod reclaim;
mod recv_buffers;
mod request;
mod split;
mod template;

// What the files here name as `super::X`: the QP object's types.
use crate::qp::{QpAttr, QpCaps, QpInitAttr, QpState, QpType, QueuePair};

pub use completed::{Completed, Completion, PostError, RequestKind};
#[cfg(feature = "cm")]
pub(crate) use ex::create_ex_with;
pub(crate) use ex::{create as create_ex, QpEx};
pub use ex::{FlushPlacement, FlushSelectivity, RemoteWr, SendOpsFlags, WrBatch};
pub use halves::{RecvHalf, SendHalf};
pub use recv_buffers::{Received, RecvBuffers, Taken};
pub use request::{RecvWr, RemoteAddr, SendOp, SendWr, MAX_SGE};
pub use split::{OwnedRecvHalf, OwnedSendHalf, ReuniteError};
pub use template::SendTemplate;

// The crate-internal API the QP object, the SRQ, memory windows and
// extended CQs use.
pub(crate) use chain::Scratch;
pub(crate) use completed::sealed::Sealed as CompletionSealed;
pub(crate) use entries::{Loan, SendLoan};
pub(crate) use halves::QpCommon;
pub(crate) use ledger::{Kind, RecvLedger};
pub(crate) use post::{chain_room, fail as post_error, leaked_batch, post_recv_chain};
pub(crate) use post::{RecvFacts, GRH_LEN};
pub(crate) use queues::Pending;
