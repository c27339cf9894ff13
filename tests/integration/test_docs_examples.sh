#!/usr/bin/env bash
# The documentation is tested, as Python's doctest tests its examples:
# every fenced ```sh block of README.md and docs/**/*.md runs, in one
# scratch folder, README.md first and then the docs pages in name order
# (so a page may go on from the README's five-minute tour: tiny.toml,
# data/, runs/tiny), with this build's dtrain first on PATH.  A block whose
# command fails fails the test, naming the file and the line.
#
# A block not meant to run (several nodes, a GPU, a long build) says so on
# the line just above its fence, where a reader sees it too:
#   <!-- not run: REASON -->
# Every other fence language (toml, text) is not run.
#
# The pages are checked as well: README.md under 300 lines, no line over 100
# characters (but a program's output quoted in a ```text block), every
# relative link to a file or folder that exists (and its #anchor to a heading).
#
#   test_docs_examples.sh DTRAIN WORK [FILE.md ...]    (default: all pages)
set -euo pipefail
bin=$1 work=$2
shift 2
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/lib.sh"
bindir=$(cd "$(dirname "$bin")" && pwd)
rm -rf "$work"; mkdir -p "$work/run"

if [ $# -gt 0 ]; then
  pages=("$@")
else
  pages=(README.md)
  while IFS= read -r f; do pages+=("$f"); done < <(cd "$src" && find docs -name '*.md' | sort)
fi

# slugs FILE.md: the anchors of its headings, as GitHub makes them
slugs() {
  awk '/^```/ { code = !code } !code && /^#+ / {
    h = tolower($0); sub(/^#+ /, "", h); gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h); print h
  }' "$1"
}

# ---- the pages' shape ---------------------------------------------------
n=$(wc -l < "$src/README.md")
[ "$n" -lt 300 ] && ok "README.md has $n lines (under 300)" ||
  bad "README.md has $n lines: keep it under 300 (move detail to docs/)"
for p in "${pages[@]}"; do
  case $(head -n 1 "$src/$p") in
    "# "?*) ok "$p: opens with its title" ;;
    *) bad "$p: does not open with a '# ' title line (empty?)" ;;
  esac
  # (example output in a ```text block is quoted as a program prints it)
  long=$(awk '/^```/ { text = !text && $0 == "```text"; next }
              !text && length($0) > 100 { printf "%s:%d (%d characters)\n", FILENAME, FNR, length($0) }' \
    "$src/$p" | sed "s|^$src/||")
  [ -z "$long" ] && ok "$p: no line over 100 characters" || bad "$p: lines over 100 characters" "$long"
  # relative links: ](path) or ](path#anchor), not http(s) or a bare #anchor
  # and an #anchor to a heading of the page it names (GitHub's slugs)
  dead=""
  while IFS= read -r l; do
    t=${l%%#*}
    [ -z "$t" ] && continue
    f="$(dirname "$src/$p")/$t"
    if [ ! -e "$f" ]; then dead+="$l "; continue; fi
    case $l in
      *#*) a=${l#*#}
           grep -q -x -F -- "$a" <(slugs "$f") || dead+="$l (no such heading) " ;;
    esac
  done < <(grep -o '](\([^)#][^)]*\))' "$src/$p" | sed 's/^](//; s/)$//' | grep -v '^[a-z]*://' || true)
  [ -z "$dead" ] && ok "$p: every relative link exists" || bad "$p: links to nothing" "$dead"
done

# ---- the examples -------------------------------------------------------
# blocks FILE: each runnable block as "LINE<TAB>file of its text", and each
# skipped one as "LINE<TAB>-<TAB>REASON"
blocks() {
  awk -v out="$work/blocks" -v tag="$2" '
    /^```/ && !inb {
      inb = 1; lang = substr($0, 4); start = FNR
      skip = (prev ~ /^<!-- not run: .+ -->$/)
      if (lang == "sh" && !skip) { f = sprintf("%s/%s-%d.sh", out, tag, FNR); printf "" > f }
      if (lang == "sh" && skip) { r = prev; sub(/^<!-- not run: /, "", r); sub(/ -->$/, "", r)
                                   printf "%d\t-\t%s\n", FNR, r }
      next
    }
    /^```/ && inb {
      inb = 0
      if (lang == "sh" && !skip) { close(f); printf "%d\t%s\n", start, f }
      next
    }
    inb && lang == "sh" && !skip { print > f }
    { prev = $0 }' "$1"
}
mkdir -p "$work/blocks"
ran=0 skipped=0
for p in "${pages[@]}"; do
  tag=$(printf '%s' "$p" | tr '/.' '__')
  while IFS=$'\t' read -r line file reason; do
    if [ "$file" = - ]; then
      skipped=$((skipped + 1))
      skip "$p:$line" "not run: $reason"
      continue
    fi
    ran=$((ran + 1))
    set +e
    out=$(cd "$work/run" && PATH="$bindir:$PATH" DTRAIN_LOG=warn \
      timeout 120 bash -euo pipefail "$file" 2>&1)
    rc=$?
    set -e
    if [ $rc = 0 ]; then
      ok "$p:$line: the sh block runs"
    else
      bad "$p:$line: the sh block failed (exit $rc; run in $work/run)" \
        "$(sed 's/^/$ /' "$file"; echo "--- output (last 30 lines):"; tail -n 30 <<<"$out")"
    fi
  done < <(blocks "$src/$p" "$tag")
done
echo "$ran blocks run, $skipped marked not run"
finish
