//! Shared by the device test binaries: picks the device, and reports the
//! tests as ignored (not passed) when there is none, or as failed when the
//! run demands a device.
//!
//! Environment:
//! * `RDMA_VERBS_DEVICE`: the device to test (default: the first one);
//!   `none` skips every device test even where a device exists (`.ci/vm
//!   test` runs each test executable so on the host first, to find those
//!   that need no device);
//! * `RDMA_VERBS_PORT`: the port to test (default: 1);
//! * `RDMA_VERBS_REQUIRE_DEVICE=1`: a missing device fails every test
//!   instead of skipping it (the VM run always sets it);
//! * `RDMA_VERBS_EXPECT_LIBIBVERBS=<release>`: the rdma-core release of the
//!   libibverbs the tests must run with (a run against another rdma-core's
//!   libraries, `LD_LIBRARY_PATH` at them); any other fails the run;
//! * `RDMA_VERBS_ALLOW_UNSUPPORTED=1`: a test that [`Need`]s a verb the
//!   device's provider lacks (rxe of rdma-core 33 has no `ibv_create_qp_ex`,
//!   `ibv_create_cq_ex` or memory windows) is reported skipped, with the crate's typed
//!   refusal as the reason, even where a device is required. Without it such
//!   a test runs (and fails) wherever a device is required, so that a run
//!   against the newest rdma-core can never skip quietly.
#![allow(dead_code)]

use std::process::ExitCode;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use rdma_verbs::qp::SendOpsFlags;
use rdma_verbs::{Context, DeviceList, Error, MwType, QpInitAttr, QpType};

/// What a device test gets: an open context on the chosen device, and the port.
pub struct Env {
    pub ctx: Context,
    pub port: u8,
}

pub type TestFn = fn(&Env) -> Result<(), Failed>;

// The tables of tests, each named by its function's path (`tests!`).
#[macro_use]
pub mod registry;
pub use registry::Test;

/// Whether the run demands a device.
pub fn device_required() -> bool {
    matches!(
        std::env::var("RDMA_VERBS_REQUIRE_DEVICE").as_deref(),
        Ok("1" | "true" | "yes")
    )
}

/// The name of the device to test, or why there is none.
pub fn device_name() -> Result<String, String> {
    let list = DeviceList::new().map_err(|e| e.to_string())?;
    match std::env::var("RDMA_VERBS_DEVICE") {
        Ok(name) if name == "none" => {
            Err("RDMA_VERBS_DEVICE=none: no device tests here".to_owned())
        }
        Ok(name) if !name.is_empty() => list
            .find(&name)
            .map(|d| d.name().to_owned())
            .map_err(|e| format!("{e} (RDMA_VERBS_DEVICE={name})")),
        _ => list
            .get(0)
            .map(|d| d.name().to_owned())
            .ok_or_else(|| "no RDMA devices on this machine".to_owned()),
    }
}

pub fn port() -> u8 {
    std::env::var("RDMA_VERBS_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(1)
}

/// Opens the test device.
pub fn env() -> Result<Env, Failed> {
    let name = device_name()?;
    let ctx = Context::open(&name).map_err(|e| format!("opening {name}: {e}"))?;
    Ok(Env { ctx, port: port() })
}

/// A verb some providers lack, which a test cannot do without.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// `ibv_create_qp_ex` with send operations (`ibv_wr_*` batches).
    ExtendedQp,
    /// `ibv_create_cq_ex`.
    ExtendedCq,
    /// `ibv_alloc_mw` (a type 2 window).
    MemoryWindows,
}

impl Need {
    /// Asks the device once: `Some(refusal)` when the crate answers
    /// `Error::Unsupported` (the typed refusal is itself what is checked:
    /// any other error is no reason to skip).
    fn missing(self, env: &Env) -> Option<String> {
        let refused = |r: Result<(), Error>| match r {
            Err(e @ Error::Unsupported { .. }) => Some(e.to_string()),
            _ => None,
        };
        match self {
            Need::ExtendedCq => refused(env.ctx.create_cq_ex(16).standard().build().map(drop)),
            Need::MemoryWindows => {
                let pd = env.ctx.alloc_pd().ok()?;
                refused(pd.alloc_mw(MwType::Type2).map(drop))
            }
            Need::ExtendedQp => {
                let pd = env.ctx.alloc_pd().ok()?;
                let cq = env.ctx.create_cq(16).ok()?;
                let attr = QpInitAttr::new(QpType::Rc, &cq, &cq).send_ops(SendOpsFlags::SEND);
                refused(pd.create_qp(&attr).map(drop))
            }
        }
    }
}

/// Whether a run may skip what the provider lacks (`RDMA_VERBS_ALLOW_UNSUPPORTED`).
fn unsupported_allowed() -> bool {
    matches!(
        std::env::var("RDMA_VERBS_ALLOW_UNSUPPORTED").as_deref(),
        Ok("1" | "true" | "yes")
    )
}

/// Runs `tests` as libtest-mimic trials, with the command line's arguments.
pub fn run(binary: &str, tests: &[Test]) -> ExitCode {
    run_needing(binary, tests, &[])
}

/// Runs `tests`, where `needs` names what some of them cannot do without:
/// each entry is a test's full name, a module's prefix ending in `::`, or
/// a prefix followed by `*`.
/// A test whose need the device refuses is skipped with the refusal as
/// its reason when the run allows it (see the module's docs).
pub fn run_needing(binary: &str, tests: &[Test], needs: &[(&'static str, Need)]) -> ExitCode {
    run_with(binary, tests, needs, Arguments::from_args())
}

fn matches_need(name: &str, pat: &str) -> bool {
    if let Some(prefix) = pat.strip_suffix('*') {
        name.starts_with(prefix)
    } else if pat.ends_with("::") {
        name.starts_with(pat)
    } else {
        name == pat
    }
}

/// For each [`Need`] of `needs` the device refuses: the refusal.
fn refusals(binary: &str, needs: &[(&'static str, Need)]) -> Vec<(Need, String)> {
    let Ok(env) = env() else { return Vec::new() };
    let mut out = Vec::new();
    for need in [Need::ExtendedQp, Need::ExtendedCq, Need::MemoryWindows] {
        let n = needs.iter().filter(|&&(_, k)| k == need).count();
        if n == 0 {
            continue;
        }
        if let Some(why) = need.missing(&env) {
            if unsupported_allowed() || !device_required() {
                eprintln!("{binary}: SKIPPED what needs {need:?} ({n} name(s)): {why}");
            } else {
                eprintln!(
                    "{binary}: the device refuses {need:?} ({why}); the tests that need it run \
                     and fail (set RDMA_VERBS_ALLOW_UNSUPPORTED=1 to skip them)"
                );
                continue;
            }
            out.push((need, why));
        }
    }
    out
}

/// Runs `tests` as libtest-mimic trials; `needs` as for [`run_needing`].
pub fn run_with(
    binary: &str,
    tests: &[Test],
    needs: &[(&'static str, Need)],
    args: Arguments,
) -> ExitCode {
    run_ignoring(binary, tests, needs, &[], args)
}

/// [`run_with`], where the tests `ignored` names (full names) are reported
/// ignored with the reason beside each: what they compare does not exist
/// here (a C program of another shape), never what they check failing.
pub fn run_ignoring(
    binary: &str,
    tests: &[Test],
    needs: &[(&'static str, Need)],
    ignored: &[(&'static str, String)],
    args: Arguments,
) -> ExitCode {
    for (name, why) in ignored {
        if !tests.iter().any(|t| t.name() == *name) {
            eprintln!("{binary}: `{name}` is no test");
            return ExitCode::FAILURE;
        }
        eprintln!("{binary}: SKIPPED {name}: {why}");
    }
    for &(pat, _) in needs {
        if !tests.iter().any(|t| matches_need(t.name(), pat)) {
            eprintln!("{binary}: the need `{pat}` names no test");
            return ExitCode::FAILURE;
        }
    }
    let device = device_name();
    let skip = match &device {
        Ok(name) => {
            let lib = rdma_verbs::sys::loaded_libibverbs();
            let (path, release) = lib.map_or((None, None), |l| (Some(l.path), l.release));
            eprintln!(
                "{binary}: device tests run against {name}, port {}, with {} (rdma-core {}; built against {})",
                port(),
                path.as_deref().map_or("an unknown libibverbs".into(), |p| p.display().to_string()),
                release.map_or("?".into(), |r| r.to_string()),
                rdma_verbs::sys::RDMA_CORE_RELEASE.map_or("?".into(), |r| r.to_string()),
            );
            // A run against another rdma-core names the one it must load.
            if let Ok(want) = std::env::var("RDMA_VERBS_EXPECT_LIBIBVERBS") {
                if release != want.parse().ok() {
                    eprintln!("{binary}: RDMA_VERBS_EXPECT_LIBIBVERBS={want}, but that is not the libibverbs loaded");
                    return ExitCode::FAILURE;
                }
            }
            false
        }
        Err(why) if device_required() => {
            eprintln!("{binary}: RDMA_VERBS_REQUIRE_DEVICE is set but there is no device: {why}");
            false
        }
        Err(why) => {
            eprintln!(
                "{binary}: SKIPPED {} device tests: {why} \
                 (set RDMA_VERBS_REQUIRE_DEVICE=1 to make this a failure)",
                tests.len()
            );
            true
        }
    };
    let refused = if device.is_ok() {
        refusals(binary, needs)
    } else {
        Vec::new()
    };
    let trials = tests
        .iter()
        .map(|t| {
            let (name, f) = (t.name(), t.f);
            let why = needs
                .iter()
                .filter(|&&(pat, _)| matches_need(name, pat))
                .find_map(|&(_, need)| refused.iter().find(|(n, _)| *n == need))
                .map(|(need, why)| format!("needs {need:?}: {why}"))
                .or_else(|| {
                    ignored
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, w)| w.clone())
                });
            Trial::ignorable_test(name, move || {
                if let Some(why) = why {
                    return Ok(Completion::ignored_with(why));
                }
                let env = env()?;
                f(&env).map(|()| Completion::Completed)
            })
            .with_ignored_flag(skip)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// Fails with a message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+).into());
        }
    };
}

// `scaled(base)`: `base` times `RDMA_VERBS_TIME_SCALE`, the one reading of
// that variable the examples use too.
#[path = "../../examples/common/time.rs"]
mod time;
pub use time::scaled;

// Child processes: running the examples and rdma-core's C programs.
pub mod procs;

/// xorshift64*: a seeded, reproducible sequence, for the model tests.
pub struct Rng(pub u64);

impl Rng {
    /// The next number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Whether the test runs under valgrind's memcheck: `.ci/vm test --valgrind`
/// sets `RDMA_VERBS_VALGRIND=1`. A stress loop runs fewer rounds there.
pub fn under_valgrind() -> bool {
    std::env::var("RDMA_VERBS_VALGRIND").as_deref() == Ok("1")
}

/// How long a test waits for something that must happen (completions, an
/// event, a drain): `RDMA_VERBS_TEST_DEADLINE_SECS` if set, else 20 s
/// [`scaled`].
pub fn deadline() -> std::time::Duration {
    match std::env::var("RDMA_VERBS_TEST_DEADLINE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(secs) => std::time::Duration::from_secs(secs),
        None => scaled(std::time::Duration::from_secs(20)),
    }
}

/// Connection options on the test port with `access`.
pub fn opts(env: &Env, access: rdma_verbs::AccessFlags) -> rdma_verbs::qp::ConnectOptions {
    rdma_verbs::qp::ConnectOptions {
        port: env.port,
        access,
        ..Default::default()
    }
}

/// Two connected QPs of one type on one device, sharing one CQ.
pub struct Pair {
    pub pd: rdma_verbs::ProtectionDomain,
    pub cq: rdma_verbs::CompletionQueue,
    pub a: rdma_verbs::QueuePair,
    pub b: rdma_verbs::QueuePair,
}

/// Two QPs of type `t` with `caps`, connected to each other (RTS).
pub fn pair(
    env: &Env,
    t: rdma_verbs::QpType,
    caps: rdma_verbs::QpCaps,
    access: rdma_verbs::AccessFlags,
) -> Result<Pair, Failed> {
    use rdma_verbs::QpInitAttr;
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(256)?;
    let mut a = pd.create_qp(&QpInitAttr::new(t, &cq, &cq).caps(caps))?;
    let mut b = pd.create_qp(&QpInitAttr::new(t, &cq, &cq).caps(caps))?;
    connect(env, &mut a, &mut b, access)?;
    Ok(Pair { pd, cq, a, b })
}

/// Two RC QPs made for every RC operation of the `ibv_wr_*` API
/// (`send_ops`), connected to each other (RTS), sharing one CQ of 64.
pub fn ex_rc_pair(env: &Env, access: rdma_verbs::AccessFlags) -> Result<Pair, Failed> {
    use rdma_verbs::qp::SendOpsFlags;
    use rdma_verbs::{QpInitAttr, QpType};
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let attr =
        QpInitAttr::new(QpType::Rc, &cq, &cq).send_ops(SendOpsFlags::for_transport(QpType::Rc));
    let mut a = pd.create_qp(&attr)?;
    let mut b = pd.create_qp(&attr)?;
    connect(env, &mut a, &mut b, access)?;
    Ok(Pair { pd, cq, a, b })
}

/// Takes two fresh QPs to RTS, connected to each other (UD: each brought
/// up on its own, with the Q_Key of [`opts`]).
pub fn connect(
    env: &Env,
    a: &mut rdma_verbs::QueuePair,
    b: &mut rdma_verbs::QueuePair,
    access: rdma_verbs::AccessFlags,
) -> Result<(), Failed> {
    use rdma_verbs::qp::Psn;
    let o = opts(env, access);
    if a.qp_type() == rdma_verbs::QpType::Ud && b.qp_type() == rdma_verbs::QpType::Ud {
        // Datagrams need no peer: each send names its destination.
        a.bring_up_ud(o.port, o.qkey, Psn::new(100)?)?;
        b.bring_up_ud(o.port, o.qkey, Psn::new(200)?)?;
        return Ok(());
    }
    let (ea, eb) = (
        a.local_endpoint(&o, Psn::new(100)?)?,
        b.local_endpoint(&o, Psn::new(200)?)?,
    );
    a.connect(&o, ea.psn, &eb)?;
    b.connect(&o, eb.psn, &ea)?;
    Ok(())
}

/// The IPv4 address of the test port, for the connection manager: its
/// IPv4-mapped RoCE GID, or `RDMA_VERBS_CM_ADDR`.
pub fn cm_addr(env: &Env) -> Result<std::net::IpAddr, Failed> {
    if let Ok(a) = std::env::var("RDMA_VERBS_CM_ADDR") {
        return a
            .parse()
            .map_err(|e| format!("RDMA_VERBS_CM_ADDR={a}: {e}").into());
    }
    env.ctx
        .gid_table()?
        .iter()
        .filter(|e| e.port == u32::from(env.port))
        .find_map(|e| e.gid.as_ipv6().to_ipv4_mapped())
        .map(std::net::IpAddr::V4)
        .ok_or_else(|| {
            format!(
                "port {} of {} has no IPv4 GID; set RDMA_VERBS_CM_ADDR to its IP address",
                env.port,
                env.ctx.name()
            )
            .into()
        })
}

/// An example binary, built next to the test binary by `cargo test`.
pub fn rust_example(name: &str) -> Result<std::path::PathBuf, Failed> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .ok_or("no target dir")?;
    let path = dir.join("examples").join(name);
    ensure!(
        path.exists(),
        "{} is not built (cargo test builds the examples)",
        path.display()
    );
    Ok(path)
}

/// A program from PATH; a failure names the `package` to install.
pub fn on_path(name: &str, package: &str) -> Result<std::path::PathBuf, Failed> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{name} not found: install {package}").into())
}

/// Waits until `rdma resource show cm_id` lists a CM id for which `wanted`
/// holds (given the line's words), while `child` runs: how a test knows
/// that a server listens through the CM (which `ss` does not show).
pub fn wait_for_cm_id(
    child: &mut std::process::Child,
    what: &str,
    wanted: impl Fn(&[&str]) -> bool,
) -> Result<(), Failed> {
    let rdma = on_path("rdma", "iproute2 (the rdma tool)")?;
    let (start, limit) = (std::time::Instant::now(), deadline());
    let mut pause = std::time::Duration::from_millis(10);
    loop {
        if let Some(st) = child.try_wait()? {
            return Err(format!("{what}: exited ({st}) before it was ready").into());
        }
        let out = std::process::Command::new(&rdma)
            .args(["resource", "show", "cm_id"])
            .output()
            .map_err(|e| format!("running `rdma resource show cm_id`: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if text
            .lines()
            .any(|l| wanted(&l.split_whitespace().collect::<Vec<_>>()))
        {
            return Ok(());
        }
        ensure!(
            start.elapsed() < limit,
            "{what}: not ready after {limit:?} (raise RDMA_VERBS_TIME_SCALE on a slow machine); \
             `rdma resource show cm_id`:\n{text}"
        );
        // Each look runs a process: back off, to leave the machine to the
        // program being waited for.
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(100));
    }
}

/// Polls `cq` until exactly `n` completions arrived (or [`deadline`] passed).
pub fn poll_n(
    cq: &rdma_verbs::CompletionQueue,
    n: usize,
) -> Result<Vec<rdma_verbs::WorkCompletion>, Failed> {
    let mut out = Vec::new();
    let mut wcs = [rdma_verbs::WorkCompletion::default(); 16];
    let (start, limit) = (std::time::Instant::now(), deadline());
    while out.len() < n {
        let room = (n - out.len()).min(wcs.len());
        let got = cq.poll(&mut wcs[..room])?;
        if got.is_empty() {
            // Let the other side's thread run: valgrind runs one thread
            // at a time, and a spinning poller starves it there.
            std::thread::yield_now();
        }
        out.extend_from_slice(got);
        ensure!(
            start.elapsed() < limit,
            "{} of {n} completions after {limit:?} (raise RDMA_VERBS_TIME_SCALE on a slow machine): {out:?}",
            out.len()
        );
    }
    Ok(out)
}

/// The first index of the test port's GID table (below `limit`) that
/// `gid_table()` does not list: an empty entry.
pub fn empty_gid_index(env: &Env, limit: u32) -> Result<u32, Failed> {
    let len = env.ctx.query_port(env.port)?.gid_tbl_len;
    let used: Vec<u32> = env
        .ctx
        .gid_table()?
        .iter()
        .filter(|e| e.port == u32::from(env.port))
        .map(|e| e.index)
        .collect();
    ensure!(!used.is_empty(), "port {} lists no GIDs", env.port);
    (0..len.min(limit))
        .find(|i| !used.contains(i))
        .ok_or_else(|| {
            format!(
                "port {} has no empty GID entry below {} (table of {len}, used {used:?})",
                env.port,
                len.min(limit)
            )
            .into()
        })
}

/// A UD destination for sends to `to` on the test port: its endpoint
/// (PSN 1) and an address handle in `pd` (with a GRH naming the endpoint's
/// GID on RoCE).
pub fn ud_dest(
    env: &Env,
    pd: &rdma_verbs::ProtectionDomain,
    to: &rdma_verbs::QueuePair,
) -> Result<(rdma_verbs::AddressHandle, rdma_verbs::qp::Endpoint), Failed> {
    use rdma_verbs::qp::{AddressVector, GlobalRoute, Psn};
    let o = opts(env, rdma_verbs::AccessFlags::empty());
    let ep = to.local_endpoint(&o, Psn::new(1)?)?;
    let mut av = AddressVector::new(env.port).dlid(ep.lid);
    if !ep.gid.is_zero() {
        let idx = env
            .ctx
            .gid_table()?
            .into_iter()
            .find(|e| e.gid == ep.gid)
            .map(|e| e.index as u8)
            .unwrap_or(0);
        av = av.global(GlobalRoute::new(ep.gid, idx).hop_limit(64));
    }
    Ok((pd.create_ah(&av)?, ep))
}

/// One datagram from UD QP `a` to UD QP `b` (both in `pd`): a receive of
/// 1064 bytes (room for the GRH) posted on `b` as wr_id 1, then `a`'s
/// SEND_WITH_IMM 42 of `datagram!` (9 bytes) as wr_id 2, with Q_Key
/// `QKey::PINGPONG`. The address handle the send names.
pub fn post_datagram(
    env: &Env,
    pd: &rdma_verbs::ProtectionDomain,
    a: &mut rdma_verbs::QueuePair,
    b: &mut rdma_verbs::QueuePair,
) -> Result<rdma_verbs::AddressHandle, Failed> {
    use rdma_verbs::qp::{QKey, RecvWr, SendOp, SendWr};
    let (ah, eb) = ud_dest(env, pd, b)?;
    let mut bufs = pd.alloc_chunks(2, 1024 + 40, rdma_verbs::AccessFlags::LOCAL_WRITE)?;
    let mut send = bufs.pop().ok_or("no chunk")?;
    send.as_mut_slice()[..9].copy_from_slice(b"datagram!");
    b.post_recv([RecvWr::new(1).sge(bufs.pop().ok_or("no chunk")?)])?;
    a.post_send(
        [SendWr::new(2, SendOp::SendWithImm(42))
            .sge_len(send, 9)
            .ud(&ah, eb.qpn, QKey::PINGPONG)],
    )?;
    Ok(ah)
}

/// A region peers may read, write and run atomics on.
pub fn remote_region(
    pd: &rdma_verbs::ProtectionDomain,
    len: usize,
) -> Result<rdma_verbs::MemoryRegion, Failed> {
    use rdma_verbs::AccessFlags;
    Ok(pd.register(
        len,
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
    )?)
}

/// Reclaims `wc` on whichever of `qps` it belongs to (a basic or an
/// extended CQ's completion): the ended requests' `(wr_id, chunk)` pairs.
#[allow(dead_code)]
pub fn reclaim_on<C: rdma_verbs::qp::Completion + ?Sized>(
    qps: &mut [&mut rdma_verbs::QueuePair],
    wc: &C,
) -> Vec<(u64, rdma_verbs::Chunk)> {
    let mut back = Vec::new();
    for qp in qps.iter_mut() {
        qp.reclaim(wc, |done| {
            let id = done.wr_id;
            back.extend(done.chunks().map(|c| (id, c)));
        });
    }
    back
}

/// The running kernel's `(major, minor)`, from `/proc/sys/kernel/osrelease`.
pub fn kernel_version() -> Option<(u32, u32)> {
    let text = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut parts = text.trim().split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether the device is soft-RoCE: its vendor id is the kernel's
/// `RXE_VENDOR_ID` (`drivers/infiniband/sw/rxe/rxe_param.h`).
pub fn is_rxe(env: &Env) -> bool {
    env.ctx.attr().vendor_id == 0x00ff_ffff
}

/// The rdma-core release of both the headers the crate was built with and
/// the libibverbs it runs with (the older of the two).
pub fn rdma_core_release() -> Option<u32> {
    let built = rdma_verbs::sys::RDMA_CORE_RELEASE?;
    let loaded = rdma_verbs::sys::loaded_libibverbs()?.release?;
    Some(built.min(loaded))
}

/// Whether rxe of this kernel and rdma-core must offer what `since`
/// (kernel) and `rdma_core` (release) added: a device test's oracle, so
/// that a newer stack can never quietly take the "unsupported" branch.
pub fn rxe_has(env: &Env, since: (u32, u32), rdma_core: u32) -> bool {
    is_rxe(env)
        && kernel_version().is_some_and(|k| k >= since)
        && rdma_core_release().is_some_and(|r| r >= rdma_core)
}

/// The GID of the test port that requests name it by, and its index: the
/// first IPv4-mapped (RoCE v2) entry, as `ConnectOptions` picks, else the
/// first non-zero one. The IPv6 link-local entry that comes first on RoCE
/// can be unusable for a while after the link comes up (Linux 7.2:
/// `ibv_create_ah` to it timed out, ETIMEDOUT, at the start of a run).
pub fn port_gid(env: &Env) -> Result<(rdma_verbs::Gid, u8), Failed> {
    let entries: Vec<_> = env
        .ctx
        .gid_table()?
        .into_iter()
        .filter(|e| e.port == u32::from(env.port) && !e.gid.is_zero())
        .collect();
    let e = entries
        .iter()
        .find(|e| e.gid.as_ipv6().to_ipv4_mapped().is_some())
        .or(entries.first())
        .ok_or("no GID on the test port")?;
    Ok((e.gid, e.index as u8))
}

/// Starts the echo example `example` (`async_echo`, `sync_echo`) as a
/// server on `ip:port`, exiting after `n` connections, and waits until its
/// CM id listens.
pub fn echo_server(
    example: &str,
    ip: std::net::IpAddr,
    port: u16,
    n: u32,
) -> Result<std::process::Child, Failed> {
    let mut child = procs::spawn(std::process::Command::new(rust_example(example)?).args([
        "-b",
        &ip.to_string(),
        "-p",
        &port.to_string(),
        "-x",
        &n.to_string(),
    ]))?;
    let want = format!("{ip}:{port}");
    let listening = |w: &[&str]| {
        w.windows(2).any(|p| p == ["state", "LISTEN"])
            && w.windows(2).any(|p| p[0] == "src-addr" && p[1] == want)
    };
    let what = format!("the {example} server");
    if let Err(e) = wait_for_cm_id(&mut child, &what, listening) {
        let _ = child.kill();
        let ran = procs::finish(child, std::time::Duration::ZERO)?;
        return Err(format!("{e:?}\nserver: {}", ran.merged()).into());
    }
    Ok(child)
}

/// Runs the echo example `example` with bad command lines: each exits 2
/// with its usage.
pub fn echo_bad_command_lines(example: &str) -> Result<(), Failed> {
    for args in [
        &["-s", "4"][..],
        &["-s", "5000"],
        &["-c", "0", "host"],
        &["-n", "x", "host"],
        &["--bogus"],
        &["a", "b"],
        &["-p"],
    ] {
        let out = std::process::Command::new(rust_example(example)?)
            .args(args)
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(2) && err.contains(&format!("usage: {example}")),
            "{args:?}: {:?} {err}",
            out.status.code()
        );
    }
    Ok(())
}
