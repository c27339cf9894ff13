#!/usr/bin/env bash
# The offload_nvme tier's raw write and read throughput (bench_offload_io,
# through the offload ABI) beside fio's on the same file system, with the
# same block size, queue depth, O_DIRECT and ioengine=io_uring (fio with
# registered buffers, --fixedbufs, as the tier registers its bounce
# buffers), for several cases in one run.  Interleaved rounds: each round
# runs every case, and each case the tier (write, then read back) and fio
# (write, then read), in alternating order so that a drift in the
# machine's load falls on both; the figure per direction is the median
# over rounds, with the slowest and fastest round beside it (the spread),
# and the ratio is the tier's median over fio's.  Target: >= 80 % of fio
# in both directions (issue 13).  Not part of ctest.
#
#   bench/bench_offload_fio.sh BUILD_DIR [DIR]
#
# DIR: where both write their file (default /var/tmp/dtrain-offload-fio).
# Environment: MIB (256) bytes per pass, ROUNDS (3), CASES: a list of
# "BS:QD:REQUEST:INFLIGHT[:MISALIGN]", BS bytes per I/O, QD I/Os in
# flight (the tier's `buffers` and `queue_depth`, fio's iodepth), REQUEST
# the tier's request size, INFLIGHT how many requests the driver keeps
# outstanding, MISALIGN (0) bytes past 4 KiB alignment of the tier's host
# memory (0: read and written in place; 64: through the bounce buffers,
# as the strategies' staging from the cpu device's host_alloc is).  The
# default covers the strategies' 4 MiB piece over 1 MiB and 128 KiB
# blocks (in place and 64-byte aligned), and one request per I/O at
# 1 MiB (QD 4 and QD 1) and 128 KiB (QD 8).
set -euo pipefail
build=$(readlink -f "$1")
dir=${2:-/var/tmp/dtrain-offload-fio}
MIB=${MIB:-256} ROUNDS=${ROUNDS:-3}
CASES=${CASES:-"1048576:4:4194304:2 131072:8:4194304:2 1048576:4:4194304:2:64 131072:8:4194304:2:64 1048576:4:1048576:4 1048576:1:1048576:1 131072:8:131072:8"}
drv=$build/bench/bench_offload_io
command -v fio > /dev/null || { echo "bench_offload_fio: fio is not installed (scripts/install-deps.sh)" >&2; exit 2; }
[ -x "$drv" ] || { echo "bench_offload_fio: $drv not built" >&2; exit 2; }
mkdir -p "$dir"
fsys=$(df -T "$dir" | awk 'NR == 2 { print $2 " (" $1 ")" }')
declare -A tier_w tier_r fio_w fio_r   # case -> "MiB/s MiB/s ..." (one per round)

run_tier() { # CASE
  local bs qd req inf mis line
  IFS=: read -r bs qd req inf mis <<<"$1"
  line=$("$drv" --dir "$dir" --mib "$MIB" --bs "$bs" --qd "$qd" --request "$req" \
         --inflight "$inf" --misalign "${mis:-0}" --direct on 2>/dev/null)
  set -- "$1" $line   # CASE write_mib_s W read_mib_s R direct on
  tier_w[$1]+="$3 " tier_r[$1]+="$5 "
}
run_fio() { # write|read BS QD: MiB/s
  local f=$dir/fio-$$.dat
  fio --name=x --filename="$f" --size="${MIB}M" --bs="$2" --iodepth="$3" --direct=1 \
      --ioengine=io_uring --fixedbufs --rw="$1" --output-format=json 2>/dev/null |
    python3 -c 'import json, sys; j = json.load(sys.stdin)["jobs"][0]; print("%.1f" % (j[sys.argv[1]]["bw_bytes"] / 2**20))' "$1"
}
fio_pass() { # CASE
  local bs qd req inf mis
  IFS=: read -r bs qd req inf mis <<<"$1"
  fio_w[$1]+="$(run_fio write "$bs" "$qd") " fio_r[$1]+="$(run_fio read "$bs" "$qd") "
  rm -f "$dir/fio-$$.dat"
}
for ((k = 0; k < ROUNDS; k++)); do
  for c in $CASES; do
    if ((k % 2 == 0)); then run_tier "$c"; fio_pass "$c"; else fio_pass "$c"; run_tier "$c"; fi
  done
done
# "median min max" of the numbers given
stats() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; print m, a[1], a[NR] }'; }
echo "file system $fsys at $dir; $MIB MiB per pass, O_DIRECT, io_uring; $ROUNDS interleaved"
echo "rounds: median (slowest-fastest) MiB/s"
echo
echo "| bs | qd | tier request x outstanding | tier memory | direction | offload_nvme MiB/s | fio MiB/s | offload_nvme / fio |"
echo "|---|---|---|---|---|---|---|---|"
for c in $CASES; do
  IFS=: read -r bs qd req inf mis <<<"$c"
  for d in write read; do
    if [ $d = write ]; then t=${tier_w[$c]} f=${fio_w[$c]}; else t=${tier_r[$c]} f=${fio_r[$c]}; fi
    # shellcheck disable=SC2086
    read -r tm tlo thi <<<"$(stats $t)"
    # shellcheck disable=SC2086
    read -r fm flo fhi <<<"$(stats $f)"
    awk -v bs="$bs" -v qd="$qd" -v req="$req" -v inf="$inf" -v mis="${mis:-0}" -v d=$d \
        -v tm="$tm" -v tlo="$tlo" -v thi="$thi" -v fm="$fm" -v flo="$flo" -v fhi="$fhi" '
      function sz(b) { return b >= 1048576 ? b / 1048576 " MiB" : b / 1024 " KiB" }
      BEGIN { printf "| %s | %s | %s x %s | %s | %s | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | %.0f %% |\n",
              sz(bs), qd, sz(req), inf, mis ? "4 KiB + " mis ": bounce" : "aligned: in place",
              d, tm, tlo, thi, fm, flo, fhi, 100 * tm / fm }'
  done
done
