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
//! Headers older than the newest rdma-core lack some items; the build
//! script finds which (the crate's code for them is compiled out and
//! answers at run time instead) and adds the few enumeration values the
//! safe layer names (`IBV_WC_ATOMIC_WRITE`, `IBV_WC_DRIVER2`/`3`,
//! `IBV_QP_EX_WITH_ATOMIC_WRITE`) with the values of later headers, which
//! are libibverbs' ABI: a library of a release without them never reports
//! them. [`RDMA_CORE_RELEASE`] says which release the build found.
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

/// The rdma-core release of the libibverbs this crate was built against,
/// when its version says so (pkg-config's `libibverbs` version, or the
/// `libibverbs.so.1.<abi>.<release>.<patch>` file in `RDMA_CORE_DIR` or
/// `IBVERBS_LIB_DIR`): `Some(44)` for Debian 12's rdma-core 44.0. The
/// oldest the build accepts is 33.
pub const RDMA_CORE_RELEASE: Option<u32> = parse_release(env!("RDMA_VERBS_RDMA_CORE"));

/// A decimal number, or `None` (the build script writes `unknown`).
const fn parse_release(s: &str) -> Option<u32> {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > 9 {
        return None;
    }
    let (mut i, mut v) = (0, 0u32);
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            return None;
        }
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_numbers_parse() {
        assert_eq!(parse_release("44"), Some(44));
        assert_eq!(parse_release("unknown"), None);
        assert_eq!(parse_release(""), None);
        assert_eq!(parse_release("1234567890"), None);
        // The build that runs this found its release (pkg-config or the
        // library's file name), at or above the floor.
        assert!(
            RDMA_CORE_RELEASE.is_none_or(|r| r >= 33),
            "{RDMA_CORE_RELEASE:?}"
        );
    }

    #[test]
    fn later_enumeration_values_have_their_abi_values_whatever_the_headers() {
        assert_eq!(ibv_wc_opcode::IBV_WC_ATOMIC_WRITE, 9);
        assert_eq!(ibv_wc_opcode::IBV_WC_DRIVER1, 135);
        assert_eq!(ibv_wc_opcode::IBV_WC_DRIVER2, 136);
        assert_eq!(ibv_wc_opcode::IBV_WC_DRIVER3, 137);
        assert_eq!(
            ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_WRITE.0,
            1 << 12
        );
        assert_eq!(ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_TSO.0, 1 << 10);
    }
}
