// A registered buffer belongs to its region: the program cannot touch it
// until into_inner hands it back.
use rdma_verbs::{AccessFlags, ProtectionDomain};

fn register(pd: &ProtectionDomain) -> rdma_verbs::Result<()> {
    let mut log = vec![0u8; 4096];
    let mr = pd.register_owned(log, AccessFlags::LOCAL_WRITE)?;
    log[0] = 1;
    drop(mr);
    Ok(())
}

fn main() {
    let _ = register;
}
