// Only owned buffers can be registered: a borrowed slice could be freed or
// used while the device still reaches it.
use rdma_verbs::{AccessFlags, ProtectionDomain};

fn register(pd: &ProtectionDomain) -> rdma_verbs::Result<()> {
    let mut local = [0u8; 4096];
    let mr = pd.register_owned(&mut local[..], AccessFlags::LOCAL_WRITE)?;
    drop(mr);
    Ok(())
}

fn main() {
    let _ = register;
}
