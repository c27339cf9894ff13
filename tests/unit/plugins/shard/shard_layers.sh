#!/bin/sh
# tests/unit/plugins/shard/shard_layers.sh NM ARCHIVE - the shard engine's files stand in
# the layers plugins/shard/shard_internal.h draws: each calls (links to)
# only files of the layers above it, so no two depend on each other.  The
# table below is that diagram; a file missing from it fails too, so a new
# file is placed in the diagram when it is added.
nm=$1 lib=$2
syms=$("$nm" -A "$lib") || { echo "shard_layers: $nm -A $lib failed"; exit 1; }
printf '%s\n' "$syms" | awk '
BEGIN {
    layer["shard_plan"] = 0
    layer["shard_home"] = 1;   layer["shard_offload"] = 1
    layer["shard_gather"] = 2; layer["shard_reduce"] = 2
    layer["shard_engine"] = 3
    layer["shard_hooks"] = 4;  layer["shard_step"] = 4; layer["shard_state"] = 4
    layer["shard_estimate"] = 5
    layer["shard_strategy"] = 6
}
{
    n = split($1, part, ":"); f = ""
    for (i = 1; i <= n; i++) if (part[i] ~ /\.o$/) f = part[i]
    if (f == "" || NF < 2) next
    sub(/\.c\.o$|\.o$/, "", f)
    files[f] = 1
    type = $(NF - 1); sym = $NF   # GNU nm and llvm-nm put the value apart
    if (type == "U") users[sym] = users[sym] " " f
    else if (type ~ /^[TDBR]$/) owner[sym] = f
}
END {
    bad = 0; calls = 0
    for (f in files) if (!(f in layer)) { print f ".c is not in the layer table"; bad++ }
    for (s in users) {
        if (!(s in owner)) continue
        g = owner[s]; m = split(users[s], who, " ")
        for (i = 1; i <= m; i++) {
            f = who[i]; calls++
            if (f == g || !(f in layer) || !(g in layer)) continue
            if (layer[g] >= layer[f]) {
                print f ".c calls " s " of " g ".c, which is not in a layer above it"
                bad++
            }
        }
    }
    if (calls == 0) { print "no calls between the files found: is this the shard archive?"; bad++ }
    if (bad) exit 1
    print "ok: the shard engine files call only upward (" calls " calls)"
}'
