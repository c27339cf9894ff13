#!/usr/bin/env bash
# Install everything dtrain needs to build, test and run its example, from
# Debian packages by name.  Safe to run again.  Uses sudo when not root.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git
  clang                 # second compiler: run-tests.sh builds with GCC and Clang (clang 14 on Debian 12)
  procps                # ps, pgrep, pkill in the integration tests (absent from minimal images)
  libtomlplusplus-dev   # TOML 1.0 parser behind core/config/toml_shim.cpp
  libltdl-dev           # plugin loading
  libcmocka-dev         # unit tests
  libopenblas-dev       # cpu device plugin: sgemm
  libcjson-dev          # checkpoint manifests, safetensors headers, tokenizer.json
  libpcre2-dev          # the BPE tokenizer's Unicode-aware pre-tokenizer pattern
  libutf8proc-dev       # the BPE tokenizer's NFC normalizer (Qwen2's)
  zlib1g-dev            # CRC-32 of checkpoint segments
  liburing-dev          # NVMe offload
  fio                   # bench/bench_offload_fio.sh: the NVMe tier beside fio (not needed by the tests)
  time                  # /usr/bin/time -v: peak RSS of the GPT-2 1.5B showcase (bench/results/offload.md)
  libopenmpi-dev openmpi-bin  # MPI comparison benchmark, MPI launch
  python3 python3-numpy # float64 reference implementation used by tests
  fortunes              # the example's text corpus (/usr/share/games/fortunes)
  gnuplot-nox           # dtrain plot draws metrics files with gnuplot (tests render PNG and SVG)
)
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all ${#packages[@]} packages present"
