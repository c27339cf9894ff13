#!/usr/bin/env bash
# A third party's pipeline schedule against the INSTALLED SDK: install
# dtrain into a prefix and move the build tree's plugins aside, build the
# sequential schedule example (sdk/examples/schedule_sequential) from the
# installed copy with find_package(dtrain), and train a tiny GPT-2 on 2
# pipeline stages through the installed `dtrain`:
#  - `dtrain plugins` lists it as a schedule at ABI 1.0; only its entry
#    symbol is exported;
#  - [pipeline] schedule = "sequential" trains, and its losses are gpipe's
#    (the same forwards and backwards, gradients summed in the same
#    micro-batch order) within 1e-6 over 6 steps, evaluation included;
#  - the layouts it does not run (virtual_stages = 2, balance = "params")
#    are refused before any rank starts (exit 2), naming the key.
set -euo pipefail
build=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"
prefix=$work/prefix
install_alone "$build" "$prefix"
src=$prefix/share/dtrain/examples/schedule_sequential
for f in "$src/sequential.c" "$src/CMakeLists.txt" "$prefix/include/dtrain/schedule.h"; do
  if [ -e "$f" ]; then ok "installed ${f#$prefix/}"; else bad "not installed: ${f#$prefix/}"; fi
done
expect_exit 0 "the example builds with find_package(dtrain)" \
  bash -c "cmake -S '$src' -B '$work/ex' -DCMAKE_PREFIX_PATH='$prefix' && cmake --build '$work/ex'"
expect_only_entry "$work/ex/dtrain_sequential.so" dtrain_schedule_v1

bin=$prefix/bin/dtrain
export DTRAIN_PLUGIN_PATH=$work/ex
expect_exit 0 "dtrain plugins" "$bin" plugins
if grep -qE '^sequential +schedule +1\.0 ' <<<"$out"; then ok "listed as a schedule at ABI 1.0"
else bad "not listed as a schedule at ABI 1.0" "$out"; fi

cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer pp.toml \
  '[data]' 'val = "train.bin"' \
  '[train]' 'micro_batch = 2' 'lr = 0.003' 'eval_every = 3' '-warmup_steps' \
  '[parallel]' 'pipeline = 2'
for s in gpipe sequential; do
  if ranks 2 pp.toml --set pipeline.schedule=$s --set run.name=$s --metrics $s.jsonl; then
    ok "2 stages, schedule $s, trained"
  else bad "2 stages, schedule $s, failed" "$(cat rank*.log)"; fi
done
same_losses "sequential vs gpipe" gpipe.jsonl sequential.jsonl 1e-6
[ "$(losses sequential.jsonl | wc -l)" = 6 ] && ok "6 steps compared" ||
  bad "sequential.jsonl has $(losses sequential.jsonl | wc -l) losses"
v() { grep -o '"val_loss": [^,}]*' "$1" | cut -d' ' -f2; }
if [ -n "$(v sequential.jsonl)" ] && [ "$(v sequential.jsonl)" = "$(v gpipe.jsonl)" ]; then
  ok "the validation losses are gpipe's: $(v sequential.jsonl | tr '\n' ' ')"
else bad "validation losses differ" "$(paste <(v gpipe.jsonl) <(v sequential.jsonl))"; fi

expect_exit 2 "virtual_stages = 2 is refused" "$bin" run pp.toml --set launch.nproc=2 \
  --set pipeline.schedule=sequential --set pipeline.virtual_stages=2 --set train.global_batch=8
expect_out "the key named" \
  "dtrain run: error: schedule/sequential: pipeline.virtual_stages = 2: the sequential schedule runs one chunk a stage"
expect_exit 2 "balance = params is refused" "$bin" check pp.toml --set launch.nproc=2 \
  --set pipeline.schedule=sequential --set pipeline.balance=params
expect_out "the key named" \
  "dtrain check: error: schedule/sequential: pipeline.balance: the sequential schedule balances uniformly (\"uniform\")"
finish
