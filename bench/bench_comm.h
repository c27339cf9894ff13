/*
 * bench/bench_comm.h - the communicator bandwidth benchmark as a function,
 * so a CLI can expose it (e.g. `dtrain bench comm ...`) as well as the
 * standalone bench_comm program.
 */
#ifndef DT_BENCH_COMM_H
#define DT_BENCH_COMM_H

/* Parse argv like the bench_comm program (argv[0] is the program name),
 * fork the ranks, print an nccl-tests style table to stdout.  Returns 0
 * when every rank ran and every result checked, 1 on a failed check or
 * rank, 2 on bad usage.  Never calls exit(); forked ranks end with _exit. */
int dt_bench_comm_main(int argc, char **argv);

#endif /* DT_BENCH_COMM_H */
