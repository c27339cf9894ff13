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
#    --world is a usage error;
#  - a third-party strategy with plan presets (fakepresets) gets a row per
#    preset, each from its estimate with the preset's settings, and a
#    malformed preset's row says why; as the config's own parallel.data
#    (file and run.plugin_path) its rows appear once;
#  - the config's own strategy is blamed where the config names it: the
#    file's line, or the user's --set, never a --set plan made itself;
#  - fsdp NO_SHARD (and any strategy on one rank) is not called sharded;
#  - one number format: every size cell "N.NN MiB|GiB|TiB", the units said
#    once, no decimal MB and no scientific notation anywhere;
#  - --device-memory: the fits column agrees with total/rank for a size
#    that fits some strategies and not others (GPT-2 1.5B on 8 ranks), and
#    the recommendation is the least traffic among them, ties within 1% to
#    the least memory; none fitting names the smallest and what lowers
#    it, each remedy planned alone (activation checkpointing, a
#    micro-batch of 1, offload, twice the ranks), most first: activation
#    checkpointing first where activations dominate at micro-batch 1;
#  - --link-gbps: the time column against a hand computation (below);
#  - bad --device-memory and --link-gbps values exit 2 naming the option;
#  - --offload TIER: under each row a sub-row per offload_what the strategy
#    accepts (params only under zero-3 and fsdp FULL_SHARD), device bytes,
#    tier bytes and tier I/O against a hand computation (below); the fits
#    column says "offload" where a row fits only with offload; the
#    recommendation takes no offload where a row fits without, else the
#    least tier I/O; the config's [parallel] offload plans the same rows
#    and names its tier; --offload none turns them off; a tier that is not
#    installed is a usage error;
#  - parallel.pipeline > 1: a block per stage (units, parameters with the
#    tied copy, activations with the stash the schedule keeps, bytes sent
#    a step) and the bubble, against a hand computation (below);
#  - parallel.tensor > 1: the rows plan a tensor rank's part, and a block
#    with its parameters and the tensor group's all-reduces and bytes a
#    step, against a hand computation (below).
set -euo pipefail
bin=$1 work=$2 fakes=$3   # fakes: the fake plugins' folder (fake_strategy.c)
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
toml_from gpt2_2layer eq.toml \
  '[train]' 'steps = 20' '-lr' '-warmup_steps' \
  '[launch]' '-timeout' \
  '[cpu]' '-threads'

expect_exit 0 "plan every strategy at 4 ranks" "$bin" plan eq.toml --world 4
for row in "ddp " "zero-1 " "zero-2 " "zero-3 " "fsdp FULL_SHARD " "fsdp SHARD_GRAD_OP " "fsdp NO_SHARD "; do
  grep -q "^$row.*MiB" <<<"$out" && ok "plan has a row for ${row% }" ||
    bad "plan lacks ${row% }" "$out"
done
expect_out "hybrid without a group size says why" "fsdp HYBRID_SHARD     not planned"
expect_exit 0 "plan at 1 rank" "$bin" plan eq.toml --world 1
if grep -qxF 'fsdp HYBRID_SHARD     not planned: strategy/fsdp: sharding_strategy = "HYBRID_SHARD" needs hybrid_group_size (ranks per shard group, dividing the data-parallel world of 1 rank)' <<<"$out"
then ok "hybrid at 1 rank: 'the data-parallel world of 1 rank'"
else bad "hybrid at 1 rank: no line '... world of 1 rank)'" "$out"; fi
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
want="ddp|fsdp NO_SHARD|fsdp SHARD_GRAD_OP|fsdp FULL_SHARD|fsdp HYBRID_SHARD|zero-1|zero-2|zero-3|fakepresets first|fakepresets second|fakepresets broken|fakestrat"
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


# ---- a third party's plan presets --------------------------------------------
expect_exit 0 "plan with a third-party strategy that lists presets" \
  env DTRAIN_PLUGIN_PATH="$fakes" "$bin" plan eq.toml --world 4
for p in first second; do
  grep -q "^ *$p-preset\$" <<<"$(grep -A1 "^fakepresets $p .*MiB" <<<"$out")" &&
    ok "preset '$p' has its row, estimated with the preset's settings" ||
    bad "no planned 'fakepresets $p' row with its note" "$out"
done
expect_out "a malformed preset's row says why" \
  "fakepresets broken    not planned: strategy/fakepresets: plan preset 'fakepresets broken' sets \"note\", not up to 8 key=value assignments separated by spaces"
{ cat eq.toml; printf '[parallel]\ndata = "fakepresets"\n'; } > own3p.toml
sed -i "s|^out_dir = \"out\"|out_dir = \"out\"\nplugin_path = \"$fakes\"|" own3p.toml
expect_exit 0 "plan a config whose own strategy is a third party's with presets (file, run.plugin_path)" \
  "$bin" plan own3p.toml --world 4
n=$(grep -cE '^fakepresets (first|second) .*MiB' <<<"$out" || true)
m=$(grep -c '^fakepresets broken ' <<<"$out" || true)
if [ "$n" = 2 ] && [ "$m" = 1 ]; then ok "its preset rows appear once each"
else bad "$n planned and $m broken fakepresets rows, expected 2 and 1" "$out"; fi

# ---- whom the config's own row blames ----------------------------------------
{ cat eq.toml; printf '[parallel]\ndata = "nosuch"\n'; } > own.toml
line=$(grep -n '^data = "nosuch"' own.toml | cut -d: -f1)
expect_exit 0 "plan a config whose file names a strategy that is not installed" \
  "$bin" plan own.toml --world 4
expect_out "its row blames the file's line" \
  "nosuch                not planned: own.toml:$line: parallel.data = \"nosuch\": strategy plugin 'nosuch' not found in:"
if grep -qF -- "--set parallel.data" <<<"$out"; then bad "a --set the user did not give is blamed" "$out"
else ok "no --set the user did not give is blamed"; fi
expect_exit 0 "the same strategy named by --set" "$bin" plan own.toml --world 4 --set parallel.data=nosuch
expect_out "its row blames the --set" \
  "nosuch                not planned: --set parallel.data=nosuch: strategy plugin 'nosuch' not found in:"

# ---- NO_SHARD is not sharded -------------------------------------------------
expect_exit 0 "plan at 4 ranks" "$bin" plan eq.toml --world 4
note=$(grep -A1 '^fsdp NO_SHARD .*MiB' <<<"$out" | tail -n 1)
case "$note" in
  *"nothing sharded: every rank holds all 4 group(s); grads all-reduced over 4 ranks"*)
    case "$note" in *"sharded over"*|*"params sharded"*|*"grads sharded"*)
      bad "NO_SHARD's note still says sharded" "$note";;
      *) ok "NO_SHARD's note says nothing is sharded";; esac;;
  *) bad "NO_SHARD's note: $note" "$out";;
esac
grep -q '^ *fsdp FULL_SHARD: 4 group(s) sharded over 4 ranks; params sharded, grads sharded$' <<<"$out" &&
  ok "FULL_SHARD's note says sharded over 4 ranks" || bad "FULL_SHARD's note" "$out"
expect_exit 0 "plan on 1 rank" "$bin" plan eq.toml --world 1
expect_out "zero-3 on one rank shards nothing" "zero stage 3: nothing sharded on 1 rank: it holds all 4 group(s)"

# ---- numbers: one format -----------------------------------------------------
# rows LABEL-REGEX: the planned rows' cells (everything after the 19-column
# label), one row a line, "label|cells"
rows() { sed -n '/^strategy /,/^$/p' <<<"$out" | grep -E '^[^ ].* (MiB|GiB|TiB) ' |
         grep -v '^strategy ' | sed -E 's/^(.{19}) (.*)$/\1|\2/; s/ +\|/|/'; }
expect_exit 0 "plan GPT-2 1.5B on 8 ranks (the size that printed 4.26e+03 MB)" \
  "$bin" plan eq.toml --world 8 --model gpt2-1558m
n=$(grep -c '^units: sizes binary (1 MiB = 2^20 bytes, 1 GiB = 2^30 bytes), bandwidth decimal (1 Gb/s = 10^9 bit/s)$' <<<"$out" || true)
if [ "$n" = 1 ]; then ok "the units are said once"; else bad "units said $n times" "$out"; fi
badcells=$(rows | cut -d'|' -f2 | awk '{ if (NF != 16) print "fields " NF ": " $0
  for (i = 1; i <= 16; i += 2) if ($i !~ /^[0-9]+\.[0-9][0-9]$/ || $(i+1) !~ /^(MiB|GiB|TiB)$/) print $i " " $(i+1) }')
nrows=$(rows | wc -l)
if [ "$nrows" = 7 ] && [ -z "$badcells" ]; then ok "all 8 cells of all 7 planned rows are N.NN MiB|GiB|TiB"
else bad "$nrows rows; cells not N.NN MiB|GiB|TiB: $badcells" "$out"; fi
if grep -qE '[0-9]e[+-]?[0-9]|[0-9] ?MB\b|[0-9] ?GB\b' <<<"$out"; then
  bad "scientific notation or decimal MB/GB in the output" "$(grep -E '[0-9]e[+-]?[0-9]|[0-9] ?MB\b|[0-9] ?GB\b' <<<"$out")"
else ok "no scientific notation and no decimal MB/GB"; fi

# ---- --device-memory: fits and the recommendation ----------------------------
# GPT-2 1.5B, fp32 AdamW, on 8 ranks: ddp, zero-1, zero-2 and fsdp NO_SHARD
# need 12.6-23.9 GiB per rank, zero-3 6.07, fsdp SHARD_GRAD_OP 9.81 and
# FULL_SHARD 4.66; SHARD_GRAD_OP sends what ddp sends (an all-reduce's
# worth), zero-3 and FULL_SHARD 1.5 times that (a second all-gather).
gib() { awk -v n="$1" -v u="$2" 'BEGIN { printf "%.6f", n * (u == "TiB" ? 1024 : u == "GiB" ? 1 : 1/1024) }'; }
fits_check() { # MEM_GIB EXPECTED-YES-LABELS: the fits column agrees with total/rank and the expected rows
  local mem=$1 want=$2 got="" wrong="" label cells
  while IFS='|' read -r label cells; do
    set -- $cells
    local t; t=$(gib "${13}" "${14}")
    local fit=${17}
    if awk -v t="$t" -v m="$mem" 'BEGIN { exit !(t <= m) }'; then [ "$fit" = yes ] || wrong+="$label($t GiB: $fit) "
    else [ "$fit" = no ] || wrong+="$label($t GiB: $fit) "; fi
    [ "$fit" = yes ] && got+="${got:+,}$label"
  done < <(rows)
  if [ -z "$wrong" ] && [ "$got" = "$want" ]; then ok "$mem GiB: fits is total/rank <= $mem GiB; fit: $got"
  else bad "$mem GiB: fit: $got (expected $want); wrong: $wrong" "$out"; fi
}
expect_exit 0 "plan 1.5B with 10GiB per rank" "$bin" plan eq.toml --world 8 --model gpt2-1558m \
  --device-memory 10GiB
expect_out "the device memory is stated" "device memory: 10.00 GiB per rank (fits: total/rank within it)"
grep -qE '^strategy .* sent/step +fits$' <<<"$out" && ok "a fits column" || bad "no fits column" "$out"
fits_check 10 "fsdp SHARD_GRAD_OP,fsdp FULL_SHARD,zero-3"
expect_out "the least traffic that fits is recommended" \
  "recommended: fsdp SHARD_GRAD_OP (9.81 GiB per rank of 10.00 GiB; sends 10.15 GiB per step)"
expect_out "and why" "  the least traffic of the 3 strategies that fit; of those within 1% of it, the least memory per rank"
expect_exit 0 "plan 1.5B with 8GiB per rank" "$bin" plan eq.toml --world 8 --model gpt2-1558m \
  --device-memory 8GiB
fits_check 8 "fsdp FULL_SHARD,zero-3"
expect_out "equal traffic: the least memory is recommended" \
  "recommended: fsdp FULL_SHARD (4.66 GiB per rank of 8.00 GiB; sends 15.77 GiB per step)"
expect_exit 0 "plan 1.5B with 5GiB per rank" "$bin" plan eq.toml --world 8 --model gpt2-1558m \
  --device-memory 5GiB
fits_check 5 "fsdp FULL_SHARD"
expect_out "one fits: it is recommended" \
  "recommended: fsdp FULL_SHARD (4.66 GiB per rank of 5.00 GiB; sends 15.77 GiB per step)"
if grep -qxF "  the only strategy that fits" <<<"$out"; then ok "and why: the only one that fits"
else bad "the reason for one fitting strategy is not 'the only strategy that fits'" "$out"; fi
expect_exit 0 "plan 1.5B with 4GiB per rank" "$bin" plan eq.toml --world 8 --model gpt2-1558m \
  --device-memory 4GiB
fits_check 4 ""
expect_out "none fits: the smallest is named" \
  "recommended: none: no planned strategy fits in 4.00 GiB per rank; the smallest, fsdp FULL_SHARD, needs 4.66 GiB"
expect_exit 0 "--device-memory in decimal units" "$bin" plan eq.toml --world 8 --model gpt2-1558m \
  --device-memory "80 GB"
expect_out "80 GB is 74.51 GiB" "device memory: 74.51 GiB per rank"
fits_check 74.505806 "ddp,fsdp NO_SHARD,fsdp SHARD_GRAD_OP,fsdp FULL_SHARD,zero-1,zero-2,zero-3"
expect_exit 0 "plan without --device-memory" "$bin" plan eq.toml --world 8 --model gpt2-1558m
if grep -qE 'fits|recommended' <<<"$out"; then bad "fits or a recommendation without --device-memory" "$out"
else ok "no fits column and no recommendation without --device-memory"; fi

# ---- --link-gbps: communication time per step --------------------------------
# Hand computation: GPT-2 124M (vocab V = 50257, context T = 1024, C = 768,
# L = 12, tied head) has P = V C + T C + L (12 C^2 + 13 C) + 2 C =
# 124,439,808 parameters, E = (V + T) C = 39,383,808 of them in the
# embedding unit.  On n = 8 ranks ddp all-reduces the f32 gradients once
# per step; a ring sends 2 (n-1)/n x 4 P = 871,078,656 bytes per rank, at
# 25 Gb/s 871078656 x 8 / 25e9 s = 278.75 ms; zero-2 the same
# (reduce-scatter + all-gather).  fsdp FULL_SHARD all-gathers every unit in
# forward and again in backward, and the embedding twice more (the tied
# head reads it again in forward and in backward, plugins/gpt2/gpt2.c), then
# reduce-scatters the gradients: (n-1)/n x 4 (3 P + 2 E) = 1,582,304,640
# bytes, 506.34 ms.  The engines pad each unit to an aligned shard, so the
# check allows 0.5%.
V=50257 T=1024 C=768 L=12 n=8
P=$((V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C)) E=$(((V + T) * C))
[ "$P" = 124439808 ] && ok "P = 124,439,808 by hand" || bad "P = $P"
ddp_bytes=$((2 * (n - 1) * 4 * P / n)) fs_bytes=$(((n - 1) * 4 * (3 * P + 2 * E) / n))
expect_exit 0 "plan GPT-2 124M on 8 ranks over 25 Gb/s" "$bin" plan eq.toml --world 8 \
  --model gpt2-124m --link-gbps 25
expect_out "the link is stated" "link: 25.00 Gb/s per rank (comm/step: sent/step over it; ring algorithms, bandwidth-bound, no latency, no overlap with compute)"
grep -qE '^strategy .* sent/step +comm/step$' <<<"$out" && ok "a comm/step column" || bad "no comm/step column" "$out"
link_check() { # LABEL BYTES GBPS: the row's comm/step within 0.5% of BYTES x 8 / GBPS
  local cells; cells=$(rows | grep "^$1|" | cut -d'|' -f2)
  set -- "$1" "$2" "$3" $cells
  local got=${20} unit=${21}
  local want; want=$(awk -v b="$2" -v g="$3" 'BEGIN { printf "%.2f", b * 8 / (g * 1e9) * 1e3 }')
  if awk -v g="$got" -v u="$unit" -v w="$want" 'BEGIN { ms = u == "s" ? g * 1e3 : g; d = (ms - w) / w; if (d < 0) d = -d; exit !(u ~ /^m?s$/ && d <= 0.005) }'
  then ok "$1 at $3 Gb/s: $got $unit, by hand $want ms"
  else bad "$1 at $3 Gb/s: $got $unit, by hand $want ms" "$out"; fi
}
link_check ddp "$ddp_bytes" 25
link_check zero-2 "$ddp_bytes" 25
link_check "fsdp FULL_SHARD" "$fs_bytes" 25
link_check zero-3 "$fs_bytes" 25
expect_out "278.75 ms for ddp (no padding in its buffer)" "   278.75 ms"
expect_exit 0 "the same over 100 Gb/s" "$bin" plan eq.toml --world 8 --model gpt2-124m --link-gbps 100
link_check ddp "$ddp_bytes" 100
link_check "fsdp FULL_SHARD" "$fs_bytes" 100

# ---- bad values --------------------------------------------------------------
expect_exit 2 "--device-memory 80XB" "$bin" plan eq.toml --device-memory 80XB
expect_out "names the option and the units" \
  "dtrain plan: error: --device-memory 80XB is not a size: a number above 0 and a unit, binary KiB MiB GiB TiB or decimal KB MB GB TB (e.g. 80GiB)"
expect_exit 2 "--device-memory without a unit" "$bin" plan eq.toml --device-memory 80
expect_out "is refused naming it" "--device-memory 80 is not a size"
expect_exit 2 "--device-memory negative" "$bin" plan eq.toml --device-memory -1GiB
expect_out "is refused naming it" "--device-memory -1GiB is not a size"
expect_exit 2 "--link-gbps negative" "$bin" plan eq.toml --link-gbps -5
expect_out "names the option" "dtrain plan: error: --link-gbps -5 is not a link bandwidth: a number of Gb/s above 0 (e.g. 25)"
for v in 0 abc inf; do
  expect_exit 2 "--link-gbps $v" "$bin" plan eq.toml --link-gbps "$v"
  expect_out "is refused naming it" "--link-gbps $v is not a link bandwidth"
done
expect_exit 2 "--link-gbps without a value" "$bin" plan eq.toml --link-gbps
expect_out "says so" "--link-gbps needs a value"

# ---- --offload: a sub-row per offload choice, by hand ---------------------
# A tiny GPT-2: V = 256, T = 64, C = 128, L = 2, tied head: P = V C + T C +
# L (12 C^2 + 13 C) + 2 C = 437,760 parameters.  fp32 AdamW: the device
# holds 4P params, 4P grads and 8P moments (3.34 MiB).  The tier holds, per
# rank, for "optimizer" the f32 master and both moments of the owned
# elements (12 bytes each) and for "params" the compute shard (4 bytes
# each, fp32); a step reads and writes the optimizer's bytes once each
# (2 x 12) and loads the compute shard before the forward and the backward
# gather of every micro-step and writes it once ((2 n_micro + 1) x 4).
# With the optimizer, the sharded engine (zero-2/3, fsdp; not zero-1's
# full gradients, not ddp's) moves the f32 gradient shard to the tier too
# (4 bytes each, grads column 0): stored every micro-step, read back to
# add to after the first, read by the norm and the optimizer
# ((2 n_micro + 1) x 4).
# World 1: every element owned, n_micro 2 (global batch 8 = 2 x 4 x 1):
#   optimizer: ddp tier 12P = 5.01 MiB, I/O 24P = 10.02 MiB, optimizer
#   column 0; zero-3 tier 16P = 6.68 MiB, I/O 24P + 20P = 44P = 18.37 MiB
#   params: tier 4P = 1.67 MiB, I/O 5 x 4P = 20P = 8.35 MiB
#   optimizer_and_params: tier 20P = 8.35 MiB, I/O 64P = 26.72 MiB,
#   params, grads and optimizer columns 0
# World 2 (zero-3: half the elements owned; n_micro 1): optimizer_and_params
#   tier 20P/2 = 10P = 4.17 MiB, I/O (24 + 3 x 4 + 3 x 4) P/2 = 24P = 10.02 MiB.
# The compute shard's loads are the replayed schedule's, as the run makes
# them: zero-3 keeps the embedding (E = (V + T) C elements) gathered after
# its first load of the step (3 of its 4 loads at n_micro 2 saved, 1 of 2
# at n_micro 1: 12E and, per rank of 2, 2E bytes fewer; 6E in bf16);
# fsdp FULL_SHARD loads the tied embedding again for its use at the head,
# forward and backward (4 more loads of 4E: 16E bytes more).
tiny=(--set model.n_embd=128 --set model.vocab_size=256 --set model.context=64 --set train.seq_len=64)
V=256 T=64 C=128 L=2
P=$((V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C)) E=$(((V + T) * C))
[ "$P" = 437760 ] && ok "tiny P = 437,760 by hand" || bad "tiny P = $P"
mib() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }
# sub STRATEGY CHOICE: that strategy's sub-row, "label|cells"
sub() { sed -n "/^$1 /,/^[^ ]/p" <<<"$out" | grep -E "^  $2 " | sed -E 's/^ +([a-z_]+) +/\1|/'; }
# cell CELLS N: the Nth "N.NN MiB" cell (1 params, 2 grads, 3 optimizer, 4
# activations, 5 comm bufs, 6 model state, 7 total/rank, 8 sent/step,
# 9 tier/rank, 10 tier I/O)
cell() { set -- $1 "$2"; local n=${!#}; local i=$((2 * n - 1)) j=$((2 * n)); echo "${!i} ${!j}"; }
sub_check() { # STRATEGY CHOICE N WANT-BYTES WHAT
  local row cells got want
  row=$(sub "$1" "$2"); cells=${row#*|}
  got=$(cell "$cells" "$3"); want=$(mib "$4")
  if [ -n "$row" ] && [ "$got" = "$want" ]; then ok "$1 / $2: $5 $got, by hand $want"
  else bad "$1 / $2: $5 '$got', by hand $want" "$out"; fi
}
expect_exit 0 "plan the tiny model on 1 rank with --offload offload_cpu" \
  "$bin" plan eq.toml --world 1 "${tiny[@]}" --offload offload_cpu
expect_out "the tier is named with where it keeps bytes" \
  "offload: offload_cpu (offload tier in pinned host memory, outside the device's budget)"
grep -qE '^strategy .* sent/step +tier/rank +tier I/O$' <<<"$out" &&
  ok "tier/rank and tier I/O columns" || bad "no tier columns" "$out"
for s in ddp zero-1 zero-2 zero-3 "fsdp NO_SHARD" "fsdp SHARD_GRAD_OP" "fsdp FULL_SHARD"; do
  got=$(sed -n "/^$s /,/^[^ ]/p" <<<"$out" | grep -oE '^  [a-z_]+ ' | tr -d ' ' | paste -sd,)
  case "$s" in zero-3|"fsdp FULL_SHARD") want="optimizer,params,optimizer_and_params";;
                *) want="optimizer";; esac
  if [ "$got" = "$want" ]; then ok "$s offers $want"; else bad "$s offers '$got', expected $want" "$out"; fi
done
main=$(grep '^ddp ' <<<"$out" | sed -E 's/^ddp +//')
[ "$(cell "$main" 3)" = "$(mib $((8 * P)))" ] && [ "$(cell "$main" 9)" = "0.00 MiB" ] &&
  ok "ddp's own row: 8P of moments on the device, nothing in the tier" ||
  bad "ddp's own row: optimizer $(cell "$main" 3), tier $(cell "$main" 9)" "$out"
sub_check ddp optimizer 3 0 "optimizer on the device"
sub_check ddp optimizer 1 $((4 * P)) "params on the device"
sub_check ddp optimizer 9 $((12 * P)) "tier/rank (12P)"
sub_check ddp optimizer 10 $((24 * P)) "tier I/O (24P)"
sub_check ddp optimizer 2 $((4 * P)) "grads on the device (ddp keeps them)"
sub_check zero-1 optimizer 2 $((4 * P)) "grads on the device (zero-1's full gradients)"
sub_check zero-1 optimizer 9 $((12 * P)) "tier/rank (12P)"
sub_check zero-2 optimizer 2 0 "grads on the device (in the tier)"
sub_check zero-3 optimizer 2 0 "grads on the device (in the tier)"
sub_check zero-3 optimizer 9 $((16 * P)) "tier/rank (12P + 4P of gradients)"
sub_check zero-3 optimizer 10 $((44 * P)) "tier I/O (24P + 5 x 4P)"
sub_check "fsdp SHARD_GRAD_OP" optimizer 9 $((16 * P)) "tier/rank (12P + 4P)"
t_main=$(cell "$main" 7); t_sub=$(cell "$(sub ddp optimizer | cut -d'|' -f2)" 7)
awk -v a="${t_main% *}" -v b="${t_sub% *}" -v d="$(mib $((8 * P)))" \
  'BEGIN { x = a - b - d; if (x < 0) x = -x; exit !(x <= 0.011) }' &&
  ok "ddp: the optimizer sub-row's total is the row's less 8P ($t_main - $t_sub)" ||
  bad "ddp totals: $t_main, $t_sub" "$out"
sub_check zero-3 params 9 $((4 * P)) "tier/rank (4P)"
sub_check zero-3 params 10 $((20 * P - 12 * E)) "tier I/O ((2 x 2 + 1) x 4P - 3 x 4E)"
# the embedding ((V + T) C, below zero's persistence threshold) stays
# gathered on the device, as the run keeps it; fsdp keeps no such group
sub_check zero-3 optimizer_and_params 1 $(((V + T) * C * 4)) "params on the device ((V + T) C)"
sub_check "fsdp FULL_SHARD" optimizer_and_params 1 0 "params on the device"
sub_check zero-3 optimizer_and_params 3 0 "optimizer on the device"
sub_check zero-3 optimizer_and_params 2 0 "grads on the device"
sub_check zero-3 optimizer_and_params 9 $((20 * P)) "tier/rank (20P)"
sub_check zero-3 optimizer_and_params 10 $((64 * P - 12 * E)) "tier I/O (24P + 20P - 12E + 20P)"
sub_check "fsdp FULL_SHARD" optimizer_and_params 10 $((64 * P + 16 * E)) "tier I/O (24P + 20P + 16E + 20P)"
sub_check "fsdp FULL_SHARD" optimizer_and_params 9 $((20 * P)) "tier/rank (20P)"
expect_exit 0 "the same on 2 ranks" "$bin" plan eq.toml --world 2 "${tiny[@]}" --offload offload_cpu
sub_check zero-3 optimizer_and_params 9 $((10 * P)) "tier/rank (20P / 2)"
sub_check zero-3 optimizer_and_params 10 $((24 * P - 2 * E)) "tier I/O ((24 + 3 x 4 + 3 x 4) P / 2 - 4E / 2)"
# bf16 compute parameters: the device keeps 2P compute + 4P master (6P);
# "optimizer" takes the master with the moments and the f32 gradients
# (tier 16P, device params 2P), "params" only the 2-byte compute copy
# (tier 2P, I/O 5 x 2P = 10P)
expect_exit 0 "bf16 on 1 rank" "$bin" plan eq.toml --world 1 "${tiny[@]}" --set model.dtype=bf16 \
  --offload offload_cpu
sub_check zero-3 optimizer 1 $((2 * P)) "params on the device (2P)"
sub_check zero-3 optimizer 9 $((16 * P)) "tier/rank (16P)"
sub_check zero-3 params 9 $((2 * P)) "tier/rank (2P)"
sub_check zero-3 params 10 $((10 * P - 6 * E)) "tier I/O (5 x 2P - 3 x 2E)"

# fits and the recommendation (1 rank: every row sends nothing; the rows
# total 13.94 MiB, ddp's and zero-1's optimizer sub-rows 10.60, zero-3's
# 9.85, fsdp FULL_SHARD's optimizer_and_params 9.69: the gradient shard
# in the tier, on the device the gathered groups loaded from it, one
# ahead, and the gradient buffers; zero-3's 9.85 with its embedding kept
# gathered)
expect_exit 0 "--offload with 11MiB" "$bin" plan eq.toml --world 1 "${tiny[@]}" --offload offload_cpu \
  --device-memory 11MiB
grep -qE '^ddp .* offload$' <<<"$out" && ok "ddp fits only with offload: says so" ||
  bad "ddp's fits cell is not 'offload'" "$out"
[ "$(sub zero-3 params | awk '{ print $NF }')" = no ] && ok "zero-3 params does not fit" ||
  bad "zero-3 params fits" "$out"
[ "$(sub ddp optimizer | awk '{ print $NF }')" = yes ] && ok "ddp optimizer fits" ||
  bad "ddp optimizer does not fit" "$out"
expect_out "the least tier I/O that fits, first of equals" \
  'recommended: ddp, offload_what = "optimizer" on offload_cpu (10.60 MiB per rank of 11.00 MiB; the tier holds 5.01 MiB per rank and moves 10.02 MiB per step; sends 0.00 MiB per step)'
expect_out "and why" "  nothing fits without offload; of the 9 offload choices that fit, the least tier I/O per step"
expect_exit 0 "--offload with 9.75MiB" "$bin" plan eq.toml --world 1 "${tiny[@]}" --offload offload_cpu \
  --device-memory 9.75MiB
expect_out "only optimizer_and_params fits" \
  'recommended: fsdp FULL_SHARD, offload_what = "optimizer_and_params" on offload_cpu (9.69 MiB per rank of 9.75 MiB; the tier holds 8.35 MiB per rank and moves 27.34 MiB per step;'
expect_exit 0 "--offload with 14MiB" "$bin" plan eq.toml --world 1 "${tiny[@]}" --offload offload_cpu \
  --device-memory 14MiB
expect_out "no offload where a row fits without" "recommended: ddp (13.94 MiB per rank of 14.00 MiB; sends 0.00 MiB per step)"
expect_exit 0 "--offload with 8MiB" "$bin" plan eq.toml --world 1 "${tiny[@]}" --offload offload_cpu \
  --device-memory 8MiB
expect_out "none fits: the smallest offload choice is named" \
  'recommended: none: no planned strategy fits in 8.00 MiB per rank; the smallest, fsdp FULL_SHARD, offload_what = "optimizer_and_params" on offload_cpu, needs 9.69 MiB; what lowers it, each alone, most first:'
expect_out "with a tier: a smaller micro-batch first, then checkpointing" \
  $'  a micro-batch of 1 sequence (--set train.micro_batch=1): 4.24 MiB per rank, fits\n  activation checkpointing (--set model.activation_checkpointing=all): 7.68 MiB per rank, fits\n'
expect_exit 0 "without --offload, 8MiB" "$bin" plan eq.toml --world 1 "${tiny[@]}" --device-memory 8MiB
expect_out "none fits: offload is suggested, in the order that helps" \
  $'needs 13.94 MiB; what lowers it, each alone, most first:\n  a micro-batch of 1 sequence (--set train.micro_batch=1): 8.50 MiB per rank\n  offload (--offload offload_cpu --set ddp.offload_what=optimizer): 10.60 MiB per rank\n  activation checkpointing (--set model.activation_checkpointing=all): 11.94 MiB per rank\n'
# activations dominate and the micro-batch is 1 already (512 tokens of a
# 2-layer model): activation checkpointing comes first, and fits; no
# smaller micro-batch is offered.  Each remedy's number is the planner's
# own with that setting (the zero-1 row of a plan with it).
long=(--set model.context=512 --set train.seq_len=512 --set train.micro_batch=1)
expect_exit 0 "activations dominate, micro-batch 1, 7MiB" "$bin" plan eq.toml --world 2 "${long[@]}" \
  --device-memory 7MiB
expect_out "activation checkpointing is named first" \
  $'the smallest, zero-1, needs 9.22 MiB; what lowers it, each alone, most first:\n  activation checkpointing (--set model.activation_checkpointing=all): 6.28 MiB per rank, fits\n  offload (--offload offload_cpu --set zero.offload_what=optimizer): 9.03 MiB per rank\n  twice the ranks (--world 4): 9.13 MiB per rank\n'
if grep -qF "micro-batch of 1" <<<"$out"; then bad "a micro-batch of 1 offered at micro-batch 1" "$out"
else ok "no smaller micro-batch offered at micro-batch 1"; fi
remedy_is() { # WHAT WANT ARGS...: zero-1's total/rank planned with ARGS
  local what=$1 want=$2 got; shift 2
  out=$("$bin" plan eq.toml "$@" 2>&1) || true
  got=$(cell "$(grep -E '^zero-1 ' <<<"$out" | sed -E 's/^zero-1 +//')" 7)
  [ "$got" = "$want" ] && ok "$what: the plan with it says $got too" ||
    bad "$what: the plan with it says '$got', the remedy $want" "$out"
}
remedy_is "checkpointing" "6.28 MiB" --world 2 "${long[@]}" --set model.activation_checkpointing=all
remedy_is "twice the ranks" "9.13 MiB" --world 4 "${long[@]}"
if grep -qE 'tier/rank|^  optimizer' <<<"$out"; then bad "offload rows without a tier" "$out"
else ok "no offload rows without a tier"; fi
# the config's own tier: the same rows, named by it
{ cat eq.toml; printf '[parallel]\noffload = "offload_nvme"\n'; } > nvme.toml
expect_exit 0 "plan a config with [parallel] offload = offload_nvme" \
  "$bin" plan nvme.toml --world 1 "${tiny[@]}"
expect_out "the NVMe tier is named" "offload: offload_nvme (offload tier in files on NVMe"
sub_check zero-3 optimizer_and_params 9 $((20 * P)) "the same bytes on NVMe"
expect_exit 0 "--offload none over the config's tier" "$bin" plan nvme.toml --world 1 "${tiny[@]}" \
  --offload none
if grep -qE 'tier/rank|^  optimizer' <<<"$out"; then bad "offload rows with --offload none" "$out"
else ok "--offload none: no offload rows"; fi
expect_exit 2 "--offload names a tier that is not installed" "$bin" plan eq.toml --offload nosuch
expect_out "says which and where it looked" \
  "dtrain plan: error: --offload: offload tier 'nosuch': offload plugin 'nosuch' not found in:"

# ---- pipeline (issue 14): a block per stage after the table -------------
# micro-batch 1 x 32 tokens x n_embd 32 in f32: a boundary tensor is
# 4096 bytes; 8 micro-batches a step on one replica.  Stage 0 sends 8
# activations and stage 1 8 gradients (32768 bytes), and both the tied
# embedding's gradient, wte 256 x 32 + wpe 32 x 32 f32 = 36864 bytes:
# 69632 bytes = 0.07 MiB each.  A stage's rank allocates its own units'
# activations only, per micro-batch it keeps: stage 0 keeps the tokens
# (128 bytes), x[0] and x[1] (4096 each) and block.0's (15 x 4096 + the
# norms' 512 + attention's 2 x 32 x 32 f32 probabilities 8192): 78464
# bytes, and a workspace of 65536 (no head: no logits; 0.20 MiB whole);
# stage 1 its input x[1], block.1's 74240, the head's ln_f and
# probabilities (4 x (1024 + 8192) + 256) and the targets: 115584, and a
# workspace of 131200 with the logits, their gradient and the losses.
# keep_activations = false keeps one micro-batch's (0.14 and 0.24 MiB)
# and stashes stage 1's inputs, gpipe all 8; the default keeps every
# micro-batch in flight and stashes one input: gpipe all 8 (8 x 78464 +
# 65536 = 0.66 MiB, 8 x 115584 + 131200 = 1.01 MiB), 1f1b at most p - k
# (stage 0: 2 x 78464 + 65536 = 0.21 MiB; stage 1: 0.24 MiB).  The
# schedule's boundary tensors (4096 bytes each) besides: stage 0 its 2
# outputs in flight and the received gradient (3: 0.01 MiB), stage 1 its
# stash and 2 input gradients in flight (gpipe recomputing: 8 + 2 = 10,
# 0.04 MiB; else 1 + 2 = 3).
expect_exit 0 "plan a pipeline of 2 stages, gpipe, activations recomputed" "$bin" plan eq.toml \
  --world 2 --set parallel.pipeline=2 --set train.micro_batch=1 --set pipeline.schedule=gpipe \
  --set pipeline.keep_activations=false
expect_out "the bubble (p - 1) / (m + p - 1)" \
  "pipeline: 2 stages x 1 data-parallel replicas, 8 micro-batches a step: bubble (p - 1) / (m + p - 1) = 11.1%"
expect_out "stage 0: its units, nothing stashed, its sends" \
  "  stage 0: units 0-1 (embedding .. block.0), 0.022M parameters; activations 0.14 MiB (1 micro-batch of its units) + boundary tensors 0.01 MiB (3: 0 stashed inputs, sends in flight, received gradients); sends 0.07 MiB a step"
expect_out "stage 1: the tied copy, every input stashed (gpipe, recomputing)" \
  "  stage 1: units 2-3 (block.1 .. head) + a tied copy of the embedding, 0.022M parameters; activations 0.24 MiB (1 micro-batch of its units) + boundary tensors 0.04 MiB (10: 8 stashed inputs, sends in flight, received gradients); sends 0.07 MiB a step"
expect_exit 0 "plan a pipeline of 2 stages, gpipe" "$bin" plan eq.toml --world 2 \
  --set parallel.pipeline=2 --set train.micro_batch=1 --set pipeline.schedule=gpipe
expect_out "gpipe: stage 0 keeps all 8 micro-batches" \
  "  stage 0: units 0-1 (embedding .. block.0), 0.022M parameters; activations 0.66 MiB (8 micro-batches of its units) + boundary tensors 0.01 MiB (3: 0 stashed inputs, sends in flight, received gradients); sends 0.07 MiB a step"
expect_out "gpipe: stage 1 keeps all 8, stashes one input" \
  "  stage 1: units 2-3 (block.1 .. head) + a tied copy of the embedding, 0.022M parameters; activations 1.01 MiB (8 micro-batches of its units) + boundary tensors 0.01 MiB (3: 1 stashed input, sends in flight, received gradients); sends 0.07 MiB a step"
expect_exit 0 "plan a pipeline of 2 stages, 1f1b" "$bin" plan eq.toml --world 2 \
  --set parallel.pipeline=2 --set train.micro_batch=1
expect_out "1f1b: stage 0 keeps its 2 in flight" \
  "activations 0.21 MiB (2 micro-batches of its units) + boundary tensors 0.01 MiB (3: 0 stashed inputs,"
expect_out "1f1b: stage 1 keeps one, stashes one input" \
  "activations 0.24 MiB (1 micro-batch of its units) + boundary tensors 0.01 MiB (3: 1 stashed input,"
# interleaved, 2 chunks a stage: virtual stages 0-3 are units 0-3, stage 0
# running 0 and 2 (the embedding, block.1), stage 1 running 1 and 3; the
# bubble 1 / (2 x 8 + 1) = 5.9%.  Stage 0 keeps at most 4 micro-batches
# of a chunk in flight: per micro-batch the tokens and x[0] (4224 bytes),
# x[1] (block.1's input, 4096) and block.1's 74240: 4 x 82560 + the
# workspace 65536 = 0.38 MiB, and 27 boundary tensors (a send buffer per
# micro-batch: chunk 0's 8 outputs + its received gradient, chunk 1's
# input + 8 input gradients + 8 outputs + its received gradient) =
# 0.11 MiB.  Each stage sends 3 x 8 boundary tensors
# (stage 0: chunk 0's outputs, chunk 1's outputs and input gradients;
# stage 1: chunk 0's both ways, chunk 1's input gradients) = 98304 bytes
# and the tied gradient's 36864: 0.13 MiB.
expect_exit 0 "plan 2 stages of 2 interleaved chunks" "$bin" plan eq.toml --world 2 \
  --set parallel.pipeline=2 --set train.micro_batch=1 --set pipeline.virtual_stages=2
expect_out "interleaved: the bubble (p - 1) / (V m + p - 1)" \
  "pipeline: 2 stages of 2 interleaved chunks x 1 data-parallel replicas, 8 micro-batches a step: bubble (p - 1) / (V m + p - 1) = 5.9%"
expect_out "interleaved: stage 0's chunks, kept activations and sends" \
  "  stage 0: units 0-0, 2-2 (2 chunks: embedding .. embedding, block.1 .. block.1), 0.022M parameters; activations 0.38 MiB (4 micro-batches of its units) + boundary tensors 0.11 MiB (27: 1 stashed input, sends in flight, received gradients); sends 0.13 MiB a step"
# each stage's model state per row, over the data group (--world 4: dp 2).
# Stage 0 holds the embedding (wte 256 x 32 + wpe 32 x 32 = 9216) and
# block.0 (12704): 21920 parameters; stage 1 block.1 (12704), the head
# (64) and the tied copy (9216): 21984.  ddp keeps f32 params, grads and
# AdamW's two moments, 16 bytes each: 350720 = 0.33 MiB and 351744 =
# 0.34 MiB; zero-2 shards the grads and moments over 2 ranks, 4 + 2 + 4 =
# 10 bytes: 219200 = 0.21 MiB and 219840 = 0.21 MiB.
expect_exit 0 "plan pp2 x dp2" "$bin" plan eq.toml --world 4 --set parallel.pipeline=2 \
  --set train.micro_batch=1
expect_out "the stage table's header" \
  "model state per rank of each stage (parameters, gradients, optimizer over the 2-rank data group):"
expect_out "ddp: each stage's own units, the tied copy on the last" \
  "  ddp                        0.33 MiB     0.34 MiB"
expect_out "zero-2: gradients and moments halved" \
  "  zero-2                     0.21 MiB     0.21 MiB"
expect_exit 2 "more stages than units" "$bin" plan eq.toml --world 5 --set parallel.pipeline=5 \
  --set train.global_batch=5 --set train.micro_batch=1
expect_out "more stages than units: named" \
  "parallel.pipeline = 5 stages, but the model has 4 units (each stage needs at least one)"

# ---- tensor parallelism (issue 14): a tensor rank's part, its all-reduces ----
# tp 2 over 4 ranks: dp 2, so 4 micro-batches of 1 x 32 tokens a step.  A
# rank holds wte's 128 of 256 rows (4096), wpe whole (1024), per block its
# head's QKV rows and bias (1536 + 48), c_proj's 16 columns and the whole
# bias (512 + 32), half of the MLP (2048 + 64, 2048 + 32) and the two
# LayerNorms whole (128): 6448, and ln_f (64): 18080 of 34688 parameters,
# 72320 bytes = 0.07 MiB of parameters in the ddp row.  Per micro-batch:
# forward 2 per block + the embedding's + the cross-entropy's 2 = 7,
# backward 2 per block + the LM head's = 5; 10 of them of 1 x 32 x 32 f32
# = 4096 bytes, and 3 x 32 f32 for the cross-entropy: 41344 bytes, x 4 =
# 165376 = 0.16 MiB a step; a 2-rank ring sends 2 (2 - 1) / 2 of it.
expect_exit 0 "plan tp2 x dp2" "$bin" plan eq.toml --world 4 --set parallel.tensor=2 \
  --set train.micro_batch=1
expect_out "the rows plan a tensor rank's part" \
  "tensor parallel: 2 ranks; the rows plan tensor rank 0's part of the model (0.02M parameters) over the 2 ranks holding the same part"
expect_out "ddp: the part's parameters" "ddp                    0.07 MiB    0.07 MiB    0.14 MiB"
expect_out "the part and the whole" \
  "tensor: 2 ranks x 1 stage(s) x 2 data-parallel replicas; a rank holds 0.018M of the 0.035M parameters"
expect_out "the all-reduces and their bytes" \
  "  all-reduces over the tensor group per micro-batch: 7 forward, 5 backward (2 + 2 per transformer block, the embedding's, the LM head's and the cross-entropy's 2); 4 micro-batches a step: 0.16 MiB all-reduced, 0.16 MiB sent per rank"
expect_exit 2 "a tensor degree that does not divide the world" "$bin" plan eq.toml --world 3 \
  --set parallel.tensor=2
expect_out "the degree and the world named" \
  "parallel.tensor = 2 does not divide the world of 3 ranks"

finish
