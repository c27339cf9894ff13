#!/usr/bin/env bash
# Where dtrain writes (issue 24): an output path replaces only a regular
# file, or nothing - a FIFO, a socket, a folder, a link (to a device or a
# file) or, as root, a device node there is an error naming it (exit 1),
# and it is left as it was; a FIFO never hangs a run or a command.  Output
# files and folders follow the umask (0666 and 0777 less it), except the
# checkpoint folder's LOCK (0600).  Outputs go into folders that do not
# exist yet (made as mkdir -p).  `dtrain import` into a folder holding
# checkpoints and `dtrain export` over another model's config.json are
# refused (exit 2) unless --overwrite.  Nothing here touches a real
# device: every odd file is made in this test's own folder.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
umask 022

tiny_run_setup "$bin"
expect_exit 0 "a run saving step 2, with a metrics file" "$bin" run tiny.toml --set run.name=a \
  --metrics a.jsonl
ck=out/a/ckpt
has_gnuplot=0; command -v gnuplot >/dev/null 2>&1 && has_gnuplot=1

# mode PATH: its octal mode, or "missing"
mode() { stat -c %a "$1" 2>/dev/null || echo missing; }
# kind PATH: what is at PATH (type, and where a link points), to compare
kind() { stat -c %F "$1" 2>/dev/null || echo missing; [ ! -L "$1" ] || readlink "$1"; }
# odd_files DIR: make the things that are not regular files in DIR, one
# "path|how the message words it" line each
odd_files() {
  mkdir -p "$1"
  mkfifo "$1/fifo"; echo "$1/fifo|a FIFO"
  python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$1/sock"
  echo "$1/sock|a socket"
  mkdir "$1/folder"; echo "$1/folder|a directory"
  ln -s /dev/null "$1/devlink"; echo "$1/devlink|a symbolic link"
  echo "someone's file" > "$1/victim"; ln -s victim "$1/filelink"; echo "$1/filelink|a symbolic link"
  if [ "$(id -u)" = 0 ]; then mknod "$1/chardev" c 1 3; echo "$1/chardev|a character device"; fi
}
# refused NAME PATH WHAT CMD...: CMD exits 1 within 20 s naming PATH and
# WHAT, and PATH is as it was
refused() {
  local name=$1 p=$2 what=$3 before; shift 3
  before=$(kind "$p")
  expect_exit 1 "$name" timeout 20 "$@"
  expect_out "$name: names it" "writing '$p': not a regular file ($what): only a regular file is replaced"
  [ "$(kind "$p")" = "$before" ] && ok "$name: left as it was" || bad "$name: changed" "$(ls -la "$p")"
}

# ---- 1. only a regular file (or nothing) is replaced -----------------------
while IFS='|' read -r p what; do
  refused "export to $what" "$p" "$what" "$bin" export "$ck" "$p"
  refused "data prepare to $what" "$p" "$what" "$bin" data prepare text.txt "$p"
  refused "data prepare --val to $what" "$p" "$what" "$bin" data prepare text.txt ok.bin \
    --val "$p" --val-fraction 0.1
  if [ $has_gnuplot = 1 ]; then
    # plot's name must end in .png: the same odd files under such a name
    q=${p%/*}/png-${p##*/}.png
    mv "$p" "$q"
    refused "plot -o to $what" "$q" "$what" "$bin" plot a.jsonl -o "$q"
    mv "$q" "$p"
  fi
done < <(odd_files odd)
[ $has_gnuplot = 1 ] || skip "plot -o to odd files" "no gnuplot on PATH"
[ "$(cat odd/victim)" = "someone's file" ] && ok "the linked-to file is untouched" ||
  bad "the linked-to file changed" "$(cat odd/victim)"
[ ! -e ok.bin ] && ok "a refused --val leaves no train file either" || bad "ok.bin written" ""
left=$(find odd -name '*.tmp*'); [ -z "$left" ] && ok "no temp file left" || bad "temp files left" "$left"
# config.json beside the export: checked before the weights are written
mkdir -p cfgfifo; mkfifo cfgfifo/config.json
refused "export whose config.json is a FIFO" cfgfifo/config.json "a FIFO" \
  "$bin" export "$ck" cfgfifo/model.safetensors
[ ! -e cfgfifo/model.safetensors ] && ok "... and no weights written" ||
  bad "weights written beside a FIFO config.json" ""
# a regular file is replaced, as always
echo old > plain.bin
expect_exit 0 "data prepare over a regular file" "$bin" data prepare text.txt plain.bin
[ "$(head -c 3 plain.bin)" != old ] && ok "the regular file was replaced" || bad "not replaced" ""

# ---- 9. a FIFO (or anything odd) as the metrics file: an error, not a hang --
while IFS='|' read -r p what; do
  before=$(kind "$p")
  expect_exit 1 "metrics file that is $what" timeout 20 "$bin" run tiny.toml \
    --set run.name=m --metrics "$p"
  expect_out "metrics $what named" \
    "opening metrics file '$p': not a regular file ($what): only a regular file is replaced"
  [ "$(kind "$p")" = "$before" ] && ok "metrics $what left as it was" || bad "metrics $what changed" ""
done < <(odd_files oddm)
# a plugin file that is a FIFO: refused, not a hang in dlopen
mkdir -p fifoplug; mkfifo fifoplug/dtrain_self.so
expect_exit 1 "a FIFO as a plugin file" timeout 20 env DTRAIN_PLUGIN_PATH="$PWD/fifoplug" \
  "$bin" run tiny.toml --set run.name=p
expect_out "plugin FIFO named" \
  "comm plugin 'self' at $PWD/fifoplug/dtrain_self.so exists but is not a regular file (a FIFO)"

# ---- 5 and 12. modes follow the umask; missing folders are made ------------
for mask in 022 002 077; do
  f=$(printf '%03o' $((0666 & ~8#$mask))) d=$(printf '%03o' $((0777 & ~8#$mask)))
  rm -rf "m$mask"
  expect_exit 0 "umask $mask: export into folders that do not exist" \
    bash -c "umask $mask && exec \"\$0\" export $ck m$mask/hf/x/model.safetensors" "$bin"
  expect_exit 0 "umask $mask: data prepare into a new folder" \
    bash -c "umask $mask && exec \"\$0\" data prepare text.txt m$mask/tok/t.bin --val m$mask/tok/v.bin --val-fraction 0.1" "$bin"
  expect_exit 0 "umask $mask: a run with its metrics file in a new folder" \
    bash -c "umask $mask && exec \"\$0\" run tiny.toml --set run.name=u$mask --set run.out_dir=m$mask/out --metrics m$mask/met/a.jsonl" "$bin"
  files="m$mask/hf/x/model.safetensors m$mask/hf/x/config.json m$mask/tok/t.bin m$mask/tok/v.bin
    m$mask/met/a.jsonl m$mask/out/u$mask/ckpt/step-00000002/manifest.json
    m$mask/out/u$mask/ckpt/step-00000002/COMPLETE"
  dirs="m$mask m$mask/hf m$mask/hf/x m$mask/tok m$mask/met m$mask/out/u$mask/ckpt
    m$mask/out/u$mask/ckpt/step-00000002"
  if [ $has_gnuplot = 1 ]; then
    expect_exit 0 "umask $mask: plot into a new folder" \
      bash -c "umask $mask && exec \"\$0\" plot a.jsonl -o m$mask/plots/a.png" "$bin"
    files+=" m$mask/plots/a.png"; dirs+=" m$mask/plots"
  fi
  wrong=""
  for x in $files; do [ "$(mode "$x")" = "$f" ] || wrong+="$x $(mode "$x"); "; done
  [ -z "$wrong" ] && ok "umask $mask: every output file is $f" || bad "umask $mask: files" "$wrong"
  wrong=""
  for x in $dirs; do [ "$(mode "$x")" = "$d" ] || wrong+="$x $(mode "$x"); "; done
  [ -z "$wrong" ] && ok "umask $mask: every folder made is $d" || bad "umask $mask: folders" "$wrong"
  [ "$(mode m$mask/out/u$mask/ckpt/LOCK)" = 600 ] && ok "umask $mask: LOCK stays 600" ||
    bad "umask $mask: LOCK is $(mode m$mask/out/u$mask/ckpt/LOCK)" ""
done
# the README's own line, hf/ absent
rm -rf hf
expect_exit 0 "export runs/tiny/ckpt hf/model.safetensors without hf/" "$bin" export "$ck" \
  hf/model.safetensors
expect_out "... says where config.json went" "dtrain: wrote hf/config.json (Hugging Face config)"
if python3 - hf/config.json <<'P'
import json, sys
c = json.load(open(sys.argv[1]))
assert c["vocab_size"] == 256 and c["bos_token_id"] is None and c["eos_token_id"] is None, c
P
then ok "a byte-level (256) export states bos/eos_token_id: null"; else bad "bos/eos in config.json" ""; fi
echo x > notafolder
expect_exit 1 "export under a file where a folder should be" "$bin" export "$ck" notafolder/m.safetensors
expect_out "the folder named" "creating directory 'notafolder': Not a directory"

# ---- 8. import and export do not silently replace another model -----------
mkdir -p h8
expect_exit 0 "an export to import" "$bin" export "$ck" h8/model.safetensors
expect_exit 0 "import into a new folder" "$bin" import h8/model.safetensors imp
sums=$(ckpt_sums imp/step-00000000)
expect_exit 2 "import again into the same folder" "$bin" import h8/model.safetensors imp
expect_out "refused, naming the folder and the flag" \
  "dtrain import: error: importing 'h8/model.safetensors' into 'imp': the folder 'imp' already holds checkpoints (the newest: step 0): give --overwrite to replace them with the import, or import into another folder"
[ "$(ckpt_sums imp/step-00000000)" = "$sums" ] && ok "the checkpoint there is untouched" ||
  bad "the checkpoint changed" ""
expect_exit 2 "import into a run's checkpoint folder" "$bin" import h8/model.safetensors "$ck"
expect_out "refused, naming the newest step" "the folder '$ck' already holds checkpoints (the newest: step 2)"
[ -d "$ck/step-00000002" ] && [ ! -e "$ck/step-00000000" ] && ok "the run's checkpoints are untouched" ||
  bad "the run's folder changed" "$(ls "$ck")"
cp -r out/a/ckpt ow
expect_exit 0 "import --overwrite into a run's checkpoint folder" "$bin" import \
  h8/model.safetensors ow --overwrite
expect_out "warns what it removed" "warning: --overwrite: removed the 1 other checkpoint(s) of 'ow'; it now holds the import, step 0"
[ "$(ls ow | grep step- | tr '\n' ' ')" = "step-00000000 " ] && ok "only the import is left" ||
  bad "folder after --overwrite" "$(ls ow)"
expect_exit 0 "the import verifies" "$bin" ckpt inspect ow --verify
expect_exit 0 "import --overwrite (flag first) over an import" "$bin" import --overwrite \
  h8/model.safetensors imp

# export: the same model again is fine; another model's config.json is not
cp h8/config.json cfg.orig
expect_exit 0 "export the same model over its own export" "$bin" export "$ck" h8/model.safetensors
cmp -s h8/config.json cfg.orig && ok "config.json unchanged" || bad "config.json changed" ""
printf '{"model_type": "gpt2", "n_layer": 12, "vocab_size": 50257}\n' > h8/config.json
cp h8/config.json foreign.json; cp h8/model.safetensors weights.orig
expect_exit 2 "export over another model's config.json" "$bin" export "$ck" h8/model.safetensors
expect_out "refused, naming config.json and the flag" \
  "dtrain export: error: exporting 'out/a/ckpt/step-00000002' to 'h8/model.safetensors': 'h8/config.json' already exists and is not this export's config.json (another model's?): give --overwrite to replace it, or export to another folder"
cmp -s h8/config.json foreign.json && cmp -s h8/model.safetensors weights.orig &&
  ok "both files untouched" || bad "a file changed on refusal" ""
expect_exit 0 "export --overwrite" "$bin" export "$ck" h8/model.safetensors --overwrite
cmp -s h8/config.json cfg.orig && ok "--overwrite wrote this model's config.json" ||
  bad "config.json after --overwrite" "$(cat h8/config.json)"
expect_exit 0 "ckpt export --overwrite too" "$bin" ckpt export "$ck" h8/model.safetensors --overwrite
finish
