#!/usr/bin/env bash
# Sequence parallelism (issue 25: [tensor] scheme = "megatron_sp",
# Megatron-LM's sequence parallelism on top of its 1D tensor parallelism)
# through `dtrain run`, ranks started the way an external launcher starts
# them, on the shm communicator, with the layouts of test_tensor.sh (a
# 2-layer GPT-2 of 4 heads, n_embd 32, 6 AdamW steps of a global batch of 8
# in micro-batches of 2, 1 cpu thread per rank) and test_llama.sh's llama
# (4 query heads sharing 2 kv heads, untied; and tied with q/k/v biases):
#  - equivalence with one rank under the tolerances of test_tensor.sh
#    (lib.sh's same_as_n1: every loss and validation loss within 1e-6, the
#    gradient norm within 1e-5, the final parameters within 2e-5): GPT-2
#    tp2, tp4, tp2 with every block recomputed, tp2 x dp2 (zero-1 and
#    fsdp), tp2 x pp2 (1f1b: the pipeline's boundary carries this rank's
#    B*T/tp rows) and tp2 x pp2 x dp2 zero-1 (8 ranks); llama tp2, tp2 x
#    dp2 zero-1, tp2 x pp2, and tied with biases tp2; GPT-2 bf16
#    parameters at tp2 against one bf16 rank (loss 1e-5, norm 1e-4);
#  - the 1D scheme's curve and megatron_sp's agree within 1e-6;
#  - the layout line names the scheme; its rank 0 reports the all-gathers
#    and reduce-scatters it ran; the memory the tp2 rank measured is what
#    it planned (tag by tag, the cpu device's attention scratch aside);
#  - a checkpoint saved under megatron_sp resumes under megatron and on one
#    rank (a checkpoint holds no scheme), continuing one rank's curve;
#  - `dtrain plan`: the sequence-parallel line, and the activations of a
#    rank smaller than under the 1D scheme;
#  - config errors (exit 2, the exact message): a sequence that the tensor
#    degree does not divide.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
layout_toml 4
sp=(--set tensor.scheme=megatron_sp)
# layout N NAME DESCRIPTION ARGS...: train on N ranks, compare with n1
layout() {
  local n=$1 name=$2 what=$3; shift 3
  if ranks "$n" eq.toml "$@" --set run.name="$name" --metrics "$name.jsonl"; then
    ok "$what trained"
  else bad "$what failed" "$(cat rank*.log | tail -20)"; fi
  out=$(cat rank0.log)
  same_as_n1 "$name" "$what"
}

# ---- GPT-2 ---------------------------------------------------------------
expect_exit 0 "gpt2: 1 rank" "$bin" run eq.toml --set run.comm=self --set run.name=n1 \
  --metrics n1.jsonl
"$bin" export out/n1/ckpt n1.st --layout dtrain >/dev/null
layout 2 s2 "gpt2 tp2 sp" --set parallel.tensor=2 "${sp[@]}"
expect_out "tp2 sp: the layout names the scheme" \
  "dtrain: tensor parallel over 2 ranks x 1 pipeline stage(s) x 1 data-parallel replicas (scheme megatron_sp over the tensor groups"
# 24 training micro-batches (6 steps of 4) of 6 L + 2 = 14 all-gathers and
# 4 L + 2 = 10 reduce-scatters, and the 2 evaluations' 32 forward-only
# micro-batches of 2 L + 1 = 5 each
expect_out "tp2 sp: its collectives counted" "all-gathers and"
if n=$(sed -nE 's/.* ([0-9]+) all-gathers and ([0-9]+) reduce-scatters .*/\1 \2/p' rank0.log) &&
   [ "$n" = "$((24 * 14 + 32 * 5)) $((24 * 10 + 32 * 5))" ]; then
  ok "tp2 sp: 14 all-gathers and 10 reduce-scatters a training micro-batch, 5 each in evaluation"
else bad "tp2 sp: all-gathers and reduce-scatters: '$n'" "$(tail -3 rank0.log)"; fi
planned_is_measured "tp2 sp: memory as planned" s2.jsonl 128
layout 2 t2 "gpt2 tp2 (1D, for comparison)" --set parallel.tensor=2
if v=$($py "$cmp" curves t2.jsonl s2.jsonl 1e-6 1e-5); then ok "gpt2: megatron_sp = megatron: $v"
else bad "gpt2: megatron_sp differs from megatron" "$v"; fi
layout 4 s4 "gpt2 tp4 sp" --set parallel.tensor=4 "${sp[@]}"
layout 2 s2r "gpt2 tp2 sp, every block recomputed" --set parallel.tensor=2 "${sp[@]}" \
  --set model.activation_checkpointing=all
layout 4 s2z1 "gpt2 tp2 x dp2 zero-1 sp" --set parallel.tensor=2 "${sp[@]}" \
  --set parallel.data=zero --set zero.stage=1
layout 4 s2f "gpt2 tp2 x dp2 fsdp sp" --set parallel.tensor=2 "${sp[@]}" --set parallel.data=fsdp
layout 4 s2p2 "gpt2 tp2 x pp2 (1f1b) sp" --set parallel.tensor=2 "${sp[@]}" \
  --set parallel.pipeline=2
layout 8 s2p2z1 "gpt2 tp2 x pp2 x dp2 zero-1 sp (8 ranks)" --set parallel.tensor=2 "${sp[@]}" \
  --set parallel.pipeline=2 --set parallel.data=zero --set zero.stage=1
if "$bin" run eq.toml --set run.comm=self --set model.dtype=bf16 --set run.name=n1bf \
     --metrics n1bf.jsonl >n1bf.log 2>&1 &&
   ranks 2 eq.toml --set parallel.tensor=2 "${sp[@]}" --set model.dtype=bf16 \
     --set run.name=s2bf --metrics s2bf.jsonl; then ok "gpt2 tp2 sp bf16 trained"
else bad "gpt2 tp2 sp bf16 failed" "$(cat n1bf.log rank*.log | tail -20)"; fi
if v=$($py "$cmp" curves n1bf.jsonl s2bf.jsonl 1e-5 1e-4); then ok "gpt2 tp2 sp bf16: $v"
else bad "gpt2 tp2 sp bf16: differs from one bf16 rank's" "$v"; fi

# a megatron_sp checkpoint is the model's: resumed under megatron, and on 1 rank
for to in "2 --set parallel.tensor=2" "1"; do
  read -r n2 a2 <<<"$to"; name=rs$n2
  if ranks 2 eq.toml --set parallel.tensor=2 "${sp[@]}" --set run.name=$name \
       --set train.stop_at=3 --metrics $name.jsonl >/dev/null 2>&1 &&
     if [ "$n2" = 1 ]; then
       "$bin" run eq.toml --set run.comm=self --set run.name=$name --set checkpoint.resume=latest \
         --metrics $name.jsonl >$name.log 2>&1
     else
       # shellcheck disable=SC2086
       ranks 2 eq.toml $a2 --set run.name=$name --set checkpoint.resume=latest \
         --metrics $name.jsonl
     fi; then ok "tp2 sp saved, resumed on $n2 rank(s) ($( [ "$n2" = 1 ] || echo megatron))"
  else bad "tp2 sp -> $n2 rank(s): failed" "$(cat $name.log rank*.log 2>/dev/null | tail -20)"; fi
  if v=$($py "$cmp" curves n1.jsonl $name.jsonl 1e-6 1e-5); then
    ok "tp2 sp -> $n2 rank(s): steps 1-6 follow one rank's: $v"
  else bad "tp2 sp -> $n2 rank(s): the resumed curve differs" "$v"; fi
done

# ---- the plan ------------------------------------------------------------
cat > plan.toml <<T
[model]
preset = "gpt2-124m"
[train]
micro_batch = 4
seq_len = 1024
global_batch = 8
[parallel]
tensor = 2
T
acts() { # SCHEME: the activations column of ddp's row (GiB)
  "$bin" plan plan.toml --world 2 --set tensor.scheme="$1" |
    awk '$1 == "ddp" && $9 == "GiB" { print $8 }'
}
if out=$("$bin" plan plan.toml --world 2 "${sp[@]}" 2>&1); then
  expect_out "plan: the sequence-parallel line" \
    "sequence parallelism (the regions between the split layers on 2048 of the 4096 positions of a micro-batch)"
else bad "plan with megatron_sp failed" "$out"; fi
a1=$(acts megatron) a2=$(acts megatron_sp)
if $py -c "import sys; sys.exit(not (0 < float('$a2') < float('$a1')))" 2>/dev/null; then
  ok "plan: a rank's activations $a2 GiB under megatron_sp, $a1 GiB under megatron"
else bad "plan: activations megatron_sp '$a2' not below megatron's '$a1'"; fi

# ---- llama (a folder of its own: its 1-rank runs are n1 too) ----------------
mkdir llama; cd llama; ln -s ../train.bin train.bin
layout_toml 4
sed -i 's/^\[model\]$/[model]\narch = "llama"\nn_kv_head = 2\nintermediate_size = 64/' eq.toml
expect_exit 0 "llama: 1 rank" "$bin" run eq.toml --set run.comm=self --set run.name=n1 \
  --metrics n1.jsonl
"$bin" export out/n1/ckpt n1.st --layout dtrain >/dev/null
layout 2 ls2 "llama tp2 sp" --set parallel.tensor=2 "${sp[@]}"
layout 4 ls2z1 "llama tp2 x dp2 zero-1 sp" --set parallel.tensor=2 "${sp[@]}" \
  --set parallel.data=zero --set zero.stage=1
layout 4 ls2p2 "llama tp2 x pp2 sp" --set parallel.tensor=2 "${sp[@]}" --set parallel.pipeline=2
tied=(--set model.tie_embeddings=true --set model.qkv_bias=true)
mkdir ../tied; cp eq.toml ../tied/; cd ../tied; ln -s ../train.bin train.bin
expect_exit 0 "llama tied with biases: 1 rank" "$bin" run eq.toml --set run.comm=self \
  --set run.name=n1 --metrics n1.jsonl "${tied[@]}"
"$bin" export out/n1/ckpt n1.st --layout dtrain >/dev/null
layout 2 lt2 "llama tied with biases, tp2 sp" --set parallel.tensor=2 "${sp[@]}" "${tied[@]}"

# ---- config errors ---------------------------------------------------------
expect_exit 2 "a sequence tp does not divide" ranks 2 eq.toml --set parallel.tensor=2 "${sp[@]}" \
  --set train.seq_len=31 --set run.name=bad
out=$(cat rank0.log)
expect_out "... names both keys and the scheme" \
  'error: [train] seq_len = 31 is not a multiple of [parallel] tensor = 2: [tensor] scheme = "megatron_sp" splits each sequence over the tensor group'
finish
