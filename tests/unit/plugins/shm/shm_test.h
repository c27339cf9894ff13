/*
 * tests/unit/plugins/shm/shm_test.h - what the files of test_shm share
 * (shm_fixture.c): the plugin's table, a world joined in a forked rank, the
 * deterministic inputs every rank computes for every rank and the bitwise
 * checks against them, the segment helpers; and the cases each file holds,
 * which test_shm.c lists.
 */
#ifndef DT_TEST_SHM_TEST_H
#define DT_TEST_SHM_TEST_H

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <pwd.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "mp_harness.h"
#include "ref_kernels.h"
#include "test_host.h"
#include "util/error.h"

/* white box: the segment naming helpers only (test_segment_names makes
 * one of them truncate on purpose; clang has no -Wformat-truncation) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif
#include "shm/shm_internal.h"
#include "test_plugin.h"

#define PLUGIN_PATH DT_TEST_PLUGIN_DIR "/dtrain_shm.so"

extern const dt_comm_ops_v1_t *g_ops; /* loaded once in the parent, inherited */
extern void *g_dl;
extern char g_job_prefix[64];         /* "dtt<pid>" */

typedef struct run_args {
    char job[128];
    int64_t timeout_ms;
    const dt_test_kv_t *kv;
    int param;    /* scenario-specific */
    const char *secret; /* the job secret, NULL: none */
} run_args_t;

#define CHILD_CHECK(cond, ...)                                                  \
    do {                                                                       \
        if (!(cond))                                                           \
            return dt_mp_fail(__VA_ARGS__);                                    \
    } while (0)

#define CHILD_OK(expr)                                                         \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != DT_OK)                                                      \
            return dt_mp_fail("%s:%d: %s -> %s: %s", __FILE__, __LINE__, #expr, \
                              dt_status_name(rc_), dt_last_error());           \
    } while (0)

/* slot_bytes 65536: a small segment */
extern const dt_test_kv_t small_slots[];

/* ---- plumbing (shm_fixture.c) ---- */
double now_s(void);
void new_job(char *buf, size_t cap, const char *what);
int leftovers(const char *job);
int join(const run_args_t *a, int rank, int size, dt_test_host_t *th, dt_comm_t **c);
void run_expect_ok(int nproc, dt_mp_fn_t fn, run_args_t *a, double deadline);

/* ---- reference numbers (shm_fixture.c) ---- */
float gen(int rank, uint64_t i, uint32_t salt);
uint16_t ref_bf16(float f);
float ref_bf16_f32(uint16_t h);
uint16_t ref_f16(float f);
float ref_f16_f32(uint16_t u);
void input_elem(void *out, int dt, int rank, uint64_t i, uint32_t salt);
void fill(void *dst, int dt, int rank, uint64_t n, uint32_t salt);
float widen(const void *p, int dt, uint64_t i);
uint32_t ref_reduce_bits(int dt, int op, int n, uint64_t idx, uint32_t salt);
uint32_t bits_at(const void *p, int dt, uint64_t i);
const char *op_name(int op);
int check_reduced(const void *got, int dt, int op, int nranks, uint64_t n,
                  uint64_t base, uint32_t salt, const char *what);
int check_copy(const void *got, int dt, int src, uint64_t n, uint64_t base,
               uint32_t salt, const char *what);

/* ---- segments (shm_fixture.c), shared by the segment and secret cases ---- */
#define PLANT_TIMEOUT_MS 10000 /* the victims' timeout: refusals take far less */
#define PROMPT_S 2.0           /* "at once": well under the 10 s timeout, with
                                * room for a loaded 2-core CI machine */

/* Shared by the processes of one test (MAP_SHARED, made before forking). */
typedef struct secret_board {
    _Atomic int creator_pid; /* rank 0's, once it starts */
    _Atomic int refused;     /* outsiders done */
} secret_board_t;

typedef struct secret_args {
    run_args_t run;
    secret_board_t *board;
    const char *outsider_secret[2]; /* the outsiders', NULL: none */
    int outsiders;
} secret_args_t;

void seg_path_of(char *buf, size_t cap, const char *job);
void owner_text(char *buf, size_t cap, uid_t uid);
int wait_for(_Atomic int *word, int value, double limit_s);
void free_template_image(void);

/* ---- the cases, by file ---- */
/* shm_collectives.c */
void test_world_1(void **state);
void test_world_2(void **state);
void test_world_3(void **state);
void test_world_4(void **state);
void test_world_5(void **state);
void test_world_6(void **state);
void test_world_7(void **state);
void test_world_8(void **state);
void test_half_precision_patterns(void **state);
void test_large_64mib(void **state);
void test_split_grids(void **state);
void test_p2p_with_collectives(void **state);

/* shm_failures.c */
void test_rank_killed(void **state);
void test_rendezvous_timeout(void **state);
void test_stalled_rank(void **state);
void test_wait_limit(void **state);
void test_abort(void **state);
void test_mismatched_collectives(void **state);
void test_p2p_size_mismatch(void **state);

/* shm_symmetric.c */
void test_symmetric(void **state);
void test_symmetric_mismatch(void **state);
void test_symmetric_refused(void **state);
void test_symmetric_rank_killed(void **state);

/* shm_segments.c */
void test_stale_segment(void **state);
void test_planted_foreign_owner(void **state);
void test_planted_open_mode(void **state);
void test_planted_symlink(void **state);
void test_planted_hard_link(void **state);
void test_planted_corrupt_header(void **state);
void test_planted_valid_stale(void **state);
void test_planted_garbage(void **state);
void test_creator_pid_reused(void **state);
void test_segment_mode_whatever_umask(void **state);
void test_rendezvous_without_rank0(void **state);
void test_segment_names(void **state);
void test_cleanup_job(void **state);

/* shm_job_secret.c */
void test_job_secret(void **state);
void test_secret_hash_vectors(void **state);

/* shm_arguments.c */
void test_arguments(void **state);
void test_plugin_info(void **state);
void test_spans_nodes(void **state);

#endif
