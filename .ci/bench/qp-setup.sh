#!/usr/bin/env bash
# QP setup rate and kernel calls per QP: the crate's typed builders
# (examples/perf_setup.rs) against plain libibverbs (.ci/bench/qp_setup.c).
# Runs inside the VM (a device is needed):
#
#   .ci/bench/qp-setup.sh PERF_SETUP_BINARY WORK_DIR
#
# e.g. from the host, after `cargo build --release --example perf_setup` and
# `cargo build --release --manifest-path .ci/xtask/Cargo.toml` (its lines):
#   RDMA_VERBS_SKIP_SETUP=1 .ci/vm run -- .ci/bench/qp-setup.sh \
#       "$CARGO_TARGET_DIR/release/examples/perf_setup" /tmp/qs
#
# Compiles the C program into WORK_DIR, runs C and Rust interleaved three
# times each (RDMA_VERBS_QP_SETUP_ROUNDS) at N=200 (each line printed), then prints
#   qp_setup: rust/c rate ratio median=R (min..max)
# and, from `strace -f -c` runs at N=50 and N=100 (the difference over 50
# QPs, so that start-up and teardown cancel),
#   qp_setup: kernel calls per QP: c=X rust=Y
# followed by the per-system-call difference of each, and, from callgrind
# runs at N=50 and N=250 (the difference over 200 QPs, so that start-up
# and teardown cancel),
#   qp_setup: user-space instructions per QP (callgrind): c=X rust=Y rust/c=R
# with the Rust run's heaviest functions (inclusive, per QP) in
# WORK/rust.cg.fns, printed too (RDMA_VERBS_QP_SETUP_CALLGRIND=0 skips this
# part; RDMA_VERBS_QP_SETUP_ROUNDS=0 skips the rate rounds and their line).
#
# Environment: RDMA_VERBS_DEVICE (default rxe0), RDMA_VERBS_QP_SETUP_GID_INDEX (default 1),
# RDMA_VERBS_QP_SETUP_N (default 200), RDMA_VERBS_QP_SETUP_ROUNDS (default 3; more on a
# busy machine), RDMA_VERBS_QP_SETUP_CALLGRIND (default 1). .ci/vm hands every RDMA_VERBS_* variable to the guest.
# Exits 0 whatever the ratio; non-zero only when something fails to run.
# This script runs the programs; `xtask bench qp-setup` ($RDMA_VERBS_XTASK)
# reads their outputs and prints the lines after the rate lines.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 PERF_SETUP_BINARY WORK_DIR" >&2
    exit 2
fi
RUST=$1
WORK=$2
DEV=${RDMA_VERBS_DEVICE:-rxe0}
GIDX=${RDMA_VERBS_QP_SETUP_GID_INDEX:-1}
N=${RDMA_VERBS_QP_SETUP_N:-200}
ROUNDS=${RDMA_VERBS_QP_SETUP_ROUNDS:-3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

[ -x "$RUST" ] || { echo "qp-setup: $RUST is not an executable" >&2; exit 1; }
mkdir -p "$WORK"
C="$WORK/qp_setup"
cc -O2 "$HERE/qp_setup.c" -o "$C" -libverbs

X=${RDMA_VERBS_XTASK:?the xtask binary (.ci/vm builds it)}

# The rate rounds: each line printed, and kept in WORK/rate.{c,rust}.ROUND.
[ "$ROUNDS" -gt 0 ] 2>/dev/null || ROUNDS=0
for round in $(seq 1 "$ROUNDS"); do
    "$C" -d "$DEV" -x "$GIDX" -n "$N" | tee "$WORK/rate.c.$round"
    "$RUST" -d "$DEV" -x "$GIDX" -n "$N" | tee "$WORK/rate.rust.$round"
done

# Kernel calls: strace at N=50 and N=100 (WORK/{c,rust}.{50,100}).
for who in c rust; do
    prog=$C; [ "$who" = c ] || prog=$RUST
    strace -f -c -o "$WORK/$who.50" "$prog" -d "$DEV" -x "$GIDX" -n 50 >/dev/null
    strace -f -c -o "$WORK/$who.100" "$prog" -d "$DEV" -x "$GIDX" -n 100 >/dev/null
done

# User-space instructions, counted by callgrind (the same on a busy or a
# quiet machine, unlike the rates above): runs at N=50 and N=250, their
# profiles WORK/{c,rust}.cg.{50,250} and valgrind's logs *.log.
if [ "${RDMA_VERBS_QP_SETUP_CALLGRIND:-1}" != 0 ] && command -v valgrind >/dev/null; then
    for who in c rust; do
        prog=$C; [ "$who" = c ] || prog=$RUST
        for n in 50 250; do
            valgrind --tool=callgrind --callgrind-out-file="$WORK/$who.cg.$n" "$prog" -d "$DEV" -x "$GIDX" -n "$n" \
                >/dev/null 2>"$WORK/$who.cg.$n.log" || mv "$WORK/$who.cg.$n.log" "$WORK/$who.cg.$n.log.failed"
        done
    done
fi

# The ratio, the calls and the instructions per QP (.ci/xtask/src/bench/qps.rs).
"$X" bench qp-setup "$WORK" "$ROUNDS"
