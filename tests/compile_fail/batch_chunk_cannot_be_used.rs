// A chunk that went into a batch of the ibv_wr_* API belongs to the QP:
// it cannot be written (nor read) while the device may use it, whether the
// batch was completed or not; only a completion, abort or RESET hands it back.
use rdma_verbs::qp::{SendOp, SendWr};
use rdma_verbs::{Chunk, QueuePair};

fn send(qp: &mut QueuePair, mut chunk: Chunk) -> Result<(), rdma_verbs::qp::PostError> {
    let mut batch = qp.start_batch()?;
    batch.post(SendWr::new(1, SendOp::Send).sge(chunk))?;
    batch.complete()?;
    chunk.as_mut_slice()[0] = 1;
    Ok(())
}

fn main() {
    let _ = send;
}
