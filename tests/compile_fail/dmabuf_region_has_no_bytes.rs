// A region over a dma-buf has no bytes in this process: no read, write or chunks.
use rdma_verbs::{DmaBuf, MemoryRegion};

fn peek(mr: &MemoryRegion<DmaBuf>) -> rdma_verbs::Result<u8> {
    let mut b = [0u8; 1];
    mr.read(0, &mut b)?;
    Ok(b[0])
}

fn main() {
    let _ = peek;
}
