//! Compile-fail tests. The typed transition API refuses, at compile time, a
//! missing required attribute, an attribute the transition does not take,
//! and a builder of another transport; the data path refuses using,
//! freeing or holding a slice of a buffer once it is posted, a slice of
//! memory peers may write, using a chunk that went into an `ibv_wr_*`
//! batch, and posting beside an open batch; an extended CQ refuses reading
//! a field it was not created with and keeping a completion past its
//! batch. Each case is a file in `tests/compile_fail/` with the compiler's
//! expected complaint beside it.
//!
//! They run rustc, so inside the soft-RoCE VM (`RDMA_VERBS_VM=1`) they are
//! reported as ignored; the host's `cargo test` runs them.

use std::process::ExitCode;

use libtest_mimic::{Arguments, Trial};

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let in_vm = std::env::var_os("RDMA_VERBS_VM").is_some();
    if in_vm {
        eprintln!("compile_fail: SKIPPED in the VM: these tests run rustc; the host's cargo test runs them");
    }
    let trial = Trial::test("typed_transitions_refuse_wrong_code", || {
        let cases = trybuild::TestCases::new();
        cases.compile_fail("tests/compile_fail/*.rs");
        drop(cases); // runs them; panics (a failure) on any mismatch
        Ok(())
    })
    .with_ignored_flag(in_vm);
    libtest_mimic::run(&args, vec![trial]).exit_code()
}
