// UC SQD->SQD: the kernel adds IBV_QP_PORT to any modify with IBV_QP_AV
// outside INIT->RTR, and UC SQD->SQD does not take PORT, so no `av` setter.
use rdma_verbs::qp::{AddressVector, SqdToSqd, Uc};

fn main() {
    let _ = SqdToSqd::<Uc>::new().av(AddressVector::new(1));
}
