// A field the extended CQ was not created with cannot be read: the
// provider leaves its read function unset.
use rdma_verbs::Context;

fn read(ctx: &Context) -> rdma_verbs::Result<()> {
    let mut cq = ctx.create_cq_ex(16).qp_num().build()?;
    if let Some(mut batch) = cq.start_poll()? {
        while let Some(wc) = batch.next()? {
            let _ = wc.byte_len();
        }
    }
    Ok(())
}

fn main() {
    let _ = read;
}
