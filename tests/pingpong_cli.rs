//! The pingpong examples' command lines against rdma-core's C programs,
//! without a device: a bad option gives the same getopt message, usage text
//! and exit status as the C program's, and `-N` is accepted.
//!
//! The usage texts are compared line by line after two normalisations: runs
//! of blanks count as one space (the C programs mix tabs and spaces), and a
//! trailing note in parentheses that the port adds ("not available in this
//! port ...", "extension: ...") is dropped. Differences beyond that are
//! listed in [`KNOWN`]. In uc, ud and srq the `-N` line is the port's
//! extension (rdma-core 44's programs have no `-N`): it must be there, last,
//! and marked as an extension. In rc it must be the C program's line,
//! byte for byte.
//!
//! Needs the C programs (`ibv_rc_pingpong`, ... from rdma-core's
//! ibverbs-utils): without them the tests fail, saying what to install.

#[path = "common/mod.rs"]
#[allow(unused_macros)]
#[macro_use]
mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Lines where the port's usage text knowingly differs from the C
/// program's: (example, C line, Rust line), both normalised.
/// `ibv_ud_pingpong` says "default 2048" but sends 1024 bytes by default;
/// the port prints what it does.
const KNOWN: &[(&str, &str, &str)] = &[(
    "ud",
    "-s, --size=<size> size of message to exchange (default 2048)",
    "-s, --size=<size> size of message to exchange (default 1024)",
)];

/// Runs `bin` with `args`, no input; its output.
fn run(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A usage line with blanks collapsed and the port's trailing note dropped.
fn normalise(line: &str) -> String {
    let mut l = line.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some(i) = l.rfind(" (") {
        let note = &l[i + 2..];
        if note.ends_with(')')
            && (note.starts_with("not available in this port") || note.starts_with("extension: "))
        {
            l.truncate(i);
        }
    }
    l
}

fn programs(example: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let rust =
        common::rust_example(&format!("{example}_pingpong")).unwrap_or_else(|e| panic!("{e:?}"));
    let c = common::on_path(
        &format!("ibv_{example}_pingpong"),
        "rdma-core's ibverbs-utils",
    )
    .unwrap_or_else(|e| panic!("{e:?}"));
    (rust, c)
}

/// Options rdma-core added to the C programs after the release the ports
/// follow (44), which the ports do not take: rdma-core 65's rc_pingpong
/// `-U` (memory for confidential-computing guests).
const LATER_C_OPTIONS: &[&str] = &["  -U, --allow-cc-unprotected"];

/// `lines` without the [`LATER_C_OPTIONS`] and the indented lines that
/// continue them.
fn without_later_options(lines: Vec<&str>) -> Vec<&str> {
    let mut out = Vec::new();
    let mut dropping = false;
    for line in lines {
        if LATER_C_OPTIONS.iter().any(|o| line.starts_with(o)) {
            dropping = true;
        } else if !(dropping && line.starts_with("      ")) {
            dropping = false;
            out.push(line);
        }
    }
    out
}

/// `-h` (an invalid option) to both programs: the same getopt message
/// (after the program name), exit status 1, and usage texts equal as
/// described in the module docs.
fn usage_matches(example: &str) {
    let (rust_bin, c_bin) = programs(example);
    let rust = run(&rust_bin, &["-h"]);
    let c = run(&c_bin, &["-h"]);
    assert_eq!(rust.status.code(), Some(1), "{example}: Rust exit status");
    assert_eq!(c.status.code(), Some(1), "{example}: C exit status");
    let name = |out: &Output, bin: &Path| {
        let argv0 = bin.to_string_lossy().into_owned();
        (
            text(&out.stdout).replace(&argv0, "PROG"),
            text(&out.stderr).replace(&argv0, "PROG"),
        )
    };
    let (rust_out, rust_err) = name(&rust, &rust_bin);
    let (c_out, c_err) = name(&c, &c_bin);
    assert_eq!(rust_err, c_err, "{example}: getopt's message");
    assert_eq!(c_err, "PROG: invalid option -- 'h'\n");

    let mut rust_lines: Vec<&str> = rust_out.lines().collect();
    let c_lines = without_later_options(c_out.lines().collect());
    let c_new_send = "  -N, --new_send            use new post send WR API";
    if example == "rc" {
        assert!(
            c_lines.contains(&c_new_send) && rust_lines.contains(&c_new_send),
            "rc: the -N line must be the C program's, byte for byte\n{rust_out}"
        );
    } else {
        assert!(
            !c_lines.iter().any(|l| l.contains("--new_send")),
            "{example}: the C program has -N now: the port's extension note is out of date"
        );
        let last = rust_lines.pop().unwrap_or_default();
        assert_eq!(
            last,
            format!("{c_new_send} (extension: not in ibv_{example}_pingpong)"),
            "{example}: the -N line (last, marked as an extension)"
        );
    }
    assert_eq!(
        rust_lines.len(),
        c_lines.len(),
        "{example}: usage texts of different lengths\n--- Rust:\n{rust_out}--- C:\n{c_out}"
    );
    for (r, c) in rust_lines.iter().zip(&c_lines) {
        let (r, c) = (normalise(r), normalise(c));
        let known = KNOWN
            .iter()
            .any(|&(ex, kc, kr)| ex == example && kc == c && kr == r);
        assert!(
            r == c || known,
            "{example}: usage line differs\n  Rust: {r:?}\n  C:    {c:?}"
        );
    }
}

/// `-N` is accepted: no getopt message, no usage text; with a device name
/// that does not exist the program fails at the device, as the C program
/// does (rc: with `-N`; the others: without, as they have no `-N`).
fn new_send_accepted(example: &str) {
    let (rust_bin, c_bin) = programs(example);
    let dev = ["-d", "no-such-rdma-device"];
    let rust = run(&rust_bin, &[&["-N"][..], &dev].concat());
    let c_args = if example == "rc" {
        [&["-N"][..], &dev].concat()
    } else {
        dev.to_vec()
    };
    let c = run(&c_bin, &c_args);
    let (rust_out, rust_err) = (text(&rust.stdout), text(&rust.stderr));
    assert!(
        !rust_out.contains("Usage:") && !rust_err.contains("option"),
        "{example}: -N refused\n{rust_out}{rust_err}"
    );
    assert_eq!(rust.status.code(), Some(1), "{example}: {rust_err}");
    assert_eq!(c.status.code(), Some(1), "{example}: C exit status");
    assert!(rust_out.is_empty() && c.stdout.is_empty());
    // Where libibverbs lists devices (none matching), both name the device;
    // on a machine without RDMA support at all the C program reports the
    // failed device list instead (perror), which the port does not mirror.
    let c_err = text(&c.stderr);
    if c_err.starts_with("IB device ") {
        assert_eq!(rust_err, c_err, "{example}: the device error");
    } else {
        assert_eq!(rust_err, "IB device no-such-rdma-device not found\n");
    }
}

#[test]
fn rc_usage() {
    usage_matches("rc");
}

#[test]
fn uc_usage() {
    usage_matches("uc");
}

#[test]
fn ud_usage() {
    usage_matches("ud");
}

#[test]
fn srq_usage() {
    usage_matches("srq");
}

#[test]
fn rc_new_send_accepted() {
    new_send_accepted("rc");
}

#[test]
fn uc_new_send_accepted() {
    new_send_accepted("uc");
}

#[test]
fn ud_new_send_accepted() {
    new_send_accepted("ud");
}

#[test]
fn srq_new_send_accepted() {
    new_send_accepted("srq");
}
