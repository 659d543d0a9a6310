// A completion of an extended CQ is read from the provider's current
// entry: it cannot be kept past the end of its batch.
use rdma_verbs::Context;

fn keep(ctx: &Context) -> rdma_verbs::Result<()> {
    let mut cq = ctx.create_cq_ex(16).standard().build()?;
    let mut kept = None;
    if let Some(mut batch) = cq.start_poll()? {
        kept = batch.next()?;
        batch.end();
    }
    if let Some(wc) = kept {
        let _ = wc.wr_id();
    }
    Ok(())
}

fn main() {
    let _ = keep;
}
