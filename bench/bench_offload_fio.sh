#!/usr/bin/env bash
# The offload_nvme tier's raw write and read throughput (bench_offload_io,
# through the offload ABI) beside fio's on the same file system, with the
# same block size, queue depth, O_DIRECT and ioengine=io_uring (fio with
# registered buffers, --fixedbufs, as the tier registers its bounce
# buffers).  Interleaved rounds: each round runs the tier (write, then read
# back) and fio (write, then read), in alternating order so that a drift
# in the machine's load falls on both; the figure per direction is the
# median over rounds, the ratio the tier's median over fio's.  Target:
# >= 80 % of fio in both directions (issue 13).  Not part of ctest.
#
#   bench/bench_offload_fio.sh BUILD_DIR [DIR]
#
# DIR: where both write their file (default /var/tmp/dtrain-offload-fio).
# Environment: MIB (256) bytes per pass, BS (1048576) bytes per I/O, QD (4)
# I/Os in flight (the tier's `buffers` and `queue_depth`, fio's iodepth),
# ROUNDS (3); REQUEST (4194304: the strategies' piece, 2^20 f32) and
# INFLIGHT (2) are the tier's requests and how many the driver keeps
# outstanding (REQUEST=$BS INFLIGHT=$QD: one request per I/O).
set -euo pipefail
build=$(readlink -f "$1")
dir=${2:-/var/tmp/dtrain-offload-fio}
MIB=${MIB:-256} BS=${BS:-1048576} QD=${QD:-4} ROUNDS=${ROUNDS:-3}
REQUEST=${REQUEST:-4194304} INFLIGHT=${INFLIGHT:-2}
drv=$build/bench/bench_offload_io
command -v fio > /dev/null || { echo "bench_offload_fio: fio is not installed (scripts/install-deps.sh)" >&2; exit 2; }
[ -x "$drv" ] || { echo "bench_offload_fio: $drv not built" >&2; exit 2; }
mkdir -p "$dir"
fsys=$(df -T "$dir" | awk 'NR == 2 { print $2 " (" $1 ")" }')
tier_w=() tier_r=() fio_w=() fio_r=()

run_tier() {
  local line
  line=$("$drv" --dir "$dir" --mib "$MIB" --bs "$BS" --qd "$QD" --request "$REQUEST" \
         --inflight "$INFLIGHT" --direct on 2>/dev/null)
  set -- $line   # write_mib_s W read_mib_s R direct on
  tier_w+=("$2") tier_r+=("$4")
}
run_fio() { # write|read: MiB/s
  local f=$dir/fio-$$.dat
  fio --name=x --filename="$f" --size="${MIB}M" --bs="$BS" --iodepth="$QD" --direct=1 \
      --ioengine=io_uring --fixedbufs --rw="$1" --output-format=json 2>/dev/null |
    python3 -c 'import json, sys; j = json.load(sys.stdin)["jobs"][0]; print("%.1f" % (j[sys.argv[1]]["bw_bytes"] / 2**20))' "$1"
}
fio_pass() {
  fio_w+=("$(run_fio write)") fio_r+=("$(run_fio read)")
  rm -f "$dir/fio-$$.dat"
}
for ((k = 0; k < ROUNDS; k++)); do
  if ((k % 2 == 0)); then run_tier; fio_pass; else fio_pass; run_tier; fi
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
tw=$(median "${tier_w[@]}") tr=$(median "${tier_r[@]}") fw=$(median "${fio_w[@]}") fr=$(median "${fio_r[@]}")
echo "file system $fsys at $dir; $MIB MiB per pass, bs $BS, queue depth $QD, O_DIRECT, io_uring;"
echo "tier requests of $REQUEST bytes, $INFLIGHT outstanding; $ROUNDS interleaved rounds (median)"
echo
echo "| direction | offload_nvme MiB/s | fio MiB/s | offload_nvme / fio | rounds (tier / fio) |"
echo "|---|---|---|---|---|"
awk -v d=write -v t="$tw" -v f="$fw" -v rt="${tier_w[*]}" -v rf="${fio_w[*]}" \
  'BEGIN { printf "| %s | %.1f | %.1f | %.0f %% | %s / %s |\n", d, t, f, 100 * t / f, rt, rf }'
awk -v d=read -v t="$tr" -v f="$fr" -v rt="${tier_r[*]}" -v rf="${fio_r[*]}" \
  'BEGIN { printf "| %s | %.1f | %.1f | %.0f %% | %s / %s |\n", d, t, f, 100 * t / f, rt, rf }'
