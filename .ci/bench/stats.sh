# Sourced by .ci/hosts-bench (inside the VMs): reading perftest-style
# result tables and summing up rounds, through `xtask bench`
# ($RDMA_VERBS_XTASK, .ci/xtask/src/bench/: parse.rs and stats.rs), as the
# bench's own tables do.

# column LOG SIZE COL: field COL of the result line for SIZE (perftest's table
# layout: #bytes #iterations ...), both for perftest and for ours; nothing
# if that is not a plain number.
column() { "$RDMA_VERBS_XTASK" bench column "$@"; }

# median of the numbers on stdin ("-" if none); range: "min..max" of them.
median() { "$RDMA_VERBS_XTASK" bench median; }
range() { "$RDMA_VERBS_XTASK" bench range; }

# ratio A B: A/B to three places, 0 when B is not positive.
ratio3() { "$RDMA_VERBS_XTASK" bench ratio3 "$@"; }
