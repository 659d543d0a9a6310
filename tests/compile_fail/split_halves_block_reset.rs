// While a QP is split into a send half and a receive half (both borrow
// it), what needs the whole QP (RESET, modify, close) does not compile.
use rdma_verbs::qp::{SendOp, SendWr};
use rdma_verbs::{Chunk, QueuePair};

fn send_then_reset(qp: &mut QueuePair, chunk: Chunk) -> rdma_verbs::Result<()> {
    let (mut tx, _rx) = qp.split();
    qp.reset()?;
    tx.post_send([SendWr::new(1, SendOp::Send).sge(chunk)])?;
    Ok(())
}

fn main() {
    let _ = send_then_reset;
}
