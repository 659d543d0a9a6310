// A slice of a chunk cannot be held across posting it: the device may write
// the memory while the slice says it is ours.
use rdma_verbs::qp::RecvWr;
use rdma_verbs::{Chunk, QueuePair};

fn receive(qp: &mut QueuePair, mut chunk: Chunk) -> rdma_verbs::Result<()> {
    let bytes = chunk.as_mut_slice();
    qp.post_recv([RecvWr::new(1).sge(chunk)])?;
    bytes[0] = 1;
    Ok(())
}

fn main() {
    let _ = receive;
}
