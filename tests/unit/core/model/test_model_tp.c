/*
 * tests/unit/core/model/test_model_tp.c - GPT-2 split across a tensor-parallel group
 * ([parallel] tensor, core/model/model.h) computes what the whole model
 * computes.
 *
 * GPT-2 (2 blocks, 4 heads, n_embd 32, a vocabulary of 42 so that 4 ranks
 * split it unevenly: 11 11 10 10) is opened once whole (the reference,
 * parameters perturbed away from init) and once per rank of a tensor group
 * of P ranks (dt_model_create_part), each rank's parameters set to its
 * blocks of the reference's (the description's dt_param_split_t), so the
 * two hold the same model.  The ranks run as threads; their tensor-parallel
 * scheme (dt_model_set_tensor) is the test's, summing (or taking the
 * maximum) in rank order so every rank gets the same bits.  One step of 2
 * micro-batches with accumulation; asserted:
 *   - every rank's loss equals the reference's within LOSS_ATOL (1e-5;
 *     measured: a few 1e-7, the parallel cross-entropy sums its
 *     exponentials in a different order), and the ranks' losses are the
 *     same bits;
 *   - every gradient within GRAD_TOL (1e-5) of its tensor's largest
 *     |gradient|: a split tensor's part against the same blocks of the
 *     reference gradient, a replicated tensor (norms, the row-parallel
 *     biases, wpe) whole on every rank (measured: a few 1e-7);
 *   - the forward all-reduces: 2 per block plus one for the embedding and
 *     2 for the cross-entropy; backward: 2 per block plus one for the LM
 *     head; per micro-batch (Megatron's 2 + 2 per transformer block).
 * For P = 2 and 4, P = 2 with every block recomputed in backward, and
 * P = 2 with the reductions backward leaves in flight done only at their
 * wait (a model reading an input gradient before waiting would be off).
 * Also: dt_model_init_unit of a part is its blocks of the whole model's
 * init; the refusals of impossible layouts (n_head not divisible, a
 * vocabulary smaller than the group, mlp, a rank outside the group) with
 * their messages; a pass without a reduction set is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "model/model.h"
#include "model_harness.h"
#include "test_assert.h"
#include "util/error.h"

enum { L = 2, NU = L + 2, V = 42, B = 2, T = 8, M = 2, MAXP = 4 };
#define SEED 7
#define LOSS_ATOL 1e-5
#define GRAD_TOL 1e-5

static void must(int rc, const char *what)
{
    if (rc != DT_OK)
        fail_msg("%s: %s", what, dt_last_error());
}

static void model_toml(char *out, size_t cap, int P, const char *ckpt)
{
    snprintf(out, cap,
             "[model]\narch = \"gpt2\"\nn_layer = 2\nn_head = 4\nn_embd = 32\nvocab_size = 42\n"
             "context = 16\nactivation_checkpointing = \"%s\"\n[parallel]\ntensor = %d\n",
             ckpt, P);
}

/* ---- the group's all-reduce, between threads ---- */

typedef struct group {
    int P;
    pthread_barrier_t bar;
    float *bufs[MAXP];
    uint64_t calls, bytes; /* rank 0's count of all-reduces and their bytes */
} group_t;

typedef struct rank {
    const dt_tensor_ops_t *ops; /* first: &group_scheme, as a tensor group
                                 * starts with its table (tensor_parallel.h) */
    group_t *g;
    int r;
    /* defer: a reduction asked for with a request is done in group_wait,
     * not before (the buffer still holds the partial sum meanwhile), so a
     * model reading it before waiting gets wrong numbers */
    int defer;
    struct pending {
        void *buf;
        uint64_t count;
        int dtype, op;
        dt_stream_t *stream;
    } pending;
    uint64_t deferred; /* reductions done in group_wait */
    dt_mh_t h;
    const int32_t *inputs, *targets;
    double loss;
    int rc;
    char err[512];
} rank_t;

static int group_reduce_now(rank_t *rk, void *buf, uint64_t count, int dtype, int op,
                            dt_stream_t *stream)
{
    group_t *g = rk->g;
    if (dtype != DT_F32 || (op != DT_OP_SUM && op != DT_OP_MAX))
        return DT_ERR_UNSUPPORTED;
    int rc = rk->h.D->stream_sync(rk->h.dev, stream);
    if (rc)
        return rc;
    float *tmp = malloc(count * sizeof *tmp);
    g->bufs[rk->r] = buf;
    pthread_barrier_wait(&g->bar);
    for (uint64_t i = 0; tmp && i < count; i++) {
        float acc = g->bufs[0][i];
        for (int j = 1; j < g->P; j++)
            acc = op == DT_OP_SUM ? acc + g->bufs[j][i] : fmaxf(acc, g->bufs[j][i]);
        tmp[i] = acc;
    }
    pthread_barrier_wait(&g->bar); /* every rank has read every buffer */
    if (tmp)
        memcpy(buf, tmp, count * sizeof *tmp);
    free(tmp);
    if (rk->r == 0) {
        g->calls++;
        g->bytes += count * sizeof(float);
    }
    return tmp ? DT_OK : DT_ERR_NOMEM;
}

/* The test's tensor-parallel scheme (dtrain/tensor_parallel.h): its
 * instance is the rank. */
static int group_row(dt_tensor_group_t *g, void *buf, uint64_t count, int dtype,
                     dt_stream_t *stream)
{
    return group_reduce_now((rank_t *)g, buf, count, dtype, DT_OP_SUM, stream);
}

/* Done before it returns, so the model gets no request (NULL: nothing to
 * wait for), as a scheme may; or with rk->defer left for group_wait. */
static int group_column_start(dt_tensor_group_t *g, void *buf, uint64_t count, int dtype,
                              dt_stream_t *stream, dt_comm_req_t **req)
{
    rank_t *rk = (rank_t *)g;
    *req = NULL;
    if (rk->defer) {
        if (rk->pending.buf)
            return DT_ERR_INVALID; /* one in flight at a time is what the model does */
        rk->pending = (struct pending){buf, count, dtype, DT_OP_SUM, stream};
        *req = (dt_comm_req_t *)&rk->pending;
        return DT_OK;
    }
    return group_reduce_now(rk, buf, count, dtype, DT_OP_SUM, stream);
}

static int group_wait(dt_tensor_group_t *g, dt_comm_req_t *req)
{
    rank_t *rk = (rank_t *)g;
    if (!req || req != (dt_comm_req_t *)&rk->pending || !rk->pending.buf)
        return DT_ERR_INVALID;
    struct pending p = rk->pending;
    rk->pending.buf = NULL;
    rk->deferred++;
    return group_reduce_now(rk, p.buf, p.count, p.dtype, p.op, p.stream);
}

static int group_xent(dt_tensor_group_t *g, float *buf, uint64_t count, int op,
                      dt_stream_t *stream)
{
    return group_reduce_now((rank_t *)g, buf, count, DT_F32, op, stream);
}

static const dt_tensor_ops_t group_scheme = {
    .row_forward = group_row,
    .column_backward_start = group_column_start,
    .column_backward_wait = group_wait,
    .embedding_forward = group_row,
    .xent_reduce = group_xent,
};

/* One step of M micro-batches on this rank (a thread: no cmocka calls). */
static void *rank_step(void *arg)
{
    rank_t *rk = arg;
    const int64_t bt = B * T;
    double sum = 0;
    rk->rc = dt_mh_begin_step(&rk->h, M);
    for (uint32_t m = 0; rk->rc == DT_OK && m < M; m++) {
        double loss = NAN;
        rk->rc = dt_model_step_micro(rk->h.model, &rk->h.ctx, rk->inputs + m * bt,
                                     rk->targets + m * bt, m, M, 0, (float)(1.0 / M), &loss);
        sum += loss;
    }
    if (rk->rc == DT_OK)
        rk->rc = dt_mh_end_step(&rk->h);
    if (rk->rc)
        snprintf(rk->err, sizeof rk->err, "%s", dt_last_error());
    rk->loss = sum / M;
    return NULL;
}

/* ---- the reference ---- */

typedef struct ref {
    dt_mh_t h;
    int32_t inputs[M * B * T], targets[M * B * T];
    double loss;
    float *grads[NU];
} ref_t;

static void ref_open(ref_t *w, const char *ckpt)
{
    char toml[512];
    model_toml(toml, sizeof toml, 1, ckpt);
    dt_mh_tp_rank = 0;
    must(dt_mh_open(&w->h, toml, B, T, SEED), "opening the whole model");
    dt_mh_tokens(11, V, M * B * T, w->inputs, w->targets);
    w->loss = dt_mh_step(&w->h, w->inputs, w->targets, M, 0);
    for (uint32_t u = 0; u < NU; u++) {
        const uint64_t n = w->h.desc->units[u].numel;
        w->grads[u] = malloc(n * sizeof(float));
        assert_non_null(w->grads[u]);
        memcpy(w->grads[u], dt_mh_grads(&w->h, u), n * sizeof(float));
    }
}

static void ref_close(ref_t *w)
{
    for (uint32_t u = 0; u < NU; u++)
        free(w->grads[u]);
    dt_mh_close(&w->h);
}

/* This rank's values of parameter `k` of unit u out of the whole model's
 * `whole` (the unit's flat f32 buffer) into `part`. */
static void take_part(const dt_param_desc_t *pd, const dt_param_desc_t *wd, const float *whole,
                      float *part)
{
    const dt_param_split_t *sp = pd->ext;
    assert_non_null(sp);
    assert_int_equal(sp->struct_size, sizeof *sp);
    if (sp->copies > 1) {
        assert_int_equal(pd->numel, wd->numel);
        memcpy(part, whole + wd->offset, pd->numel * sizeof(float));
    } else {
        assert_int_equal(sp->global_shape[0], wd->shape[0]);
        dt_model_gather_blocks(sp, pd->ndim, whole + wd->offset, part);
    }
}

/* Open the P ranks with the reference's parameters. */
static void ranks_open(ref_t *w, group_t *g, rank_t *rk, int P, const char *ckpt)
{
    char toml[512];
    model_toml(toml, sizeof toml, P, ckpt);
    memset(g, 0, sizeof *g);
    g->P = P;
    assert_int_equal(pthread_barrier_init(&g->bar, NULL, (unsigned)P), 0);
    for (int r = 0; r < P; r++) {
        memset(&rk[r], 0, sizeof rk[r]);
        rk[r].g = g;
        rk[r].r = r;
        rk[r].inputs = w->inputs;
        rk[r].targets = w->targets;
        dt_mh_tp_rank = r;
        must(dt_mh_open(&rk[r].h, toml, B, T, SEED), "opening a tensor-parallel rank");
        rk[r].ops = &group_scheme;
        dt_model_set_tensor(rk[r].h.model, (dt_tensor_group_t *)&rk[r]);
        for (uint32_t u = 0; u < NU; u++) {
            const dt_unit_desc_t *ud = &rk[r].h.desc->units[u];
            float *mine = dt_mh_master(&rk[r].h, u);
            for (uint32_t k = 0; k < ud->n_params; k++)
                take_part(&ud->params[k], &w->h.desc->units[u].params[k],
                          dt_mh_master(&w->h, u), mine + ud->params[k].offset);
        }
        must(dt_mh_sync_params(&rk[r].h), "setting a rank's parameters");
    }
    dt_mh_tp_rank = 0;
}

static void ranks_close(group_t *g, rank_t *rk)
{
    for (int r = 0; r < g->P; r++)
        dt_mh_close(&rk[r].h);
    pthread_barrier_destroy(&g->bar);
}

static void ranks_step(group_t *g, rank_t *rk)
{
    pthread_t th[MAXP];
    for (int r = 0; r < g->P; r++)
        assert_int_equal(pthread_create(&th[r], NULL, rank_step, &rk[r]), 0);
    for (int r = 0; r < g->P; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < g->P; r++)
        if (rk[r].rc)
            fail_msg("tensor rank %d: %s", r, rk[r].err);
}

/* Every rank's loss and gradients against the reference. */
static void check_ranks(const char *what, ref_t *w, group_t *g, rank_t *rk)
{
    double worst = 0, worst_loss = 0;
    for (int r = 0; r < g->P; r++) {
        worst_loss = fmax(worst_loss, fabs(rk[r].loss - w->loss));
        if (fabs(rk[r].loss - w->loss) > LOSS_ATOL)
            fail_msg("%s: rank %d's loss %.9g, the whole model's %.9g", what, r, rk[r].loss,
                     w->loss);
        if (rk[r].loss != rk[0].loss)
            fail_msg("%s: rank %d's loss %.17g differs from rank 0's %.17g", what, r,
                     rk[r].loss, rk[0].loss);
        for (uint32_t u = 0; u < NU; u++) {
            const dt_unit_desc_t *ud = &rk[r].h.desc->units[u];
            const float *got = dt_mh_grads(&rk[r].h, u);
            for (uint32_t k = 0; k < ud->n_params; k++) {
                const dt_param_desc_t *pd = &ud->params[k];
                float *want = malloc(pd->numel * sizeof *want);
                assert_non_null(want);
                take_part(pd, &w->h.desc->units[u].params[k], w->grads[u], want);
                double ref_max = 0, diff = 0;
                for (uint64_t i = 0; i < pd->numel; i++) {
                    ref_max = fmax(ref_max, fabs((double)want[i]));
                    diff = fmax(diff, fabs((double)got[pd->offset + i] - (double)want[i]));
                }
                free(want);
                if (ref_max == 0 || diff / ref_max > GRAD_TOL)
                    fail_msg("%s: rank %d, gradient of %s: max |diff| %.3g, max |ref| %.3g",
                             what, r, pd->name, diff, ref_max);
                worst = fmax(worst, diff / ref_max);
            }
        }
    }
    printf("%s: loss diff %.3g, worst gradient diff %.3g of the tensor's max\n", what,
           worst_loss, worst);
}

static void run_layout_defer(int P, const char *ckpt, int defer)
{
    ref_t *w = calloc(1, sizeof *w);
    group_t g;
    rank_t *rk = calloc(MAXP, sizeof *rk);
    assert_non_null(w);
    assert_non_null(rk);
    ref_open(w, ckpt);
    ranks_open(w, &g, rk, P, ckpt);
    for (int r = 0; r < P; r++)
        rk[r].defer = defer;
    ranks_step(&g, rk);
    char what[96];
    snprintf(what, sizeof what, "tp %d, activation_checkpointing %s%s", P, ckpt,
             defer ? ", reductions done at the wait" : "");
    check_ranks(what, w, &g, rk);
    /* all-reduces per micro-batch: forward 2 per block + the embedding +
     * the cross-entropy's 2, backward 2 per block + the LM head; a
     * recomputed block's forward runs its 2 again in backward */
    const uint64_t per_micro =
        (2 * L + 1 + 2) + (2 * L + 1) + (strcmp(ckpt, "all") == 0 ? 2 * L : 0);
    assert_int_equal(g.calls, M * per_micro);
    /* the planner's count (dt_model_tp_comm) is what ran, and its bytes */
    dt_model_tp_comm_t tc;
    dt_model_tp_comm(rk[0].h.model, B, T, &tc);
    assert_int_equal(M * (tc.fwd + tc.bwd), g.calls);
    assert_int_equal(M * (tc.fwd_bytes + tc.bwd_bytes), g.bytes);
    /* with requests honoured, backward leaves the input gradients of the
     * column-parallel layers (2 per block and the LM head's) in flight
     * while it computes their weight gradients */
    assert_int_equal(rk[0].deferred, defer ? M * (2 * L + 1) : 0);
    ranks_close(&g, rk);
    ref_close(w);
    free(rk);
    free(w);
}

static void run_layout(int P, const char *ckpt) { run_layout_defer(P, ckpt, 0); }

static void test_tp2(void **state) { run_layout(2, "none"); }
static void test_tp2_deferred(void **state) { run_layout_defer(2, "none", 1); }
static void test_tp4(void **state) { run_layout(4, "none"); }
static void test_tp2_recompute(void **state) { run_layout(2, "all"); }

/* A part's init is its blocks of the whole model's init. */
static void test_init_parts(void **state)
{
    char toml[512];
    dt_mh_t whole, part;
    model_toml(toml, sizeof toml, 1, "none");
    must(dt_mh_open(&whole, toml, B, T, SEED), "whole model");
    model_toml(toml, sizeof toml, 4, "none");
    int64_t vocab_rows = 0;
    for (int r = 0; r < 4; r++) {
        dt_mh_tp_rank = r;
        must(dt_mh_open(&part, toml, B, T, SEED), "part");
        dt_mh_tp_rank = 0;
        const dt_model_desc_t *pd = part.desc, *wd = whole.desc;
        assert_int_equal(dt_model_info(part.model)->tensor_parallel, 4);
        assert_int_equal(dt_model_info(part.model)->tensor_rank, r);
        /* 42 = 11 + 11 + 10 + 10 rows, in rank order */
        const dt_param_split_t *wte = pd->units[0].params[0].ext;
        assert_int_equal(wte->blocks[0].start[0], vocab_rows);
        assert_int_equal(wte->blocks[0].size[0], r < 2 ? 11 : 10);
        vocab_rows += wte->blocks[0].size[0];
        for (uint32_t u = 0; u < NU; u++) {
            float *wv = malloc(wd->units[u].numel * sizeof(float));
            float *pv = malloc(pd->units[u].numel * sizeof(float));
            float *want = malloc(pd->units[u].numel * sizeof(float));
            assert_true(wv && pv && want);
            must(dt_model_init_unit(whole.model, u, SEED, wv), "init");
            must(dt_model_init_unit(part.model, u, SEED, pv), "init");
            for (uint32_t k = 0; k < pd->units[u].n_params; k++)
                take_part(&pd->units[u].params[k], &wd->units[u].params[k], wv,
                          want + pd->units[u].params[k].offset);
            assert_memory_equal(pv, want, pd->units[u].numel * sizeof(float));
            free(wv);
            free(pv);
            free(want);
        }
        dt_mh_close(&part);
    }
    assert_int_equal(vocab_rows, V);
    dt_mh_close(&whole);
}

static void expect_refusal(const char *toml, int32_t rank, int status, const char *msg)
{
    dt_mh_t h;
    dt_mh_tp_rank = rank;
    int rc = dt_mh_open(&h, toml, B, T, SEED);
    dt_mh_tp_rank = 0;
    assert_int_equal(rc, status);
    assert_string_equal(dt_last_error(), msg);
    dt_mh_close(&h);
}

static void test_refusals(void **state)
{
    expect_refusal("[model]\narch = \"gpt2\"\nn_layer = 1\nn_head = 6\nn_embd = 24\n"
                   "vocab_size = 42\ncontext = 16\n[parallel]\ntensor = 4\n",
                   0, DT_ERR_CONFIG,
                   "config: [parallel] tensor = 4 does not divide [model] n_head = 6: "
                   "attention heads are split across the tensor group");
    expect_refusal("[model]\narch = \"gpt2\"\nn_layer = 1\nn_head = 4\nn_embd = 16\n"
                   "vocab_size = 3\ncontext = 16\n[parallel]\ntensor = 4\n",
                   0, DT_ERR_CONFIG,
                   "config: [parallel] tensor = 4 exceeds [model] vocab_size = 3: the "
                   "vocabulary is split across the tensor group");
    expect_refusal("[model]\narch = \"mlp\"\nvocab_size = 42\n[parallel]\ntensor = 2\n", 0,
                   DT_ERR_CONFIG,
                   "config: [parallel] tensor = 2: arch \"mlp\" has no tensor-parallel "
                   "layout (gpt2 has)");
    expect_refusal("[model]\narch = \"gpt2\"\nn_layer = 1\nn_head = 4\nn_embd = 16\n"
                   "vocab_size = 42\ncontext = 16\n[parallel]\ntensor = 2\n",
                   2, DT_ERR_INVALID,
                   "model: tensor rank 2 is outside the tensor group of 2 ranks");
}

/* A tensor-parallel pass needs the group's all-reduce. */
static void test_no_reduce(void **state)
{
    char toml[512];
    model_toml(toml, sizeof toml, 2, "none");
    dt_mh_t h;
    must(dt_mh_open(&h, toml, B, T, SEED), "open");
    int32_t in[B * T], tg[B * T];
    dt_mh_tokens(3, V, B * T, in, tg);
    double loss;
    must(dt_mh_begin_step(&h, 1), "begin");
    assert_int_equal(dt_model_step_micro(h.model, &h.ctx, in, tg, 0, 1, 0, 1.0f, &loss),
                     DT_ERR_INVALID);
    assert_string_equal(dt_last_error(),
                        "model: the all-reduce of the embedding output (unit embedding) over "
                        "the tensor group of 2 ranks: no tensor-parallel scheme was set "
                        "(dt_model_set_tensor)");
    dt_mh_close(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp2),          cmocka_unit_test(test_tp2_deferred),
        cmocka_unit_test(test_tp4),
        cmocka_unit_test(test_tp2_recompute), cmocka_unit_test(test_init_parts),
        cmocka_unit_test(test_refusals),     cmocka_unit_test(test_no_reduce),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
