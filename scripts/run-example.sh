#!/usr/bin/env bash
# The main job: build dtrain, turn the fortunes corpus into byte-level
# tokens, and train a small GPT-2 on it (examples/gpt2_fortunes.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"
mkdir -p data
if [ ! -f data/fortunes_train.bin ]; then
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' \
    -print0 | sort -z | xargs -0 cat > data/fortunes.txt
  ./build/dtrain data prepare data/fortunes.txt data/fortunes_train.bin \
    --val data/fortunes_val.bin --val-fraction 0.05
fi
./build/dtrain run examples/gpt2_fortunes.toml --metrics runs/gpt2-fortunes-metrics.jsonl "$@"
