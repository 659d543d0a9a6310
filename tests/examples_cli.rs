//! The examples at the edges of their command line, as C tools behave
//! there (no device needed): `--help` on a stdout that is a closed pipe
//! (`example --help | head`, the reader gone) ends the process quietly,
//! with the status a shell shows for SIGPIPE (141) where the help goes to
//! stdout, and never with a panic; the examples of this crate's own
//! (`qp_state_machine`, `perf_setup`, `perf_scale`) take `-h`/`--help`,
//! print their usage and options on stdout and exit 0.

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Every example, and whether its `--help` text goes to stdout through
/// `println!` (then the closed pipe must end it as SIGPIPE would). rping
/// writes its usage through its own `outln!`, which drops a failed write
/// as C's buffered printf does, and exits with C's status (22).
const EXAMPLES: &[(&str, bool)] = &[
    ("cmtime", false),
    ("devinfo", false),
    ("mckey", false),
    ("mw_invalidate", false),
    ("perf", true),
    ("perf_scale", true),
    ("perf_setup", true),
    ("qp_state_machine", true),
    ("rc_pingpong", true),
    ("rdma_ops", false),
    ("rping", false),
    ("srq_pingpong", true),
    ("uc_pingpong", true),
    ("ud_pingpong", true),
    ("udaddy", false),
];

/// An example binary, built next to this test by `cargo test`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("the target dir");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built (cargo test builds the examples)",
        path.display()
    );
    path
}

/// The write end of a pipe whose read end is already closed: every write
/// to it fails with EPIPE (or raises SIGPIPE), from the first byte on.
fn closed_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // `fds` is two writable ints, as pipe(2) asks.
    // SAFETY: a plain system call on a local array.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // Both descriptors were just made by pipe2 and belong to nothing else.
    // SAFETY: so each is owned once, here.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    write
}

#[test]
fn help_on_a_closed_stdout_ends_quietly() {
    for &(name, to_stdout) in EXAMPLES {
        let out = Command::new(example(name))
            .arg("--help")
            .stdin(Stdio::null())
            .stdout(Stdio::from(closed_pipe()))
            .stderr(Stdio::piped())
            .output()
            .unwrap_or_else(|e| panic!("running {name}: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{name} panicked: {stderr}");
        assert_eq!(out.status.signal(), None, "{name}: {:?}", out.status);
        if to_stdout {
            assert_eq!(
                out.status.code(),
                Some(141),
                "{name}: the help to stdout should end as SIGPIPE ends a C tool: {:?}, {stderr}",
                out.status
            );
        }
    }
}

#[test]
fn the_crates_own_examples_take_help() {
    for name in ["qp_state_machine", "perf_setup", "perf_scale"] {
        for flag in ["-h", "--help"] {
            let out = Command::new(example(name))
                .arg(flag)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("running {name}: {e}"));
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{name} {flag}: {:?}", out.status);
            assert!(
                stdout.starts_with(&format!("usage: {name} ")),
                "{name} {flag}: {stdout}"
            );
            assert!(stdout.contains("-h, --help"), "{name} {flag}: {stdout}");
            assert!(
                out.stderr.is_empty(),
                "{name} {flag}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
