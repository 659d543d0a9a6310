#!/usr/bin/env bash
# QP setup rate and kernel calls per QP: the crate's typed builders
# (examples/perf_setup.rs) against plain libibverbs (.ci/bench/qp_setup.c).
# Runs inside the VM (a device is needed):
#
#   .ci/bench/qp-setup.sh PERF_SETUP_BINARY WORK_DIR
#
# e.g. from the host, after `cargo build --release --example perf_setup`:
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

rate() { sed -n 's/.*per_sec=\([0-9.]*\).*/\1/p'; }

ratios=()
[ "$ROUNDS" -gt 0 ] 2>/dev/null || ROUNDS=0
for round in $(seq 1 "$ROUNDS"); do
    c_line=$("$C" -d "$DEV" -x "$GIDX" -n "$N")
    echo "$c_line"
    r_line=$("$RUST" -d "$DEV" -x "$GIDX" -n "$N")
    echo "$r_line"
    c_rate=$(rate <<<"$c_line")
    r_rate=$(rate <<<"$r_line")
    [ -n "$c_rate" ] && [ -n "$r_rate" ] || { echo "qp-setup: no rate in round $round" >&2; exit 1; }
    ratios+=("$(awk -v r="$r_rate" -v c="$c_rate" 'BEGIN { printf "%.3f", (c > 0 ? r / c : 0) }')")
done
[ "$ROUNDS" = 0 ] || printf '%s\n' "${ratios[@]}" | sort -g | awk '
    { v[NR] = $1 }
    END {
        m = (NR % 2) ? v[(NR + 1) / 2] : sprintf("%.3f", (v[NR / 2] + v[NR / 2 + 1]) / 2)
        printf "qp_setup: rust/c rate ratio median=%s (%s..%s)\n", m, v[1], v[NR]
    }'

# calls FILE: "syscall calls" lines from an `strace -c` summary (total included).
calls() {
    awk '$1 ~ /^[0-9.]+$/ && NF >= 5 { print $NF, $4 }' "$1"
}
# per_qp NAME PROG...: strace at N=50 and N=100; prints the total per QP,
# and writes the per-syscall differences to WORK/NAME.per-qp.
per_qp() {
    local name=$1; shift
    strace -f -c -o "$WORK/$name.50" "$@" -n 50 >/dev/null
    strace -f -c -o "$WORK/$name.100" "$@" -n 100 >/dev/null
    join -a1 -a2 -e 0 -o 0,1.2,2.2 <(calls "$WORK/$name.50" | sort) <(calls "$WORK/$name.100" | sort) |
        awk -v name="$name" -v out="$WORK/$name.per-qp" '
            $1 == "total" { total = ($3 - $2) / 50; next }
            $3 != $2 { printf "qp_setup:   %s %s %.2f per QP\n", name, $1, ($3 - $2) / 50 > out }
            END { printf "%.2f\n", total }'
}
c_calls=$(per_qp c "$C" -d "$DEV" -x "$GIDX")
r_calls=$(per_qp rust "$RUST" -d "$DEV" -x "$GIDX")
echo "qp_setup: kernel calls per QP: c=$c_calls rust=$r_calls"
cat "$WORK/c.per-qp" "$WORK/rust.per-qp" 2>/dev/null || true

# User-space instructions per QP, counted by callgrind (the same on a busy
# or a quiet machine, unlike the rates above): N=250 minus N=50, over 200.
if [ "${RDMA_VERBS_QP_SETUP_CALLGRIND:-1}" != 0 ] && command -v valgrind >/dev/null; then
    collected() { sed -nE 's/^==[0-9]+== Collected : ([0-9]+).*/\1/p' "$1" | tail -n 1; }
    cg() {  # cg NAME N PROG...: callgrind run, its log WORK/NAME.cg.N.log
        local name=$1 n=$2; shift 2
        valgrind --tool=callgrind --callgrind-out-file="$WORK/$name.cg.$n" "$@" -n "$n" \
            >/dev/null 2>"$WORK/$name.cg.$n.log"
    }
    per_qp_instr() {
        local name=$1 a b; shift
        cg "$name" 50 "$@" && cg "$name" 250 "$@" || { echo "-"; return; }
        a=$(collected "$WORK/$name.cg.50.log"); b=$(collected "$WORK/$name.cg.250.log")
        [ -n "$a" ] && [ -n "$b" ] || { echo "-"; return; }
        awk -v a="$a" -v b="$b" 'BEGIN { printf "%.0f\n", (b - a) / 200 }'
    }
    c_i=$(per_qp_instr c "$C" -d "$DEV" -x "$GIDX")
    r_i=$(per_qp_instr rust "$RUST" -d "$DEV" -x "$GIDX")
    echo "qp_setup: user-space instructions per QP (callgrind): c=$c_i rust=$r_i rust/c=$(awk -v r="$r_i" -v c="$c_i" 'BEGIN { if (r + 0 > 0 && c + 0 > 0) printf "%.2f", r / c; else print "-" }')"
    # Where the Rust side's go: per function, inclusive instructions of
    # the N=250 run minus those of the N=50 run, over 200 (start-up cancels).
    incl() {
        callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
            awk '$1 ~ /^[0-9,]+$/ { v = $1; gsub(",", "", v); sub(/^ *[0-9,]+ +(\([^)]*\) +)?/, "")
                                    print v "\t" $0 }' || true
    }
    if [ -s "$WORK/rust.cg.50" ] && [ -s "$WORK/rust.cg.250" ]; then
        incl "$WORK/rust.cg.50" >"$WORK/rust.cg.50.fns"
        incl "$WORK/rust.cg.250" >"$WORK/rust.cg.250.fns"
        awk -F'\t' 'NR == FNR { a[$2] = $1; next } { d = ($1 - a[$2]) / 200; if (d >= 40) printf "%8.0f  %s\n", d, substr($2, 1, 140) }' \
            "$WORK/rust.cg.50.fns" "$WORK/rust.cg.250.fns" | sort -rn >"$WORK/rust.cg.fns" || true
        echo "qp_setup: Rust functions, inclusive instructions per QP (N=250 minus N=50, over 200; 40 and more):"
        sed 's/^/qp_setup:   /' "$WORK/rust.cg.fns"
    fi
fi
