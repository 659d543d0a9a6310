// A region peers may write is only reachable by copy, never as a slice.
use rdma_verbs::MemoryRegion;

fn peek(region: &MemoryRegion) -> u8 {
    region.as_slice()[0]
}

fn main() {
    let _ = peek;
}
