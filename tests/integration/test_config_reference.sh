#!/usr/bin/env bash
# docs/config-reference.md is current: scripts/gen-config-reference.sh run
# with this build's dtrain writes the checked-in file byte for byte, so a
# key added, renamed or re-documented without regenerating the page fails
# here, naming the command that fixes it.
set -euo pipefail
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work"; mkdir -p "$work"
if ! bash "$src/scripts/gen-config-reference.sh" "$bin" "$work/config-reference.md" \
     2> "$work/gen.log"; then
  cat "$work/gen.log" >&2
  echo "FAIL - scripts/gen-config-reference.sh failed" >&2
  exit 1
fi
cat "$work/gen.log"
if ! diff -u "$src/docs/config-reference.md" "$work/config-reference.md" > "$work/diff"; then
  head -n 60 "$work/diff"
  echo "FAIL - docs/config-reference.md is stale: run scripts/gen-config-reference.sh" \
       "(with a build of dtrain: scripts/gen-config-reference.sh BUILD/dtrain) and commit it"
  exit 1
fi
echo "ok   - docs/config-reference.md is what this build's dtrain prints"
