#!/usr/bin/env bash
# A third party's model plugin against the INSTALLED SDK: install dtrain
# into a prefix and move the build tree's plugins aside, build the bigram
# example (sdk/examples/model_bigram) from the installed copy with
# find_package(dtrain), and train it on 2 ranks (ddp over shm) through the
# installed `dtrain`:
#  - `dtrain plugins` lists it as a model at ABI 1.0 beside gpt2 and mlp;
#    only its entry symbol is exported;
#  - [model] arch = "bigram" trains with its own [bigram] width key, and
#    its losses are arch = "mlp" with mlp_layers = 0's to the bit (tolerance
#    0, over 6 steps, evaluation included): the same tensors, so the same
#    initial parameters, and the same kernels.  The in-tree mlp, and the
#    example itself (tests/unit/sdk/test_model_bigram), are checked against
#    tests/reference/mlp_ref.py (float64 numpy) within DT_MH_TOL_F32;
#  - its checkpoint rebuilds it ([bigram] width from the manifest's keys);
#  - a [model] key it does not read is refused before any rank starts.
set -euo pipefail
build=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"
prefix=$work/prefix
install_alone "$build" "$prefix"
src=$prefix/share/dtrain/examples/model_bigram
for f in "$src/bigram.c" "$src/CMakeLists.txt" "$prefix/include/dtrain/model.h"; do
  if [ -e "$f" ]; then ok "installed ${f#$prefix/}"; else bad "not installed: ${f#$prefix/}"; fi
done
expect_exit 0 "the example builds with find_package(dtrain)" \
  bash -c "cmake -S '$src' -B '$work/ex' -DCMAKE_PREFIX_PATH='$prefix' && cmake --build '$work/ex'"
expect_only_entry "$work/ex/dtrain_bigram.so" dtrain_model_v1

bin=$prefix/bin/dtrain
export DTRAIN_PLUGIN_PATH=$work/ex
expect_exit 0 "dtrain plugins" "$bin" plugins
for n in bigram gpt2 mlp; do
  if grep -qE "^$n +model +1\.0 " <<<"$out"; then ok "$n listed as a model at ABI 1.0"
  else bad "$n not listed as a model at ABI 1.0" "$out"; fi
done

cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
cat > base.toml <<'T'
[run]
comm = "shm"
out_dir = "out"
[data]
train = "train.bin"
val = "train.bin"
[train]
steps = 6
global_batch = 8
micro_batch = 2
seq_len = 32
lr = 0.003
eval_every = 3
[launch]
timeout = 30.0
[cpu]
threads = 1
T
{ cat base.toml; printf '[model]\narch = "bigram"\nvocab_size = 256\n[bigram]\nwidth = 24\n'; } > bigram.toml
{ cat base.toml; printf '[model]\narch = "mlp"\nvocab_size = 256\nmlp_in = 24\nmlp_layers = 0\n'; } > mlp.toml
for a in bigram mlp; do
  if ranks 2 $a.toml --set run.name=$a --metrics $a.jsonl; then ok "2 ranks (ddp over shm), arch $a, trained"
  else bad "2 ranks, arch $a, failed" "$(cat rank*.log)"; fi
done
same_losses "bigram vs mlp (0 layers)" mlp.jsonl bigram.jsonl 0
[ "$(losses bigram.jsonl | wc -l)" = 6 ] && ok "6 steps compared" ||
  bad "bigram.jsonl has $(losses bigram.jsonl | wc -l) losses"
v() { grep -o '"val_loss": [^,}]*' "$1" | cut -d' ' -f2; }
if [ -n "$(v bigram.jsonl)" ] && [ "$(v bigram.jsonl)" = "$(v mlp.jsonl)" ]; then
  ok "the validation losses are mlp's: $(v bigram.jsonl | tr '\n' ' ')"
else bad "validation losses differ" "$(paste <(v mlp.jsonl) <(v bigram.jsonl))"; fi

# its checkpoint records its own key (width) and rebuilds from it: sample
# gets as far as asking for a decoder, which the example has none of
ck=$(ls -d out/bigram/ckpt 2>/dev/null || true)
if [ -n "$ck" ]; then
  expect_exit 1 "sample of a bigram checkpoint" "$bin" sample "$ck"
  expect_out "rebuilt from the manifest, then refused for want of a decoder" \
    "holds an arch = \"bigram\" model: generation needs a model plugin with a decoder"
else bad "no checkpoint of the bigram run" "$(ls -R out)"; fi

expect_exit 2 "a [model] key the plugin does not read is refused" "$bin" check bigram.toml \
  --set model.n_layer=3
expect_out "the key named" \
  "[model] n_layer is set (--set) but arch = \"bigram\" does not read it"
finish
