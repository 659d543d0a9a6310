//! The timed loops, written once over [`DataPath`].

use std::time::{Duration, Instant};

use crate::allocs;
use crate::opts::Test;
use crate::path::{DataPath, Plan, Progress, RECV_CHAIN};
use crate::pingpong::Res;
use crate::wait::Stall;

/// What one size's run measured.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Latency tests: one sample per iteration, in microseconds.
    pub samples: Vec<f64>,
    /// The timed part.
    pub elapsed: Duration,
    /// Completed operations (iterations times QPs).
    pub ops: u64,
    pub polls: u64,
    pub empty_polls: u64,
    /// BW tests: the best rate over windows of at least a tenth of the
    /// operations (operations per second).
    pub peak_ops_per_sec: f64,
    /// Heap allocations during the timed part (by any thread).
    pub allocs: u64,
}

/// Scratch space reused by every size, so the timed loops allocate nothing.
pub struct Runner {
    p: Progress,
    posted: Vec<u64>,
    recv_posted: Vec<u64>,
    recv_total: u64,
    times: Vec<Instant>,
    marks: Vec<(Instant, u64)>,
    stall: Stall,
    qps: usize,
}

/// The last-byte value of write_lat's iteration `k` (never 0, the initial value).
fn stamp_of(k: u64) -> u8 {
    (k % 255 + 1) as u8
}

impl Runner {
    pub fn new(qps: usize) -> Self {
        Runner {
            p: Progress::new(qps),
            posted: vec![0; qps],
            recv_posted: vec![0; qps],
            recv_total: 0,
            times: Vec::new(),
            marks: Vec::new(),
            stall: Stall::new(),
            qps,
        }
    }

    /// Resets the counters for a size and, for send tests, posts the first
    /// receives (`iters` receives per QP are posted over the run, no more,
    /// so that none is left over for the next size).
    pub fn start<P: DataPath>(&mut self, path: &mut P, plan: &Plan) -> Res<()> {
        self.p.reset();
        self.posted.iter_mut().for_each(|x| *x = 0);
        self.recv_posted.iter_mut().for_each(|x| *x = 0);
        self.recv_total = if plan.rx_bufs > 0 { plan.iters } else { 0 };
        self.times.clear();
        self.marks.clear();
        // Room for every timestamp, so that the timed loops never grow them.
        let (times, marks) = if plan.test.is_lat() {
            (plan.iters as usize + 1, 0)
        } else {
            (0, (plan.iters / plan.cq_mod + 2) as usize * self.qps + 2)
        };
        self.times.try_reserve(times).map_err(|_| {
            format!("cannot allocate room for {times} latency samples: use fewer iterations")
        })?;
        self.marks.try_reserve(marks).map_err(|_| {
            format!("cannot allocate room for {marks} progress marks: use fewer iterations")
        })?;
        self.stall = Stall::new();
        for q in 0..self.qps {
            self.refill(path, q)?;
        }
        Ok(())
    }

    fn refill<P: DataPath>(&mut self, path: &mut P, q: usize) -> Res<()> {
        loop {
            let want = (self.recv_total - self.recv_posted[q])
                .min(path.free_recvs(q) as u64)
                .min(RECV_CHAIN as u64) as usize;
            if want == 0 {
                return Ok(());
            }
            path.post_recvs(q, want)?;
            self.recv_posted[q] += want as u64;
        }
    }

    /// Polls once; with `-e`, sleeps on an event when nothing was there.
    /// Keeps the receives posted.
    #[inline]
    fn pump<P: DataPath>(&mut self, path: &mut P, plan: &Plan, what: &str) -> Res<usize> {
        let n = path.poll(&mut self.p)?;
        if n == 0 {
            if plan.events {
                path.wait_event()?;
            } else {
                self.stall.idle(what)?;
            }
            return Ok(0);
        }
        self.stall.progress();
        if self.recv_total != 0 {
            for q in 0..self.qps {
                self.refill(path, q)?;
            }
        }
        Ok(n)
    }

    /// Waits until QP 0 has room for one more request.
    fn wait_room<P: DataPath>(&mut self, path: &mut P, plan: &Plan) -> Res<()> {
        while self.posted[0] - self.p.sends_done[0] >= plan.tx_depth as u64 {
            self.pump(path, plan, "a send completion")?;
        }
        Ok(())
    }

    fn post_one<P: DataPath>(&mut self, path: &mut P) -> Res<()> {
        path.post(0, self.posted[0] + 1, 1)?;
        self.posted[0] += 1;
        Ok(())
    }

    fn drain<P: DataPath>(&mut self, path: &mut P, plan: &Plan) -> Res<()> {
        for q in 0..self.qps {
            while self.p.sends_done[q] < self.posted[q] {
                self.pump(path, plan, "the last send completions")?;
            }
        }
        Ok(())
    }

    fn wait_inbox<P: DataPath>(&mut self, path: &mut P, v: u8) -> Res<()> {
        while path.inbox_last()? != v {
            self.stall.idle("the peer's RDMA write")?;
        }
        self.stall.progress();
        Ok(())
    }

    /// The client's timed run of one size.
    pub fn client<P: DataPath>(&mut self, path: &mut P, plan: &Plan) -> Res<Outcome> {
        if plan.test.is_lat() {
            self.client_lat(path, plan)
        } else {
            self.client_bw(path, plan)
        }
    }

    fn client_lat<P: DataPath>(&mut self, path: &mut P, plan: &Plan) -> Res<Outcome> {
        let allocs0 = allocs::count();
        let start = Instant::now();
        self.timed_client_lat(path, plan)?;
        let elapsed = start.elapsed();
        let allocs = allocs::count() - allocs0;
        let (polls, empty_polls) = (self.p.polls, self.p.empty_polls);
        self.drain(path, plan)?;
        Ok(Outcome {
            samples: self.samples(plan),
            elapsed,
            ops: plan.iters,
            polls,
            empty_polls,
            peak_ops_per_sec: 0.0,
            allocs,
        })
    }

    /// The client's latency loop (a function of its own, so that callgrind
    /// can count it alone: `--toggle-collect='*timed_*'`).
    #[inline(never)]
    fn timed_client_lat<P: DataPath>(&mut self, path: &mut P, plan: &Plan) -> Res<()> {
        // Each timestamp is taken right after a post, while the request is
        // on its way, so reading the clock is not on the round trip's path.
        for k in 0..plan.iters {
            self.wait_room(path, plan)?;
            match plan.test {
                Test::SendLat => {
                    self.post_one(path)?;
                    self.times.push(Instant::now());
                    while self.p.recvs_done[0] <= k {
                        self.pump(path, plan, "the server's reply")?;
                    }
                }
                Test::WriteLat => {
                    path.stamp(stamp_of(k))?;
                    self.post_one(path)?;
                    self.times.push(Instant::now());
                    self.wait_inbox(path, stamp_of(k))?;
                }
                _ => {
                    self.post_one(path)?;
                    self.times.push(Instant::now());
                    while self.p.sends_done[0] < self.posted[0] {
                        self.pump(path, plan, "the completion")?;
                    }
                }
            }
        }
        self.times.push(Instant::now());
        Ok(())
    }

    fn samples(&self, plan: &Plan) -> Vec<f64> {
        let half = matches!(plan.test, Test::SendLat | Test::WriteLat);
        self.times
            .windows(2)
            .map(|w| {
                let us = (w[1] - w[0]).as_secs_f64() * 1e6;
                if half {
                    us / 2.0
                } else {
                    us
                }
            })
            .collect()
    }

    fn client_bw<P: DataPath>(&mut self, path: &mut P, plan: &Plan) -> Res<Outcome> {
        let total = plan.iters * self.qps as u64;
        let allocs0 = allocs::count();
        let start = Instant::now();
        self.marks.push((start, 0));
        self.timed_client_bw(path, plan)?;
        let elapsed = start.elapsed();
        Ok(Outcome {
            samples: Vec::new(),
            elapsed,
            ops: total,
            polls: self.p.polls,
            empty_polls: self.p.empty_polls,
            peak_ops_per_sec: peak(&self.marks, total),
            allocs: allocs::count() - allocs0,
        })
    }

    /// The client's bandwidth loop (see [`timed_client_lat`](Self::timed_client_lat)).
    #[inline(never)]
    fn timed_client_bw<P: DataPath>(&mut self, path: &mut P, plan: &Plan) -> Res<()> {
        let iters = plan.iters;
        let total = iters * self.qps as u64;
        let window = plan.tx_depth as u64;
        let mut done_total = 0u64;
        while done_total < total {
            for q in 0..self.qps {
                loop {
                    let left = iters - self.posted[q];
                    let n = (plan.post_list as u64).min(left);
                    if n == 0 || self.posted[q] - self.p.sends_done[q] + n > window {
                        break;
                    }
                    path.post(q, self.posted[q] + 1, n as usize)?;
                    self.posted[q] += n;
                }
            }
            if self.pump(path, plan, "send completions")? > 0 {
                let done: u64 = self.p.sends_done.iter().sum();
                if done != done_total {
                    done_total = done;
                    if self.marks.len() < self.marks.capacity() {
                        self.marks.push((Instant::now(), done));
                    }
                }
            }
        }
        Ok(())
    }

    /// The server's part of one size (send_lat, write_lat, send_bw); the
    /// other tests leave the server passive.
    pub fn server<P: DataPath>(&mut self, path: &mut P, plan: &Plan) -> Res<Outcome> {
        let allocs0 = allocs::count();
        if plan.test == Test::SendBw {
            let elapsed = self.timed_server_bw(path, plan)?;
            return Ok(Outcome {
                elapsed,
                ops: plan.iters * self.qps as u64,
                polls: self.p.polls,
                empty_polls: self.p.empty_polls,
                allocs: allocs::count() - allocs0,
                ..Default::default()
            });
        }
        let start = Instant::now();
        self.timed_server_lat(path, plan)?;
        let elapsed = start.elapsed();
        let allocs = allocs::count() - allocs0;
        self.drain(path, plan)?;
        Ok(Outcome {
            samples: self.samples(plan),
            elapsed,
            ops: plan.iters,
            polls: self.p.polls,
            empty_polls: self.p.empty_polls,
            peak_ops_per_sec: 0.0,
            allocs,
        })
    }

    /// send_bw's server: counts receives; the time from the first to the last.
    #[inline(never)]
    fn timed_server_bw<P: DataPath>(&mut self, path: &mut P, plan: &Plan) -> Res<Duration> {
        let total = plan.iters * self.qps as u64;
        let mut start = None;
        loop {
            let got: u64 = self.p.recvs_done.iter().sum();
            if got >= total {
                break;
            }
            if self.pump(path, plan, "the client's sends")? > 0 && start.is_none() {
                start = Some(Instant::now());
            }
        }
        Ok(start.map_or(Duration::ZERO, |s| s.elapsed()))
    }

    /// The server's side of the ping-pong (send_lat, write_lat).
    #[inline(never)]
    fn timed_server_lat<P: DataPath>(&mut self, path: &mut P, plan: &Plan) -> Res<()> {
        for k in 0..plan.iters {
            match plan.test {
                Test::SendLat => {
                    while self.p.recvs_done[0] <= k {
                        self.pump(path, plan, "the client's message")?;
                    }
                    self.wait_room(path, plan)?;
                    self.post_one(path)?;
                    self.times.push(Instant::now());
                }
                Test::WriteLat => {
                    self.wait_inbox(path, stamp_of(k))?;
                    self.wait_room(path, plan)?;
                    path.stamp(stamp_of(k))?;
                    self.post_one(path)?;
                    self.times.push(Instant::now());
                }
                other => return Err(format!("{} has a passive server", other.name())),
            }
        }
        self.times.push(Instant::now());
        Ok(())
    }
}

/// The best rate over any stretch of the run that covers at least a tenth
/// of the operations (a single batch of completions would otherwise look
/// infinitely fast).
fn peak(marks: &[(Instant, u64)], total: u64) -> f64 {
    let need = (total / 10).max(1);
    let mut best = 0.0f64;
    let mut i = 0;
    for j in 0..marks.len() {
        while i + 1 < j && marks[j].1 - marks[i + 1].1 >= need {
            i += 1;
        }
        if i < j && marks[j].1 - marks[i].1 >= need {
            let dt = (marks[j].0 - marks[i].0).as_secs_f64();
            if dt > 0.0 {
                best = best.max((marks[j].1 - marks[i].1) as f64 / dt);
            }
        }
    }
    best
}
