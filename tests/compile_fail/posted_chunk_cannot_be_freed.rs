// A posted chunk cannot be dropped (freed) while the device may use it.
use rdma_verbs::qp::RecvWr;
use rdma_verbs::{Chunk, QueuePair};

fn receive(qp: &mut QueuePair, chunk: Chunk) -> rdma_verbs::Result<()> {
    qp.post_recv([RecvWr::new(1).sge(chunk)])?;
    drop(chunk);
    Ok(())
}

fn main() {
    let _ = receive;
}
