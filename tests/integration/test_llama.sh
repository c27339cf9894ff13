#!/usr/bin/env bash
# The llama model plugin (plugins/llama/llama.c) through `dtrain run`, ranks started
# the way an external launcher starts them (DTRAIN_* environment, one
# process each) on the shm communicator: a 2-layer llama (n_embd 32, 4
# query heads sharing 2 kv heads, intermediate_size 64, untied head) and a
# tied one with Qwen2's q/k/v biases, 6 AdamW steps of a global batch of 8
# in micro-batches of 2, validated at steps 3 and 6, 1 cpu thread per rank:
#  - equivalence with one rank under ddp, zero-3 (also with every layer
#    recomputed, and with the optimizer on offload_cpu) and fsdp FULL_SHARD
#    (2 ranks), pp2 (1f1b; gpipe recomputing forwards), tp2 x dp2 (zero-1)
#    and, tied, pp2 and pp2 x 2 interleaved chunks (the last stage
#    holds a copy of the embedding for the LM head) and tp2: the
#    tolerances of the GPT-2 layout tests (test_tensor.sh,
#    test_pipeline.sh; lib.sh's same_as_n1): every loss and validation
#    loss within 1e-6, the gradient norm within 1e-5, the final parameters
#    within 2e-5; bf16 and fp16 parameters at tp2 against one rank of the
#    same dtype, loss within 1e-5 and norm within 1e-4;
#  - a checkpoint resume: stopped at step 3 and resumed, steps 1-6 are the
#    uninterrupted run's bit for bit (one rank), and within 1e-6 when the
#    save was tp2 x dp2 and the resume pp2;
#  - bf16 activations and parameters: one rank within 5e-2 of f32, zero-3,
#    pp2 and tp2 within 5e-4 of one bf16 rank (test_bf16.sh's bounds);
#  - rope_theta and rms_norm_eps recorded by a checkpoint: `dtrain eval`
#    gives the run's validation loss with them, a resume with another
#    rope_theta notes it, one with tie_embeddings changed is refused;
#  - the memory the one-rank run measured is what was planned, per tag;
#  - `dtrain check` shows the preset's values (rope_theta, rope_scaling,
#    tie_embeddings) as the preset's;
#  - `dtrain plan` of the llama-3.2-1b preset in a config, and of
#    smollm-135m and tinyllama-1.1b as --model: their parameter counts;
#  - config errors: a tensor degree that does not divide n_kv_head.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
# eq.toml: GPT-2's layout config (lib.sh), made a llama
layout_toml 4
sed -i 's/^\[model\]$/[model]\narch = "llama"\nn_kv_head = 2\nintermediate_size = 64/' eq.toml
layout() {
  local n=$1 name=$2 what=$3; shift 3
  if ranks "$n" eq.toml "$@" --set run.name="$name" --metrics "$name.jsonl"; then
    ok "$what trained"
  else bad "$what failed" "$(cat rank*.log)"; fi
  out=$(cat rank0.log)
  same_as_n1 "$name" "$what"
}
one_rank() { # NAME ARGS...: the 1-rank reference run NAME and its export
  local name=$1; shift
  expect_exit 0 "1 rank ($name)" "$bin" run eq.toml --set run.comm=self --set run.name="$name" \
    --metrics "$name.jsonl" "$@"
  "$bin" export "out/$name/ckpt" "$name.st" --layout dtrain >/dev/null
}

# ---- equivalence: GQA, untied ------------------------------------------
one_rank n1
expect_out "the llama's parameters counted" "dtrain: llama, 0.03M parameters (4 units)"
# every tag as planned to the byte, but the cpu device's own attention
# backward scratch (1 thread x T = 32 floats: lib.sh)
planned_is_measured "1 rank: memory as planned" n1.jsonl 128
layout 2 ddp "ddp (2 ranks)"
layout 2 z3 "zero-3 (2 ranks)" --set parallel.data=zero --set zero.stage=3
layout 2 fsdp "fsdp FULL_SHARD (2 ranks)" --set parallel.data=fsdp
layout 2 pp2 "pp2 (1f1b)" --set parallel.pipeline=2
layout 4 t2z1 "tp2 x dp2 zero-1" --set parallel.tensor=2 --set parallel.data=zero \
  --set zero.stage=1
expect_out "tp2 x dp2: the grid printed" \
  "dtrain: tensor parallel over 2 ranks x 1 pipeline stage(s) x 2 data-parallel replicas"
layout 2 z3ac "zero-3, activation checkpointing of every layer" --set parallel.data=zero \
  --set zero.stage=3 --set model.activation_checkpointing=all
layout 2 z3o "zero-3, optimizer and gradients on offload_cpu" --set parallel.data=zero \
  --set zero.stage=3 --set zero.offload_what=optimizer --set parallel.offload=offload_cpu
layout 2 gp "pp2 gpipe, forwards recomputed (keep_activations false)" \
  --set parallel.pipeline=2 --set pipeline.schedule=gpipe --set pipeline.keep_activations=false
# bf16 and fp16 compute parameters: tp2 against one rank of the same dtype
# (test_tensor.sh's tolerances: loss 1e-5, norm 1e-4)
for dt in bf16 fp16; do
  if "$bin" run eq.toml --set run.comm=self --set model.dtype=$dt --set run.name=n1$dt \
       --metrics n1$dt.jsonl >n1$dt.log 2>&1 &&
     ranks 2 eq.toml --set parallel.tensor=2 --set model.dtype=$dt --set run.name=t2$dt \
       --metrics t2$dt.jsonl; then ok "tp2 $dt trained"
  else bad "tp2 $dt failed" "$(cat n1$dt.log rank*.log | tail -20)"; fi
  if v=$($py "$cmp" curves n1$dt.jsonl t2$dt.jsonl 1e-5 1e-4); then ok "tp2 $dt: $v"
  else bad "tp2 $dt: differs from one rank's $dt" "$v"; fi
done

# ---- checkpoint resume ---------------------------------------------------
expect_exit 0 "1 rank, stopped at step 3" "$bin" run eq.toml --set run.comm=self \
  --set run.name=rs --set train.stop_at=3 --metrics rs.jsonl
expect_exit 0 "1 rank, resumed" "$bin" run eq.toml --set run.comm=self --set run.name=rs \
  --set checkpoint.resume=latest --metrics rs.jsonl
if v=$($py "$cmp" curves n1.jsonl rs.jsonl 0 0); then ok "resumed: bit-identical: $v"
else bad "resumed: the curve differs from the uninterrupted run's" "$v"; fi
"$bin" export out/rs/ckpt rs.st --layout dtrain >/dev/null
if v=$($py "$cmp" params n1.st rs.st 0); then ok "resumed: the same parameters: $v"
else bad "resumed: parameters differ" "$v"; fi
if ranks 4 eq.toml --set parallel.tensor=2 --set run.name=rx --set train.stop_at=3 \
     --metrics rx.jsonl && ranks 2 eq.toml --set parallel.pipeline=2 --set run.name=rx \
     --set checkpoint.resume=latest --metrics rx.jsonl; then
  ok "tp2 x dp2 saved, pp2 resumed"
else bad "tp2 x dp2 -> pp2 failed" "$(tail -20 rank*.log)"; fi
if v=$($py "$cmp" curves n1.jsonl rx.jsonl 1e-6 1e-5); then ok "tp2 x dp2 -> pp2: $v"
else bad "tp2 x dp2 -> pp2: differs from one rank's" "$v"; fi

# ---- tied head with q/k/v biases ------------------------------------------
sed -i 's/^intermediate_size = 64$/intermediate_size = 64\ntie_embeddings = true\nqkv_bias = true/' \
  eq.toml
one_rank n1t
cp n1t.jsonl n1.jsonl; cp n1t.st n1.st
layout 2 tpp2 "tied, qkv_bias: pp2" --set parallel.pipeline=2
layout 2 tt2 "tied, qkv_bias: tp2" --set parallel.tensor=2

layout 2 tvs "tied, qkv_bias: pp2 x 2 interleaved chunks" --set parallel.pipeline=2 \
  --set pipeline.virtual_stages=2
# bf16 activations and parameters (test_bf16.sh's bounds): one rank within
# 5e-2 of f32, zero-3, pp2 and tp2 within 5e-4 of one bf16 rank (every
# loss and validation loss; measured 3.4e-4 at tp2, whose partial sums are
# all-reduced in bf16, 4.8e-7 and less for the others)
b16=(--set model.activations=bf16 --set model.dtype=bf16)
expect_exit 0 "bf16 activations, 1 rank" "$bin" run eq.toml --set run.comm=self \
  --set run.name=b1 --metrics b1.jsonl "${b16[@]}"
if v=$($py "$cmp" curves n1.jsonl b1.jsonl 5e-2 1e30); then ok "bf16 against f32: $v"
else bad "bf16 activations: too far from f32" "$v"; fi
for l in "z3 --set parallel.data=zero --set zero.stage=3" "p2 --set parallel.pipeline=2" \
         "t2 --set parallel.tensor=2"; do
  set -- $l; name=b$1; shift
  if ranks 2 eq.toml "$@" "${b16[@]}" --set run.name=$name --metrics $name.jsonl; then
    ok "bf16 activations, $name trained"
  else bad "bf16 activations, $name failed" "$(tail -20 rank*.log)"; fi
  if v=$($py "$cmp" curves b1.jsonl $name.jsonl 5e-4 1e30); then ok "bf16 $name: $v"
  else bad "bf16 $name: differs from one bf16 rank" "$v"; fi
done

# ---- settings a checkpoint records ----------------------------------------
# rope_theta and rms_norm_eps change no shape: the manifest records them,
# eval rebuilds the model with them (the run's own validation loss, to the
# printed digit), and a resume with another value says so
expect_exit 0 "rope_theta 500000, rms_norm_eps 1e-6: trained" "$bin" run eq.toml \
  --set run.comm=self --set run.name=kk --set model.rope_theta=500000 \
  --set model.rms_norm_eps=1e-6 --metrics kk.jsonl
want=$(grep -o '"val_loss": [^,}]*' kk.jsonl | tail -1 | cut -d' ' -f2)
expect_exit 0 "eval of that checkpoint" "$bin" eval out/kk/ckpt --data train.bin --config eq.toml \
  --batches 4
expect_out "eval: the run's validation loss, with its rope_theta and rms_norm_eps" \
  "4 batches of 8 x 32 tokens of 'train.bin': loss $want, perplexity"
expect_exit 0 "rope_theta 500000: stopped at step 3" "$bin" run eq.toml --set run.comm=self \
  --set run.name=kr --set model.rope_theta=500000 --set train.stop_at=3
expect_exit 0 "resumed with the default rope_theta" "$bin" run eq.toml --set run.comm=self \
  --set run.name=kr --set checkpoint.resume=latest
expect_out "the changed setting noted" \
  "dtrain: note: [model] rope_theta is 10000 in this run but 500000 in checkpoint"
expect_exit 1 "resumed untied: refused" "$bin" run eq.toml --set run.comm=self --set run.name=kr \
  --set checkpoint.resume=latest --set model.tie_embeddings=false --set train.steps=8
expect_out "the changed shape key named with both values" \
  "[model] tie_embeddings = true there but false in this run: it was saved from another model"

# ---- plan and errors ------------------------------------------------------
printf '[model]\narch = "llama"\npreset = "llama-3.2-1b"\n[train]\nmicro_batch = 1\nseq_len = 2048\n' \
  >p.toml
expect_exit 0 "plan the llama-3.2-1b preset" "$bin" plan p.toml --world 2
expect_out "llama-3.2-1b: 1,235,814,400 parameters" \
  "plan: llama, 1235.81M parameters, fp32, adamw; 2 rank(s); micro-batch 1 x 2048 tokens"
expect_exit 0 "check the llama-3.2-1b config" "$bin" check p.toml
expect_out "the preset's rotary base shown as the preset's" "rope_theta = 500000.0  # preset"
expect_out "the preset's scaling shown" 'rope_scaling = "llama3"  # preset'
expect_out "the preset's tied head shown" "tie_embeddings = true  # preset"
# --model: a llama preset replaces the file's shape and arch
expect_exit 0 "plan --model smollm-135m" "$bin" plan eq.toml --world 2 --model smollm-135m
expect_out "smollm-135m: 134,515,008 parameters" "plan: llama, 134.52M parameters"
expect_exit 0 "plan --model tinyllama-1.1b" "$bin" plan eq.toml --world 2 --model tinyllama-1.1b
expect_out "tinyllama-1.1b: 1,100,048,384 parameters" "plan: llama, 1100.05M parameters"
set +e; ranks 4 eq.toml --set parallel.tensor=4 --set run.name=t4; e=$?; set -e
if [ $e = 2 ]; then ok "tp4 with 2 kv heads refused (exit 2)"; else bad "tp4: exit $e, expected 2"; fi
out=$(cat rank0.log)
expect_out "tp4: the kv heads named" \
  "[parallel] tensor = 4 does not divide [model] n_kv_head = 2: key/value heads (with their query heads) are split across the tensor group"
finish
