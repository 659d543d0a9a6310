//! `xtask cargo ...`: what `.ci`'s scripts need from cargo's JSON, read on
//! standard input (cargo runs in the script, on the host or in a stack's
//! chroot, so that its output is what the build really did).
//!
//! | command | input | prints | called by |
//! |---|---|---|---|
//! | `target-dir` | `cargo metadata --format-version 1 --no-deps` | the target folder (honours `CARGO_TARGET_DIR` and config) | `target_dir` in `.ci/vm-common` |
//! | `rust-version` | the same | the package's `rust-version` | `.ci/releases floor` |
//! | `out-dir PACKAGE` | `cargo build --message-format=json` | the last build script `OUT_DIR` of PACKAGE | `.ci/run`'s `docs_rs` |
//! | `executable TARGET` | `cargo test --no-run --message-format=json` | the last test executable of TARGET | `.ci/hosts tests` |
//!
//! The list of test executables that `.ci/vm test` runs is `xtask tests
//! list` (it reads the same messages: [`messages`] here).

use crate::json::{self, Value};
use std::io::Read;
use std::process::ExitCode;

/// Runs `xtask cargo ARGS...`.
pub fn main(args: &[String]) -> Result<ExitCode, String> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("standard input: {e}"))?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let found = match args[..] {
        ["target-dir"] => metadata_field(&input, "target_directory")?,
        ["rust-version"] => metadata_field(&input, "rust_version")?,
        ["out-dir", package] => out_dir(&messages(&input), package),
        ["executable", target] => executable(&messages(&input), target),
        _ => {
            return Err(
                "usage: xtask cargo target-dir|rust-version|out-dir PACKAGE|executable TARGET"
                    .into(),
            )
        }
    };
    match found {
        Some(s) => {
            println!("{s}");
            Ok(ExitCode::SUCCESS)
        }
        None => Err(format!("cargo's output names no {}", args.join(" "))),
    }
}

/// The JSON messages among cargo's lines (those that start with `{`; cargo
/// may mix in other lines, such as a build script's).
pub fn messages(input: &str) -> Vec<Value> {
    input
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| json::parse(l).ok())
        .collect()
}

/// `target_directory` of `cargo metadata`, or the first package's field
/// `name` (such as `rust_version`) when the top level has none.
fn metadata_field(input: &str, name: &str) -> Result<Option<String>, String> {
    let meta = json::parse(input)?;
    let top = meta.get(name);
    let first_package = || match meta.get("packages") {
        Some(Value::Array(p)) => p.first().and_then(|p| p.get(name)),
        _ => None,
    };
    Ok(top
        .or_else(first_package)
        .and_then(Value::as_str)
        .map(str::to_owned))
}

/// The `out_dir` of the last `build-script-executed` message whose package
/// id names `package`.
fn out_dir(messages: &[Value], package: &str) -> Option<String> {
    messages
        .iter()
        .filter(|m| m.get("reason").and_then(Value::as_str) == Some("build-script-executed"))
        .filter(|m| {
            m.get("package_id")
                .and_then(Value::as_str)
                .is_some_and(|id| id.contains(package))
        })
        .filter_map(|m| m.get("out_dir").and_then(Value::as_str))
        .next_back()
        .map(str::to_owned)
}

/// A test executable that cargo built: its target's name, its path, and
/// the folder of its package's manifest (where the test runs).
#[derive(Debug, Clone, PartialEq)]
pub struct TestExe {
    pub target: String,
    pub path: String,
    pub package_dir: String,
}

/// Every test executable (`compiler-artifact` with `profile.test` and an
/// `executable`), in the order cargo reported them.
pub fn test_executables(messages: &[Value]) -> Vec<TestExe> {
    let field = |m: &Value, path: &[&str]| m.at(path).and_then(Value::as_str).map(str::to_owned);
    messages
        .iter()
        .filter(|m| m.get("reason").and_then(Value::as_str) == Some("compiler-artifact"))
        .filter(|m| m.at(&["profile", "test"]).is_some_and(Value::is_true))
        .filter_map(|m| {
            let manifest = field(m, &["manifest_path"])?;
            let package_dir = manifest.rsplit_once('/').map_or("", |(d, _)| d).to_owned();
            Some(TestExe {
                target: field(m, &["target", "name"])?,
                path: field(m, &["executable"])?,
                package_dir,
            })
        })
        .collect()
}

/// The path of the last test executable of target `target`.
fn executable(messages: &[Value], target: &str) -> Option<String> {
    test_executables(messages)
        .into_iter()
        .rfind(|e| e.target == target)
        .map(|e| e.path)
}

#[cfg(test)]
mod unit {
    use super::{executable, messages, metadata_field, out_dir, test_executables};

    #[test]
    fn metadata_gives_the_target_folder_and_rust_version() {
        const METADATA: &str = include_str!("../tests/samples/cargo-metadata.json");
        let field = |name| metadata_field(METADATA, name).unwrap();
        assert_eq!(
            field("target_directory").as_deref(),
            Some("/tmp/hB/rv/target")
        );
        assert_eq!(field("rust_version").as_deref(), Some("1.83"));
    }

    #[test]
    fn messages_give_out_dir_and_executables() {
        const MESSAGES: &str = include_str!("../tests/samples/cargo-messages.json");
        let m = messages(&format!("a build script's line\n{MESSAGES}"));
        let out = out_dir(&m, "rdma-verbs").unwrap();
        assert!(
            out.starts_with("/tmp/hB/rv/target/debug/build/rdma-verbs-") && out.ends_with("/out"),
            "{out}"
        );
        assert_eq!(out_dir(&m, "other-crate"), None);
        let exes = test_executables(&m);
        let names: Vec<_> = exes.iter().map(|e| e.target.as_str()).collect();
        assert_eq!(names, ["rdma_verbs", "device", "hosts"]);
        assert!(exes.iter().all(|e| e.package_dir == "/tmp/hB/rv"));
        assert!(executable(&m, "hosts")
            .unwrap()
            .contains("/target/debug/deps/hosts-"));
    }
}
