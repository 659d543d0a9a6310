//! The raw path: `rdma_verbs::sys` work requests built once per size and
//! reused, `post_send_raw`/`post_recv_raw`, buffers named by address (no
//! ledger, no chunk ownership). Completions are polled with the safe
//! `CompletionQueue::poll` and never given to `reclaim`.
//!
//! Memory comes from `MemoryRegion`s (registration is not the data path):
//! a region per QP for sources/landing places, one per QP for receives,
//! split into equal slots. They live in `keep`, which is dropped after the
//! QPs (field order), and a size's regions are freed only once nothing
//! posted on them is outstanding.

use std::ptr;

use rdma_verbs::qp::QpNum;
use rdma_verbs::sys;
use rdma_verbs::{AccessFlags, MemoryRegion, WorkCompletion};

use crate::path::{DataPath, Op, Plan, Progress, POLL_BATCH, RECV_CHAIN};
use crate::pingpong::{OrFail, Res};
use crate::safe::wc_error;
use crate::setup::Conn;

/// Receives' `wr_id`s have this bit and their slot; sends' are their
/// sequence numbers.
const RECV: u64 = 1 << 63;

/// One QP's send side: slots of a region, a chain of `post_list` requests.
struct Tx {
    base: u64,
    slot_len: usize,
    slots: usize,
    next_slot: usize,
    wrs: Vec<sys::ibv_send_wr>,
    sges: Vec<sys::ibv_sge>,
    flags: u32,
}

/// One QP's receive side: slots, the free ones, a chain of up to
/// `RECV_CHAIN` requests.
struct Rx {
    base: u64,
    slot_len: usize,
    free: Vec<u32>,
    wrs: Vec<sys::ibv_recv_wr>,
    sges: Vec<sys::ibv_sge>,
}

pub struct RawPath {
    /// First: its QPs are destroyed before `keep` is dropped.
    conn: Conn,
    /// Every region a posted request may name.
    keep: Vec<MemoryRegion>,
    plan: Option<Plan>,
    tx: Vec<Tx>,
    rx: Vec<Rx>,
    /// Per QP: receives posted and not completed.
    rx_out: Vec<u64>,
    /// Per QP: last send sequence posted / known done.
    tx_posted: Vec<u64>,
    tx_done: Vec<u64>,
    wcs: [WorkCompletion; POLL_BATCH],
    qpns: Vec<QpNum>,
}

impl RawPath {
    pub fn new(conn: Conn) -> Self {
        let qpns = conn.qps.iter().map(|q| q.qp_num()).collect();
        let n = conn.qps.len();
        RawPath {
            conn,
            keep: Vec::new(),
            plan: None,
            tx: Vec::new(),
            rx: Vec::new(),
            rx_out: vec![0; n],
            tx_posted: vec![0; n],
            tx_done: vec![0; n],
            wcs: [WorkCompletion::default(); POLL_BATCH],
            qpns,
        }
    }

    fn plan(&self) -> Res<Plan> {
        self.plan.ok_or_else(|| "internal: no size prepared".into())
    }

    /// The address of write_lat's inbox byte (the target region's byte
    /// `size - 1`).
    fn inbox_ptr(&self) -> Res<*mut u8> {
        let last = self.plan()?.size - 1;
        if last >= self.conn.target.len() {
            return Err("internal: size beyond the target region".into());
        }
        Ok((self.conn.target.addr() as usize + last) as *mut u8)
    }
}

/// A send request template for `op`: everything but `wr_id`, `next`,
/// `sg_list` and the flags.
fn template(op: Op) -> sys::ibv_send_wr {
    use sys::ibv_wr_opcode as o;
    let mut wr = sys::ibv_send_wr {
        num_sge: 1,
        ..Default::default()
    };
    let rdma = |r: rdma_verbs::qp::RemoteAddr| sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
        remote_addr: r.addr,
        rkey: r.rkey,
    };
    let atomic = |r: rdma_verbs::qp::RemoteAddr, compare_add, swap| {
        sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr: r.addr,
            compare_add,
            swap,
            rkey: r.rkey,
        }
    };
    match op {
        Op::Send => wr.opcode = o::IBV_WR_SEND,
        Op::Write(r) => {
            wr.opcode = o::IBV_WR_RDMA_WRITE;
            wr.wr.rdma = rdma(r);
        }
        Op::Read(r) => {
            wr.opcode = o::IBV_WR_RDMA_READ;
            wr.wr.rdma = rdma(r);
        }
        Op::FetchAdd(r) => {
            wr.opcode = o::IBV_WR_ATOMIC_FETCH_AND_ADD;
            wr.wr.atomic = atomic(r, 1, 0);
        }
        Op::CmpSwap(r) => {
            wr.opcode = o::IBV_WR_ATOMIC_CMP_AND_SWP;
            wr.wr.atomic = atomic(r, 0, 0);
        }
    }
    wr
}

impl RawPath {
    /// What a poll that found `n` completions does with them (a function of
    /// its own, so that callgrind prices it apart from the empty polls of a
    /// busy wait: see `.ci/bench/guest`).
    #[inline(never)]
    fn completions(&mut self, n: usize, p: &mut Progress) -> Res<()> {
        for i in 0..n {
            let wc = &self.wcs[i];
            let q = self
                .qpns
                .iter()
                .position(|&n| n == wc.qp_num())
                .ok_or_else(|| format!("completion for unknown QP {:#x}", wc.qp_num()))?;
            if !wc.is_success() {
                return Err(wc_error(wc));
            }
            let id = wc.wr_id();
            if id & RECV != 0 {
                self.rx[q].free.push(id as u32);
                self.rx_out[q] -= 1;
                p.recvs_done[q] += 1;
            } else {
                // A send completion ends every earlier send of its QP.
                self.tx_done[q] = id;
                p.sends_done[q] = id;
            }
        }
        Ok(())
    }
}

impl DataPath for RawPath {
    fn prepare(&mut self, plan: &Plan) -> Res<()> {
        if self.tx_posted != self.tx_done || self.rx_out.iter().any(|&n| n != 0) {
            return Err("internal: requests of the last size are still outstanding".into());
        }
        self.tx.clear();
        self.rx.clear();
        let len = plan.size;
        let inline = if plan.inline {
            sys::ibv_send_flags::IBV_SEND_INLINE.0
        } else {
            0
        };
        for q in 0..self.conn.qps.len() {
            let mr = self
                .conn
                .pd
                .register(plan.tx_depth * len, AccessFlags::LOCAL_WRITE)
                .or_fail("Couldn't register the send buffers")?;
            let tmpl = template(Op::of(plan, self.conn.remote[q]));
            let sge = sys::ibv_sge {
                addr: mr.addr(),
                length: len as u32,
                lkey: mr.lkey(),
            };
            self.tx.push(Tx {
                base: mr.addr(),
                slot_len: len,
                slots: plan.tx_depth,
                next_slot: 0,
                wrs: vec![tmpl; plan.post_list],
                sges: vec![sge; plan.post_list],
                flags: inline,
            });
            self.keep.push(mr);
            if plan.rx_bufs > 0 {
                let mr = self
                    .conn
                    .pd
                    .register(plan.rx_bufs * len, AccessFlags::LOCAL_WRITE)
                    .or_fail("Couldn't register the receive buffers")?;
                let sge = sys::ibv_sge {
                    addr: mr.addr(),
                    length: len as u32,
                    lkey: mr.lkey(),
                };
                let wr = sys::ibv_recv_wr {
                    wr_id: 0,
                    next: ptr::null_mut(),
                    sg_list: ptr::null_mut(),
                    num_sge: 1,
                };
                let mut free = Vec::with_capacity(plan.rx_bufs);
                free.extend((0..plan.rx_bufs as u32).rev());
                self.rx.push(Rx {
                    base: mr.addr(),
                    slot_len: len,
                    free,
                    wrs: vec![wr; RECV_CHAIN],
                    sges: vec![sge; RECV_CHAIN],
                });
                self.keep.push(mr);
            }
        }
        self.tx_posted.iter_mut().for_each(|x| *x = 0);
        self.tx_done.iter_mut().for_each(|x| *x = 0);
        self.plan = Some(*plan);
        Ok(())
    }

    #[inline(never)]
    fn post(&mut self, q: usize, first: u64, n: usize) -> Res<()> {
        let plan = self.plan()?;
        let t = &mut self.tx[q];
        if n == 0 || n > t.wrs.len() {
            return Err(format!("internal: a chain of {n} requests"));
        }
        let signaled = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let base = t.wrs.as_mut_ptr();
        let sbase = t.sges.as_mut_ptr();
        for i in 0..n {
            let seq = first + i as u64;
            let addr = t.base + (t.next_slot * t.slot_len) as u64;
            t.next_slot += 1;
            if t.next_slot == t.slots {
                t.next_slot = 0;
            }
            let flags = t.flags | if plan.signaled(seq) { signaled } else { 0 };
            let next = if i + 1 < n {
                base.wrapping_add(i + 1)
            } else {
                ptr::null_mut()
            };
            // `i < n <= wrs.len() == sges.len()`, so both element pointers
            // are in bounds; no reference to either vector's elements is
            // alive (they are only reached through these base pointers
            // until the post below returns).
            // SAFETY: in-bounds, unaliased writes to initialised elements.
            unsafe {
                let s = sbase.add(i);
                (*s).addr = addr;
                let w = base.add(i);
                (*w).wr_id = seq;
                (*w).send_flags = flags;
                (*w).sg_list = s;
                (*w).next = next;
            }
        }
        // The chain is NULL-terminated, built above from `base`, whose
        // elements stay put (the vectors never grow) until the call returns.
        // Every entry names a slot of a region in `self.keep`, which lives
        // until the QPs are destroyed (`conn` is dropped first) and is freed
        // by `finish` only when every request has completed; a slot is not
        // reused before its request completed (slots == tx depth, round
        // robin, completions in order); Rust touches a source slot only in
        // `stamp`, between its request's completion and its next post. The
        // completions carry our own wr_ids and never reach `reclaim`.
        // SAFETY: the post_send_raw contract holds (above).
        let res = unsafe { self.conn.qps[q].post_send_raw(&mut *base) };
        self.tx_posted[q] = first + n as u64 - 1;
        res.or_fail("Couldn't post send")
    }

    fn free_recvs(&self, q: usize) -> usize {
        self.rx.get(q).map_or(0, |r| r.free.len())
    }

    #[inline(never)]
    fn post_recvs(&mut self, q: usize, n: usize) -> Res<()> {
        let r = &mut self.rx[q];
        let n = n.min(r.free.len()).min(r.wrs.len());
        if n == 0 {
            return Ok(());
        }
        let base = r.wrs.as_mut_ptr();
        let sbase = r.sges.as_mut_ptr();
        for i in 0..n {
            let slot = r.free.pop().unwrap_or(0);
            let addr = r.base + slot as u64 * r.slot_len as u64;
            let next = if i + 1 < n {
                base.wrapping_add(i + 1)
            } else {
                ptr::null_mut()
            };
            // `i < n <= wrs.len() == sges.len()`: in bounds; the elements
            // are reached only through these pointers until the post returns.
            // SAFETY: in-bounds, unaliased writes to initialised elements.
            unsafe {
                let s = sbase.add(i);
                (*s).addr = addr;
                let w = base.add(i);
                (*w).wr_id = RECV | u64::from(slot);
                (*w).sg_list = s;
                (*w).next = next;
            }
        }
        self.rx_out[q] += n as u64;
        // A NULL-terminated chain (built above) naming free slots of a
        // receive region in `self.keep` (dropped after the QPs; freed by
        // `finish` only when no receive is outstanding); Rust never reads
        // receive slots; the completions never reach `reclaim`.
        // SAFETY: the post_recv_raw contract holds (above).
        let res = unsafe { self.conn.qps[q].post_recv_raw(&mut *base) };
        res.or_fail("Couldn't post receive")
    }

    fn poll(&mut self, p: &mut Progress) -> Res<usize> {
        let n = self.conn.poll(&mut self.wcs, p)?;
        if n > 0 {
            self.completions(n, p)?;
        }
        Ok(n)
    }

    fn wait_event(&mut self) -> Res<()> {
        self.conn.wait_event()
    }

    fn stamp(&mut self, v: u8) -> Res<()> {
        let plan = self.plan()?;
        let t = &self.tx[0];
        let p = (t.base + (t.next_slot * t.slot_len) as u64) as usize + plan.size - 1;
        // `p` is the last byte of the next source slot, inside a live
        // region of `self.keep` (ibv_mr.addr is the buffer's address:
        // rdma-verbs registers its buffer with addr == iova). The region
        // is LOCAL_WRITE only (no peer writes it), and the device reads
        // this slot only while a request naming it is outstanding, which
        // the loop rules out (it stamps only when the queue has room, and
        // the slot's last request has completed). No Rust reference to the
        // region's memory exists.
        // SAFETY: valid, unaliased byte, not in use by the device (above).
        unsafe { (p as *mut u8).write_volatile(v) };
        Ok(())
    }

    fn inbox_last(&self) -> Res<u8> {
        let p = self.inbox_ptr()?;
        // `p` is inside the target region that `self.conn` keeps registered
        // (checked against its length; ibv_mr.addr is the buffer address);
        // the peer may be writing it, so it is read once, volatile, as a
        // single byte (which cannot tear), and no reference is made.
        // SAFETY: a valid byte of live memory, read without a reference.
        Ok(unsafe { p.read_volatile() })
    }

    fn clear_inbox(&mut self) -> Res<()> {
        let p = self.inbox_ptr()?;
        // As in `inbox_last`; between sizes the peer writes nothing.
        // SAFETY: a valid byte of live memory, written without a reference.
        unsafe { p.write_volatile(0) };
        Ok(())
    }

    fn finish(&mut self) -> Res<()> {
        if self.tx_posted != self.tx_done || self.rx_out.iter().any(|&n| n != 0) {
            return Err("internal: requests still outstanding at the end of a size".into());
        }
        self.tx.clear();
        self.rx.clear();
        self.keep.clear();
        Ok(())
    }
}
