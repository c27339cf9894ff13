# shellcheck shell=sh
# bench/rounds.sh - sourced by the scripts that run two programs in
# alternating rounds and table each size's best time and spread
# (run_comm_vs_mpi.sh, run_netns_hier_bench.sh).
#
#   span FILE     FILE's "size time" rows (one per size and round) as
#                 "size best worst", sizes ascending
#   AWK_SIZE      an awk function, size_label(bytes): "4 MiB", "64 KiB",
#                 "512 B"; put it in front of a table's awk program

span() {
    awk '{ if (!($1 in b) || $2 < b[$1]) b[$1] = $2; if ($2 > w[$1]) w[$1] = $2 }
         END { for (k in b) print k, b[k], w[k] }' "$1" | sort -n
}

AWK_SIZE='function size_label(s) {
    if (s >= 1048576) return s / 1048576 " MiB"
    if (s >= 1024) return s / 1024 " KiB"
    return s " B"
}'
