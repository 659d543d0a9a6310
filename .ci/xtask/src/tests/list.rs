//! The test executables a `.ci/vm test` run runs, from cargo's messages
//! (`cargo test --no-run --all-targets --message-format=json...`) and the
//! selection of `RDMA_VERBS_VM_TESTS` or `RDMA_VERBS_VALGRIND_TESTS`.
//!
//! Each is a line `EXECUTABLE<TAB>PACKAGE_DIR` (every executable) or
//! `EXECUTABLE<TAB>PACKAGE_DIR<TAB>FILTER` (a selection), the list that
//! `.ci/vm` runs in order and [`super::summary`] reads back.

use crate::cargo::TestExe;

/// The list's lines, and the notes for standard error; or the error when the
/// selection names a target that was not built.
///
/// `select`: space-separated `TARGET` or `TARGET=FILTER` (a libtest filter;
/// `-FILTER` skips what it matches). Empty: every executable but
/// `compile_fail` (the host runs it: trybuild, no device) and `hosts` (two
/// VMs run it).
pub fn lines(built: &[TestExe], select: &str) -> Result<(Vec<String>, Vec<String>), String> {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    if select.split_whitespace().next().is_none() {
        for exe in built {
            match exe.target.as_str() {
                "compile_fail" => notes.push(
                    "vm: compile_fail runs on the host only (cargo test), not in the VM".to_owned(),
                ),
                "hosts" => notes
                    .push("vm: hosts runs in two VMs (.ci/vm hosts tests), not here".to_owned()),
                _ => out.push(format!("{}\t{}", exe.path, exe.package_dir)),
            }
        }
        return Ok((out, notes));
    }
    for item in select.split_whitespace() {
        let (name, filter) = item.split_once('=').unwrap_or((item, ""));
        let hits: Vec<_> = built.iter().filter(|e| e.target == name).collect();
        if hits.is_empty() {
            return Err(not_built(built, name));
        }
        out.extend(
            hits.iter()
                .map(|e| format!("{}\t{}\t{filter}", e.path, e.package_dir)),
        );
    }
    Ok((out, notes))
}

fn not_built(built: &[TestExe], name: &str) -> String {
    let mut names: Vec<&str> = built.iter().map(|e| e.target.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    format!(
        "vm: RDMA_VERBS_VALGRIND_TESTS/RDMA_VERBS_VM_TESTS names '{name}', but no such test executable was built (built: {})",
        names.join(", ")
    )
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::cargo::{messages, test_executables};

    fn built() -> Vec<TestExe> {
        test_executables(&messages(include_str!(
            "../../tests/samples/cargo-messages.json"
        )))
    }

    fn exe_of(target: &str) -> String {
        built()
            .into_iter()
            .find(|e| e.target == target)
            .unwrap()
            .path
    }

    /// The list's line of `target`'s executable, with `tail` after its folder.
    fn line(target: &str, tail: &str) -> String {
        format!("{}\t/tmp/hB/rv{tail}", exe_of(target))
    }

    #[test]
    fn everything_but_hosts_by_default() {
        let (out, notes) = lines(&built(), "").unwrap();
        assert_eq!(out, [line("rdma_verbs", ""), line("device", "")]);
        let note = "vm: hosts runs in two VMs (.ci/vm hosts tests), not here";
        assert_eq!(notes, [note]);
    }

    #[test]
    fn a_selection_keeps_its_order_and_filters() {
        let (out, _) = lines(&built(), "hosts device=round_trip:: rdma_verbs=-x").unwrap();
        let want = [
            line("hosts", "\t"),
            line("device", "\tround_trip::"),
            line("rdma_verbs", "\t-x"),
        ];
        assert_eq!(out, want);
    }

    #[test]
    fn a_target_not_built_is_an_error() {
        let e = lines(&built(), "device nope").unwrap_err();
        assert!(e.ends_with("names 'nope', but no such test executable was built (built: device, hosts, rdma_verbs)"), "{e}");
    }
}
