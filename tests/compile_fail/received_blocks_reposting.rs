// The bytes a queue-owned receive buffer brought are a borrow of its pool:
// while they are held, the pool cannot post its buffers again (which would
// let the device write under the slice).
use rdma_verbs::qp::{RecvBuffers, Taken};
use rdma_verbs::{QueuePair, WorkCompletion};

fn serve(bufs: &mut RecvBuffers, qp: &mut QueuePair, wc: &WorkCompletion) {
    if let Taken::Mine(msg) = bufs.take(qp, wc) {
        let _ = bufs.post(qp);
        println!("{}", msg[0]);
    }
}

fn main() {
    let _ = serve;
}
