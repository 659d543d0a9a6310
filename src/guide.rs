//! Guides: the reference material behind the README, one page each.
//!
//! Nothing here is code; the pages are the crate's long-form documentation,
//! kept beside the source so that each fact has one home (the README links
//! here). Their Rust code blocks are compiled as doctests.
//!
//! - [`promises`]: what the safe layer guarantees, and how each promise is
//!   attacked in the tests;
//! - [`examples`]: the connection manager and the extended verbs in code, and
//!   the example programs with the C programs they match;
//! - [`testing`]: the soft-RoCE VM, valgrind, the environment variables, and
//!   where everything is in the source tree;
//! - [`performance`]: the cost of the safe layer against C (perftest,
//!   `ibv_rc_pingpong`, QP setup), and how it is measured;
//! - [`releases`]: the rdma-core releases the crate builds and runs on.

#[doc = include_str!("guide/promises.md")]
pub mod promises {}

#[doc = include_str!("guide/examples.md")]
pub mod examples {}

#[doc = include_str!("guide/testing.md")]
pub mod testing {}

#[doc = include_str!("guide/performance.md")]
pub mod performance {}

#[doc = include_str!("guide/releases.md")]
pub mod releases {}
