//! `--ex`: the safe path's requests posted through an extended QP's
//! `ibv_wr_*` batch. One batch per post call: `start_batch`
//! (`ibv_wr_start`), `post` per request (`ibv_wr_send`,
//! `ibv_wr_rdma_write`, ... with `ibv_wr_set_sge` or
//! `ibv_wr_set_inline_data`), `complete` (`ibv_wr_complete`). Requests,
//! buffers, receives and the reclaim are the safe path's
//! (`safe::SafePath`); only this differs.
#![forbid(unsafe_code)]

use rdma_verbs::qp::SendWr;
use rdma_verbs::QueuePair;

use crate::safe::{Refused, SafePath, Submit};

/// The `--ex` data path.
pub type ExPath = SafePath<Batched>;

/// One `ibv_wr_*` batch per post call.
pub struct Batched;

impl Submit for Batched {
    #[inline]
    fn submit<'a, I: IntoIterator<Item = SendWr<'a>>>(
        qp: &mut QueuePair,
        wrs: I,
    ) -> Result<(), Refused> {
        let mut batch = qp
            .start_batch()
            .map_err(|e| (format!("Couldn't start a batch: {e}"), Vec::new()))?;
        let mut refused = None;
        for wr in wrs {
            if let Err(e) = batch.post(wr) {
                refused = Some(e);
                break;
            }
        }
        // A refused request leaves the batch open: abort it, so that none
        // of the call's requests reaches the device, and hand back every
        // chunk (the refused request's and those the batch held).
        if let Some(e) = refused {
            let mut back = e.returned;
            for done in batch.abort() {
                back.extend(done.chunks());
            }
            return Err((format!("Couldn't post send: {}", e.error), back));
        }
        // A failed complete leaves the requests outstanding (in doubt):
        // nothing comes back here; a completion or the QP's end returns them.
        batch
            .complete()
            .map_err(|e| (format!("Couldn't complete the batch: {e}"), e.returned))
    }
}
