// A Qp<Ud> takes only UD transitions.
use rdma_verbs::qp::{Qp, Rc, ResetToInit, Ud};
use rdma_verbs::AccessFlags;

fn bring_up(qp: &mut Qp<Ud>) -> rdma_verbs::Result<()> {
    qp.apply(ResetToInit::<Rc>::new(0, 1, AccessFlags::empty()))
}

fn main() {
    let _ = bring_up;
}
