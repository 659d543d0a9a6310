//! The `file_write` example (registered application buffers: a file's
//! memory mapping RDMA-written into the peer's, which puts it on disk),
//! server and client, on files of several sizes: empty, one byte, less
//! than a page, several RDMA WRITEs with a short last one, and with the
//! write size larger than the file.
//!
//! Each run must end with both processes exiting 0, the output file equal
//! to the input byte for byte, and both sides printing the same hash.
//!
//! Needs the device (see `tests/common`): without one the runs are
//! reported as ignored.

#[path = "common/mod.rs"]
#[macro_use]
mod common;

use std::path::PathBuf;

use libtest_mimic::Failed;

use common::{procs, rust_example, Env, Test};

const EXAMPLE: &str = "file_write";

fn main() -> std::process::ExitCode {
    let tests: &[Test] = tests![
        empty_file,
        one_byte,
        less_than_a_page,
        many_writes_short_last,
        one_write_larger_than_the_file,
        missing_input_file,
    ];
    // Fixed TCP ports and one device: one run at a time.
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads = Some(1);
    common::run_with("file_write", tests, &[], args)
}

fn empty_file(env: &Env) -> Result<(), Failed> {
    copy(env, 0, &[], 19_400)
}

fn one_byte(env: &Env) -> Result<(), Failed> {
    copy(env, 1, &[], 19_401)
}

fn less_than_a_page(env: &Env) -> Result<(), Failed> {
    copy(env, 1000, &[], 19_402)
}

fn many_writes_short_last(env: &Env) -> Result<(), Failed> {
    // 3 MiB + 7 bytes in 64 KiB writes: 49 writes, the last 7 bytes, more
    // than the 16 the client keeps outstanding.
    copy(env, (3 << 20) + 7, &["-s", "65536"], 19_403)
}

fn one_write_larger_than_the_file(env: &Env) -> Result<(), Failed> {
    copy(env, 100_000, &["-s", "1048576"], 19_404)
}

/// A client whose file does not exist fails before it connects, saying so.
fn missing_input_file(_env: &Env) -> Result<(), Failed> {
    let bin = rust_example(EXAMPLE)?;
    let out = std::process::Command::new(&bin)
        .args([
            "-f",
            "/nonexistent/file_write-input",
            "127.0.0.1",
            "-p",
            "19405",
        ])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(1) && err.contains("cannot open /nonexistent/file_write-input"),
        "exit {:?}, stderr:\n{err}",
        out.status.code()
    );
    Ok(())
}

/// The contents of a test file: a hash of each byte's position.
fn contents(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            (x >> 56) as u8 ^ (i as u8)
        })
        .collect()
}

/// A scratch directory of the test's own (removed at the end).
fn scratch(tag: &str) -> Result<PathBuf, Failed> {
    let dir = std::env::temp_dir().join(format!(
        "rdma-verbs-file-write-{}-{tag}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Sends a file of `len` bytes and checks the copy.
fn copy(env: &Env, len: usize, extra: &[&str], tcp_port: u16) -> Result<(), Failed> {
    let bin = rust_example(EXAMPLE)?;
    let dir = scratch(&len.to_string())?;
    let (input, output) = (dir.join("in"), dir.join("out"));
    let data = contents(len);
    std::fs::write(&input, &data)?;
    // A stale output of another length must be replaced, not kept.
    std::fs::write(&output, b"stale bytes that must go")?;
    let (in_s, out_s) = (input.to_string_lossy(), output.to_string_lossy());
    let mut server_args = vec!["-f", &out_s];
    server_args.extend_from_slice(extra);
    let mut client_args = vec!["-f", &in_s];
    client_args.extend_from_slice(extra);
    let (s, c) = procs::tcp_pair(
        env,
        (&bin, &server_args),
        (&bin, &client_args),
        tcp_port,
        EXAMPLE,
    )?;
    let (s_out, c_out) = (s.merged(), c.merged());
    let both = format!("--- server:\n{s_out}\n--- client:\n{c_out}");
    ensure!(
        s.code == Some(0) && c.code == Some(0),
        "{len} bytes: server exit {:?}, client exit {:?}\n{both}",
        s.code,
        c.code
    );
    let got = std::fs::read(&output)?;
    ensure!(
        got.len() == len,
        "the copy has {} bytes, not {len}\n{both}",
        got.len()
    );
    if let Some(i) = got.iter().zip(&data).position(|(a, b)| a != b) {
        return Err(format!("byte {i} of the copy differs\n{both}").into());
    }
    let hash = |out: &str, what: &str| -> Option<String> {
        out.lines()
            .find(|l| l.starts_with("file_write: ") && l.contains(what))
            .and_then(|l| l.rsplit_once("fnv1a "))
            .map(|(_, h)| h.to_owned())
    };
    let (sh, ch) = (hash(&s_out, "received "), hash(&c_out, "sent "));
    ensure!(
        sh.is_some() && sh == ch,
        "the hashes differ or are missing\n{both}"
    );
    let how = s_out
        .lines()
        .find(|l| l.contains("received "))
        .unwrap_or("")
        .to_owned();
    eprintln!("file_write: {len} bytes: {how}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
