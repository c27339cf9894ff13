#!/usr/bin/env bash
# The nccl communicator on two "nodes" of this machine (`dtrain run
# --nnodes 2` twice on 127.0.0.1).  On any machine whose build has it:
#  - run.device = "cpu": the job forms over the rendezvous (both nodes
#    agree on an "mn-" job id) and nccl refuses the device for its lack of
#    CUDA streams (exit 2 on both; that check comes before the bootstrap);
#  - run.device = "cuda" without a GPU: both nodes exit 1 with "no CUDA
#    device".  `dtrain run` initialises the device before it opens the
#    rendezvous and the communicator (core/train/train.c), so this run
#    stops before the NCCL bootstrap; the bootstrap across nodes is tested
#    without a GPU by unit.test_nccl_bootstrap (forked ranks on the core's
#    TCP rendezvous).  The check that no rank joined fails when that order
#    changes, as a reminder to check the bootstrap here instead.
# With two GPUs or more: one rank per node on nccl against two ranks on
# shm, the same losses.  That part has not yet run on a GPU.
# Exit 77 when the build has no nccl communicator.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
if [ ! -f "$(dirname "$bin")/plugins-out/dtrain_nccl.so" ]; then
  echo "SKIPPED: this build has no nccl communicator"; exit 77
fi
rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer tiny.toml \
  '[run]' 'comm = "nccl"' 'device = "cuda"' 'log_every = 1' \
  '[train]' 'micro_batch = 4' '-global_batch' '-warmup_steps' \
  '[launch]' '-timeout' \
  '[cpu]' '-threads'

# nodes NAME ARGS...: node 0 and node 1 of a 2-node job, one rank each, on
# a port of their own, the same config (launch.node_rank aside, a
# difference fails the rendezvous); outputs in NAME0.log, NAME1.log, exit codes in
# $c0, $c1, both logs in $out.
port=$(( 20000 + ($$ + 11) % 20000 ))
nodes() {
  local name=$1; shift
  port=$((port + 1))
  for n in 0 1; do
    env DTRAIN_JOB_SECRET=nccl$$ ${visible:+CUDA_VISIBLE_DEVICES=$n} "$bin" run tiny.toml \
      --nnodes 2 --node-rank $n --nproc 1 --master-addr 127.0.0.1 --master-port $port \
      --set launch.timeout=10 "$@" > "$name$n.log" 2>&1 &
    eval "npid$n=\$!"
  done
  set +e; wait "$npid0"; c0=$?; wait "$npid1"; c1=$?; set -e
  out=$(cat "${name}0.log" "${name}1.log")
}

visible=
nodes cpu --set run.device=cpu
ids=$(grep -ho 'rendezvous: rank [01] of 2 joined job [^ ]*' cpu0.log cpu1.log | awk '{print $NF}' | sort -u)
if [ "$(grep -c . <<<"$ids")" = 1 ] && [[ "$ids" == mn-* ]]; then
  ok "two nodes with run.comm = nccl meet and agree on the job id ($ids)"
else bad "the nodes did not agree on a job id" "$out"; fi
expect_out "nccl refuses the cpu device" "comm/nccl: init: the nccl communicator runs on a CUDA device's streams (run.device = \"cuda\"; dtrain bench comm --device cuda); device \"cpu\" has no native stream"
if [ "$c0" = 2 ] && [ "$c1" = 2 ]; then ok "both nodes exit 2"; else bad "nodes exited $c0 and $c1" "$out"; fi

gpus=$("$bin" env | sed -n 's/^  GPUs *\([0-9]*\) visible.*/\1/p')
if [ "${gpus:-0}" = 0 ]; then
  nodes nogpu
  expect_out "node 0: no CUDA device" "[rank 0] dtrain run: error: device/cuda: init: no CUDA device: "
  expect_out "node 1: no CUDA device" "[rank 1] dtrain run: error: device/cuda: init: no CUDA device: "
  if [ "$c0" = 1 ] && [ "$c1" = 1 ]; then ok "both nodes exit 1"; else bad "nodes exited $c0 and $c1" "$out"; fi
  if grep -q "joined job" <<<"$out"; then
    bad "a rank joined the rendezvous before its device: check the NCCL bootstrap here now" "$out"
  else ok "the device fails before the rendezvous (no rank joined)"; fi
  skip "2 nodes on nccl against shm" "no CUDA device"
elif [ "$gpus" -ge 2 ]; then
  visible=1
  nodes nccl --metrics nccl.jsonl
  if [ "$c0" = 0 ] && [ "$c1" = 0 ]; then ok "2 nodes on nccl (exit 0)"; else bad "nodes exited $c0 and $c1" "$out"; fi
  expect_exit 0 "2 ranks on shm" "$bin" run tiny.toml --metrics shm.jsonl --set run.name=shm \
    --set run.comm=shm --set launch.nproc=2
  same_losses "2 nodes on nccl against 2 ranks on shm" shm.jsonl nccl.jsonl 1e-4
else
  skip "2 nodes on nccl" "needs 2 GPUs ($gpus visible)"
fi
finish
