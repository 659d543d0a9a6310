// IBV_QP_QKEY is a UD attribute: RC RTR->RTS has no setter for it.
use rdma_verbs::qp::{AckTimeout, Psn, QKey, Rc, RetryCount, RnrRetry, RtrToRts};

fn main() {
    let _ = RtrToRts::<Rc>::new(
        AckTimeout::new(14).unwrap(),
        RetryCount::new(7).unwrap(),
        RnrRetry::INFINITE,
        Psn::new(0).unwrap(),
        1,
    )
    .qkey(QKey(1));
}
