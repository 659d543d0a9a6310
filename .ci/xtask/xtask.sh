# Sourced by the scripts of .ci/ (with CI_DIR set to .ci's absolute path):
# `xtask ARGS...` runs the CI's logic in Rust (.ci/xtask: parsing, summaries,
# statistics, package indexes), built on the host on first use, in its own
# target folder whatever CARGO_TARGET_DIR says. Guests cannot build (a
# stack's root sees the project read-only): they run "$RDMA_VERBS_XTASK",
# which .ci/vm-common's guest_env passes on: .ci/vm and .ci/hosts call
# xtask_build before they boot one.
export RDMA_VERBS_XTASK=$CI_DIR/xtask/target/release/xtask
xtask_build() {
    CARGO_TARGET_DIR=$CI_DIR/xtask/target \
        cargo build --quiet --release --locked --manifest-path "$CI_DIR/xtask/Cargo.toml" >&2 ||
        { echo "cannot build $CI_DIR/xtask" >&2; return 2; }
}
xtask() {
    xtask_build || return
    "$RDMA_VERBS_XTASK" "$@"
}
