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
//! safe layer names (`IBV_WC_ATOMIC_WRITE`, `IBV_WC_FLUSH`,
//! `IBV_WC_DRIVER2`/`3`, `IBV_QP_EX_WITH_ATOMIC_WRITE`/`_FLUSH`,
//! `IBV_ACCESS_FLUSH_*`, `IBV_ODP_SUPPORT_FLUSH`/`_ATOMIC_WRITE`) with the
//! values of later headers, which
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

/// The libibverbs a process runs with: the file the dynamic linker
/// loaded, its symbolic links resolved, and the rdma-core release its
/// name says (`libibverbs.so.1.<abi>.<release>.<patch>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedLibrary {
    /// The library's file, e.g.
    /// `/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0`.
    pub path: std::path::PathBuf,
    /// Its rdma-core release (44 above), when the name says.
    pub release: Option<u32>,
}

/// The libibverbs this process runs with, to compare with the one it was
/// built against ([`RDMA_CORE_RELEASE`]); `None` if the dynamic linker
/// does not say.
///
/// A build against a prefix (`RDMA_CORE_DIR`, `IBVERBS_LIB_DIR`) puts no
/// RPATH into the programs that use this crate: Cargo passes a library's
/// link arguments to that library's own tests and examples only. Such a
/// program runs with whichever libibverbs the dynamic linker finds, the
/// system's unless `LD_LIBRARY_PATH` (or the program's own RPATH) names
/// the prefix's; this says which one it was. A library older than the
/// headers may lack what the crate asks of it (the calls that need a newer
/// release then fail, or the provider refuses); a newer one is what
/// rdma-core keeps compatible.
///
/// ```no_run
/// let lib = rdma_verbs::sys::loaded_libibverbs();
/// if let Some(lib) = &lib {
///     if lib.release != rdma_verbs::sys::RDMA_CORE_RELEASE {
///         eprintln!(
///             "built against rdma-core {:?}, running {} ({:?})",
///             rdma_verbs::sys::RDMA_CORE_RELEASE,
///             lib.path.display(),
///             lib.release
///         );
///     }
/// }
/// ```
#[doc(alias = "dladdr")]
pub fn loaded_libibverbs() -> Option<LoadedLibrary> {
    use std::os::unix::ffi::OsStrExt;
    // The address of a libibverbs function as the dynamic linker resolved
    // it (not a PLT stub of the program's own).
    // SAFETY: dlsym reads a NUL-terminated name; RTLD_DEFAULT searches the
    // objects the process loaded.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"ibv_get_device_list".as_ptr()) };
    if f.is_null() {
        return None;
    }
    // SAFETY: all-zero is a valid `Dl_info` (null pointers), which dladdr
    // overwrites.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `f` is an address in a loaded object; dladdr only reads it
    // and writes `info`.
    if unsafe { libc::dladdr(f, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set `dli_fname` to the NUL-terminated name the dynamic
    // linker keeps for the object, which stays loaded (the program links
    // it); it is copied out at once.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let release = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("libibverbs.so.1."))
        .and_then(|rest| rest.split('.').nth(1))
        .and_then(parse_release);
    Some(LoadedLibrary { path, release })
}

/// The rdma-core release of the libibverbs this process runs with
/// ([`loaded_libibverbs`]), found once.
pub(crate) fn loaded_release() -> Option<u32> {
    static RELEASE: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *RELEASE.get_or_init(|| loaded_libibverbs().and_then(|l| l.release))
}

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
    fn the_loaded_library_is_found() {
        let lib = loaded_libibverbs().expect("the process links libibverbs");
        let name = lib.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        assert!(name.starts_with("libibverbs.so.1"), "{lib:?}");
        assert!(lib.release.is_some_and(|r| r >= 33), "{lib:?}");
        // With RDMA_VERBS_EXPECT_LIBIBVERBS set (a run against a prefix,
        // `LD_LIBRARY_PATH` at its library), the release it names.
        if let Some(want) = std::env::var("RDMA_VERBS_EXPECT_LIBIBVERBS").ok() {
            assert_eq!(lib.release, want.parse().ok(), "{lib:?}");
        }
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
        assert_eq!(ibv_wc_opcode::IBV_WC_FLUSH, 8);
        assert_eq!(
            ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_FLUSH.0,
            1 << 11
        );
        assert_eq!(ibv_access_flags::IBV_ACCESS_FLUSH_GLOBAL.0, 1 << 8);
        assert_eq!(ibv_access_flags::IBV_ACCESS_FLUSH_PERSISTENT.0, 1 << 9);
        assert_eq!(ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_FLUSH.0, 1 << 6);
        assert_eq!(
            ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_ATOMIC_WRITE.0,
            1 << 7
        );
    }
}
