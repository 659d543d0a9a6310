//! Output as the C program's stdio produces it.
//!
//! rping prints its data lines and debug lines with `printf`, so stdout is
//! line-buffered on a terminal and fully buffered (4 KiB blocks) otherwise,
//! and flushed at exit; its error lines go to stderr unbuffered. With both
//! redirected into one file, the stderr lines therefore come before stdout
//! text printed earlier, and a program killed by a signal loses what its
//! stdout buffer held. Rust's `println!` is always line-buffered, so the
//! example writes stdout through this module instead (`outln!`), and ends
//! through [`exit`], which flushes it like C's `exit()`.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use rdma_verbs::Error;

/// The size of glibc's stdout buffer when stdout is not a terminal.
const BLOCK: usize = 4096;

struct Stdout {
    /// Whether stdout is a terminal (line-buffered), once known.
    tty: Option<bool>,
    buf: Vec<u8>,
}

static STDOUT: Mutex<Stdout> = Mutex::new(Stdout {
    tty: None,
    buf: Vec::new(),
});

/// `-d`: whether `debug_log!` lines are printed (C's `static int debug`).
static DEBUG: AtomicBool = AtomicBool::new(false);

/// Set when a CM error event was handled: the C program's CM thread then
/// calls `exit(-1)`, so the process ends with status 255 whatever the
/// main thread was doing.
static FATAL: AtomicBool = AtomicBool::new(false);

pub fn debug() -> bool {
    DEBUG.load(Ordering::Relaxed)
}

pub fn set_debug() {
    DEBUG.store(true, Ordering::Relaxed);
}

pub fn set_fatal() {
    FATAL.store(true, Ordering::Relaxed);
}

pub fn fatal() -> bool {
    FATAL.load(Ordering::Relaxed)
}

fn lock() -> MutexGuard<'static, Stdout> {
    // A thread that panicked while printing left the buffer usable.
    STDOUT.lock().unwrap_or_else(|e| e.into_inner())
}

fn write_through(bytes: &[u8]) {
    let mut stdout = std::io::stdout().lock();
    // Like printf, errors writing stdout (a closed pipe) are not reported.
    let _ = stdout.write_all(bytes);
    let _ = stdout.flush();
}

/// Appends `bytes` to stdout, writing out what C's stdio would write now.
pub fn print_bytes(bytes: &[u8]) {
    let mut out = lock();
    let tty = *out
        .tty
        .get_or_insert_with(|| std::io::stdout().is_terminal());
    out.buf.extend_from_slice(bytes);
    let ready = if tty {
        out.buf
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1)
    } else {
        out.buf.len() / BLOCK * BLOCK
    };
    if ready > 0 {
        write_through(&out.buf[..ready]);
        out.buf.drain(..ready);
    }
}

/// One line on stdout (the `outln!` macro).
pub fn line(args: std::fmt::Arguments<'_>) {
    print_bytes(format!("{args}\n").as_bytes());
}

/// Writes out everything buffered.
pub fn flush() {
    let mut out = lock();
    if !out.buf.is_empty() {
        write_through(&out.buf);
        out.buf.clear();
    }
}

/// Ends the process as C's `exit(code)` does: stdout flushed, status
/// `code & 0xff` (so -1 is 255). A CM error event seen on the way makes
/// it 255, as the C program's CM thread would have exited with -1.
pub fn exit(code: i32) -> ! {
    flush();
    std::process::exit(if fatal() { -1 } else { code })
}

/// `strerror(errno)`: the system's text without Rust's " (os error N)".
pub fn strerror(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    match text.find(" (os error ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

/// `perror(what)` for a failed call: `what: <strerror(errno)>` on stderr.
/// Errors the crate raised before calling C (they have no errno) show the
/// crate's own description instead.
pub fn perror(what: &str, e: &Error) {
    match e.errno() {
        Some(errno) => eprintln!("{what}: {}", strerror(errno)),
        None => eprintln!("{what}: {e}"),
    }
}

/// The C return value of a failed call: its errno, or -1.
pub fn ret_of(e: &Error) -> i32 {
    e.errno().unwrap_or(-1)
}
