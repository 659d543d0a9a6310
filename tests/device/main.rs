//! Tests against a real RDMA device (a NIC, or soft-RoCE in the VM run).
//! See `tests/common/mod.rs` for how the device is chosen and skipped.

#[path = "../common/mod.rs"]
#[macro_use]
mod common;

mod bring_up;
mod by_value;
#[cfg(feature = "cm")]
mod cm;
mod context;
mod cq_ex;
mod data;
mod ex;
mod in_use;
mod modify;
mod mw;
mod objects;
mod port_cache;
mod qp;
mod recv_buffers;
mod recv_model;
mod remote;
mod template_pins;

fn main() -> std::process::ExitCode {
    let mut tests = Vec::new();
    tests.extend_from_slice(context::TESTS);
    tests.extend_from_slice(objects::TESTS);
    tests.extend_from_slice(in_use::TESTS);
    tests.extend_from_slice(qp::TESTS);
    tests.extend_from_slice(bring_up::TESTS);
    tests.extend_from_slice(remote::TESTS);
    tests.extend_from_slice(modify::TESTS);
    tests.extend_from_slice(data::TESTS);
    tests.extend_from_slice(by_value::TESTS);
    tests.extend_from_slice(recv_buffers::TESTS);
    tests.extend_from_slice(template_pins::TESTS);
    tests.extend_from_slice(recv_model::TESTS);
    tests.extend_from_slice(ex::TESTS);
    tests.extend_from_slice(mw::TESTS);
    tests.extend_from_slice(cq_ex::TESTS);
    tests.extend_from_slice(port_cache::TESTS);
    #[cfg(feature = "cm")]
    tests.extend_from_slice(cm::TESTS);
    common::run("device", &tests)
}
