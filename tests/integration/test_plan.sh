#!/usr/bin/env bash
# `dtrain plan`: predicted memory and traffic per strategy, without running
# anything (no data file, no ranks):
#  - a row per strategy preset, in order; fsdp's hybrid row says why it is
#    not planned without a group size and is planned with one;
#  - a third-party strategy (tests/fake_plugins) gets its own row from its
#    estimate, found through DTRAIN_PLUGIN_PATH or the config's
#    run.plugin_path (then it is also the config's parallel.data: one row);
#  - a strategy that is not installed gets a row that says why;
#  - presets of any size are planned without allocating them; a bad
#    --world is a usage error.
set -euo pipefail
bin=$1 work=$2 fakes=$3   # fakes: the fake plugins' folder (fake_strategy.c)
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
cat > eq.toml <<'T'
[run]
comm = "shm"
out_dir = "out"
[model]
n_layer = 2
n_head = 2
n_embd = 32
context = 32
[data]
train = "train.bin"
[train]
steps = 20
global_batch = 8
seq_len = 32
T

expect_exit 0 "plan every strategy at 4 ranks" "$bin" plan eq.toml --world 4
for row in "ddp " "zero-1 " "zero-2 " "zero-3 " "fsdp FULL_SHARD " "fsdp SHARD_GRAD_OP " "fsdp NO_SHARD "; do
  grep -q "^$row.*MiB" <<<"$out" && ok "plan has a row for ${row% }" ||
    bad "plan lacks ${row% }" "$out"
done
expect_out "hybrid without a group size says why" "fsdp HYBRID_SHARD     not planned"
expect_exit 0 "plan hybrid groups of 2" "$bin" plan eq.toml --world 4 --set fsdp.hybrid_group_size=2
grep -q '^fsdp HYBRID_SHARD .*MiB' <<<"$out" && ok "hybrid planned with a group size" ||
  bad "hybrid not planned" "$out"
# a strategy the core has never heard of, without plan presets: one row
# with its defaults (its table's values from --set), after the shipped ones
# in their order; found through DTRAIN_PLUGIN_PATH or the config's
# run.plugin_path (then it is also the config's parallel.data: one row)
expect_exit 0 "plan with a third-party strategy on the path" \
  env DTRAIN_PLUGIN_PATH="$fakes" "$bin" plan eq.toml --world 4 --set fakestrat.note=from-the-config
rows=$(printf '%s\n' "$out" | sed -n '/^strategy /,$p' | grep -v '^ ' | tail -n +2 |
       sed -E 's/ +([0-9.]+ [MG]iB|not planned).*//' | paste -sd'|')
want="ddp|zero-1|zero-2|zero-3|fsdp NO_SHARD|fsdp SHARD_GRAD_OP|fsdp FULL_SHARD|fsdp HYBRID_SHARD|fakestrat"
if [ "$rows" = "$want" ]; then ok "rows in order, the third-party strategy last"
else bad "rows: $rows, expected $want" "$out"; fi
grep -q '^ *from-the-config$' <<<"$(grep -A1 '^fakestrat .*MiB' <<<"$out")" &&
  ok "the third-party row is its own estimate, with its table's values" ||
  bad "no planned fakestrat row with its note" "$out"
expect_exit 0 "plan a config whose strategy is found through run.plugin_path" \
  "$bin" plan eq.toml --world 4 --set run.plugin_path="$fakes" --set parallel.data=fakestrat
n=$(printf '%s\n' "$out" | grep -c '^fakestrat .*MiB' || true)
if [ "$n" = 1 ]; then ok "the config's own strategy has one row"; else bad "$n fakestrat rows" "$out"; fi
expect_exit 0 "plan names a strategy that is not installed" "$bin" plan eq.toml --world 4 \
  --set parallel.data=nosuch
expect_out "its row says why" "nosuch                not planned: --set parallel.data=nosuch: strategy plugin 'nosuch' not found in:"
expect_exit 0 "plan a 1.5B preset without allocating it" "$bin" plan eq.toml --world 64 --model gpt2-1558m
expect_out "the preset replaces the file's shape" "1557.61M parameters"
expect_exit 2 "plan: bad --world" "$bin" plan eq.toml --world 0
expect_out "plan: --world explained" "--world 0 is not a rank count"

finish
