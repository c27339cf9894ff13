#!/usr/bin/env bash
# The `dtrain` CLI as a user meets it: help, exit codes (0 ok, 1 runtime,
# 2 usage/config), `check` errors with file:line:col and did-you-mean,
# --set overrides and provenance, plugin listing and description, env.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"

expect_exit 2 "no arguments is a usage error" "$bin"
expect_exit 0 "--help" "$bin" --help
expect_out "--help lists commands" "check"
expect_exit 2 "unknown command" "$bin" frobnicate
expect_out "unknown command named" "unknown command 'frobnicate'"
for c in run check plugins env data; do
  expect_exit 0 "$c --help" "$bin" "$c" --help
  expect_out "$c --help shows usage" "usage: dtrain $c"
done
expect_exit 2 "check without CONFIG" "$bin" check
expect_exit 2 "check with unknown option" "$bin" check x.toml --bogus
expect_out "unknown option named" "unknown option '--bogus'"

cat > typo.toml <<'T'
[run]
name = "typo"

[train]
lr = 3e-4
gradient_clipp1ng = 1.0
T
expect_exit 2 "misspelt key is a config error" "$bin" check typo.toml
expect_out "names file, line and column" "typo.toml:6:1"
expect_out "suggests the right key" "did you mean 'gradient_clipping'"

printf '[train]\nsteps = 0\n' > range.toml
expect_exit 2 "out-of-range value" "$bin" check range.toml
expect_out "range error located" "range.toml:2:"

printf '[train\nsteps = 1\n' > syntax.toml
expect_exit 2 "TOML syntax error" "$bin" check syntax.toml
expect_out "syntax error located" "syntax.toml:1:"

expect_exit 2 "missing file" "$bin" check does-not-exist.toml
expect_out "missing file named" "does-not-exist.toml"

printf '[run]\ncomm = "self"\n[trian]\nsteps = 3\n' > table.toml
expect_exit 2 "unknown table" "$bin" check table.toml
expect_out "unknown table suggestion" "did you mean [train]"

printf '[run]\ncomm = "self"\n[parallel]\ndata = "zero9"\n' > plugin.toml
expect_exit 2 "unknown strategy plugin" "$bin" check plugin.toml
expect_out "plugin not found names where it looked" "not found in"

# a bad plugin name or run name is the config's fault (2), blamed where it
# was written: the --set as typed, or file:line
expect_exit 2 "invalid plugin name from --set" "$bin" check plugin.toml --set parallel.data=../../x
expect_out "invalid plugin name located" "dtrain check: error: --set parallel.data=../../x: strategy plugin name '../../x' is not valid (1 to 63 letters, digits, '_' or '-')"
expect_exit 2 "unknown plugin from --set" "$bin" check plugin.toml --set run.comm=shmm
expect_out "--set blamed, not the file" "dtrain check: error: --set run.comm=shmm: comm plugin 'shmm' not found in: "
expect_exit 2 "unknown plugin from the file" "$bin" check plugin.toml
expect_out "file line blamed" "dtrain check: error: plugin.toml:4: parallel.data = \"zero9\": strategy plugin 'zero9' not found in: "
printf '[run]\ncomm = "self"\nname = "../../x"\n' > name.toml
expect_exit 2 "run.name outside out_dir" "$bin" check name.toml
expect_out "run.name refused" "dtrain check: error: name.toml:3: run.name = \"../../x\": run.name must be a plain name, 1 to 64 letters, digits, '.', '_' or '-', not \".\" or \"..\" (it names the folder <run.out_dir>/<run.name>)"

printf '[run]\nname = "ok"\ncomm = "self"\n[train]\nsteps = 7\n' > good.toml
expect_exit 0 "valid config" "$bin" check good.toml --set train.lr=0.01 --set optimizer.type=sgd
expect_out "file origin shown" "steps = 7"
expect_out "--set value applied" "lr = 0.01"
expect_out "bare word --set is a string" 'type = "sgd"'
expect_out "default origin shown" "# default"
expect_out "--set origin shown" "# --set"
expect_exit 2 "--set with a misspelt key" "$bin" check good.toml --set train.stpes=3
expect_out "--set did-you-mean" "did you mean 'steps'"

# plugins from a folder another user can write are loaded with a warning
# (once per folder), as ssh warns about loose key permissions
plugdir=$(dirname "$bin")/plugins-out
mkdir -p loose; cp "$plugdir/dtrain_self.so" loose/; chmod 0777 loose
expect_exit 0 "plugin from a world-writable folder still loads" env DTRAIN_PLUGIN_PATH="$PWD/loose" "$bin" check good.toml
expect_out "world-writable folder warned" "[rank ?] loader: warning: plugin folder $PWD/loose is writable by group and others (mode 0777): another user could replace the comm plugin 'self' loaded from it (chmod go-w, or move it)"
[ "$(grep -c 'plugin folder' <<<"$out")" = 1 ] && ok "warned once" || bad "warned once" "$out"
chmod 0755 loose; chmod 0666 loose/dtrain_self.so
expect_exit 0 "plugin file writable by others" env DTRAIN_PLUGIN_PATH="$PWD/loose" "$bin" check good.toml
expect_out "writable plugin file warned" "[rank ?] loader: warning: plugin file $PWD/loose/dtrain_self.so is writable by group and others (mode 0666): another user"
chmod 0644 loose/dtrain_self.so
expect_exit 0 "a tight folder" env DTRAIN_PLUGIN_PATH="$PWD/loose" "$bin" check good.toml
case $out in *warning*) bad "no warning for a tight folder" "$out";; *) ok "no warning for a tight folder";; esac

expect_exit 0 "plugins lists" "$bin" plugins
expect_out "plugins table header" "NAME"
# --describe: zero's names are longer than the usual 18 columns; the name
# column widens to the longest (27, param_persistence_threshold), so every
# key's type, default and range start at one column
expect_exit 0 "plugins --describe zero" "$bin" plugins --describe zero
for line in "  stage                       int    default (required), range 1 .. 3" \
            "  param_persistence_threshold int    default 100000, range 0 .. 1000000000000000" \
            "  overlap_comm                bool   default true"; do
  if grep -qxF -- "$line" <<<"$out"; then ok "describe has the line '${line#  }'"
  else bad "describe: no line '$line'" "$out"; fi
done
cols=$(awk '/^  [a-z_]+ +(int|bool|float|enum|string) +default/ { print index($0, " " $2 " ") }' <<<"$out" | sort -u)
if [ "$cols" = 30 ]; then ok "describe: every key's type starts at column 31"
else bad "describe: types start at columns $(echo $cols)" "$out"; fi
expect_exit 0 "env reports" "$bin" env
expect_out "env reports GPUs" "GPUs"
expect_out "env reports MPI" "MPI"
# the plugin table: every row's second column where the search line's is,
# past the longest name (offload_nvme)
if grep -qxF "  offload_nvme offload  loadable" <<<"$out"; then ok "env: the longest plugin name in its column"
else bad "env: no line '  offload_nvme offload  loadable'" "$out"; fi
cols=$(sed -n '/^plugins$/,$p' <<<"$out" | awk 'NR > 1 { match($0, /^  [^ ]+ +/); print RLENGTH }' | sort -u)
if [ "$cols" = 15 ]; then ok "env: the plugin table's columns line up (the kind at column 16)"
else bad "env: the plugin table's second column starts at $(echo $cols)" "$out"; fi
finish
