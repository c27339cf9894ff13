#!/usr/bin/env bash
# A third party's view of the SDK: install dtrain into a prefix, build the
# example plugin against the INSTALLED headers (CMake package and plain
# pkg-config), and have the installed `dtrain` load it.
set -euo pipefail
build=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"
prefix=$work/prefix
expect_exit 0 "cmake --install" cmake --install "$build" --prefix "$prefix"
for f in include/dtrain/dtrain.h include/dtrain/comm.h lib/pkgconfig/dtrain.pc \
         lib/cmake/dtrain/dtrainConfig.cmake bin/dtrain share/dtrain/examples/comm_self/comm_self.c; do
  if [ -e "$prefix/$f" ]; then ok "installed $f"; else bad "not installed: $f"; fi
done
src=$prefix/share/dtrain/examples/comm_self
expect_exit 0 "example builds with find_package(dtrain)" \
  bash -c "cmake -S '$src' -B '$work/ex' -DCMAKE_PREFIX_PATH='$prefix' && cmake --build '$work/ex'"
mkdir -p "$work/pc"
expect_exit 0 "example builds with pkg-config" bash -c \
  "cc -std=c11 -Wall -Wextra -Werror -Wno-unused-parameter -shared -fPIC -fvisibility=hidden \
   \$(PKG_CONFIG_PATH='$prefix/lib/pkgconfig' pkg-config --cflags dtrain) \
   '$src/comm_self.c' -o '$work/pc/dtrain_self.so'"
syms=$(nm -D --defined-only "$work/ex/dtrain_self.so" | awk '{print $3}' | grep -v '^_' || true)
if [ "$syms" = "dtrain_comm_v1" ]; then ok "only the entry symbol is exported"; else bad "exported: $syms"; fi
expect_exit 0 "installed dtrain lists the plugin" env DTRAIN_PLUGIN_PATH="$work/ex" "$prefix/bin/dtrain" plugins
expect_out "listed as a loadable comm plugin" "self       comm      1.0   0.1.0    loadable"
expect_exit 0 "describe shows its keys" env DTRAIN_PLUGIN_PATH="$work/pc" "$prefix/bin/dtrain" plugins --describe self
expect_out "key documented" "an example key: log each call"
finish
