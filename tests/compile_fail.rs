//! Compile-fail tests. The typed transition API refuses, at compile time, a
//! missing required attribute, an attribute the transition does not take,
//! and a builder of another transport; the data path refuses using,
//! freeing or holding a slice of a buffer once it is posted, a slice of
//! memory peers may write (and writing it while a view reads it), using a chunk that went into an `ibv_wr_*`
//! batch, and posting beside an open batch; an extended CQ refuses reading
//! a field it was not created with and keeping a completion past its
//! batch. Each case is a file in `tests/compile_fail/` with the compiler's
//! expected complaint beside it.
//!
//! They run rustc, so inside the soft-RoCE VM (`RDMA_VERBS_VM=1`) they are
//! reported as ignored; the host's `cargo test` runs them.
//!
//! The `.stderr` files are what Rust [`WRITTEN_WITH`] says. Another
//! compiler words its errors its own way (the floor's check runs these with
//! Debian 13's rustc 1.85): there every case must still fail to compile,
//! checked on copies of the cases, and the text is not compared.

use std::process::ExitCode;

use libtest_mimic::{Arguments, Failed, Trial};

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let in_vm = std::env::var_os("RDMA_VERBS_VM").is_some();
    if in_vm {
        eprintln!("compile_fail: SKIPPED in the VM: these tests run rustc; the host's cargo test runs them");
    }
    // Named by its function, as the other binaries' tests are (`tests!`).
    let trial = Trial::test(
        stringify!(every_case_fails_to_compile),
        every_case_fails_to_compile,
    )
    .with_ignored_flag(in_vm);
    libtest_mimic::run(&args, vec![trial]).exit_code()
}

/// Every case of `tests/compile_fail/` fails to compile, with the expected
/// message where the compiler is the one that wrote them.
fn every_case_fails_to_compile() -> Result<(), Failed> {
    let rustc = rustc_version()?;
    let cases = trybuild::TestCases::new();
    if rustc.starts_with(&format!("rustc {WRITTEN_WITH}.")) {
        cases.compile_fail("tests/compile_fail/*.rs");
        drop(cases); // runs them; panics (a failure) on any mismatch
        return Ok(());
    }
    eprintln!("compile_fail: {rustc}, not {WRITTEN_WITH}: each case must fail to compile; its message is not compared");
    let dir = copies_without_messages()?;
    // trybuild then records each message instead of comparing it, and
    // still fails a case that compiles.
    std::env::set_var("TRYBUILD", "overwrite");
    cases.compile_fail(dir.join("*.rs"));
    drop(cases);
    std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(())
}

/// The Rust release (`major.minor`) whose messages the `.stderr` files hold.
const WRITTEN_WITH: &str = "1.95";

/// `rustc --version` of the compiler cargo runs (`$RUSTC`, else `rustc`).
fn rustc_version() -> Result<String, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = std::process::Command::new(&rustc)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", rustc.to_string_lossy()))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The cases copied, without their `.stderr` files, into a folder of their
/// own under the target directory (never the source tree).
fn copies_without_messages() -> Result<std::path::PathBuf, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("compile_fail-cases");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compile_fail");
    for entry in std::fs::read_dir(&src).map_err(|e| format!("{}: {e}", src.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|e| e == "rs") {
            let to = dir.join(path.file_name().expect("a file's name"));
            std::fs::copy(&path, &to).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(dir)
}
