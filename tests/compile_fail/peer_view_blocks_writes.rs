// A view of what peers write borrows the region: the program's own write
// (which takes `&mut`) cannot run while the view is alive.
use rdma_verbs::MemoryRegion;

fn overwrite_while_viewed(region: &mut MemoryRegion) -> rdma_verbs::Result<u8> {
    let view = region.view(0, 8)?;
    region.write(0, &[1; 8])?;
    Ok(view.bytes()[0].load(std::sync::atomic::Ordering::Relaxed))
}

fn main() {
    let _ = overwrite_while_viewed;
}
