//! Tests against a real RDMA device (a NIC, or soft-RoCE in the VM run).
//! See `tests/common/mod.rs` for how the device is chosen and skipped.

#[path = "../common/mod.rs"]
#[macro_use]
mod common;
use common::Need;

mod bring_up;
mod chunks_back;
#[cfg(feature = "cm")]
mod cm;
#[cfg(feature = "cm")]
mod cm_datagram;
#[cfg(feature = "cm")]
mod cm_own_qps;
#[cfg(feature = "cm")]
mod cm_user;
mod context;
mod cq_ex;
mod cq_route;
mod data;
mod endpoint_cache;
mod ex;
mod ex_chunks_back;
mod explain;
mod halves_model;
mod in_use;
mod modify;
mod modify_values;
mod mw;
mod objects;
mod odp;
mod owned;
mod peer_view;
mod port_cache;
mod qp;
mod reclaim_one;
mod recv_buffers;
mod recv_model;
mod registration;
mod remote;
mod remote_only;
mod round_trip;
#[cfg(feature = "cm")]
mod route;
mod template_pins;
mod templates;
mod wait;

fn main() -> std::process::ExitCode {
    let mut tests = Vec::new();
    tests.extend_from_slice(context::TESTS);
    tests.extend_from_slice(objects::TESTS);
    tests.extend_from_slice(owned::TESTS);
    tests.extend_from_slice(registration::TESTS);
    tests.extend_from_slice(in_use::TESTS);
    tests.extend_from_slice(qp::TESTS);
    tests.extend_from_slice(bring_up::TESTS);
    tests.extend_from_slice(remote::TESTS);
    tests.extend_from_slice(peer_view::TESTS);
    tests.extend_from_slice(modify::TESTS);
    tests.extend_from_slice(modify_values::TESTS);
    tests.extend_from_slice(data::TESTS);
    tests.extend_from_slice(chunks_back::TESTS);
    tests.extend_from_slice(reclaim_one::TESTS);
    tests.extend_from_slice(templates::TESTS);
    tests.extend_from_slice(recv_buffers::TESTS);
    tests.extend_from_slice(round_trip::TESTS);
    tests.extend_from_slice(template_pins::TESTS);
    tests.extend_from_slice(halves_model::TESTS);
    tests.extend_from_slice(recv_model::TESTS);
    tests.extend_from_slice(ex::TESTS);
    tests.extend_from_slice(ex_chunks_back::TESTS);
    tests.extend_from_slice(remote_only::TESTS);
    tests.extend_from_slice(odp::TESTS);
    tests.extend_from_slice(mw::TESTS);
    tests.extend_from_slice(cq_ex::TESTS);
    tests.extend_from_slice(port_cache::TESTS);
    tests.extend_from_slice(endpoint_cache::TESTS);
    tests.extend_from_slice(wait::TESTS);
    tests.extend_from_slice(cq_route::TESTS);
    tests.extend_from_slice(explain::TESTS);
    #[cfg(feature = "cm")]
    tests.extend_from_slice(cm::TESTS);
    #[cfg(feature = "cm")]
    tests.extend_from_slice(cm_datagram::TESTS);
    #[cfg(feature = "cm")]
    tests.extend_from_slice(cm_own_qps::TESTS);
    #[cfg(feature = "cm")]
    tests.extend_from_slice(cm_user::TESTS);
    #[cfg(feature = "cm")]
    tests.extend_from_slice(route::TESTS);
    common::run_needing("device", &tests, NEEDS)
}

/// What rxe lacks before rdma-core 34 (extended QPs and CQs) and 36 (memory
/// windows); see `common::Need`.
const NEEDS: &[(&str, Need)] = &[
    ("explain::an_extended_cqs_completion", Need::ExtendedCq),
    ("ex::", Need::ExtendedQp),
    ("ex_chunks_back::", Need::ExtendedQp),
    ("remote_only::", Need::ExtendedQp),
    ("mw::", Need::MemoryWindows),
    ("mw::", Need::ExtendedQp),
    (
        "mw::send_with_invalidate_seen_through_an_extended_cq",
        Need::ExtendedCq,
    ),
    // Not cq_ex::timestamps_need_the_device_mask and
    // cq_ex::cvlan_and_flow_tag_refused_on_rxe: their refusals come first.
    (
        "cq_ex::send_recv_with_imm_reads_byte_len_imm_qp_num",
        Need::ExtendedCq,
    ),
    (
        "cq_ex::rdma_write_with_imm_without_qp_num_still_reclaims",
        Need::ExtendedCq,
    ),
    (
        "cq_ex::ud_receive_reads_src_qp_sl_slid_path_bits",
        Need::ExtendedCq,
    ),
    (
        "cq_ex::bad_arguments_refused_before_the_call",
        Need::ExtendedCq,
    ),
    ("cq_ex::empty_cq_starts_no_batch", Need::ExtendedCq),
    (
        "cq_ex::many_drained_batches_see_each_completion_once",
        Need::ExtendedCq,
    ),
    (
        "cq_ex::batch_dropped_midway_resumes_with_the_next",
        Need::ExtendedCq,
    ),
    ("cq_ex::basic_poll_refused_on_as_cq", Need::ExtendedCq),
    (
        "cq_ex::flushed_completions_read_and_reclaimed",
        Need::ExtendedCq,
    ),
    (
        "cq_ex::event_through_a_channel_and_srq_reclaim",
        Need::ExtendedCq,
    ),
    #[cfg(feature = "cm")]
    ("cm_own_qps::extended_cm_qps_post_batches", Need::ExtendedQp),
];
