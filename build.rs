//! Build script: finds the system's libibverbs, generates the raw bindings
//! (`rdma_verbs::sys`) with bindgen from `wrapper.h`, and compiles C wrappers
//! for the `static inline` functions of `infiniband/verbs.h` with `cc`.
//!
//! With the `cm` feature (on by default) it also binds librdmacm's
//! `rdma/rdma_cma.h` and links `librdmacm`, found the same ways (the
//! `RDMA_CORE_DIR` prefix, `RDMACM_LIB_DIR` next to `IBVERBS_LIB_DIR`, or
//! `pkg-config librdmacm`).
//!
//! Where libibverbs comes from:
//! * `RDMA_CORE_DIR=<prefix>`: a custom rdma-core install or build tree
//!   (headers in `<prefix>/include`, library in `<prefix>/lib64`, `<prefix>/lib`
//!   or `<prefix>/lib/<triple>`);
//! * `IBVERBS_INCLUDE_DIR` / `IBVERBS_LIB_DIR`: the two directories named apart;
//! * otherwise `pkg-config libibverbs`.
//!
//! The oldest rdma-core it builds against is 33 ([`FLOOR`]): the library's
//! release (pkg-config's version, or the `libibverbs.so.1.<abi>.<release>.*`
//! file) is checked first, with a clear message when it is older. What the
//! crate uses of later releases is found in the generated bindings
//! ([`PROBES`], emitted as `cfg`s) or, for enumeration values, added with
//! their ABI values where the headers lack them ([`COMPAT_CONSTS`]).

use std::env;
use std::path::{Path, PathBuf};
use std::process::exit;

/// What to install, printed whenever a prerequisite is missing.
const INSTALL_HINT: &str = "\
Install the libibverbs development files and libclang, then build again:
    Debian/Ubuntu:  sudo apt-get install libibverbs-dev librdmacm-dev pkg-config clang libclang-dev
    Fedora/RHEL:    sudo dnf install rdma-core-devel pkgconf-pkg-config clang-devel
    openSUSE:       sudo zypper install rdma-core-devel pkg-config clang-devel
(librdmacm-dev is needed for the default `cm` feature; build with
`--no-default-features` to go without the connection manager.)
A custom rdma-core can be named with RDMA_CORE_DIR=<install prefix or build dir>,
or with IBVERBS_INCLUDE_DIR and IBVERBS_LIB_DIR (and RDMACM_LIB_DIR).";

/// Stops the build with `what` and the install hint, instead of a backtrace.
fn fail(what: &str) -> ! {
    eprintln!("\nerror: rdma-verbs cannot be built: {what}\n\n{INSTALL_HINT}\n");
    exit(1)
}

/// Where to find the headers and the library.
struct Ibverbs {
    include_dirs: Vec<PathBuf>,
    /// The library directory named by `RDMA_CORE_DIR`/`IBVERBS_LIB_DIR`
    /// (None when pkg-config found it).
    lib_dir: Option<PathBuf>,
    /// The rdma-core release of the library, when it tells (pkg-config's
    /// version, or the `libibverbs.so.1.<abi>.<release>.<patch>` file).
    release: Option<u32>,
}

/// The oldest rdma-core this crate builds against.
const FLOOR: u32 = 33;

/// What the crate uses that rdma-core added after [`FLOOR`]: the cfg set
/// when the headers have it, a text only the generated bindings of such
/// headers contain, and the release that added it.
const PROBES: &[(&str, &str, u32)] = &[
    // `struct ibv_device_attr_ex::phys_port_cnt_ex` (rdma-core 35).
    ("rdma_core_phys_port_cnt_ex", "pub phys_port_cnt_ex:", 35),
    // `ibv_reg_dmabuf_mr` (rdma-core 34).
    ("rdma_core_reg_dmabuf_mr", "pub fn ibv_reg_dmabuf_mr(", 34),
    // `ibv_wr_atomic_write` (rdma-core 44).
    (
        "rdma_core_wr_atomic_write",
        "pub fn ibv_wr_atomic_write(",
        44,
    ),
    // `ibv_wr_flush` (rdma-core 45).
    ("rdma_core_wr_flush", "pub fn ibv_wr_flush(", 45),
];

/// Enumeration values of later releases, added to the bindings when the
/// headers lack them (the values are libibverbs' ABI, the same in every
/// release that has them), so that the crate's enums and flags are the
/// same whatever rdma-core it was built against; a device of an older
/// rdma-core never reports them. (bindgen module or type, constant, the
/// Rust item, release.)
const COMPAT_CONSTS: &[(&str, &str, &str, u32)] = &[
    ("pub mod ibv_wc_opcode {", "IBV_WC_ATOMIC_WRITE", "pub const IBV_WC_ATOMIC_WRITE: Type = 9;", 44),
    ("pub mod ibv_wc_opcode {", "IBV_WC_FLUSH", "pub const IBV_WC_FLUSH: Type = 8;", 45),
    ("pub mod ibv_wc_opcode {", "IBV_WC_DRIVER2", "pub const IBV_WC_DRIVER2: Type = 136;", 36),
    ("pub mod ibv_wc_opcode {", "IBV_WC_DRIVER3", "pub const IBV_WC_DRIVER3: Type = 137;", 36),
    (
        "impl ibv_qp_create_send_ops_flags {",
        "IBV_QP_EX_WITH_ATOMIC_WRITE",
        "pub const IBV_QP_EX_WITH_ATOMIC_WRITE: ibv_qp_create_send_ops_flags = ibv_qp_create_send_ops_flags(4096);",
        44,
    ),
    (
        "impl ibv_qp_create_send_ops_flags {",
        "IBV_QP_EX_WITH_FLUSH",
        "pub const IBV_QP_EX_WITH_FLUSH: ibv_qp_create_send_ops_flags = ibv_qp_create_send_ops_flags(2048);",
        45,
    ),
    (
        "impl ibv_access_flags {",
        "IBV_ACCESS_FLUSH_GLOBAL",
        "pub const IBV_ACCESS_FLUSH_GLOBAL: ibv_access_flags = ibv_access_flags(256);",
        45,
    ),
    (
        "impl ibv_access_flags {",
        "IBV_ACCESS_FLUSH_PERSISTENT",
        "pub const IBV_ACCESS_FLUSH_PERSISTENT: ibv_access_flags = ibv_access_flags(512);",
        45,
    ),
    (
        "impl ibv_odp_transport_cap_bits {",
        "IBV_ODP_SUPPORT_FLUSH",
        "pub const IBV_ODP_SUPPORT_FLUSH: ibv_odp_transport_cap_bits = ibv_odp_transport_cap_bits(64);",
        58,
    ),
    (
        "impl ibv_odp_transport_cap_bits {",
        "IBV_ODP_SUPPORT_ATOMIC_WRITE",
        "pub const IBV_ODP_SUPPORT_ATOMIC_WRITE: ibv_odp_transport_cap_bits = ibv_odp_transport_cap_bits(128);",
        58,
    ),
];

/// `bindings` with the [`COMPAT_CONSTS`] its headers lack, each as the
/// first item of its module or `impl` block (the [`PROBES`] read the
/// bindings before, so they see the headers' own items only).
fn with_compat(mut bindings: String) -> String {
    for &(anchor, name, item, since) in COMPAT_CONSTS {
        if bindings.contains(&format!("pub const {name}:")) {
            continue;
        }
        let Some(at) = bindings.find(anchor) else {
            fail(&format!("the bindings have no `{anchor}` (for {name})"));
        };
        let at = at + anchor.len();
        bindings.insert_str(
            at,
            &format!("\n    #[doc = \"Not in these headers (rdma-core {since} added it); the value of later ones.\"]\n    {item}"),
        );
    }
    bindings
}

/// The release in an rdma-core library version `1.<abi>.<release>[.<patch>]`
/// (pkg-config's, or the shared object's file name).
fn release_of(version: &str) -> Option<u32> {
    let mut parts = version.split('.');
    let (Some("1"), Some(_abi), Some(release)) = (parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    release.parse().ok()
}

/// The release of the `libibverbs.so.1.*` in `dir`, if its file name says.
fn release_in(dir: &Path) -> Option<u32> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            release_of(name.strip_prefix("libibverbs.so.")?)
        })
        .max()
}

/// Stops the build, before any compile error, when the library is older
/// than the floor.
fn check_floor(release: Option<u32>, from: &str) {
    match release {
        Some(r) if r < FLOOR => fail(&format!(
            "{from} is rdma-core {r}, older than the oldest this crate supports ({FLOOR}, \
             Debian 11's)"
        )),
        _ => {}
    }
}

fn env_path(name: &str) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed={name}");
    env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn link_from(lib_dir: &Path) {
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=ibverbs");
}

fn find_ibverbs() -> Ibverbs {
    if let Some(prefix) = env_path("RDMA_CORE_DIR") {
        let include = prefix.join("include");
        // lib64, lib, and Debian's multiarch lib/<triple>.
        let mut candidates = vec![prefix.join("lib64"), prefix.join("lib")];
        if let Ok(entries) = std::fs::read_dir(prefix.join("lib")) {
            candidates.extend(entries.flatten().map(|e| e.path()));
        }
        let lib = candidates
            .into_iter()
            .find(|d| d.join("libibverbs.so").exists())
            .unwrap_or_else(|| {
                fail(&format!(
                    "RDMA_CORE_DIR={} has no libibverbs.so in lib64/, lib/ or lib/<triple>/",
                    prefix.display()
                ))
            });
        link_from(&lib);
        let release = release_in(&lib);
        check_floor(release, &format!("RDMA_CORE_DIR={}", prefix.display()));
        return Ibverbs {
            include_dirs: vec![include],
            lib_dir: Some(lib),
            release,
        };
    }
    let include = env_path("IBVERBS_INCLUDE_DIR");
    let lib = env_path("IBVERBS_LIB_DIR");
    match (include, lib) {
        (Some(include), Some(lib)) => {
            link_from(&lib);
            let release = release_in(&lib);
            check_floor(release, &format!("IBVERBS_LIB_DIR={}", lib.display()));
            return Ibverbs {
                include_dirs: vec![include],
                lib_dir: Some(lib),
                release,
            };
        }
        (None, None) => {}
        _ => fail("IBVERBS_INCLUDE_DIR and IBVERBS_LIB_DIR must be set together"),
    }
    match pkg_config::Config::new()
        .atleast_version("1.1")
        .probe("libibverbs")
    {
        Ok(lib) => {
            let release = release_of(&lib.version);
            check_floor(release, &format!("pkg-config's libibverbs {}", lib.version));
            Ibverbs {
                include_dirs: lib.include_paths,
                lib_dir: None,
                release,
            }
        }
        Err(e) => fail(&format!("pkg-config did not find libibverbs ({e})")),
    }
}

/// Finds librdmacm (the `cm` feature): beside libibverbs when that was named
/// by hand, else by pkg-config. Returns extra include directories.
fn find_rdmacm(ibverbs: &Ibverbs) -> Vec<PathBuf> {
    let named = env_path("RDMACM_LIB_DIR").or_else(|| ibverbs.lib_dir.clone());
    if let Some(dir) = named {
        if !dir.join("librdmacm.so").exists() {
            fail(&format!(
                "{} has no librdmacm.so (the `cm` feature needs librdmacm; set RDMACM_LIB_DIR)",
                dir.display()
            ));
        }
        println!("cargo:rustc-link-search=native={}", dir.display());
        return Vec::new();
    }
    match pkg_config::Config::new()
        .cargo_metadata(false)
        .probe("librdmacm")
    {
        Ok(lib) => {
            for dir in &lib.link_paths {
                println!("cargo:rustc-link-search=native={}", dir.display());
            }
            lib.include_paths
        }
        Err(e) => fail(&format!(
            "pkg-config did not find librdmacm ({e}), which the default `cm` feature needs"
        )),
    }
}

/// Bindings for docs.rs, whose builders have no rdma-core: this crate's
/// bindings of Debian 12's rdma-core 44 with the `cm` feature, exactly as
/// the build writes them there (CI checks that they still are). Generated
/// text, copied to `OUT_DIR` as the build's own bindings are, never a
/// module of the crate: hence `.rs.in`.
const DOCS_RS_BINDINGS: &str = "src/sys/bindings-docs-rs.rs.in";
/// The rdma-core release of [`DOCS_RS_BINDINGS`].
const DOCS_RS_RELEASE: u32 = 44;

/// The `cfg`s of [`PROBES`] that `bindings` (the headers' own items) have.
fn emit_probes(bindings: &str) {
    for &(cfg, marker, _since) in PROBES {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if bindings.contains(marker) {
            println!("cargo:rustc-cfg={cfg}");
        }
    }
}

/// With `DOCS_RS` set (docs.rs sets it): documentation only, on a machine
/// that may have neither rdma-core nor libclang. The bindings are
/// [`DOCS_RS_BINDINGS`]; nothing is linked or compiled, so nothing built
/// this way can run.
fn docs_rs(manifest_dir: &Path, out_dir: &Path) {
    let path = manifest_dir.join(DOCS_RS_BINDINGS);
    println!("cargo:rerun-if-changed={}", path.display());
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", path.display())));
    emit_probes(&text);
    println!("cargo:rustc-env=RDMA_VERBS_RDMA_CORE={DOCS_RS_RELEASE}");
    std::fs::write(out_dir.join("bindings.rs"), with_compat(text))
        .unwrap_or_else(|e| fail(&format!("cannot write bindings.rs: {e}")));
}

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    if env_path("DOCS_RS").is_some() {
        return docs_rs(&manifest_dir, &out_dir);
    }

    let ibverbs = find_ibverbs();
    let cm = env::var_os("CARGO_FEATURE_CM").is_some();
    let mut include_dirs = ibverbs.include_dirs.clone();
    if cm {
        include_dirs.extend(find_rdmacm(&ibverbs));
    }
    let wrapper = manifest_dir.join("wrapper.h");

    if !ibverbs
        .include_dirs
        .iter()
        .chain(std::iter::once(&PathBuf::from("/usr/include")))
        .any(|d| d.join("infiniband/verbs.h").exists())
    {
        fail("infiniband/verbs.h was not found");
    }
    // Dependents (`links = "ibverbs"`) can read this as DEP_IBVERBS_INCLUDE.
    if let Some(dir) = include_dirs.first() {
        println!("cargo:include={}", dir.display());
    }

    let static_fns = out_dir.join("verbs_static_fns");
    let mut builder = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .clang_args(include_dirs.iter().map(|d| format!("-I{}", d.display())))
        .clang_args(cm.then_some("-DRDMA_VERBS_CM"))
        .allowlist_function("_*ibv_.*")
        .allowlist_type("ibv_.*")
        .allowlist_var("IBV_.*")
        .allowlist_var("RDMA_VERBS_.*")
        // Non-flag C enums become modules of constants (`ibv_qp_state::IBV_QPS_RTS`
        // of type `ibv_qp_state::Type`): an out-of-range value read from C is
        // then just a number, never undefined behaviour.
        .default_enum_style(bindgen::EnumVariation::ModuleConsts)
        // Anonymous enums (`enum { IBV_LINK_LAYER_ETHERNET, ... }`) would get
        // unstable `_bindgen_ty_N` module names: make them plain constants.
        .constified_enum("IBV_.*|RDMA_VERBS_.*")
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(false)
        .generate_comments(true)
        // Formatted in-process, never by a `rustfmt` that may be missing
        // (Debian's packaged rustc, rustup's minimal profile): the probes and
        // `with_compat` read the bindings as this formatter writes them.
        .formatter(bindgen::Formatter::Prettyplease)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&static_fns)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    // Flag enums become bitfield newtypes with `|`/`&` (`ibv_access_flags::IBV_ACCESS_LOCAL_WRITE`).
    if cm {
        // librdmacm: functions, types and constants (`rdma_cm_event_type::
        // RDMA_CM_EVENT_ESTABLISHED`, `RDMA_UDP_QKEY`, ...).
        builder = builder
            .allowlist_function("rdma_.*")
            .allowlist_type("rdma_.*")
            .allowlist_var("RDMA_.*")
            .constified_enum("RDMA_.*");
    }
    for flags in [
        r"ibv_.*_flags2?",
        r"ibv_.*_mask",
        r"ibv_raw_packet_caps",
        r"ibv_odp_general_caps",
        r"ibv_odp_transport_cap_bits",
        r"ibv_rx_hash_fields",
        r"ibv_pci_atomic_op_size",
    ] {
        builder = builder.bitfield_enum(flags);
    }

    // A missing libclang makes bindgen panic deep inside clang-sys; turn that
    // into the same install hint as a missing libibverbs.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let generated =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
    std::panic::set_hook(default_hook);
    let bindings = match generated {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => fail(&format!(
            "bindgen could not parse infiniband/verbs.h ({e}); is clang's resource directory installed?"
        )),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("bindgen panicked");
            fail(&format!("libclang is missing or unusable ({msg})"))
        }
    };
    // The probes read the headers' own items, before any compat item.
    let text = bindings.to_string();
    emit_probes(&text);
    let text = with_compat(text);
    let release = ibverbs
        .release
        .map_or_else(|| "unknown".to_owned(), |r| r.to_string());
    println!("cargo:rustc-env=RDMA_VERBS_RDMA_CORE={release}");
    std::fs::write(out_dir.join("bindings.rs"), text)
        .unwrap_or_else(|e| fail(&format!("cannot write bindings.rs: {e}")));

    // The C wrappers bindgen wrote for the `static inline` functions.
    let mut cc = cc::Build::new();
    if cm {
        cc.define("RDMA_VERBS_CM", None);
    }
    cc.file(static_fns.with_extension("c"))
        .include(&manifest_dir)
        .includes(&include_dirs)
        .warnings(false);
    cc.try_compile("rdma_verbs_static_fns")
        .unwrap_or_else(|e| fail(&format!("compiling the static-inline wrappers failed: {e}")));
    // The wrappers call into the libraries, so they come after them on the link line.
    if cm {
        println!("cargo:rustc-link-lib=rdmacm");
    }
    println!("cargo:rustc-link-lib=ibverbs");
}
