//! The command line of `perf`: the test name, perftest's option names, and
//! the defaults that depend on the test.

use crate::pingpong::{getopt_long, opt, parse_c_int, OptDef};

/// The largest message size (`-a` goes up to it).
pub const MAX_SIZE: usize = 1 << 23;

/// What the program measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    SendLat,
    SendBw,
    WriteLat,
    WriteBw,
    ReadLat,
    ReadBw,
    AtomicLat,
    AtomicBw,
}

/// The verb a test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Send,
    Write,
    Read,
    Atomic,
}

impl Test {
    const ALL: [(&'static str, Test); 8] = [
        ("send_lat", Test::SendLat),
        ("send_bw", Test::SendBw),
        ("write_lat", Test::WriteLat),
        ("write_bw", Test::WriteBw),
        ("read_lat", Test::ReadLat),
        ("read_bw", Test::ReadBw),
        ("atomic_lat", Test::AtomicLat),
        ("atomic_bw", Test::AtomicBw),
    ];

    pub fn parse(s: &str) -> Option<Test> {
        Self::ALL.iter().find(|(n, _)| *n == s).map(|&(_, t)| t)
    }

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, t)| *t == self)
            .map_or("?", |(n, _)| n)
    }

    pub fn is_lat(self) -> bool {
        matches!(
            self,
            Test::SendLat | Test::WriteLat | Test::ReadLat | Test::AtomicLat
        )
    }

    pub fn verb(self) -> Verb {
        match self {
            Test::SendLat | Test::SendBw => Verb::Send,
            Test::WriteLat | Test::WriteBw => Verb::Write,
            Test::ReadLat | Test::ReadBw => Verb::Read,
            Test::AtomicLat | Test::AtomicBw => Verb::Atomic,
        }
    }

    /// perftest's title line.
    pub fn title(self) -> &'static str {
        match self {
            Test::SendLat => "Send Latency Test",
            Test::SendBw => "Send BW Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::WriteBw => "RDMA_Write BW Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::AtomicLat => "Atomic FETCH_AND_ADD Latency Test",
            Test::AtomicBw => "Atomic FETCH_AND_ADD BW Test",
        }
    }

    /// Whether the server answers (ping-pong) rather than stays passive.
    pub fn server_active(self) -> bool {
        matches!(self, Test::SendLat | Test::SendBw | Test::WriteLat)
    }
}

/// Which of the crate's data paths posts the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// The safe path: `post_send`/`post_recv` with `SendWr`/`RecvWr`.
    Safe,
    /// `--raw`: `post_send_raw`/`post_recv_raw` with `sys` structs.
    Raw,
    /// `--ex`: the safe path's requests through an extended QP's
    /// `ibv_wr_*` batch (`start_batch`, `post`, `complete`).
    Ex,
}

impl PathKind {
    /// The name in the header and in `perf-result:` lines.
    pub fn name(self) -> &'static str {
        match self {
            PathKind::Safe => "safe",
            PathKind::Raw => "raw",
            PathKind::Ex => "ex",
        }
    }
}

/// `-A`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicType {
    CmpAndSwap,
    FetchAndAdd,
}

/// Everything the command line says.
#[derive(Debug, Clone)]
pub struct Opts {
    pub test: Test,
    pub server: Option<String>,
    pub dev: Option<String>,
    pub ib_port: u8,
    pub gid_index: Option<u8>,
    pub tcp_port: u16,
    /// The sizes to run, in order (`-s`, or every power of two with `-a`).
    pub sizes: Vec<usize>,
    pub all: bool,
    pub iters: u64,
    pub tx_depth: usize,
    pub post_list: usize,
    pub cq_mod: usize,
    pub inline_size: usize,
    pub qps: usize,
    pub events: bool,
    pub atomic: AtomicType,
    pub rx_depth: usize,
    pub path: PathKind,
    /// `--recv-buffers`: the safe path's receives from queue-owned
    /// buffers (`RecvBuffers`) rather than chunks it moves itself.
    pub recv_buffers: bool,
    /// `--async`: sleep on CQ events through tokio (`rdma_verbs::tokio::AsyncCq`
    /// on a current-thread runtime) rather than in `ibv_get_cq_event`;
    /// implies `events`.
    pub async_wait: bool,
}

/// `--raw` and `--ex` have no short form.
const RAW: char = '\0';
const EX: char = '\u{1}';
const RECV_BUFFERS: char = '\u{2}';
const ASYNC: char = '\u{3}';

const OPTS: &[OptDef] = &[
    opt('d', "ib-dev", true),
    opt('i', "ib-port", true),
    opt('x', "gid-index", true),
    opt('p', "port", true),
    opt('s', "size", true),
    opt('a', "all", false),
    opt('n', "iters", true),
    opt('t', "tx-depth", true),
    opt('l', "post_list", true),
    opt('Q', "cq-mod", true),
    opt('I', "inline_size", true),
    opt('q', "qp", true),
    opt('e', "events", false),
    opt('A', "atomic_type", true),
    opt('r', "rx-depth", true),
    opt(RAW, "raw", false),
    opt(EX, "ex", false),
    opt(RECV_BUFFERS, "recv-buffers", false),
    opt(ASYNC, "async", false),
    opt('F', "CPU-freq", false),
    opt('h', "help", false),
];

pub const USAGE: &str = "\
Usage:
  perf TEST [OPTIONS]          start a server and wait for a connection
  perf TEST [OPTIONS] HOST     connect to the server at HOST and run TEST

TEST: send_lat send_bw write_lat write_bw read_lat read_bw atomic_lat atomic_bw

Options (both ends must be given the same TEST and options):
  -d, --ib-dev=DEV          RDMA device (default: the first one)
  -i, --ib-port=N           port of the device (default 1)
  -x, --gid-index=N         local GID index (default: none on IB, 0 on Ethernet)
  -p, --port=N              TCP port (default 18515)
  -s, --size=BYTES          message size (default 2 for lat, 65536 for bw; atomics: 8)
  -a, --all                 every size 2, 4, ... 2^23
  -n, --iters=N             iterations (default 1000 for lat, 5000 for bw)
  -t, --tx-depth=N          send queue depth (default 1 for lat, 128 for bw)
  -l, --post_list=N         requests per post call (bw, default 1)
  -Q, --cq-mod=N            one signalled completion every N requests (bw, default 100, at most tx-depth)
  -I, --inline_size=N       send/write sizes up to N go inline (default 0)
  -q, --qp=N                number of QPs, round robin (bw, default 1)
  -e, --events              sleep on CQ events instead of busy polling
      --async               sleep on CQ events through tokio (AsyncCq)
  -A, --atomic_type=TYPE    CMP_AND_SWAP or FETCH_AND_ADD (default FETCH_AND_ADD)
  -r, --rx-depth=N          receives kept posted (send tests, default 512, at most iters)
      --raw                 the raw path: sys structs, post_send_raw/post_recv_raw
      --ex                  the safe path's requests through an extended QP's batch
      --recv-buffers        the safe path's receives from queue-owned buffers (RecvBuffers)
                            (start_batch, post, complete; -l requests per batch)
  -F, --CPU-freq            accepted and ignored
  -h, --help                this text";

fn number(c: char, v: &str, min: i64, max: i64) -> Result<i64, String> {
    match parse_c_int(v) {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        Some(n) => Err(format!("-{c} {n} is out of range {min}..={max}")),
        None => Err(format!("invalid number '{v}' for -{c}")),
    }
}

/// Parses `args` (without the program name). `Err("")` asks for the usage
/// text alone (`-h`).
pub fn parse(args: &[String]) -> Result<Opts, String> {
    let (found, positional) = getopt_long("perf", args, OPTS)?;
    let (test, server) = match positional.as_slice() {
        [] if found.iter().any(|(c, _)| *c == 'h') => return Err(String::new()),
        [] => return Err("no TEST given".into()),
        [t] => (t, None),
        [t, host] => (t, Some(host.clone())),
        more => return Err(format!("too many arguments: {:?}", &more[2..])),
    };
    let test = Test::parse(test).ok_or_else(|| format!("unknown TEST '{test}'"))?;
    let lat = test.is_lat();
    let mut o = Opts {
        test,
        server,
        dev: None,
        ib_port: 1,
        gid_index: None,
        tcp_port: 18515,
        sizes: Vec::new(),
        all: false,
        iters: if lat { 1000 } else { 5000 },
        tx_depth: if lat { 1 } else { 128 },
        post_list: 1,
        cq_mod: 100,
        inline_size: 0,
        qps: 1,
        events: false,
        atomic: AtomicType::FetchAndAdd,
        rx_depth: 512,
        path: PathKind::Safe,
        recv_buffers: false,
        async_wait: false,
    };
    let mut size = None;
    let mut tx_given = false;
    let mut cq_mod_given = false;
    let max_u32 = i64::from(u32::MAX);
    for (c, v) in found {
        let v = v.as_deref().unwrap_or("");
        match c {
            'd' => o.dev = Some(v.to_owned()),
            'i' => o.ib_port = number(c, v, 1, 255)? as u8,
            'x' => o.gid_index = Some(number(c, v, 0, 255)? as u8),
            'p' => o.tcp_port = number(c, v, 1, 65535)? as u16,
            's' => size = Some(number(c, v, 1, MAX_SIZE as i64)? as usize),
            'a' => o.all = true,
            'n' => o.iters = number(c, v, 5, i64::from(i32::MAX))? as u64,
            't' => {
                o.tx_depth = number(c, v, 1, 16384)? as usize;
                tx_given = true;
            }
            'l' => o.post_list = number(c, v, 1, 4096)? as usize,
            'Q' => {
                o.cq_mod = number(c, v, 1, max_u32)? as usize;
                cq_mod_given = true;
            }
            'I' => o.inline_size = number(c, v, 0, 4096)? as usize,
            'q' => o.qps = number(c, v, 1, 256)? as usize,
            'e' => o.events = true,
            'A' => {
                o.atomic = match v {
                    "CMP_AND_SWAP" => AtomicType::CmpAndSwap,
                    "FETCH_AND_ADD" => AtomicType::FetchAndAdd,
                    _ => {
                        return Err(format!(
                            "-A {v}: the atomic type is CMP_AND_SWAP or FETCH_AND_ADD"
                        ))
                    }
                }
            }
            'r' => o.rx_depth = number(c, v, 1, 16384)? as usize,
            RAW | EX => {
                let want = if c == RAW {
                    PathKind::Raw
                } else {
                    PathKind::Ex
                };
                if o.path != PathKind::Safe && o.path != want {
                    return Err("--raw and --ex cannot be given together".into());
                }
                o.path = want;
            }
            RECV_BUFFERS => o.recv_buffers = true,
            ASYNC => {
                o.async_wait = true;
                o.events = true;
            }
            'F' => {}
            'h' => return Err(String::new()),
            _ => return Err(format!("option -{c} is not handled")),
        }
    }
    if o.recv_buffers && o.path == PathKind::Raw {
        return Err("--recv-buffers is a safe-path option, not --raw's".into());
    }
    if o.atomic == AtomicType::CmpAndSwap && test.verb() != Verb::Atomic {
        return Err("-A applies to the atomic tests only".into());
    }
    if lat {
        if o.qps > 1 {
            return Err(format!("-q {}: latency tests run one QP", o.qps));
        }
        if o.post_list > 1 {
            return Err(format!(
                "-l {}: latency tests post one request at a time",
                o.post_list
            ));
        }
    }
    if test == Test::WriteLat && o.events {
        return Err(
            "-e and --async are not supported for write_lat: it detects arrivals by polling memory"
                .into(),
        );
    }
    if !tx_given && !lat && o.post_list > o.tx_depth {
        o.tx_depth = o.post_list;
    }
    if o.post_list > o.tx_depth {
        return Err(format!(
            "-l {} is more than the tx depth {}",
            o.post_list, o.tx_depth
        ));
    }
    if cq_mod_given && o.cq_mod > o.tx_depth {
        eprintln!(
            "perf: -Q {} is more than the tx depth: using {}",
            o.cq_mod, o.tx_depth
        );
    }
    o.cq_mod = o.cq_mod.min(o.tx_depth);
    if !lat && o.post_list > 1 && o.cq_mod % o.post_list != 0 {
        let m = (o.cq_mod - o.cq_mod % o.post_list).max(o.post_list);
        eprintln!(
            "perf: -Q {} is not a multiple of the post list {}: using {m}",
            o.cq_mod, o.post_list
        );
        o.cq_mod = m;
    }
    o.rx_depth = o.rx_depth.min(o.iters.min(16384) as usize);
    o.sizes = if test.verb() == Verb::Atomic {
        if size.is_some_and(|s| s != 8) {
            return Err("atomics are 8 bytes: -s must be 8 (or left out)".into());
        }
        vec![8]
    } else if o.all {
        (1..=23).map(|e| 1usize << e).collect()
    } else {
        vec![size.unwrap_or(if lat { 2 } else { 65536 })]
    };
    Ok(o)
}

impl Opts {
    pub fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(8)
    }

    /// What both ends must agree on, sent in the hello.
    pub fn fingerprint(&self) -> String {
        format!(
            "test={} sizes={}..{}x{} iters={} qps={} atomic={:?}",
            self.test.name(),
            self.sizes.first().copied().unwrap_or(0),
            self.max_size(),
            self.sizes.len(),
            self.iters,
            self.qps,
            self.atomic
        )
    }
}
