//! Adversarial device tests: each tries to break one promise of the safe
//! API from safe code only (no `unsafe` in this test binary), on a real
//! device (soft-RoCE in the VM run). Which promise each module attacks:
//! `src/guide/promises.md` names its tests under each promise.
#![forbid(unsafe_code)]

#[path = "../common/mod.rs"]
#[macro_use]
mod common;
use common::Need;

mod acks;
#[cfg(feature = "cm")]
mod cm;
mod cq_ex;
mod data;
mod extremes;
mod gid;
mod halves;
mod known_state;
mod mw;
mod no_hang_no_crash;
mod owned;
mod sure_to_fail;
mod wire;

fn main() -> std::process::ExitCode {
    let mut tests = Vec::new();
    tests.extend_from_slice(acks::TESTS);
    tests.extend_from_slice(extremes::TESTS);
    tests.extend_from_slice(cq_ex::TESTS);
    tests.extend_from_slice(data::TESTS);
    tests.extend_from_slice(gid::TESTS);
    tests.extend_from_slice(mw::TESTS);
    tests.extend_from_slice(owned::TESTS);
    tests.extend_from_slice(sure_to_fail::TESTS);
    tests.extend_from_slice(known_state::TESTS);
    tests.extend_from_slice(halves::TESTS);
    tests.extend_from_slice(no_hang_no_crash::TESTS);
    tests.extend_from_slice(wire::TESTS);
    #[cfg(feature = "cm")]
    tests.extend_from_slice(cm::TESTS);
    #[cfg(feature = "cm")]
    tests.extend_from_slice(extremes::CM_TESTS);
    common::run_needing("adversarial", &tests, NEEDS)
}

/// What rxe before rdma-core 34 lacks (see `common::Need`).
const NEEDS: &[(&str, Need)] = &[
    (
        "extremes::sge_len_past_the_chunk_or_u32_is_refused",
        Need::ExtendedQp,
    ),
    (
        "cq_ex::cq_poll_past_its_end_calls_nothing_round_the_ring",
        Need::ExtendedCq,
    ),
    (
        "cq_ex::cq_poll_dropped_before_next_loses_no_buffer",
        Need::ExtendedCq,
    ),
    (
        "no_hang_no_crash::leaked_cq_poll_refuses_not_spins",
        Need::ExtendedCq,
    ),
    (
        "mw::handles_dropped_while_binding_keep_window_and_region",
        Need::ExtendedQp,
    ),
    (
        "mw::bind_completion_moves_the_window_once_on_its_qp",
        Need::ExtendedQp,
    ),
    (
        "mw::never_bound_or_invalidated_twice_at_once",
        Need::ExtendedQp,
    ),
    (
        "mw::never_bound_windows_refuse_invalidate_and_unbind",
        Need::ExtendedQp,
    ),
    (
        "mw::type1_rebound_elsewhere_while_binding_region_closed",
        Need::ExtendedQp,
    ),
    (
        "sure_to_fail::batch_read_into_region_without_local_write_is_refused",
        Need::ExtendedQp,
    ),
    (
        "no_hang_no_crash::leaked_batch_refuses_sends_not_spins",
        Need::ExtendedQp,
    ),
    (
        "no_hang_no_crash::window_key_after_reset_cut_a_bind_short",
        Need::ExtendedQp,
    ),
    (
        "no_hang_no_crash::zz_send_with_inv_of_unbound_window_refused",
        Need::ExtendedQp,
    ),
];
