// Once split, the bytes are the chunks': the ChunkedRegion neither copies in
// or out nor re-registers (rejoin first, which needs every chunk back).
use rdma_verbs::{AccessFlags, ChunkedRegion};

fn poke(region: &mut ChunkedRegion<Vec<u8>>) -> rdma_verbs::Result<()> {
    region.write(0, b"x")?;
    region.rereg_access(AccessFlags::LOCAL_WRITE)?;
    Ok(())
}

fn main() {
    let _ = poke;
}
