//! Adversarial device tests: each tries to break one promise of the safe
//! API from safe code only (no `unsafe` in this test binary), on a real
//! device (soft-RoCE in the VM run). One test per class of issue 7.
#![forbid(unsafe_code)]

#[path = "../common/mod.rs"]
#[macro_use]
mod common;

mod arith;
#[cfg(feature = "cm")]
mod cm;
mod cq_ex;
mod data;
mod gid;
mod hardening;
mod mw;
mod predict;
mod wire;

fn main() -> std::process::ExitCode {
    let mut tests = Vec::new();
    tests.extend_from_slice(arith::TESTS);
    tests.extend_from_slice(cq_ex::TESTS);
    tests.extend_from_slice(data::TESTS);
    tests.extend_from_slice(gid::TESTS);
    tests.extend_from_slice(mw::TESTS);
    tests.extend_from_slice(predict::TESTS);
    tests.extend_from_slice(hardening::TESTS);
    tests.extend_from_slice(wire::TESTS);
    #[cfg(feature = "cm")]
    tests.extend_from_slice(cm::TESTS);
    #[cfg(feature = "cm")]
    tests.extend_from_slice(arith::CM_TESTS);
    common::run("adversarial", &tests)
}
