//! The raw layer: bindgen's bindings to the system's `infiniband/verbs.h`.
//!
//! Everything here is generated at build time from `wrapper.h`, so it matches
//! the rdma-core version installed on the build machine. The `static inline`
//! functions of verbs.h (`ibv_post_send`, `ibv_poll_cq`, `ibv_query_port`
//! (as `___ibv_query_port`), `ibv_query_device_ex`, `ibv_create_qp_ex`, the
//! `ibv_wr_*` family, ...) are callable too: the build script compiles a C
//! wrapper for each of them and links it in.
//!
//! With the `cm` feature (on by default) librdmacm's `rdma/rdma_cma.h` is
//! here too: `rdma_create_id`, `rdma_get_cm_event`, `struct rdma_cm_id`,
//! `rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED`, `RDMA_UDP_QKEY`, ...
//!
//! Conventions:
//! * flag enums (`ibv_access_flags`, `ibv_qp_attr_mask`, `ibv_send_flags`, ...)
//!   are bitfield newtypes: `ibv_access_flags::IBV_ACCESS_LOCAL_WRITE`;
//! * other enums are modules of constants: `ibv_qp_state::IBV_QPS_RTS`, of
//!   type `ibv_qp_state::Type`.
//!
//! Use it for what the safe layer does not cover yet. Every function here is
//! `unsafe`: the caller upholds libibverbs' own rules.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_docs,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    rustdoc::all
)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
