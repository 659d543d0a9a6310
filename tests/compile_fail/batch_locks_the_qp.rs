// While a batch is open (between ibv_wr_start and ibv_wr_complete, when the
// provider holds the send queue's lock) nothing else can post to or modify
// the QP: the batch borrows it mutably.
use rdma_verbs::qp::{SendOp, SendWr};
use rdma_verbs::QueuePair;

fn post(qp: &mut QueuePair) -> rdma_verbs::Result<()> {
    let batch = qp.start_batch()?;
    qp.post_send([SendWr::new(1, SendOp::Send).inline(b"x")])?;
    batch.complete()?;
    Ok(())
}

fn main() {
    let _ = post;
}
