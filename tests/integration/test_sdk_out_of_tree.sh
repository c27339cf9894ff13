#!/usr/bin/env bash
# A third party's view of the SDK: install dtrain into a prefix and move
# the build tree's plugins aside, then
#  - the installed `dtrain plugins` lists the plugins installed in the
#    prefix, found beside itself, and searches nothing in the build tree;
#  - a dtrain program with no plugins beside it exits 1 naming the folder;
#  - the example configs (examples/*.toml) are installed, as they are, in
#    share/dtrain/examples/; the installed dtrain reads their data/ and
#    runs/ in the working folder, never beside the file or in the source
#    tree, writes nothing where it only checks, and trains from one;
#  - the example plugin builds against the INSTALLED SDK with
#    find_package(dtrain) and with one plain `cc ... $(pkg-config --cflags
#    --libs dtrain-sdk)` line (no undefined symbols), and both copies load;
#  - the installed headers are exactly the declared list, none of the
#    in-tree utilities (plugins/common/) among them, each opening with the
#    line that says it is stable.
set -euo pipefail
build=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"
prefix=$work/prefix
install_alone "$build" "$prefix"
for f in include/dtrain/dtrain.h include/dtrain/comm.h lib/pkgconfig/dtrain.pc \
         lib/pkgconfig/dtrain-sdk.pc lib/libdtrain_sdk.a lib/dtrain/plugins/dtrain_cpu.so \
         lib/cmake/dtrain/dtrainConfig.cmake bin/dtrain share/dtrain/examples/comm_self/comm_self.c \
         share/dtrain/examples/gpt2_fortunes.toml share/dtrain/examples/gpt2_1558m_nvme.toml; do
  if [ -e "$prefix/$f" ]; then ok "installed $f"; else bad "not installed: $f"; fi
done

# ---- the SDK line: exactly the declared headers, each saying it is stable ---
# The installed headers are the 1.0 SDK's promise; adding or dropping one is
# a decision made here, never a side effect of the install rule.  The
# in-tree family utilities (plugins/common/) are never installed.
declared="abi.h comm.h device.h dtrain.h half.h host.h model.h offload.h plugin.h schedule.h
sdk_helpers.h status.h strategy.h tensor.h tensor_parallel.h sdk/buckets.h sdk/cfg.h sdk/dp.h
sdk/flat.h sdk/hash.h sdk/norm.h sdk/offload.h sdk/optim.h sdk/ranges.h sdk/replica.h"
# Installed but not yet saying it: strategy.h, whose minors fold into 1.0
# next (the tensor group's slots left it with the tensor kind).
pending="strategy.h"
stable=" * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules."
want=$(tr ' ' '\n' <<<"$declared" | grep . | sort)
have=$(cd "$prefix/include/dtrain" && find . -type f | sed 's|^\./||' | sort)
if [ "$have" = "$want" ]; then ok "the installed headers are exactly the declared $(wc -l <<<"$want")"
else bad "installed headers differ from the declared list (< declared, > installed)" \
  "$(diff <(echo "$want") <(echo "$have") | grep '^[<>]')"; fi
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
for h in "$srcdir"/plugins/common/*/*.h; do
  n=$(basename "$h")
  if find "$prefix/include" -name "$n" | grep -q .; then bad "in-tree only header installed: $n"
  else ok "in-tree only plugins/common/${h#"$srcdir"/plugins/common/} not installed"; fi
done
for h in $want; do
  if grep -qxF "$h" <(tr ' ' '\n' <<<"$pending"); then continue; fi
  if head -12 "$prefix/include/dtrain/$h" | grep -qxF "$stable"; then ok "dtrain/$h says it is stable"
  else bad "dtrain/$h does not open with the stable line" "$stable"; fi
done
for f in libdtrain_common_comm.a libdtrain_common_offload.a libdtrain_common_device.a \
         libdtrain_common_sha256.a; do
  if [ -e "$prefix/lib/$f" ]; then bad "in-tree library installed: lib/$f"; else ok "lib/$f not installed"; fi
done

# ---- the example configs, beside the SDK's example plugins ------------------
src_examples=$(cd "$(dirname "$0")/../../examples" && pwd)
ex=$prefix/share/dtrain/examples
n=0
for f in "$src_examples"/*.toml; do
  n=$((n + 1))
  if cmp -s "$f" "$ex/$(basename "$f")"; then ok "installed examples/$(basename "$f") as it is"
  else bad "examples/$(basename "$f") not installed as share/dtrain/examples/$(basename "$f")"; fi
done
[ "$n" -ge 2 ] && ok "$n example configs in the source tree" || bad "only $n example configs found"
# from an empty working folder: the example's data is the folder's, not the
# source tree's (whose data/ the user may have prepared) nor the share's
cwd=$work/user; mkdir -p "$cwd"; cd "$cwd"
expect_exit 1 "installed dtrain check of the installed example, no data yet" \
  env -u DTRAIN_PLUGIN_PATH "$prefix/bin/dtrain" check "$ex/gpt2_fortunes.toml"
expect_out "it looks for data/ in the working folder" \
  "dtrain check: error: data file 'data/fortunes_train.bin': No such file or directory"
[ -z "$(ls -A "$cwd")" ] && ok "check wrote nothing" || bad "check wrote into the working folder" "$(ls -A "$cwd")"
mkdir data
printf 'the text this example trains on, repeated. %.0s' $(seq 800) > text.txt
expect_exit 0 "data prepare as the example says" "$prefix/bin/dtrain" data prepare text.txt \
  data/fortunes_train.bin --val data/fortunes_val.bin --val-fraction 0.05
for f in "$ex"/*.toml; do
  cp data/fortunes_train.bin data/readme_train.bin; cp data/fortunes_val.bin data/readme_val.bin
  expect_exit 0 "installed dtrain check $(basename "$f")" \
    env -u DTRAIN_PLUGIN_PATH "$prefix/bin/dtrain" check "$f"
  expect_out "valid" "# dtrain check: $f is valid"
done
expect_exit 0 "installed dtrain runs 2 steps of the installed example" \
  env -u DTRAIN_PLUGIN_PATH "$prefix/bin/dtrain" run "$ex/gpt2_fortunes.toml" --set train.steps=2
expect_out "trained" "summary: 2 steps (1-2 of 2)"
[ -f runs/gpt2-fortunes/ckpt/step-00000002/COMPLETE ] && ok "its outputs in the working folder's runs/" ||
  bad "no runs/gpt2-fortunes/ckpt/step-00000002 in the working folder" "$(find . -maxdepth 3)"
left=$(find "$ex" -newer text.txt)
[ -z "$left" ] && ok "nothing written beside the installed examples" || bad "written in $ex" "$left"
cd "$work"

# ---- the installed dtrain finds the installed plugins, and only them --------
plugdir=$(realpath "$prefix/lib/dtrain/plugins")
expect_exit 0 "installed dtrain plugins" env -u DTRAIN_PLUGIN_PATH "$prefix/bin/dtrain" plugins
if grep -qxF "search path: $plugdir" <<<"$out"; then ok "searches the prefix's plugin folder only"
else bad "search path is not the prefix's plugin folder alone" "$out"; fi
# (the NAME column is as wide as offload_nvme, the longest name installed)
expect_out "lists the installed cpu device" "cpu          device    1.0   1.0.0    loadable   $plugdir/dtrain_cpu.so"
expect_out "lists the installed shm comm" "$plugdir/dtrain_shm.so"
if grep -qF "plugins-out" <<<"$out"; then bad "the installed dtrain searches the build tree" "$out"
else ok "the build tree is not searched"; fi
expect_exit 0 "the installed dtrain runs a command needing a plugin" \
  env -u DTRAIN_PLUGIN_PATH "$prefix/bin/dtrain" plugins --describe shm

empty=$work/empty
mkdir -p "$empty/bin" && cp "$prefix/bin/dtrain" "$empty/bin/dtrain"
expect_exit 1 "dtrain with no plugins beside it" env -u DTRAIN_PLUGIN_PATH "$empty/bin/dtrain" plugins
expect_out "names the folder searched" "dtrain plugins: error: no plugins found in: $(realpath "$empty")/lib/dtrain/plugins (files are named dtrain_<name>.so; add folders with DTRAIN_PLUGIN_PATH or --path)"

# ---- the example plugin, both routes ----------------------------------------
src=$prefix/share/dtrain/examples/comm_self
expect_exit 0 "example builds with find_package(dtrain)" \
  bash -c "cmake -S '$src' -B '$work/ex' -DCMAKE_PREFIX_PATH='$prefix' && cmake --build '$work/ex'"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
expect_exit 0 "pkg-config --libs dtrain-sdk" pkg-config --libs dtrain-sdk
lib=$(grep -oE '[^ ]*libdtrain_sdk\.a' <<<"$out" || true)
if [ -n "$lib" ] && [ "$(realpath "$lib")" = "$(realpath "$prefix/lib/libdtrain_sdk.a")" ]; then
  ok "offers the installed helper library"; else bad "no installed libdtrain_sdk.a in the libs" "$out"; fi
if grep -qE -- '-ldtrain( |$)' <<<"$out"; then bad "dtrain-sdk links the core" "$out"
else ok "dtrain-sdk does not link the core"; fi
mkdir -p "$work/pc"
expect_exit 0 "example builds with pkg-config" bash -c \
  "cc -std=c11 -Wall -Wextra -Werror -Wno-unused-parameter -shared -fPIC -fvisibility=hidden \
   -Wl,--no-undefined '$src/comm_self.c' \$(pkg-config --cflags --libs dtrain-sdk) \
   -o '$work/pc/dtrain_self.so'"
expect_only_entry "$work/ex/dtrain_self.so" dtrain_comm_v1
expect_exit 0 "installed dtrain lists the plugin" env DTRAIN_PLUGIN_PATH="$work/ex" "$prefix/bin/dtrain" plugins
expect_out "listed as a loadable comm plugin" "self         comm      1.0   0.1.0    loadable"
expect_exit 0 "describe shows its keys" env DTRAIN_PLUGIN_PATH="$work/pc" "$prefix/bin/dtrain" plugins --describe self
expect_out "key documented" "an example key: log each call"
finish
