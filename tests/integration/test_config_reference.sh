#!/usr/bin/env bash
# docs/config-reference.md is current: scripts/gen-config-reference.sh run
# with this build's dtrain writes the checked-in file byte for byte, so a
# key added, renamed or re-documented without regenerating the page fails
# here, naming the command that fixes it.
set -euo pipefail
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"

# the two --markdown options the page is made from
expect_exit 0 "config doc --markdown train" "$bin" config doc --markdown train
expect_out "a section heading" "### [train]"
expect_out "a key as a list item" \
  "- \`steps\` (int, default \`100\`, range 1 .. 1000000000): optimizer steps"
expect_out "an enum's choices" "one of \`cosine|linear|constant\`"
expect_exit 2 "config doc --markdown NOSUCH" "$bin" config doc --markdown nosuch
expect_out "names the section" "no core section [nosuch]"
expect_exit 0 "plugins --describe zero --markdown" "$bin" plugins --describe zero --markdown
expect_out "the plugin's heading" "### zero"
expect_out "kind, ABI and version" "strategy plugin, ABI 1.0, version 1.0.0: "
expect_out "a required key" "- \`stage\` (int, required, range 1 .. 3): "
expect_exit 2 "plugins --markdown without --describe" "$bin" plugins --markdown
expect_out "says what it needs" "dtrain plugins: error: --markdown needs --describe NAME"
if ! bash "$src/scripts/gen-config-reference.sh" "$bin" "$work/config-reference.md" \
     2> "$work/gen.log"; then
  bad "scripts/gen-config-reference.sh failed" "$(cat "$work/gen.log")"
  finish
  exit 1
fi
cat "$work/gen.log"
if ! diff -u "$src/docs/config-reference.md" "$work/config-reference.md" > "$work/diff"; then
  bad "docs/config-reference.md is stale: run scripts/gen-config-reference.sh and commit it" \
      "$(echo "(it reads build/dtrain; another build: scripts/gen-config-reference.sh BUILD/dtrain)"
         head -n 60 "$work/diff")"
else
  ok "docs/config-reference.md is what this build's dtrain prints"
fi
finish
