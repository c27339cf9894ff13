#!/usr/bin/env bash
# Training under mpirun: `mpirun -np N dtrain run` makes each process a
# rank (core/launch/world.c reads OMPI_COMM_WORLD_*; the job id is
# "ompi-<uid>-<OMPI_MCA_ess_base_jobid>", which every rank of one mpirun
# shares), with the shm communicator and with the mpi one.
#  - run.comm = "mpi" at 2 ranks gives the shm run's losses and gradient
#    norms BIT FOR BIT, with ddp, zero stage 3 and fsdp: with two ranks a
#    reduction adds the two inputs once, a + b == b + a, and avg divides as
#    shm does;
#  - at 4 ranks MPI adds in an order of its own: losses within 1e-5
#    (measured ~5e-7, the metric's own reduction order);
#  - shm under mpirun equals shm under dtrain's launcher bit for bit;
#  - the mpi communicator refuses ranks that MPI does not know (dtrain's
#    own launcher with run.comm = "mpi"), naming both views;
#  - `mpirun -np 2 dtrain bench comm --comm mpi` checks its results;
#  - `dtrain plugins --describe mpi` lists its keys.
# mpirun as root needs --allow-run-as-root; the container has no network
# and may forbid ptrace, so btl self,vader without vader's single-copy
# (CMA) mechanism; --oversubscribe for 4 ranks on 2 cores.
set -euo pipefail
bin=$1 work=$2 mpiexec=$3
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
# sanitizer builds: MPI's components stay loaded and the slow unwinder
# reaches the frames tests/sanitizer/lsan.supp names
export OMPI_MCA_mca_base_component_disable_dlclose=1 PMIX_MCA_mca_base_component_disable_dlclose=1
if [ -n "${LSAN_OPTIONS:-}" ]; then export LSAN_OPTIONS="$LSAN_OPTIONS:fast_unwind_on_malloc=0"; fi
mpirun() { timeout 120 "$mpiexec" --oversubscribe --bind-to none -np "$@"; }

expect_exit 0 "plugins --describe mpi" "$bin" plugins --describe mpi
expect_out "describe lists spin_us" "spin_us            int    default 50"
expect_out "describe lists progress_us" "progress_us        int    default 100"
expect_out "describe lists abort_job" "abort_job          bool   default false"

"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer eq.toml '[run]' 'comm = "mpi"' '[train]' 'steps = 8'
# "loss" and "grad_norm" of every step, for exact comparisons
curve() { grep -o '"loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$1"; }
same_curve() {
  if [ -n "$(curve "$2")" ] && [ "$(curve "$2")" = "$(curve "$3")" ]; then
    ok "$1: losses and gradient norms bit for bit ($(curve "$2" | wc -l) steps)"
  else bad "$1: curves differ" "$(paste <(curve "$2") <(curve "$3"))"; fi
}

# ---- 2 ranks ------------------------------------------------------------
expect_exit 0 "shm, 2 ranks by dtrain's launcher" "$bin" run eq.toml --set run.comm=shm \
  --set launch.nproc=2 --set train.micro_batch=4 --set run.name=shm2 --metrics shm2.jsonl
expect_exit 0 "mpi, mpirun -np 2" mpirun 2 "$bin" run eq.toml --set train.micro_batch=4 \
  --set run.name=mpi2 --metrics mpi2.jsonl
expect_out "rank 1 is a rank of the mpi job" "[rank 1]"
same_curve "mpi vs shm at 2 ranks" shm2.jsonl mpi2.jsonl
expect_exit 0 "shm, mpirun -np 2" mpirun 2 "$bin" run eq.toml --set run.comm=shm \
  --set train.micro_batch=4 --set run.name=shmompi2 --metrics shmompi2.jsonl
same_curve "shm under mpirun vs dtrain's launcher" shm2.jsonl shmompi2.jsonl

# the sharded strategies: reduce_scatter and all_gather (zero stage 3,
# fsdp), just as exact at 2 ranks
for st in "zero --set zero.stage=3" fsdp; do
  name=${st%% *}
  # shellcheck disable=SC2086
  expect_exit 0 "shm, 2 ranks, $name" "$bin" run eq.toml --set run.comm=shm --set launch.nproc=2 \
    --set train.micro_batch=4 --set parallel.data=$st --set run.name=shm2$name --metrics shm2$name.jsonl
  # shellcheck disable=SC2086
  expect_exit 0 "mpi, mpirun -np 2, $name" mpirun 2 "$bin" run eq.toml --set train.micro_batch=4 \
    --set parallel.data=$st --set run.name=mpi2$name --metrics mpi2$name.jsonl
  same_curve "mpi vs shm at 2 ranks, $name" "shm2$name.jsonl" "mpi2$name.jsonl"
done

# ---- 4 ranks ------------------------------------------------------------
expect_exit 0 "shm, 4 ranks by dtrain's launcher" "$bin" run eq.toml --set run.comm=shm \
  --set launch.nproc=4 --set train.micro_batch=2 --set run.name=shm4 --metrics shm4.jsonl
expect_exit 0 "mpi, mpirun -np 4" mpirun 4 "$bin" run eq.toml --set train.micro_batch=2 \
  --set run.name=mpi4 --metrics mpi4.jsonl
same_losses "mpi vs shm at 4 ranks" shm4.jsonl mpi4.jsonl 1e-5

# ---- the benchmark, as one rank of an mpirun job (a smoke run: every
# result is checked on every rank; no timing is asserted) -----------------
for op in all_reduce reduce_scatter sendrecv; do
  expect_exit 0 "bench comm --comm mpi --op $op under mpirun" mpirun 2 "$bin" bench comm \
    --comm mpi --op $op --sizes 4K:64K --iters 5 --warmup 1
  expect_out "bench $op names the plugin and the ranks" "# dtrain bench comm: $op, 2 ranks, comm mpi"
done

# ---- an error line names its rank under mpirun, as dtrain's launcher
# prefixes its ranks' lines (core/cli: dt_cli_set_rank) -------------------
# expect_line NAME TEXT: the last command's output has TEXT as a whole line
expect_line() {
  if grep -qxF -- "$2" <<<"$out"; then ok "$1"; else bad "$1: no line '$2'" "$out"; fi
}
expect_exit 2 "a config error under mpirun -np 2" mpirun 2 "$bin" run eq.toml --set train.steps=0
for r in 0 1; do
  expect_line "rank $r's error line carries its rank" "[rank $r] dtrain run: error: --set train.steps=0: [train] steps = 0 is out of range (allowed 1 .. 1000000000)"
done
expect_exit 2 "a usage error under mpirun -np 2" mpirun 2 "$bin" run eq.toml --bogus
expect_line "a usage error carries the rank" "[rank 1] dtrain run: error: unknown option '--bogus' (see dtrain run --help)"

# ---- ranks MPI does not know ----------------------------------------------
expect_exit 2 "mpi under dtrain's own launcher (a config error)" "$bin" run eq.toml --set launch.nproc=2 \
  --set train.micro_batch=4 --set run.name=bad
expect_out "the refusal names both views" "of 2, MPI_COMM_WORLD as rank 0 of 1: start every rank with mpirun (mpirun -np N dtrain run|bench ...), one MPI process per rank"
if grep -qE '^\[rank [0-9]+\] \[rank ' <<<"$out"; then bad "the launcher tags a rank's error line twice" "$out"
else ok "the launcher relays a rank's own [rank R] error line as it is"; fi
finish
