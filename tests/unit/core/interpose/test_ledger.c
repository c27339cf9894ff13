/*
 * tests/unit/core/interpose/test_ledger.c - the collective ledger (core/interpose/
 * ledger.c, interpose_ledger.c) and its exchange (core/launch/
 * ledger_exchange.c):
 *  - the ring keeps the last DT_LEDGER_K calls, oldest first, numbered per
 *    group, with the crash record's step, micro-batch and unit; encoding
 *    round-trips and malformed bytes are refused;
 *  - the comparison: equal ledgers agree (naming the last call; quiet
 *    when no communicator call failed and every rank reported), the
 *    first divergence is named with the odd rank first, a missing call
 *    ("issued nothing after"), a rank that sent no ledger is named and
 *    invents no divergence, wrapped rings compare from the first number
 *    every member keeps, a split group is named by its members, of two
 *    divergences at one step the wider group's is named;
 *  - the hooks over the comm interposer (a fake comm): init's group is the
 *    world, a split's key is the same on every member, failures are noted;
 *  - the exchange between forked ranks: every rank gets rank 0's line
 *    and how many ranks began to exchange before it; a
 *    rank that never comes is reported after the timeout; with rank 0
 *    gone a rank says so within about a second.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "interpose/interpose.h"
#include "interpose/ledger.h"
#include "launch/ledger_exchange.h"
#include "util/crash.h"
#include "util/error.h"
#include "test_assert.h"

/* A fake group handle per (rank, group): only its address matters. */
static char handles[8][4];

/* Record `n` all_reduces of `count` f32 on group `h` from step `step`. */
static void calls(dt_ledger_t *l, const void *h, int n, uint64_t count, int64_t step)
{
    for (int i = 0; i < n; i++) {
        dt_crash_set_phase("training", step);
        dt_crash_set_micro(0);
        dt_crash_set_unit(1, "block.0");
        dt_ledger_entry_t e = {.count = count, .peer = -1, .slot = DT_ICOMM_ALL_REDUCE,
                               .dtype = DT_F32, .reduce_op = DT_OP_SUM};
        dt_ledger_record(l, h, 1, &e);
    }
}

static void one(dt_ledger_t *l, const void *h, int slot, uint64_t count, int dtype, int op,
                int peer, int64_t step)
{
    dt_crash_set_phase("training", step);
    dt_crash_set_micro(-1);
    dt_crash_set_unit(-1, NULL);
    dt_ledger_entry_t e = {.count = count, .peer = peer, .slot = (uint8_t)slot,
                           .dtype = (int8_t)dtype, .reduce_op = (int8_t)op};
    dt_ledger_record(l, h, 1, &e);
}

/* Encode l and decode it into *v. */
static void view_of(const dt_ledger_t *l, dt_ledger_view_t *v)
{
    uint8_t buf[DT_LEDGER_BLOB_MAX];
    size_t n = dt_ledger_encode(l, buf, sizeof buf);
    assert_true(n > 0);
    assert_ok(dt_ledger_decode(buf, n, v));
}

/* `n` ledgers, rank r's world group handles[r]. */
static void world(dt_ledger_t **l, int n)
{
    for (int r = 0; r < n; r++) {
        l[r] = dt_ledger_create(-1, -1);
        assert_non_null(l[r]);
        dt_ledger_group_add(l[r], handles[r], DT_LEDGER_WORLD, r, n);
    }
}

static int compare(dt_ledger_t **l, int n, int missing, char *out, size_t cap)
{
    static dt_ledger_view_t v[8];
    const dt_ledger_view_t *vp[8] = {0};
    for (int r = 0; r < n; r++) {
        if (r == missing)
            continue;
        view_of(l[r], &v[r]);
        vp[r] = &v[r];
    }
    return dt_ledger_compare(vp, n, "sent no ledger within 5 s", out, cap);
}

static void free_all(dt_ledger_t **l, int n)
{
    for (int r = 0; r < n; r++)
        dt_ledger_free(l[r]);
}

/* ---- the ring ---- */

static void test_ring_keeps_the_last_k(void **state)
{
    (void)state;
    dt_ledger_t *l[1];
    world(l, 1);
    calls(l[0], handles[0], 100, 4096, 7);
    dt_ledger_view_t v;
    view_of(l[0], &v);
    assert_int_equal(v.rank, 0);
    assert_int_equal(v.size, 1);
    assert_int_equal(v.n_groups, 1);
    assert_int_equal(v.groups[0].calls, 100);
    assert_int_equal(v.n_entries, DT_LEDGER_K);
    for (uint32_t i = 0; i < v.n_entries; i++) {
        assert_int_equal(v.entries[i].seq, 100 - DT_LEDGER_K + 1 + i); /* oldest first */
        assert_int_equal(v.entries[i].count, 4096);
        assert_int_equal(v.entries[i].step, 7);
        assert_int_equal(v.entries[i].micro, 0);
        assert_int_equal(v.entries[i].unit, 1);
        assert_int_equal(v.entries[i].group, DT_LEDGER_WORLD);
    }
    /* a call on a group the ledger does not know: kept, not numbered */
    one(l[0], handles[5], DT_ICOMM_BROADCAST, 3, DT_BF16, -1, 0, 8);
    view_of(l[0], &v);
    assert_int_equal(v.entries[DT_LEDGER_K - 1].group, DT_LEDGER_UNKNOWN);
    assert_int_equal(v.entries[DT_LEDGER_K - 1].seq, 0);
    free_all(l, 1);
}

static void test_decode_refuses_malformed(void **state)
{
    (void)state;
    dt_ledger_t *l[1];
    world(l, 1);
    calls(l[0], handles[0], 3, 1, 1);
    uint8_t buf[DT_LEDGER_BLOB_MAX];
    size_t n = dt_ledger_encode(l[0], buf, sizeof buf);
    dt_ledger_view_t v;
    assert_int_equal(dt_ledger_decode(buf, n - 1, &v), DT_ERR_INVALID);
    assert_string_equal(dt_last_error(), "collective ledger: 1 groups and 3 calls in 175 bytes");
    buf[0] ^= 1;
    assert_int_equal(dt_ledger_decode(buf, n, &v), DT_ERR_INVALID);
    assert_int_equal(dt_ledger_encode(l[0], buf, 10), 0); /* too small a buffer */
    free_all(l, 1);
}

static void test_call_text(void **state)
{
    (void)state;
    char buf[200];
    dt_ledger_entry_t e = {.count = 1234567, .peer = -1, .slot = DT_ICOMM_ALL_GATHER,
                           .dtype = DT_BF16, .reduce_op = -1};
    dt_ledger_call_text(&e, "world group", buf, sizeof buf);
    assert_string_equal(buf, "all_gather(bf16, 1.2M, world group)");
    e = (dt_ledger_entry_t){.count = 4096, .peer = 2, .slot = DT_ICOMM_REDUCE,
                            .dtype = DT_F32, .reduce_op = DT_OP_MAX, .group = 0xabcd};
    dt_ledger_call_text(&e, NULL, buf, sizeof buf);
    assert_string_equal(buf, "reduce(f32, 4096, max, root 2, group 0000abcd)");
    e = (dt_ledger_entry_t){.slot = DT_ICOMM_BARRIER, .peer = -1, .dtype = -1};
    dt_ledger_call_text(&e, "world group", buf, sizeof buf);
    assert_string_equal(buf, "barrier(world group)");
}

/* ---- comparing ---- */

static void test_equal_ledgers_agree(void **state)
{
    (void)state;
    dt_ledger_t *l[3];
    world(l, 3);
    for (int r = 0; r < 3; r++)
        calls(l[r], handles[r], 12, 4096, 5);
    char out[1024];
    const char *want = "ledger: ranks 0-2 issued the same calls (rank 0's last: "
                       "all_reduce(f32, 4096, sum, world group) #12 at step 5, "
                       "micro-batch 0, unit 1)";
    /* nothing failed in the communicator: nothing to add */
    assert_int_equal(compare(l, 3, -1, out, sizeof out), DT_LEDGER_QUIET);
    assert_string_equal(out, want);
    /* a collective failed on one rank: the ledgers agree, said so */
    dt_ledger_note_failure(l[1], DT_ERR_TIMEOUT);
    dt_ledger_note_failure(l[1], DT_ERR_REMOTE); /* the first stays */
    assert_int_equal(dt_ledger_failed(l[1]), DT_ERR_TIMEOUT);
    assert_int_equal(compare(l, 3, -1, out, sizeof out), DT_LEDGER_AGREE);
    assert_string_equal(out, want);
    free_all(l, 3);
}

static void test_first_divergence_named(void **state)
{
    (void)state;
    dt_ledger_t *l[4];
    world(l, 4);
    for (int r = 0; r < 4; r++) {
        calls(l[r], handles[r], 40, 1200000, 40);
        if (r == 3)
            one(l[r], handles[r], DT_ICOMM_ALL_GATHER, 1200000, DT_BF16, -1, -1, 41);
        else
            one(l[r], handles[r], DT_ICOMM_REDUCE_SCATTER, 300000, DT_BF16, DT_OP_SUM, -1, 41);
        /* later differences are not the first */
        one(l[r], handles[r], DT_ICOMM_BROADCAST, (uint64_t)r, DT_F32, -1, 0, 41);
    }
    char out[1024];
    assert_int_equal(compare(l, 4, -1, out, sizeof out), DT_LEDGER_DIVERGED);
    assert_string_equal(out, "ledger: rank 3 issued all_gather(bf16, 1.2M, world group) #41 "
                             "at step 41 while ranks 0-2 issued reduce_scatter(bf16, 300.0K, "
                             "sum, world group) #41 at step 41");
    free_all(l, 4);
}

static void test_missing_call_named(void **state)
{
    (void)state;
    dt_ledger_t *l[3];
    world(l, 3);
    for (int r = 0; r < 3; r++)
        calls(l[r], handles[r], 8, 16, 2);
    one(l[1], handles[1], DT_ICOMM_BARRIER, 0, -1, -1, -1, 3); /* an extra one */
    char out[1024];
    assert_int_equal(compare(l, 3, -1, out, sizeof out), DT_LEDGER_DIVERGED);
    assert_string_equal(out, "ledger: rank 1 issued barrier(world group) #9 at step 3 while "
                             "ranks 0, 2 issued nothing on the world group after #8");
    free_all(l, 3);
}

static void test_missing_rank_invents_nothing(void **state)
{
    (void)state;
    dt_ledger_t *l[4];
    world(l, 4);
    for (int r = 0; r < 4; r++)
        calls(l[r], handles[r], r == 2 ? 5 : 9, 64, 3); /* rank 2 died early */
    char out[1024];
    assert_int_equal(compare(l, 4, 2, out, sizeof out), DT_LEDGER_AGREE);
    assert_string_equal(out, "ledger: ranks 0, 1, 3 issued the same calls (rank 0's last: "
                             "all_reduce(f32, 64, sum, world group) #9 at step 3, micro-batch "
                             "0, unit 1); rank 2 sent no ledger within 5 s");
    free_all(l, 4);
    /* with rank 2 gone, rank 0 stopped a call before the others (the group
     * broke under each where it was): no divergence either */
    world(l, 4);
    for (int r = 0; r < 4; r++)
        calls(l[r], handles[r], r == 2 ? 5 : r == 0 ? 8 : 9, 64, 3);
    assert_int_equal(compare(l, 4, 2, out, sizeof out), DT_LEDGER_AGREE);
    assert_string_equal(out, "ledger: ranks 0, 1, 3 issued the same calls (rank 0's last: "
                             "all_reduce(f32, 64, sum, world group) #8 at step 3, micro-batch "
                             "0, unit 1); rank 2 sent no ledger within 5 s");
    /* none at all */
    const dt_ledger_view_t *none[2] = {NULL, NULL};
    assert_int_equal(dt_ledger_compare(none, 2, "sent no ledger", out, sizeof out),
                     DT_LEDGER_AGREE);
    assert_string_equal(out, "ledger: no rank reported its calls; ranks 0, 1 sent no ledger");
    free_all(l, 4);
}

/* Point-to-point calls are kept, never compared, and may be the last. */
static void test_p2p_not_compared(void **state)
{
    (void)state;
    dt_ledger_t *l[2];
    world(l, 2);
    for (int r = 0; r < 2; r++) {
        calls(l[r], handles[r], 3, 16, 4);
        dt_crash_set_phase("training", 4);
        dt_ledger_entry_t e = {.count = 16, .peer = 1 - r, .dtype = DT_F32, .reduce_op = -1,
                               .slot = (uint8_t)(r == 0 ? DT_ICOMM_SEND : DT_ICOMM_RECV)};
        dt_ledger_record(l[r], handles[r], 0, &e);
    }
    char out[1024];
    assert_int_equal(compare(l, 2, -1, out, sizeof out), DT_LEDGER_QUIET);
    assert_string_equal(out, "ledger: ranks 0, 1 issued the same calls (rank 0's last: "
                             "send(f32, 16, peer 1, world group) at step 4)");
    free_all(l, 2);
}

static void test_wrapped_rings(void **state)
{
    (void)state;
    dt_ledger_t *l[2];
    world(l, 2);
    /* rank 0 kept #37..#100, rank 1 #7..#70: compared from #37 */
    calls(l[0], handles[0], 100, 8, 9);
    calls(l[1], handles[1], 49, 8, 9);
    one(l[1], handles[1], DT_ICOMM_ALL_REDUCE, 8, DT_F32, DT_OP_MAX, -1, 9); /* #50 differs */
    calls(l[1], handles[1], 20, 8, 9);
    char out[1024];
    assert_int_equal(compare(l, 2, -1, out, sizeof out), DT_LEDGER_DIVERGED);
    assert_string_equal(out, "ledger: rank 0 issued all_reduce(f32, 8, sum, world group) #50 "
                             "at step 9, micro-batch 0, unit 1 while rank 1 issued "
                             "all_reduce(f32, 8, max, world group) #50 at step 9");
    free_all(l, 2);
    /* a difference neither ring keeps any more is not invented */
    world(l, 2);
    calls(l[0], handles[0], 10, 8, 1);
    one(l[1], handles[1], DT_ICOMM_BARRIER, 0, -1, -1, -1, 1);
    calls(l[1], handles[1], 9, 8, 1);
    calls(l[0], handles[0], 90, 8, 2);
    calls(l[1], handles[1], 90, 8, 2);
    assert_int_equal(compare(l, 2, -1, out, sizeof out), DT_LEDGER_QUIET);
    assert_string_equal(out, "ledger: ranks 0, 1 issued the same calls (rank 0's last: "
                             "all_reduce(f32, 8, sum, world group) #100 at step 2, micro-batch "
                             "0, unit 1)");
    free_all(l, 2);
}

static void test_split_group_named(void **state)
{
    (void)state;
    dt_ledger_t *l[4];
    world(l, 4);
    /* ranks 1 and 3 split off (color 1), 0 and 2 (color 0) */
    for (int r = 0; r < 4; r++) {
        uint32_t parent = 99;
        uint32_t no = dt_ledger_split_count(l[r], handles[r], &parent);
        assert_int_equal(no, 1);
        assert_int_equal(parent, DT_LEDGER_WORLD);
        dt_ledger_group_add(l[r], handles[4 + r], dt_ledger_split_key(parent, no, r % 2),
                            r / 2, 2);
    }
    assert_true(dt_ledger_split_key(0, 1, 0) != dt_ledger_split_key(0, 1, 1));
    for (int r = 0; r < 4; r++) {
        calls(l[r], handles[r], 3, 10, 1);
        calls(l[r], handles[4 + r], 2, 10, 1);
        one(l[r], handles[4 + r], r == 3 ? DT_ICOMM_ALL_GATHER : DT_ICOMM_REDUCE_SCATTER, 10,
            DT_F32, r == 3 ? -1 : DT_OP_SUM, -1, 2);
    }
    char out[1024];
    assert_int_equal(compare(l, 4, -1, out, sizeof out), DT_LEDGER_DIVERGED);
    assert_string_equal(out, "ledger: rank 1 issued reduce_scatter(f32, 10, sum, group of "
                             "ranks 1, 3) #3 at step 2 while rank 3 issued all_gather(f32, 10, "
                             "group of ranks 1, 3) #3 at step 2");
    /* without rank 1's ledger the group is named by who reported */
    assert_int_equal(compare(l, 4, 1, out, sizeof out), DT_LEDGER_AGREE);
    assert_string_equal(out, "ledger: ranks 0, 2, 3 issued the same calls (rank 0's last: "
                             "reduce_scatter(f32, 10, sum, group of ranks 0, 2) #3 at step 2); "
                             "rank 1 sent no ledger within 5 s");
    free_all(l, 4);
}

/* Rank 3 issues an extra call on the world group while ranks 2 and 3
 * share a subgroup whose next call rank 3 never makes: two divergences at
 * one step, both a missing call; the wider group's is named. */
static void test_wider_group_first(void **state)
{
    (void)state;
    dt_ledger_t *l[4];
    world(l, 4);
    for (int r = 0; r < 4; r++) {
        uint32_t parent = 0;
        uint32_t no = dt_ledger_split_count(l[r], handles[r], &parent);
        dt_ledger_group_add(l[r], handles[4 + r], dt_ledger_split_key(parent, no, r / 2),
                            r % 2, 2);
        calls(l[r], handles[r], 5, 4, 1);
        calls(l[r], handles[4 + r], 15, 4, 1);
    }
    one(l[3], handles[3], DT_ICOMM_BROADCAST, 4352, DT_F32, -1, 0, 2);
    one(l[2], handles[6], DT_ICOMM_ALL_GATHER, 4352, DT_F32, -1, -1, 2);
    for (int r = 0; r < 4; r++)
        dt_ledger_note_failure(l[r], DT_ERR_TIMEOUT);
    char out[1024];
    assert_int_equal(compare(l, 4, -1, out, sizeof out), DT_LEDGER_DIVERGED);
    assert_string_equal(out, "ledger: rank 3 issued broadcast(f32, 4352, root 0, world group) "
                             "#6 at step 2 while ranks 0-2 issued nothing on the world group "
                             "after #5");
    free_all(l, 4);
}

/* ---- the hooks over the comm interposer ---- */

struct dt_comm {
    int rank, size, color;
};
static int fake_fail;

static int f_init(const dt_host_t *h, const dt_comm_init_t *a, dt_comm_t **out)
{
    (void)h;
    *out = calloc(1, sizeof **out);
    (*out)->rank = a->rank;
    (*out)->size = a->size;
    return DT_OK;
}
static void f_finalize(dt_comm_t *c) { free(c); }
static int f_rank_size(dt_comm_t *c, int32_t *rank, int32_t *size)
{
    *rank = c->rank;
    *size = c->size;
    return DT_OK;
}
static int f_all_reduce(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt, int op,
                        dt_stream_t *st, dt_comm_req_t **req)
{
    (void)c, (void)s, (void)r, (void)n, (void)dt, (void)op, (void)st;
    if (req)
        *req = NULL;
    return fake_fail ? DT_ERR_TIMEOUT : DT_OK;
}
static int f_split(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    (void)key;
    *out = NULL;
    if (color < 0)
        return DT_OK;
    *out = calloc(1, sizeof **out);
    (*out)->rank = c->rank / 2;
    (*out)->size = 2;
    (*out)->color = color;
    return DT_OK;
}

static const dt_comm_ops_t fake_ops = {
    .info = {.struct_size = sizeof(dt_comm_ops_t), .abi_major = DT_COMM_ABI_MAJOR,
             .abi_minor = DT_COMM_ABI_MINOR, .kind = DT_KIND_COMM, .name = "fake"},
    .init = f_init, .finalize = f_finalize, .rank_size = f_rank_size,
    .all_reduce = f_all_reduce, .split = f_split};

static void test_hooks_record_groups(void **state)
{
    (void)state;
    dt_ledger_t *l[4];
    for (int r = 0; r < 4; r++) {
        l[r] = dt_ledger_create(-1, -1);
        dt_interpose_hooks_t hooks = dt_interpose_ledger_hooks(l[r]);
        dt_interpose_comm_t *ic;
        assert_ok(dt_interpose_comm_create(&fake_ops, &hooks, &ic));
        const dt_comm_ops_t *C = dt_interpose_comm_ops(ic);
        dt_comm_init_t a = {.struct_size = sizeof a, .rank = r, .size = 4, .job_id = "j"};
        dt_comm_t *w = NULL, *sub = NULL, *none = NULL;
        float x = 0;
        assert_ok(C->init(NULL, &a, &w));
        dt_crash_set_phase("training", 1);
        assert_ok(C->all_reduce(w, &x, &x, 1, DT_F32, DT_OP_SUM, NULL, NULL));
        /* a first split joins nobody; the second splits by parity */
        assert_ok(C->split(w, -1, 0, &none));
        assert_ok(C->split(w, r % 2, r, &sub));
        assert_ok(C->all_reduce(sub, &x, &x, 1, DT_F32, DT_OP_SUM, NULL, NULL));
        assert_int_equal(dt_ledger_failed(l[r]), DT_OK);
        fake_fail = r == 2;
        int rc = C->all_reduce(sub, &x, &x, 1, r == 3 ? DT_BF16 : DT_F32, DT_OP_SUM, NULL,
                               NULL);
        assert_int_equal(rc, r == 2 ? DT_ERR_TIMEOUT : DT_OK);
        assert_int_equal(dt_ledger_failed(l[r]), r == 2 ? DT_ERR_TIMEOUT : DT_OK);
        fake_fail = 0;
        C->finalize(sub);
        C->finalize(w);
        dt_interpose_comm_destroy(ic);
        assert_int_equal(dt_ledger_rank(l[r]), r);
        assert_int_equal(dt_ledger_size(l[r]), 4);
    }
    dt_ledger_view_t v;
    view_of(l[2], &v);
    assert_int_equal(v.failed, DT_ERR_TIMEOUT);
    assert_true(dt_ledger_joined(l[2]));
    view_of(l[1], &v);
    assert_int_equal(v.failed, DT_OK);
    assert_int_equal(v.n_groups, 2);
    assert_int_equal(v.groups[0].calls, 3); /* all_reduce, split, split */
    assert_int_equal(v.groups[1].calls, 2);
    assert_int_equal(v.groups[1].size, 2);
    assert_int_equal(v.n_entries, 5);
    assert_int_equal(v.entries[2].slot, DT_ICOMM_SPLIT);
    char out[1024];
    assert_int_equal(compare(l, 4, -1, out, sizeof out), DT_LEDGER_DIVERGED);
    assert_string_equal(out, "ledger: rank 1 issued all_reduce(f32, 1, sum, group of ranks "
                             "1, 3) #2 at step 1 while rank 3 issued all_reduce(bf16, 1, sum, "
                             "group of ranks 1, 3) #2 at step 1");
    free_all(l, 4);
}

/* ---- the exchange between forked ranks ---- */

static int judge(void *ctx, const uint8_t *const *blobs, const size_t *sizes, int n, char *text,
                 size_t cap)
{
    (void)ctx;
    size_t k = (size_t)snprintf(text, cap, "got");
    for (int r = 0; r < n && k < cap; r++)
        k += (size_t)snprintf(text + k, cap - k, " %d:%.*s", r, blobs[r] ? (int)sizes[r] : 1,
                              blobs[r] ? (const char *)blobs[r] : "-");
    return 7;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Ranks 0..n-1 of job `job` (all on this node, or with port > 0 each
 * on a "node" of its own, meeting over TCP at 127.0.0.1:port - 2 under
 * the job secret "s3cret", which rank `stranger` gets wrong); rank
 * `absent` never comes, rank `dead` is gone before anyone exchanges, rank
 * r begins after r x stagger_ms.  Each child writes "rc verdict order
 * text" into a pipe; lines[r] gets them. */
static void exchange_at(int port, int stranger, int n, int absent, int dead, int stagger_ms,
                        double timeout_s, char lines[][256], double *secs)
{
    char job[64];
    snprintf(job, sizeof job, "ledger-test-%d-%d", (int)getpid(), absent * 10 + dead);
    int p[8][2];
    pid_t pids[8];
    double t0 = now_s();
    for (int r = 0; r < n; r++) {
        assert_int_equal(pipe(p[r]), 0);
        fflush(NULL);
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) {
            dt_world_t w = {.rank = r, .size = n, .local_rank = port ? 0 : r,
                            .local_size = port ? 1 : n, .master_port = port - 2};
            snprintf(w.job_id, sizeof w.job_id, "%s", job);
            snprintf(w.master_addr, sizeof w.master_addr, "127.0.0.1");
            snprintf(w.job_secret, sizeof w.job_secret, "%s", r == stranger ? "other" : "s3cret");
            dt_ledger_xchg_t *x = NULL;
            if (dt_ledger_xchg_open(&w, &x) != DT_OK)
                _exit(3);
            if (r == dead)
                _exit(0);
            if (r == absent)
                pause(); /* stuck outside the communicator until killed */
            if (r != 0 && dead == 0)
                usleep(200 * 1000); /* rank 0 is gone by then */
            usleep((useconds_t)(r * stagger_ms * 1000));
            char mine[16], text[256] = "", line[300];
            snprintf(mine, sizeof mine, "L%d", r);
            int verdict = 0, order = -1;
            int rc = dt_ledger_xchg_run(x, mine, strlen(mine), timeout_s, judge, NULL, text,
                                        sizeof text, &verdict, &order);
            int k = snprintf(line, sizeof line, "%d %d %d %s", rc, verdict, order, text);
            if (write(p[r][1], line, (size_t)k) != k)
                _exit(4);
            dt_ledger_xchg_close(x);
            _exit(0);
        }
        close(p[r][1]);
        if (r == absent) { /* it never exchanges: stop it at once */
            kill(pids[r], SIGKILL);
        }
    }
    for (int r = 0; r < n; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        ssize_t k = read(p[r][0], lines[r], 255);
        lines[r][k > 0 ? k : 0] = '\0';
        close(p[r][0]);
    }
    *secs = now_s() - t0;
}

static void exchange(int n, int absent, int dead, int stagger_ms, double timeout_s,
                     char lines[][256], double *secs)
{
    exchange_at(0, -1, n, absent, dead, stagger_ms, timeout_s, lines, secs);
}

/* A port for the TCP cases, apart for concurrent runs of this test. */
static int tcp_port(int k) { return 30000 + (int)(getpid() % 5000) * 4 + k; }

static void test_exchange(void **state)
{
    (void)state;
    char lines[8][256];
    double secs;
    /* everyone: each rank gets rank 0's line and verdict, and how many
     * began before it */
    exchange(3, -1, -1, 100, 5.0, lines, &secs);
    for (int r = 0; r < 3; r++) {
        char want[64];
        snprintf(want, sizeof want, "0 7 %d got 0:L0 1:L1 2:L2", r);
        assert_string_equal(lines[r], want);
    }
    assert_true(secs < 4.0);
}

static void test_exchange_rank_absent(void **state)
{
    (void)state;
    char lines[8][256];
    double secs;
    exchange(3, 2, -1, 100, 0.5, lines, &secs);
    assert_string_equal(lines[0], "0 7 0 got 0:L0 1:L1 2:-");
    assert_string_equal(lines[1], "0 7 1 got 0:L0 1:L1 2:-");
    assert_string_equal(lines[2], "");
    assert_true(secs >= 0.5 && secs < 4.0);
}

static void test_exchange_rank0_gone(void **state)
{
    (void)state;
    char lines[8][256];
    double secs;
    exchange(3, -1, 0, 0, 30.0, lines, &secs);
    char want[200];
    snprintf(want, sizeof want, "%d -1 0 ledger: not compared: rank 0, which compares the "
             "ledgers, is gone", DT_ERR_REMOTE);
    assert_string_equal(lines[1], want);
    assert_string_equal(lines[2], want);
    assert_true(secs < 5.0); /* not the 30 s timeout */
}

static void test_exchange_several_nodes_need_a_secret(void **state)
{
    (void)state;
    dt_world_t w = {.rank = 1, .size = 4, .local_rank = 1, .local_size = 2,
                    .master_port = 29500};
    snprintf(w.job_id, sizeof w.job_id, "mn");
    snprintf(w.master_addr, sizeof w.master_addr, "127.0.0.1");
    dt_ledger_xchg_t *x = NULL;
    assert_ok(dt_ledger_xchg_open(&w, &x));
    char text[200];
    int verdict = 0, order = 0;
    assert_int_equal(dt_ledger_xchg_run(x, "a", 1, 1.0, judge, NULL, text, sizeof text,
                                        &verdict, &order),
                     DT_ERR_UNSUPPORTED);
    assert_string_equal(text, "ledger: not compared (the ranks span several nodes and no job "
                              "secret (DTRAIN_JOB_SECRET) proves who is in the job)");
    assert_int_equal(verdict, -1);
    dt_ledger_xchg_close(x);
}

/* Across nodes (TCP): the same answers as on one node. */
static void test_exchange_tcp(void **state)
{
    (void)state;
    char lines[8][256];
    double secs;
    exchange_at(tcp_port(2), -1, 3, -1, -1, 100, 5.0, lines, &secs);
    for (int r = 0; r < 3; r++) {
        char want[64];
        snprintf(want, sizeof want, "0 7 %d got 0:L0 1:L1 2:L2", r);
        assert_string_equal(lines[r], want);
    }
    assert_true(secs < 4.0);
}

/* A rank with another secret is refused: rank 0 compares without it, and
 * it gets no line. */
static void test_exchange_tcp_wrong_secret(void **state)
{
    (void)state;
    char lines[8][256];
    double secs;
    exchange_at(tcp_port(3), 2, 3, -1, -1, 100, 0.5, lines, &secs);
    assert_string_equal(lines[0], "0 7 0 got 0:L0 1:L1 2:-");
    assert_string_equal(lines[1], "0 7 1 got 0:L0 1:L1 2:-");
    char want[200];
    snprintf(want, sizeof want, "%d -1 0 ledger: not compared: rank 0, which compares the "
             "ledgers, is gone", DT_ERR_REMOTE);
    assert_string_equal(lines[2], want);
    assert_true(secs < 4.0);
}

static void test_exchange_tcp_rank0_gone(void **state)
{
    (void)state;
    char lines[8][256];
    double secs;
    exchange_at(tcp_port(4), -1, 3, -1, 0, 0, 30.0, lines, &secs);
    char want[200];
    snprintf(want, sizeof want, "%d -1 0 ledger: not compared: rank 0, which compares the "
             "ledgers, is gone", DT_ERR_REMOTE);
    assert_string_equal(lines[1], want);
    assert_string_equal(lines[2], want);
    assert_true(secs < 5.0); /* not the 30 s timeout */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_keeps_the_last_k),
        cmocka_unit_test(test_decode_refuses_malformed),
        cmocka_unit_test(test_call_text),
        cmocka_unit_test(test_equal_ledgers_agree),
        cmocka_unit_test(test_first_divergence_named),
        cmocka_unit_test(test_missing_call_named),
        cmocka_unit_test(test_missing_rank_invents_nothing),
        cmocka_unit_test(test_p2p_not_compared),
        cmocka_unit_test(test_wrapped_rings),
        cmocka_unit_test(test_split_group_named),
        cmocka_unit_test(test_wider_group_first),
        cmocka_unit_test(test_hooks_record_groups),
        cmocka_unit_test(test_exchange),
        cmocka_unit_test(test_exchange_rank_absent),
        cmocka_unit_test(test_exchange_rank0_gone),
        cmocka_unit_test(test_exchange_several_nodes_need_a_secret),
        cmocka_unit_test(test_exchange_tcp),
        cmocka_unit_test(test_exchange_tcp_wrong_secret),
        cmocka_unit_test(test_exchange_tcp_rank0_gone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
