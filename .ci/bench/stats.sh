# Sourced by the bench scripts that run inside the VMs (.ci/bench/guest,
# .ci/bench/ex-guest, .ci/hosts-bench): reading perftest-style result tables
# and summing up rounds.

# column LOG SIZE COL: field COL of the result line for SIZE (perftest's table
# layout: #bytes #iterations ...), both for perftest and for ours.
# A value that is not a plain number (perftest printed "inf" once in the VM,
# when it could not tell the CPU's clock rate) counts as no result.
column() {
    awk -v s="$2" -v c="$3" '$1 == s && NF >= c && $2 ~ /^[0-9]+$/ {
        if ($c ~ /^[0-9]+(\.[0-9]+)?$/) print $c; exit}' "$1"
}

# median of the numbers on stdin ("-" if none); range: "min..max" of them.
median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) {print "-"; exit}
    if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
range() { sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {if (NR) printf "%.3g..%.3g\n", lo, hi; else print "-"}'; }

# ratio A B: A/B to three places, 0 when B is not positive.
ratio3() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f\n", (b > 0) ? a / b : 0}'; }
