#!/usr/bin/env bash
# Config that explains itself, as a user meets it: one file configuring
# every strategy with --set picking one (the tables of unselected plugins
# checked, then set aside), `check` doing run's checks that need no plugin
# instance (batch arithmetic, derived and preset values), config errors of a
# multi-rank run (the pipeline's layout among them) reported once before any
# rank starts, `config doc`, the
# DeepSpeed/PyTorch spellings pointed at dtrain's keys, and plugin errors
# naming the key that selected the plugin.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"

# expect_line NAME TEXT: the last command's output has TEXT as a whole line
expect_line() {
  if grep -qxF -- "$2" <<<"$out"; then ok "$1"; else bad "$1: no line '$2'" "$out"; fi
}
# expect_lines NAME N TEXT: exactly N lines of the last command's output are TEXT
expect_lines() {
  local n
  n=$(grep -cxF -- "$3" <<<"$out" || true)
  if [ "$n" = "$2" ]; then ok "$1"; else bad "$1: $n lines '$3', expected $2" "$out"; fi
}
# line_of FILE PATTERN: the number of the first line of FILE matching PATTERN
line_of() { grep -n -m1 -- "$2" "$1" | cut -d: -f1; }

# ---- one file, every strategy: --set parallel.data picks one -------------
tiny_run_setup "$bin" '[zero]' 'stage = 2' '[fsdp]' 'sharding_strategy = "SHARD_GRAD_OP"' \
  '[ddp]' 'bucket_cap_mb = 1.0'
cp tiny.toml all.toml
for s in zero fsdp ddp; do
  expect_exit 0 "run with parallel.data=$s from a file with [zero], [fsdp], [ddp]" \
    "$bin" run all.toml --set parallel.data=$s --set run.name=$s
  expect_out "the run used $s" "; strategy $s"
done
expect_exit 0 "check with parallel.data=fsdp" "$bin" check all.toml --set parallel.data=fsdp
expect_line "[fsdp] is claimed: its file value" \
  "sharding_strategy = \"SHARD_GRAD_OP\"  # file all.toml:$(line_of all.toml '^sharding_strategy')"
expect_line "check notes [zero] as not used" \
  "# note: [zero] is not used: the config does not select plugin 'zero' (its keys were checked)"
expect_line "check notes [ddp] as not used" \
  "# note: [ddp] is not used: the config does not select plugin 'ddp' (its keys were checked)"
expect_lines "the unused [zero] is not printed as resolved" 0 "[zero]"
expect_exit 0 "--set into an unselected plugin's table" "$bin" check all.toml --set zero.stage=3
# a typo inside a table no one selects is still caught, located in the file
sed 's/^bucket_cap_mb = 1.0/bucket_cap_m = 1.0/' tiny.toml > typo.toml
expect_exit 2 "typo in the unselected [ddp]" "$bin" run typo.toml --set parallel.data=zero
expect_line "typo named with file, line and key" \
  "dtrain run: error: typo.toml:$(line_of typo.toml '^bucket_cap_m '):1: unknown key 'bucket_cap_m' in [ddp]; did you mean 'bucket_cap_mb'?"
sed 's/^stage = 2/stage = 7/' tiny.toml > range.toml
expect_exit 2 "out-of-range value in the unselected [zero]" "$bin" check range.toml
expect_line "range error located" \
  "dtrain check: error: range.toml:$(line_of range.toml '^stage'):9: [zero] stage = 7 is out of range (allowed 1 .. 3)"
# a plugin's declared range is the core's check (the plugin repeats none)
expect_exit 2 "[shm] slot_bytes below its declared minimum" "$bin" check tiny.toml \
  --set run.comm=shm --set shm.slot_bytes=100
expect_line "... named, with the declared range" "dtrain check: error: --set shm.slot_bytes=100: [shm] slot_bytes = 100 is out of range (allowed 16384 .. 1073741824)"
printf '[run]\ncomm = "self"\n[zeroo]\nstage = 2\n' > notplugin.toml
expect_exit 2 "a table named after no plugin" "$bin" check notplugin.toml
expect_out "unknown table, with the closest and why" \
  "dtrain check: error: notplugin.toml:3:1: unknown table [zeroo]"
expect_out "unknown table hint" "(a plugin's table is named after a plugin on the search path)"

# ---- check does run's checks that need no plugin instance ----------------
# global_batch 3 with micro_batch 2 on 2 ranks: run refuses it, so must check
nodiv=(--set launch.nproc=2 --set run.comm=shm --set train.grad_accum=0 --set train.global_batch=3)
divmsg="tiny.toml: [train] global_batch = 3 is not a multiple of micro_batch (2) x data-parallel size (2) = 4; the number of accumulation steps would not be whole"
expect_exit 2 "check refuses a global_batch that does not divide" "$bin" check tiny.toml "${nodiv[@]}"
expect_line "check says why" "dtrain check: error: $divmsg"
expect_exit 2 "run refuses it too" "$bin" run tiny.toml "${nodiv[@]}"
expect_line "with the same message" "dtrain run: error: $divmsg"
# ... and from a 2-rank run that message comes once, before any rank starts
expect_lines "the error is printed once" 1 "dtrain run: error: $divmsg"
expect_lines "nothing else is printed" 1 "$out"
if grep -qF -e "[rank " -e "launching" <<<"$out"; then bad "a rank was started" "$out"
else ok "no rank was started"; fi
printf '[run]\ncomm = "shm"\n[launch]\nnproc = 2\n[train]\nstpes = 3\n' > typo2.toml
expect_exit 2 "a typo under a 2-rank run" "$bin" run typo2.toml
expect_lines "reported once, by the launching process" 1 \
  "dtrain run: error: typo2.toml:6:1: unknown key 'stpes' in [train]; did you mean 'steps'?"
expect_lines "and nothing else" 1 "$out"
printf '[run]\ncomm = "shm"\n[launch]\nnproc = 2\n[zero]\nstag = 3\n' > typo3.toml
expect_exit 2 "a typo in a plugin's table under a 2-rank run" "$bin" run typo3.toml
expect_lines "reported once, by the launching process" 1 \
  "dtrain run: error: typo3.toml:6:1: unknown key 'stag' in [zero]; did you mean 'stage'?"
expect_lines "and nothing else" 1 "$out"
# derived values: grad_accum from global_batch, a preset's shape
expect_exit 0 "check derives grad_accum" "$bin" check tiny.toml --set launch.nproc=2 \
  --set train.grad_accum=0 --set train.global_batch=8
expect_line "grad_accum shown as derived" "grad_accum = 2         # derived"
expect_line "global_batch as given" "global_batch = 8       # --set"
expect_exit 0 "check derives global_batch" "$bin" check tiny.toml --set launch.nproc=2
expect_line "global_batch shown as derived" "global_batch = 4       # derived"
expect_line "grad_accum from the file" "grad_accum = 1         # file tiny.toml:$(line_of tiny.toml '^grad_accum')"
printf '[run]\ncomm = "self"\n[model]\npreset = "gpt2-124m"\nn_layer = 3\n' > preset.toml
expect_exit 0 "check a preset model" "$bin" check preset.toml
expect_line "a preset's value marked as the preset's" "n_embd = 768           # preset"
expect_line "a preset's context" "context = 1024         # preset"
expect_line "a written value wins over the preset" "n_layer = 3            # file preset.toml:5"
expect_line "an arch-wide key stays default" 'dtype = "fp32"         # default'
printf '[run]\ncomm = "self"\n[model]\nn_embd = 30\nn_head = 4\n' > shape.toml
expect_exit 2 "check refuses a shape run refuses" "$bin" check shape.toml
expect_line "named" "dtrain check: error: shape.toml: [model] n_embd = 30 is not divisible by n_head = 4"
expect_exit 2 "check refuses seq_len beyond the context" "$bin" check tiny.toml --set train.seq_len=32
expect_line "named" "dtrain check: error: tiny.toml: [train] seq_len = 32 is longer than the model's context (model.context = 16)"

# the token files: a missing one, tokens beyond the vocabulary, none named
expect_exit 1 "check a config whose token file is missing" "$bin" check tiny.toml --set data.train=nope.bin
expect_line "named as run names it" "dtrain check: error: data file 'nope.bin': No such file or directory"
expect_exit 1 "a 2-rank run of it" "$bin" run tiny.toml --set data.train=nope.bin --set launch.nproc=2 --set run.comm=shm
expect_lines "refused once, before any rank starts" 1 "$out"
expect_line "with the same message" "dtrain run: error: data file 'nope.bin': No such file or directory"
expect_exit 1 "check tokens beyond the vocabulary" "$bin" check tiny.toml --set model.vocab_size=100
expect_line "named" "dtrain check: error: data file 'train.bin': token 116 at position 0 is outside the vocabulary (vocab_size 100)"
expect_exit 0 "check a config that names no token file" "$bin" check tiny.toml --set data.train=
expect_line "passes with a note" "# note: [data] train is empty: dtrain run needs a token file"
expect_exit 2 "a 2-rank run of it" "$bin" run tiny.toml --set data.train= --set launch.nproc=2 --set run.comm=shm
expect_lines "refused once, before any rank starts" 1 "$out"
expect_line "why" "dtrain run: error: tiny.toml: [data] train is empty: name a token file (make one with 'dtrain data prepare TEXT OUT')"

# ---- config doc ------------------------------------------------------------
expect_exit 0 "config doc train" "$bin" config doc train
expect_line "the section's doc" "# the training loop and schedule"
expect_line "the section's table" "[train]"
expect_line "an int key: type, default, range" "  micro_batch        int    default 4, range 1 .. 1048576"
expect_line "its doc" "      sequences per rank per micro-step"
expect_line "an enum key: its values" '  decay              enum   default "cosine", one of cosine|linear|constant'
expect_line "a float key" "  gradient_clipping  float  default 1.0, range 0 .. 1e+09"
expect_lines "no other section's table" 0 "[optimizer]"
expect_exit 0 "config doc, every section" "$bin" config doc
doc=$out
# every key check prints for a core table is documented, under its table
expect_exit 0 "check a default config" "$bin" check all.toml
missing=$(awk '/^\[/ { t = $1 } /^[a-z_]+ = / { print t " " $1 }' <<<"$out" |
  while read -r t k; do
    case $t in "[run]"|"[model]"|"[data]"|"[train]"|"[optimizer]"|"[parallel]"|"[launch]"|"[checkpoint]") ;;
      *) continue ;; esac
    awk -v t="$t" -v k="$k" '/^\[/ { in_t = ($1 == t) } in_t && $1 == k { f = 1 } END { exit !f }' <<<"$doc" ||
      echo "$t $k"
  done)
[ -z "$missing" ] && ok "config doc documents every core key check prints" ||
  bad "keys config doc lacks" "$missing"
expect_exit 2 "config doc of an unknown section" "$bin" config doc trian
expect_line "named, with the closest and where plugins are documented" \
  "dtrain config: error: no core section [trian]; did you mean [train]? (the sections: run, model, data, train, optimizer, parallel, pipeline, tensor, launch, checkpoint, fp16; a plugin's keys: dtrain plugins --describe trian)"
expect_exit 2 "config without a subcommand" "$bin" config
expect_exit 0 "config --help" "$bin" config --help
expect_out "usage shown" "usage: dtrain config doc [--markdown] [SECTION]"
# every section config doc prints (its "[name]" headings) is named in the help
help=$(tr '\n' ' ' <<<"$out")
unnamed=$("$bin" config doc | sed -n 's/^\[\([a-z0-9_]*\)\].*/\1/p' | sort -u |
  while read -r t; do grep -qE "[ :]$t[,)]" <<<"$help" || echo "$t"; done)
[ -z "$unnamed" ] && ok "config --help names every section" ||
  bad "sections config --help does not name" "$unnamed"

# ---- keys spelled the DeepSpeed / PyTorch way point at dtrain's -------------
# alias NAME TOML MESSAGE: `check` of [run] comm = "self" plus TOML fails
# (exit 2) with exactly "dtrain check: error: a.toml:MESSAGE"
alias_case() {
  printf '[run]\ncomm = "self"\n%b' "$2" > a.toml
  expect_exit 2 "$1" "$bin" check a.toml
  expect_line "$1: pointed at dtrain's key" "dtrain check: error: a.toml:$3"
}
alias_case "DeepSpeed gradient_accumulation_steps" '[train]\ngradient_accumulation_steps = 4\n' \
  "4:1: unknown key 'gradient_accumulation_steps' in [train]; gradient_accumulation_steps is DeepSpeed's name for train.grad_accum"
alias_case "DeepSpeed train_micro_batch_size_per_gpu" '[train]\ntrain_micro_batch_size_per_gpu = 4\n' \
  "4:1: unknown key 'train_micro_batch_size_per_gpu' in [train]; train_micro_batch_size_per_gpu is DeepSpeed's name for train.micro_batch"
alias_case "DeepSpeed train_batch_size" '[train]\ntrain_batch_size = 64\n' \
  "4:1: unknown key 'train_batch_size' in [train]; train_batch_size is DeepSpeed's name for train.global_batch"
alias_case "DeepSpeed zero_optimization.stage" '[zero_optimization]\nstage = 2\n' \
  "3:1: unknown table [zero_optimization]; zero_optimization.stage is DeepSpeed's name for [zero] stage (with parallel.data = \"zero\")"
alias_case "DeepSpeed zero_optimization, other keys" '[zero_optimization]\noverlap_comm = true\n' \
  "3:1: unknown table [zero_optimization]; zero_optimization is DeepSpeed's name for the [zero] table (with parallel.data = \"zero\"; its keys: dtrain plugins --describe zero)"
alias_case "DeepSpeed gradient_clipping under [optimizer]" '[train]\nsteps = 2\n[optimizer]\ngradient_clipping = 1.0\n' \
  "6:1: unknown key 'gradient_clipping' in [optimizer]; 'gradient_clipping' is a key of [train] (train.gradient_clipping)"
printf 'gradient_clipping = 1.0\n[run]\ncomm = "self"\n' > a.toml
expect_exit 2 "DeepSpeed gradient_clipping at the top level" "$bin" check a.toml
expect_line "put under [train]" "dtrain check: error: a.toml:1:1: key 'gradient_clipping' is outside any table; did you mean to put it under [train]?"
alias_case "DeepSpeed fp16.enabled" '[fp16]\nenabled = true\n' \
  "4:1: unknown key 'enabled' in [fp16]; fp16.enabled is DeepSpeed's name for model.dtype = \"fp16\""
alias_case "DeepSpeed bf16.enabled" '[bf16]\nenabled = true\n' \
  "3:1: unknown table [bf16]; bf16.enabled is DeepSpeed's name for model.dtype = \"bf16\""
alias_case "DeepSpeed optimizer.params.lr" '[optimizer]\ntype = "adamw"\n[optimizer.params]\nlr = 1e-3\n' \
  "5:1: [optimizer] params: nested tables are not allowed in [optimizer] (no [optimizer.params] headers or dotted keys 'params.x = ...'; every key is a plain value); optimizer.params.lr is DeepSpeed's name for train.lr"
alias_case "DeepSpeed optimizer.params.betas" '[optimizer.params]\nbetas = [0.9, 0.95]\n' \
  "3:1: [optimizer] params: nested tables are not allowed in [optimizer] (no [optimizer.params] headers or dotted keys 'params.x = ...'; every key is a plain value); optimizer.params.betas is DeepSpeed's name for optimizer.beta1 and optimizer.beta2"
alias_case "DeepSpeed optimizer.params.weight_decay" '[optimizer.params]\nweight_decay = 0.1\n' \
  "3:1: [optimizer] params: nested tables are not allowed in [optimizer] (no [optimizer.params] headers or dotted keys 'params.x = ...'; every key is a plain value); optimizer.params.weight_decay is DeepSpeed's name for optimizer.weight_decay"
alias_case "torchrun nproc_per_node" '[launch]\nnproc_per_node = 2\n' \
  "4:1: unknown key 'nproc_per_node' in [launch]; nproc_per_node is torchrun's name for launch.nproc"
alias_case "PyTorch lr in [optimizer]" '[optimizer]\nlr = 0.1\n' \
  "4:1: unknown key 'lr' in [optimizer]; 'lr' is a key of [train] (train.lr)"
alias_case "PyTorch betas" '[optimizer]\nbetas = [0.9, 0.95]\n' \
  "4:1: unknown key 'betas' in [optimizer]; betas is PyTorch's name for optimizer.beta1 and optimizer.beta2"
alias_case "DeepSpeed offload_optimizer in the selected [zero]" \
  '[parallel]\ndata = "zero"\n[zero]\nstage = 2\noffload_optimizer = true\n' \
  "7:1: unknown key 'offload_optimizer' in [zero]; offload_optimizer is DeepSpeed's name for parallel.offload = \"offload_cpu\" (device \"nvme\": \"offload_nvme\" and its [offload_nvme] path) with offload_what = \"optimizer\" in the strategy's table ([zero] offload_what)"
alias_case "DeepSpeed zero_optimization.offload_param" \
  '[zero_optimization.offload_param]\ndevice = "cpu"\n' \
  "3:1: unknown table [zero_optimization]; offload_param is DeepSpeed's name for parallel.offload = \"offload_cpu\" or \"offload_nvme\" with offload_what = \"params\" or \"optimizer_and_params\" in the strategy's table ([zero] offload_what, zero stage 3)"
alias_case "FSDP cpu_offload in the selected [fsdp]" \
  '[parallel]\ndata = "fsdp"\n[fsdp]\ncpu_offload = true\n' \
  "6:1: unknown key 'cpu_offload' in [fsdp]; cpu_offload is PyTorch FSDP's name for parallel.offload = \"offload_cpu\" with [fsdp] offload_what = \"optimizer_and_params\" (CPUOffload(offload_params=True): parameters on the host, the optimizer step there)"
alias_case "FSDP mixed_precision in the selected [fsdp]" \
  '[parallel]\ndata = "fsdp"\n[fsdp]\nmixed_precision = "bf16"\n' \
  "6:1: unknown key 'mixed_precision' in [fsdp]; mixed_precision is PyTorch FSDP's name for model.dtype (MixedPrecision's param_dtype: \"bf16\" or \"fp16\") and [fsdp] reduce_dtype (its reduce_dtype)"
alias_case "Trainer warmup_ratio: the warmup_steps it comes to" \
  '[train]\nsteps = 300\nwarmup_ratio = 0.1\n' \
  "5:1: unknown key 'warmup_ratio' in [train]; warmup_ratio is the Hugging Face Trainer's name for train.warmup_steps, counted in steps (warmup_ratio x train.steps); here train.warmup_steps = 30 (0.1 x train.steps = 300)"
printf '[run]\ncomm = "self"\n' > good.toml
expect_exit 2 "a DeepSpeed key in --set" "$bin" check good.toml --set train.gradient_accumulation_steps=2
expect_line "pointed at dtrain's key" \
  "dtrain check: error: --set train.gradient_accumulation_steps=2: unknown key 'gradient_accumulation_steps' in [train]; gradient_accumulation_steps is DeepSpeed's name for train.grad_accum"
expect_exit 2 "a DeepSpeed path in --set" "$bin" check good.toml --set zero_optimization.stage=2
expect_line "pointed at dtrain's key" \
  "dtrain check: error: --set zero_optimization.stage=2: unknown table [zero_optimization]; zero_optimization.stage is DeepSpeed's name for [zero] stage (with parallel.data = \"zero\")"

# ---- errors about a plugin name the key that selected it -------------------
printf '[run]\ncomm = "self"\n[model]\nn_head = 3\nn_embd = 48\n[parallel]\ntensor = 2\n' > tp.toml
expect_exit 2 "parallel.tensor = 2 on one rank" "$bin" check tp.toml
expect_line "the degrees and the world named (\"1 rank\")" \
  "dtrain check: error: tp.toml: parallel.tensor = 2 x parallel.pipeline = 1 = 2 ranks per model replica does not divide the world of 1 rank"
# (the pipeline plugin exists: its stages must divide the world)
expect_exit 2 "parallel.pipeline from --set" "$bin" check good.toml --set parallel.pipeline=2
expect_line "the stages and the world named (\"1 rank\")" \
  "dtrain check: error: good.toml: parallel.tensor = 1 x parallel.pipeline = 2 = 2 ranks per model replica does not divide the world of 1 rank"
expect_exit 2 "parallel.tensor = 2 over 3 heads under a 2-rank run" "$bin" run tp.toml \
  --set launch.nproc=2
expect_lines "named once, nothing else: no rank started" 1 "$out"
expect_out "by the launching process" \
  "dtrain run: error: tp.toml: [parallel] tensor = 2 does not divide [model] n_head = 3: attention heads are split across the tensor group"
# the pipeline's layout (its plugin's assign_stages: virtual_stages against
# keep_activations, grad_accum and the model's units) is checked by the
# launching process too, and by check: before, every rank started and
# failed in the pipeline's init, each printing it
pp=(--set launch.nproc=2 --set run.comm=shm --set parallel.pipeline=2 --set pipeline.virtual_stages=2)
ppmsg="schedule/1f1b: pipeline.virtual_stages = 2 needs pipeline.keep_activations = true: an interleaved stage keeps every chunk's activations rather than stash each chunk's inputs to recompute them"
expect_exit 2 "2 chunks a stage without kept activations under a 2-rank run" "$bin" run tiny.toml \
  "${pp[@]}" --set pipeline.keep_activations=false
expect_lines "named once, by the launching process" 1 "dtrain run: error: $ppmsg"
expect_lines "nothing else: no rank started" 1 "$out"
expect_exit 2 "check refuses it too" "$bin" check tiny.toml "${pp[@]}" --set pipeline.keep_activations=false
expect_line "with the same message" "dtrain check: error: $ppmsg"
expect_exit 2 "3 micro-batches over 2 stages of 2 chunks under a 2-rank run" "$bin" run tiny.toml \
  "${pp[@]}" --set train.grad_accum=3
expect_lines "named once, nothing else" 1 "dtrain run: error: schedule/1f1b: pipeline.virtual_stages = 2 needs the micro-batches of a step ([train] grad_accum = 3) to be a multiple of the 2 stages"
expect_lines "and nothing else" 1 "$out"
expect_exit 2 "more chunks than units under a 2-rank run" "$bin" run tiny.toml "${pp[@]}" \
  --set train.grad_accum=2 --set pipeline.virtual_stages=3 --set model.n_layer=2
expect_lines "named once, nothing else" 1 "dtrain run: error: schedule/1f1b: parallel.pipeline = 2 stages x pipeline.virtual_stages = 3 chunks, but model gpt2 has 4 units (each chunk needs at least one)"
expect_lines "and nothing else" 1 "$out"
expect_exit 0 "a layout that fits passes check" "$bin" check tiny.toml "${pp[@]}" \
  --set train.grad_accum=2 --set model.n_layer=2
expect_exit 2 "a misspelt strategy plugin" "$bin" check good.toml --set parallel.data=fsdq
expect_out "named where it was given" "dtrain check: error: --set parallel.data=fsdq: strategy plugin 'fsdq' not found in: "
expect_out "with the closest plugin of that kind" "(files are named dtrain_<name>.so); did you mean 'fsdp'?"
printf '[run]\ncomm = "shmm"\n' > comm.toml
expect_exit 2 "a misspelt comm plugin in the file" "$bin" check comm.toml
expect_out "named with file and line" "dtrain check: error: comm.toml:2: run.comm = \"shmm\": comm plugin 'shmm' not found in: "
expect_out "with the closest comm plugin" "; did you mean 'shm'?"

# ---- every config error of a file at once ---------------------------------
# errors in core tables (file and --set), in the selected plugin's table,
# in a plugin table the config does not select, a misspelt plugin, an
# unknown table and a stray key: one line each, in stage order, exit 2
cat > many.toml <<'T'
stray_thing = 1
[run]
comm = "self"
nmae = "x"
[model]
n_layer = 0
[train]
lr = "fast"
[parallel]
data = "zero"
offload = "offload_cpuu"
[zero]
stage = 7
[fsdp]
sharding_strategy = "FULL"
[deepspeed]
x = 1
T
want_many="dtrain check: error: many.toml:4:1: unknown key 'nmae' in [run]; did you mean 'name'?
dtrain check: error: many.toml:6:11: [model] n_layer = 0 is out of range (allowed 1 .. 1024)
dtrain check: error: --set train.micro_batch=abc: [train] micro_batch: expected an integer, got string \"abc\"
dtrain check: error: many.toml:8:6: [train] lr: expected a float, got string \"fast\"
dtrain check: error: many.toml:13:9: [zero] stage = 7 is out of range (allowed 1 .. 3)
dtrain check: error: many.toml:11: parallel.offload = \"offload_cpuu\": offload plugin 'offload_cpuu' not found in: $(realpath "$(dirname "$bin")")/plugins-out (files are named dtrain_<name>.so); did you mean 'offload_cpu'?
dtrain check: error: many.toml:15:21: [fsdp] sharding_strategy = \"FULL\" is not one of \"FULL_SHARD\", \"SHARD_GRAD_OP\", \"NO_SHARD\", \"HYBRID_SHARD\"; did you mean \"FULL_SHARD\"?
dtrain check: error: many.toml:1:1: key 'stray_thing' is outside any table; every key belongs under a [table] heading
dtrain check: error: many.toml:16:1: unknown table [deepspeed]; the tables in use are [run], [model], [data], [train], [optimizer], [parallel], [pipeline], [tensor], [launch], [checkpoint], [fp16], [cpu], [self], [zero], [gpt2] (a plugin's table is named after a plugin on the search path)"
expect_exit 2 "a file with 9 errors" "$bin" check many.toml --set train.micro_batch=abc
if [ "$out" = "$want_many" ]; then ok "check reports all 9, one line each, nothing else"
else bad "check did not report the 9 errors" "$(diff <(echo "$want_many") <(echo "$out"))"; fi
expect_exit 2 "dtrain run of the same file" "$bin" run many.toml --set train.micro_batch=abc
if [ "$out" = "${want_many//dtrain check:/dtrain run:}" ]; then ok "run reports the same 9 before any rank"
else bad "run did not report the 9 errors" "$(diff <(echo "${want_many//dtrain check:/dtrain run:}") <(echo "$out"))"; fi
expect_exit 2 "and run with 2 ranks (the launching process)" "$bin" run many.toml \
  --set train.micro_batch=abc --set launch.nproc=2
expect_lines "each error once, from the launcher" 1 \
  "dtrain run: error: many.toml:13:9: [zero] stage = 7 is out of range (allowed 1 .. 3)"
n=$(grep -c '^dtrain run: error: ' <<<"$out" || true)
[ "$n" = 9 ] && ok "the launcher reports all 9" || bad "$n error lines, expected 9" "$out"
# the bound: 20 unknown keys, 16 shown and the rest counted
{ printf '[run]\ncomm = "self"\n[train]\n'; for k in $(seq 10 29); do echo "zq$k = 1"; done; } > lots.toml
expect_exit 2 "a file with 20 errors" "$bin" check lots.toml
n=$(grep -c "^dtrain check: error: lots.toml:[0-9]*:1: unknown key 'zq[0-9]*' in \[train\]\$" <<<"$out" || true)
[ "$n" = 16 ] && ok "the first 16 listed" || bad "$n listed, expected 16" "$out"
expect_line "the rest counted" "dtrain check: error: ... and 4 more errors (the first 16 are shown)"

finish
