// Only the crate's four transports exist: nobody can add a fifth.
use rdma_verbs::qp::{QpType, Transport};

enum Mine {}

impl Transport for Mine {
    const QP_TYPE: QpType = QpType::Rc;
}

fn main() {}
