// A chunk moved into a posted request cannot be read until its completion
// hands it back.
use rdma_verbs::qp::{SendOp, SendWr};
use rdma_verbs::{Chunk, QueuePair};

fn send(qp: &mut QueuePair, chunk: Chunk) -> rdma_verbs::Result<()> {
    qp.post_send([SendWr::new(1, SendOp::Send).sge(chunk)])?;
    let _ = chunk.as_slice();
    Ok(())
}

fn main() {
    let _ = send;
}
