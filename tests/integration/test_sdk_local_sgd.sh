#!/usr/bin/env bash
# A third party's strategy against the INSTALLED SDK: install dtrain into a
# prefix and move the build tree's plugins aside, build the local SGD
# example (sdk/examples/strategy_local_sgd) from the installed copy with
# find_package(dtrain) - the helper library comes with it - and with one
# plain `cc ... $(pkg-config --cflags --libs dtrain-sdk)` line (both load),
# and train with it on 2 ranks through the installed `dtrain`, whose own
# plugins (shm, cpu) come from the prefix:
#  - sync_every = 1 with plain SGD (no momentum, no clipping) is data
#    parallelism: its losses match ddp's within 1e-5 over 16 steps
#    (measured: 4.7e-7); the same with momentum 0.9 and averaged momentum;
#  - sync_every = 4: the ranks' parameters (a hash each rank logs after
#    every step) differ after steps 1-3, 5-7, ... and are identical after
#    steps 4, 8, 12, 16; the loss still falls by more than 1;
#  - a checkpoint taken right after an averaging step is one model: the
#    run resumed from it on 2 ranks continues bit for bit;
#  - `dtrain plan` gives it its row from its own estimate when the config
#    names it: its note, and a quarter of ddp's traffic at sync_every = 4
#    (parameters all-reduced once every 4 steps instead of gradients every
#    step), the same in the --link-gbps column;
#  - sync_every = 0 is refused before training, naming the key.
set -euo pipefail
build=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"
prefix=$work/prefix
install_alone "$build" "$prefix"
src=$prefix/share/dtrain/examples/strategy_local_sgd
for f in "$src/local_sgd.c" "$src/CMakeLists.txt" "$prefix/include/dtrain/sdk/replica.h" \
         "$prefix/lib/libdtrain_sdk.a"; do
  if [ -e "$f" ]; then ok "installed ${f#$prefix/}"; else bad "not installed: ${f#$prefix/}"; fi
done
expect_exit 0 "the example builds with find_package(dtrain)" \
  bash -c "cmake -S '$src' -B '$work/ex' -DCMAKE_PREFIX_PATH='$prefix' && cmake --build '$work/ex'"
expect_only_entry "$work/ex/dtrain_local_sgd.so" dtrain_strategy_v1
mkdir -p "$work/pc"
expect_exit 0 "the example builds with pkg-config dtrain-sdk" bash -c \
  "cc -std=c11 -Wall -Wextra -Werror -Wno-unused-parameter -shared -fPIC -fvisibility=hidden \
   -Wl,--no-undefined '$src/local_sgd.c' \
   \$(PKG_CONFIG_PATH='$prefix/lib/pkgconfig' pkg-config --cflags --libs dtrain-sdk) \
   -o '$work/pc/dtrain_local_sgd.so'"
expect_exit 0 "the pkg-config build loads" env DTRAIN_PLUGIN_PATH="$work/pc" \
  "$prefix/bin/dtrain" plugins --describe local_sgd
expect_out "its keys are listed" "sync_every         int    default 4, range 1 .. 1000000000"

bin=$prefix/bin/dtrain
export DTRAIN_PLUGIN_PATH=$work/ex
expect_exit 0 "describe lists the plugin's keys" "$bin" plugins --describe local_sgd
expect_out "sync_every is declared" "sync_every         int    default 4, range 1 .. 1000000000"

cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer lsgd.toml \
  '[train]' 'steps = 16' 'micro_batch = 4' 'lr = 0.1' 'decay = "constant"' 'gradient_clipping = 0' '-warmup_steps' \
  '[optimizer]' 'type = "sgd"' 'momentum = 0'
lsgd() { ranks 2 lsgd.toml --set parallel.data=local_sgd "$@"; }
# hashes R: "step hash" for every step rank R logged
hashes() { grep -o 'step [0-9]*: parameters hash [0-9a-f]*' "rank$1.log" | awk '{print $2, $5}' | tr -d :; }

# ---- K = 1 is ddp --------------------------------------------------------------
if ranks 2 lsgd.toml --set run.name=ddp --metrics ddp.jsonl; then ok "ddp on 2 ranks trained"
else bad "ddp on 2 ranks failed" "$(cat rank*.log)"; fi
if lsgd --set local_sgd.sync_every=1 --set run.name=k1 --metrics k1.jsonl; then
  ok "local_sgd, sync_every = 1, trained"
else bad "local_sgd, sync_every = 1, failed" "$(cat rank*.log)"; fi
same_losses "sync_every = 1, plain SGD vs ddp" ddp.jsonl k1.jsonl 1e-5
[ "$(losses k1.jsonl | wc -l)" = 16 ] && ok "16 steps compared" || bad "k1.jsonl has $(losses k1.jsonl | wc -l) losses"
ranks 2 lsgd.toml --set optimizer.momentum=0.9 --set run.name=ddpm --metrics ddpm.jsonl ||
  bad "ddp with momentum failed" "$(cat rank*.log)"
if lsgd --set optimizer.momentum=0.9 --set local_sgd.sync_every=1 \
     --set local_sgd.average_optimizer=true --set run.name=k1m --metrics k1m.jsonl; then
  ok "local_sgd with momentum, averaged momentum, trained"
else bad "local_sgd with averaged momentum failed" "$(cat rank*.log)"; fi
same_losses "sync_every = 1, momentum 0.9 averaged vs ddp" ddpm.jsonl k1m.jsonl 1e-5

# ---- K = 4: apart between averaging steps, together after them -------------------
if lsgd --set local_sgd.sync_every=4 --set local_sgd.log_params_hash=true --set run.name=k4 \
     --set checkpoint.every=4 --set checkpoint.keep=4 --metrics k4.jsonl; then
  ok "local_sgd, sync_every = 4, trained"
else bad "local_sgd, sync_every = 4, failed" "$(cat rank*.log)"; fi
cmp_hashes() { # NAME: rank 0's and rank 1's hashes agree exactly after steps % 4 == 0
  local rows same=0 apart=0 wrong=""
  rows=$(join <(hashes 0) <(hashes 1))
  while read -r step h0 h1; do
    if [ $((step % 4)) = 0 ]; then [ "$h0" = "$h1" ] && same=$((same + 1)) || wrong="$wrong $step"
    else [ "$h0" != "$h1" ] && apart=$((apart + 1)) || wrong="$wrong $step"; fi
  done <<< "$rows"
  if [ -z "$wrong" ] && [ $((same + apart)) = 16 ]; then
    ok "$1: parameters identical after $same averaging steps, different after the other $apart"
  else bad "$1: wrong at steps:${wrong:- (only $((same + apart)) of 16 logged)}" "$rows"; fi
}
cmp_hashes "sync_every = 4"
first=$(losses k4.jsonl | head -n 1); last=$(losses k4.jsonl | tail -n 1)
if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'; then
  ok "sync_every = 4: the loss falls ($first -> $last)"
else bad "sync_every = 4: the loss did not fall by 1 ($first -> $last)"; fi
if maxd=$(paste <(losses ddp.jsonl) <(losses k4.jsonl) | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d } END { print m }') &&
   awk -v d="$maxd" 'BEGIN { exit !(d > 1e-4) }'; then
  ok "sync_every = 4 is not ddp (losses differ by up to $maxd)"
else bad "sync_every = 4 trains exactly like ddp (max diff $maxd)"; fi

# ---- a checkpoint after an averaging step is one model -----------------------------
mkdir -p out/r8 && cp -r out/k4/ckpt out/r8/ && rm -rf out/r8/ckpt/step-00000012 out/r8/ckpt/step-00000016
expect_exit 0 "the step-8 checkpoint verifies" "$bin" ckpt inspect out/r8/ckpt/step-00000008 --verify
expect_out "written by 2 ranks with local_sgd" "written by 2 rank(s) with local_sgd"
if lsgd --set local_sgd.sync_every=4 --set local_sgd.log_params_hash=true --set run.name=r8 \
     --set checkpoint.resume=latest --metrics r8.jsonl; then ok "resumed from step 8 on 2 ranks"
else bad "resume from step 8 failed" "$(cat rank*.log)"; fi
grep -qF "resumed from out/r8/ckpt/step-00000008" rank0.log && ok "resumed at step 8" ||
  bad "did not resume at step 8" "$(cat rank0.log)"
if cmp -s <(losses k4.jsonl | tail -n 8) <(losses r8.jsonl) && [ -s r8.jsonl ]; then
  ok "resumed run continues the losses bit for bit"
else bad "resumed losses differ" "$(paste <(losses k4.jsonl | tail -n 8) <(losses r8.jsonl))"; fi

# ---- the planner: a third party's row ----------------------------------------------
expect_exit 0 "plan GPT-2 124M on 8 ranks with local_sgd as the config's strategy" "$bin" plan \
  lsgd.toml --world 8 --model gpt2-124m --link-gbps 25 --set parallel.data=local_sgd
# CELLS LABEL: the row's cells after its 19-column label
cells() { grep -E "^$1 +[0-9]" <<<"$out" | cut -c21-; }
expect_out "its row, with its own note" \
  "full replica per rank; own gradients, parameters averaged every 4 step(s)"
read -r -a d <<<"$(cells ddp)"; read -r -a l <<<"$(cells local_sgd)"
if [ "${#l[@]}" = 18 ] && [ "${#d[@]}" = 18 ] && [ "${l[15]}" = "${d[15]}" ] &&
   [ "${l[17]}" = "${d[17]}" ] &&
   awk -v a="${d[14]}" -v b="${l[14]}" -v c="${d[16]}" -v e="${l[16]}" \
     'BEGIN { r = b / (a / 4); q = e / (c / 4); exit !(r > 0.999 && r < 1.001 && q > 0.999 && q < 1.001) }'
then ok "local_sgd sends a quarter of ddp: ${l[14]} ${l[15]} (${l[16]} ${l[17]} at 25 Gb/s) vs ${d[14]} ${d[15]}"
else bad "local_sgd's traffic is not a quarter of ddp's" "$out"; fi

# ---- configuration errors ------------------------------------------------------------
expect_exit 2 "sync_every = 0 is refused" "$bin" run lsgd.toml --set run.comm=self \
  --set parallel.data=local_sgd --set local_sgd.sync_every=0
expect_out "the key is named" "sync_every = 0"
finish
