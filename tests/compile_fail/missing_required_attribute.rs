// RC RESET->INIT requires IBV_QP_ACCESS_FLAGS: the constructor takes it.
use rdma_verbs::qp::{Rc, ResetToInit};

fn main() {
    let _ = ResetToInit::<Rc>::new(0, 1);
}
