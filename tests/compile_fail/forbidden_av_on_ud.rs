// UD INIT->RTR takes no address vector (UD sends name their destination).
use rdma_verbs::qp::{AddressVector, InitToRtr, Ud};

fn main() {
    let _ = InitToRtr::<Ud>::new().av(AddressVector::new(1));
}
