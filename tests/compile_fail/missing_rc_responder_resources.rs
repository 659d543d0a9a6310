// RC INIT->RTR requires IBV_QP_MAX_DEST_RD_ATOMIC and IBV_QP_MIN_RNR_TIMER;
// UC's constructor (four arguments) is not enough for RC.
use rdma_verbs::qp::{AddressVector, InitToRtr, Psn, QpNum, Rc};
use rdma_verbs::Mtu;

fn main() {
    let _ = InitToRtr::<Rc>::new(
        AddressVector::new(1),
        Mtu::Mtu1024,
        QpNum::new(1).unwrap(),
        Psn::new(0).unwrap(),
    );
}
