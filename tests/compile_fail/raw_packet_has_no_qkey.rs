// RAW_PACKET RTR->RTS takes only IBV_QP_RATE_LIMIT.
use rdma_verbs::qp::{QKey, RawPacket, RtrToRts};

fn main() {
    let _ = RtrToRts::<RawPacket>::new().qkey(QKey(1));
}
