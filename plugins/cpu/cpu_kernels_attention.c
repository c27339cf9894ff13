/*
 * plugins/cpu/cpu_kernels_attention.c - causal self-attention, multi-head
 * (GPT-2's) and grouped-query (the LLaMA family's), llm.c's formulation in
 * plain loops.
 *
 * qkv (B, T, ld): for position (b, t) the NH query heads, then the NKV key
 * heads, then the NKV value heads, HD channels each, ld = (NH + 2 NKV) HD;
 * query head h reads kv head h / (NH / NKV).  Multi-head attention is the
 * case NKV = NH, HD = C / NH (q, k, v each C wide), run by the same code.
 * The saved state (dtrain/device.h: attention_state_bytes) is the softmax
 * att (B, NH, T, T), f32, row (b, h, t) holding the probabilities of query
 * t over keys 0..t (the rest of the row zero).
 *
 * Forward rows (b, h, t) are independent.  Backward works per (b, kv
 * head) slab: dk and dv of key t2 collect from every query t >= t2 of
 * every query head of the group, taken in order, and the slab owns those
 * rows of dqkv (and its heads' dq) outright, so threads never share an
 * output and each sum runs in the same order at any thread count.  The
 * only scratch is one row of T floats per thread.
 *
 * bf16 activations: qkv, out, dout and dqkv in bf16, the state still the
 * f32 probabilities (the state's dtype is the device's choice; f32 keeps
 * backward from reading rounded probabilities).  Work goes by slab both
 * ways: a thread widens the head's q, k and v rows (and dout, and the
 * dqkv it adds to) into its slice of the device scratch, runs the f32 code
 * below on them with the head's own row stride, and rounds what it stores
 * once: out once per forward, each dqkv element once per backward call.
 */
#include <math.h>

#include "cpu_bf16.h"
#include "cpu_internal.h"
#include "cpu_math.h"

typedef struct {
    float *out, *att, *dqkv, *scratch;
    const float *qkv, *dout, *catt;
    int64_t B, T, NH, NKV, HD;
    int64_t stride; /* scratch floats per thread */
} attn_t;

/* Where head h's q and its group's k and v start in a (B, T, ld) qkv
 * row, ld = (NH + 2 NKV) HD (for multi-head attention, NKV = NH and HD =
 * C / NH: q at h hs, k at C + h hs, v at 2C + h hs). */
static inline int64_t attn_ld(const attn_t *a) { return (a->NH + 2 * a->NKV) * a->HD; }
static inline int64_t attn_qcol(const attn_t *a, int64_t h) { return h * a->HD; }
static inline int64_t attn_kcol(const attn_t *a, int64_t h)
{
    return (a->NH + h / (a->NH / a->NKV)) * a->HD;
}
static inline int64_t attn_vcol(const attn_t *a, int64_t h)
{
    return attn_kcol(a, h) + a->NKV * a->HD;
}

/* Query row t of one head: q (hs); key t2 at k + t2 ks, value t2 at
 * v + t2 ks; row (T) receives the probabilities, o (hs) the output. */
static inline void attn_fwd_row(float *restrict row, float *restrict o,
                                const float *restrict q, const float *k,
                                const float *v, int64_t ks, int64_t t,
                                int64_t T, int64_t hs, float scale)
{
    float mx = -INFINITY;
    for (int64_t t2 = 0; t2 <= t; t2++) {
        const float *restrict kr = k + t2 * ks;
        float dot = cpu_dot_f32(q, kr, hs) * scale;
        row[t2] = dot;
        mx = dot > mx ? dot : mx;
    }
    for (int64_t t2 = 0; t2 <= t; t2++)
        row[t2] = cpu_expf(row[t2] - mx);
    double sum = 0.0;
    for (int64_t t2 = 0; t2 <= t; t2++)
        sum += row[t2];
    float inv = (float)(1.0 / sum);
    for (int64_t t2 = 0; t2 <= t; t2++)
        row[t2] *= inv;
    for (int64_t t2 = t + 1; t2 < T; t2++)
        row[t2] = 0.0f; /* unspecified by the contract; zero is tidy */
    for (int64_t i = 0; i < hs; i++)
        o[i] = 0.0f;
    for (int64_t t2 = 0; t2 <= t; t2++) {
        const float *restrict vr = v + t2 * ks;
        float p = row[t2];
        for (int64_t i = 0; i < hs; i++)
            o[i] += p * vr[i];
    }
}

CPU_CLONES static void attn_fwd_task(void *ctx, int64_t b0, int64_t e0, int tid)
{
    const attn_t *a = ctx;
    int64_t T = a->T, NH = a->NH, hs = a->HD, ld = attn_ld(a), oc = NH * hs;
    float scale = (float)(1.0 / sqrt((double)hs));
    for (int64_t r = b0; r < e0; r++) {
        int64_t t = r % T, h = (r / T) % NH, b = r / (T * NH);
        const float *base = a->qkv + b * T * ld;
        /* r == (b*NH + h)*T + t */
        attn_fwd_row(a->att + r * T, a->out + (b * T + t) * oc + h * hs,
                     base + attn_qcol(a, h) + t * ld, base + attn_kcol(a, h),
                     base + attn_vcol(a, h), ld, t, T, hs, scale);
    }
}

/* The (T, hs) rows of head h of sequence b in a bf16 (B, T, ld) array,
 * columns from `col`, widened into dst (T, hs). */
static inline void head_widen(float *dst, const float *src, int64_t ld,
                              int64_t col, int64_t b, int64_t T, int64_t hs)
{
    cpu_bf16_widen_rows(dst, hs, CPU_CBF16(src) + b * T * ld + col, ld, T, hs);
}

/* bf16, (b, h) slabs: q, k, v widened, (T, hs) each; o one row. */
CPU_CLONES static void attn_fwd_bf16_task(void *ctx, int64_t b0, int64_t e0,
                                          int tid)
{
    const attn_t *a = ctx;
    int64_t T = a->T, NH = a->NH, hs = a->HD, ld = attn_ld(a), oc = NH * hs;
    float scale = (float)(1.0 / sqrt((double)hs));
    float *q = a->scratch + (int64_t)tid * a->stride, *k = q + T * hs,
          *v = k + T * hs, *o = v + T * hs;
    for (int64_t bh = b0; bh < e0; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        head_widen(q, a->qkv, ld, attn_qcol(a, h), b, T, hs);
        head_widen(k, a->qkv, ld, attn_kcol(a, h), b, T, hs);
        head_widen(v, a->qkv, ld, attn_vcol(a, h), b, T, hs);
        for (int64_t t = 0; t < T; t++) {
            attn_fwd_row(a->att + (bh * T + t) * T, o, q + t * hs, k, v, hs, t,
                         T, hs, scale);
            cpu_bf16_round(CPU_BF16(a->out) + (b * T + t) * oc + h * hs, o, hs);
        }
    }
}

/* For query t with probabilities p = att[t, :t+1] and upstream g = dout:
 *   datt[t2] = g . v[t2]                 dv[t2] += p[t2] g
 *   dpre[t2] = p[t2] (datt[t2] - sum_j p[j] datt[j])   (softmax backward)
 *   dq += scale sum_t2 dpre[t2] k[t2]    dk[t2] += scale dpre[t2] q
 * One head: att (T, T) its probabilities; row t of q, k, v at q + t qs
 * (and k, v), of dout at g + t gs, of dq, dk, dv at dq + t ds (and dk, dv);
 * datt T floats of scratch. */
static inline void attn_bwd_head(float *restrict datt, const float *att,
                                 const float *qb, const float *kb,
                                 const float *vb, int64_t qs, const float *gb,
                                 int64_t gs, float *dqb, float *dkb,
                                 float *dvb, int64_t ds, int64_t T,
                                 int64_t hs, float scale)
{
    for (int64_t t = 0; t < T; t++) {
        const float *restrict p = att + t * T;
        const float *restrict g = gb + t * gs;
        const float *restrict q = qb + t * qs;
        float *restrict dq = dqb + t * ds;
        double wsum = 0.0;
        for (int64_t t2 = 0; t2 <= t; t2++) {
            const float *restrict v = vb + t2 * qs;
            float *restrict dv = dvb + t2 * ds;
            float dot = cpu_dot_f32(g, v, hs);
            datt[t2] = dot;
            wsum += (double)p[t2] * dot;
            float pt = p[t2];
            for (int64_t i = 0; i < hs; i++)
                dv[i] += pt * g[i];
        }
        float ws = (float)wsum;
        for (int64_t t2 = 0; t2 <= t; t2++) {
            const float *restrict k = kb + t2 * qs;
            float *restrict dk = dkb + t2 * ds;
            float dp = p[t2] * (datt[t2] - ws) * scale;
            for (int64_t i = 0; i < hs; i++) {
                dq[i] += dp * k[i];
                dk[i] += dp * q[i];
            }
        }
    }
}

/* Backward works per (b, kv head) slab: the group's query heads in order,
 * each adding into the slab's dk and dv (multi-head attention: one query
 * head per slab). */
CPU_CLONES static void attn_bwd_task(void *ctx, int64_t b0, int64_t e0, int tid)
{
    const attn_t *a = ctx;
    int64_t T = a->T, NH = a->NH, NKV = a->NKV, hs = a->HD, ld = attn_ld(a);
    int64_t grp = NH / NKV, oc = NH * hs;
    float scale = (float)(1.0 / sqrt((double)hs));
    float *datt = a->scratch + (int64_t)tid * a->stride;
    for (int64_t bg = b0; bg < e0; bg++) {
        int64_t b = bg / NKV, g = bg % NKV;
        const float *base = a->qkv + b * T * ld;
        float *dbase = a->dqkv + b * T * ld;
        for (int64_t h = g * grp; h < (g + 1) * grp; h++) {
            int64_t qc = attn_qcol(a, h), kc = attn_kcol(a, h), vc = attn_vcol(a, h);
            attn_bwd_head(datt, a->catt + (b * NH + h) * T * T, base + qc,
                          base + kc, base + vc, ld, a->dout + b * T * oc + h * hs,
                          oc, dbase + qc, dbase + kc, dbase + vc, ld, T, hs,
                          scale);
        }
    }
}

/* bf16, (b, kv head) slabs: k, v and the dk, dv being added to widened
 * once, q, dout and dq per query head, (T, hs) each; dq rounded back per
 * head, dk and dv once the group's heads are done. */
CPU_CLONES static void attn_bwd_bf16_task(void *ctx, int64_t b0, int64_t e0,
                                          int tid)
{
    const attn_t *a = ctx;
    int64_t T = a->T, NH = a->NH, NKV = a->NKV, hs = a->HD, ld = attn_ld(a);
    int64_t grp = NH / NKV, oc = NH * hs, th = T * hs;
    float scale = (float)(1.0 / sqrt((double)hs));
    float *datt = a->scratch + (int64_t)tid * a->stride;
    float *q = datt + cpu_pad16(T), *k = q + th, *v = k + th, *g = v + th;
    float *dq = g + th, *dk = dq + th, *dv = dk + th;
    for (int64_t bg = b0; bg < e0; bg++) {
        int64_t b = bg / NKV, kvg = bg % NKV, h0 = kvg * grp;
        int64_t kc = attn_kcol(a, h0), vc = attn_vcol(a, h0);
        uint16_t *d = CPU_BF16(a->dqkv) + b * T * ld;
        head_widen(k, a->qkv, ld, kc, b, T, hs);
        head_widen(v, a->qkv, ld, vc, b, T, hs);
        head_widen(dk, a->dqkv, ld, kc, b, T, hs);
        head_widen(dv, a->dqkv, ld, vc, b, T, hs);
        for (int64_t h = h0; h < h0 + grp; h++) {
            int64_t qc = attn_qcol(a, h);
            head_widen(q, a->qkv, ld, qc, b, T, hs);
            head_widen(g, a->dout, oc, h * hs, b, T, hs);
            head_widen(dq, a->dqkv, ld, qc, b, T, hs);
            attn_bwd_head(datt, a->catt + (b * NH + h) * T * T, q, k, v, hs, g,
                          hs, dq, dk, dv, hs, T, hs, scale);
            cpu_bf16_round_rows(d + qc, ld, dq, hs, T, hs);
        }
        cpu_bf16_round_rows(d + kc, ld, dk, hs, T, hs);
        cpu_bf16_round_rows(d + vc, ld, dv, hs, T, hs);
    }
}

static int check_attn(dt_device_t *d, const char *op, int64_t B, int64_t T,
                      int64_t C, int64_t NH, int64_t *BTC3, int64_t *BNHTT)
{
    CPU_DIM(d, op, B);
    CPU_DIM(d, op, T);
    CPU_DIM(d, op, C);
    CPU_DIM(d, op, NH);
    if (NH == 0 || C % NH != 0)
        return CPU_INVALID(d, "%s: C = %lld is not a multiple of NH = %lld",
                           op, (long long)C, (long long)NH);
    int64_t bt = 0, btc = 0, bnh = 0, bnht = 0;
    *BTC3 = 0;
    *BNHTT = 0;
    int rc = cpu_check_product(d, op, B, T, &bt);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, bt, 3 * C, &btc);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, B, NH, &bnh);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, bnh, T, &bnht);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, bnht, T, BNHTT);
    *BTC3 = btc;
    return rc;
}

/* The state is att (B, NH, T, T) f32, whatever else the shape holds, and
 * whether the activations are f32 or bf16. */
int cpu_attention_state_bytes(int64_t B, int64_t T, int64_t C, int64_t NH,
                              int dtype, uint64_t *out)
{
    if (!out || B < 0 || T < 0 || C < 0 || NH < 1 || C % NH != 0)
        return DT_ERR_INVALID;
    if (dtype != DT_F32 && dtype != DT_BF16)
        return DT_ERR_UNSUPPORTED;
    /* B * NH * T * T floats, each product within int64 as the kernels
     * check it (check_attn) */
    int64_t n = B;
    const int64_t f[3] = {NH, T, T};
    for (int i = 0; i < 3; i++) {
        if (f[i] && n > INT64_MAX / f[i])
            return DT_ERR_INVALID;
        n *= f[i];
    }
    if (n > INT64_MAX / (int64_t)sizeof(float))
        return DT_ERR_INVALID;
    *out = (uint64_t)n * sizeof(float);
    return DT_OK;
}

/* Both forwards, shapes checked: NKV == NH for multi-head attention. */
static int attn_forward_run(dt_device_t *d, const char *op, void *out,
                            void *state, const void *qkv, int dtype, int64_t B,
                            int64_t T, int64_t NH, int64_t NKV, int64_t HD)
{
    attn_t a = {.out = out, .att = state, .qkv = qkv, .B = B, .T = T,
                .NH = NH, .NKV = NKV, .HD = HD};
    cpu_lock(d);
    if (dtype == DT_BF16) {
        /* q, k, v (T, hs) and a row of out, per thread */
        void *scratch = NULL;
        a.stride = cpu_pad16(3 * T * HD + HD);
        int rc = cpu_scratch(d, (uint64_t)d->threads * (uint64_t)a.stride *
                                    sizeof(float), &scratch, op);
        if (rc != DT_OK) {
            cpu_unlock(d);
            return rc;
        }
        a.scratch = scratch;
        cpu_pool_run(d->pool, B * NH, 1, attn_fwd_bf16_task, &a);
        cpu_unlock(d);
        return DT_OK;
    }
    /* a row costs ~ t * hs; ask for a few hundred thousand flops a chunk */
    cpu_pool_run(d->pool, B * NH * T, 1 + 65536 / (T * HD + 1), attn_fwd_task,
                 &a);
    cpu_unlock(d);
    return DT_OK;
}

/* Both backwards, shapes checked. */
static int attn_backward_run(dt_device_t *d, const char *op, void *dqkv,
                             const void *dout, const void *qkv,
                             const void *state, int dtype, int64_t B,
                             int64_t T, int64_t NH, int64_t NKV, int64_t HD)
{
    /* datt (T) per thread; bf16: q, k, v, dout, dq, dk, dv (T, hs) too */
    const int64_t stride = dtype == DT_BF16 ? cpu_pad16(T) + 7 * T * HD : T;
    cpu_lock(d);
    void *scratch = NULL;
    int rc = cpu_scratch(d, (uint64_t)d->threads * (uint64_t)stride *
                                sizeof(float), &scratch, op);
    if (rc != DT_OK) {
        cpu_unlock(d);
        return rc;
    }
    attn_t a = {.dqkv = dqkv, .scratch = scratch, .dout = dout, .qkv = qkv,
                .catt = state, .B = B, .T = T, .NH = NH, .NKV = NKV, .HD = HD,
                .stride = stride};
    cpu_pool_run(d->pool, B * NKV, 1,
                 dtype == DT_BF16 ? attn_bwd_bf16_task : attn_bwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

int cpu_attention_forward(dt_device_t *d, dt_stream_t *s, void *out,
                          void *state, const void *qkv, int dtype, int64_t B,
                          int64_t T, int64_t C, int64_t NH)
{
    static const char op[] = "attention_forward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    int64_t n3 = 0, natt = 0;
    int rc = check_attn(d, op, B, T, C, NH, &n3, &natt);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, out, n3);
    CPU_PTR(d, op, state, natt);
    CPU_PTR(d, op, qkv, n3);
    if (n3 == 0)
        return DT_OK;
    return attn_forward_run(d, op, out, state, qkv, dtype, B, T, NH, NH, C / NH);
}

int cpu_attention_backward(dt_device_t *d, dt_stream_t *s, void *dqkv,
                           const void *dout, const void *qkv, const void *out,
                           const void *state, int dtype, int64_t B, int64_t T,
                           int64_t C, int64_t NH)
{
    static const char op[] = "attention_backward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    /* out is not needed: the probabilities are */
    int64_t n3 = 0, natt = 0;
    int rc = check_attn(d, op, B, T, C, NH, &n3, &natt);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, dqkv, n3);
    CPU_PTR(d, op, dout, n3);
    CPU_PTR(d, op, qkv, n3);
    CPU_PTR(d, op, out, n3);
    CPU_PTR(d, op, state, natt);
    if (n3 == 0)
        return DT_OK;
    return attn_backward_run(d, op, dqkv, dout, qkv, state, dtype, B, T, NH, NH,
                             C / NH);
}

/* Grouped-query shapes: NKV >= 1 divides NH, and the element counts of
 * qkv (B T (NH + 2 NKV) HD), out (B T NH HD) and the state (B NH T T)
 * stay in int64. */
static int check_gqa(dt_device_t *d, const char *op, int64_t B, int64_t T,
                     int64_t NH, int64_t NKV, int64_t HD, int64_t *nqkv,
                     int64_t *nout, int64_t *natt)
{
    CPU_DIM(d, op, B);
    CPU_DIM(d, op, T);
    CPU_DIM(d, op, NH);
    CPU_DIM(d, op, NKV);
    CPU_DIM(d, op, HD);
    if (NKV == 0 || NH % NKV != 0)
        return CPU_INVALID(d, "%s: NH = %lld is not a multiple of NKV = %lld",
                           op, (long long)NH, (long long)NKV);
    int64_t bt = 0, w = 0, oc = 0, bnh = 0, bnht = 0;
    *nqkv = *nout = *natt = 0;
    int rc = cpu_check_product(d, op, B, T, &bt);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, NH + 2 * NKV, HD, &w);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, bt, w, nqkv);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, NH, HD, &oc);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, bt, oc, nout);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, B, NH, &bnh);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, bnh, T, &bnht);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, bnht, T, natt);
    return rc;
}

int cpu_gqa_attention_forward(dt_device_t *d, dt_stream_t *s, void *out,
                              void *state, const void *qkv, int dtype,
                              int64_t B, int64_t T, int64_t NH, int64_t NKV,
                              int64_t HD)
{
    static const char op[] = "gqa_attention_forward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    int64_t nqkv = 0, nout = 0, natt = 0;
    int rc = check_gqa(d, op, B, T, NH, NKV, HD, &nqkv, &nout, &natt);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, out, nout);
    CPU_PTR(d, op, state, natt);
    CPU_PTR(d, op, qkv, nqkv);
    if (nout == 0)
        return DT_OK;
    return attn_forward_run(d, op, out, state, qkv, dtype, B, T, NH, NKV, HD);
}

int cpu_gqa_attention_backward(dt_device_t *d, dt_stream_t *s, void *dqkv,
                               const void *dout, const void *qkv,
                               const void *out, const void *state, int dtype,
                               int64_t B, int64_t T, int64_t NH, int64_t NKV,
                               int64_t HD)
{
    static const char op[] = "gqa_attention_backward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    int64_t nqkv = 0, nout = 0, natt = 0;
    int rc = check_gqa(d, op, B, T, NH, NKV, HD, &nqkv, &nout, &natt);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, dqkv, nqkv);
    CPU_PTR(d, op, dout, nout);
    CPU_PTR(d, op, qkv, nqkv);
    CPU_PTR(d, op, out, nout);
    CPU_PTR(d, op, state, natt);
    if (nout == 0)
        return DT_OK;
    return attn_backward_run(d, op, dqkv, dout, qkv, state, dtype, B, T, NH,
                             NKV, HD);
}
