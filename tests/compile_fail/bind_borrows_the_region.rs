// A memory window bind names the region: the buffer cannot be had back
// while the bind (and so a request made from it) may still use it.
use rdma_verbs::{AccessFlags, MemoryRegion, MwBind};

fn bind_then_take(mr: MemoryRegion<Vec<u8>>) -> rdma_verbs::Result<()> {
    let bind = MwBind::new(&mr, 0, 64, AccessFlags::REMOTE_READ)?;
    let buf = mr.into_inner()?;
    drop(bind);
    drop(buf);
    Ok(())
}

fn main() {
    let _ = bind_then_take;
}
