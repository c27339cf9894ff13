/*
 * tests/unit/plugins/shm/shm_fixture.c - what test_shm's cases share
 * (shm_test.h): the loaded plugin, job names, joining a world in a forked
 * rank, the deterministic inputs and their bitwise references, and the
 * segment helpers of the planted, job-secret and segment cases.
 */
#include "shm_test.h"

const dt_comm_ops_v1_t *g_ops; /* loaded once in the parent, inherited */
void *g_dl;
char g_job_prefix[64];         /* "dtt<pid>" */
static int g_job_no;

const dt_test_kv_t small_slots[] = {{"slot_bytes", "65536"}, {NULL, NULL}};

/* ---- plumbing ---------------------------------------------------------- */

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void new_job(char *buf, size_t cap, const char *what)
{
    snprintf(buf, cap, "%s-%d-%s", g_job_prefix, ++g_job_no, what);
}

/* Segments the job left in /dev/shm. */
int leftovers(const char *job)
{
    char pat[256];
    snprintf(pat, sizeof pat, "/dev/shm/dtrain-%s*", job);
    glob_t g;
    int n = 0;
    if (glob(pat, 0, NULL, &g) == 0) {
        n = (int)g.gl_pathc;
        for (size_t i = 0; i < g.gl_pathc; i++)
            fprintf(stderr, "left behind: %s\n", g.gl_pathv[i]);
        globfree(&g);
    }
    return n;
}

/* In a child: join the world; returns a status, the message in *err. */
int join(const run_args_t *a, int rank, int size, dt_test_host_t *th, dt_comm_t **c)
{
    dt_test_host_init(th, "comm/shm", a->kv);
    dt_comm_init_v1_t ia;
    memset(&ia, 0, sizeof ia);
    ia.struct_size = sizeof ia;
    ia.rank = rank;
    ia.size = size;
    ia.local_rank = rank;
    ia.local_size = size;
    ia.job_id = a->job;
    ia.timeout_ms = a->timeout_ms;
    ia.job_secret = a->secret;
    return g_ops->init(&th->host, &ia, c);
}

void run_expect_ok(int nproc, dt_mp_fn_t fn, run_args_t *a, double deadline)
{
    dt_mp_result_t res;
    assert_int_equal(dt_mp_run(nproc, fn, a, deadline, &res), 0);
    char why[8192];
    if (!dt_mp_all_ok(&res, why, sizeof why))
        fail_msg("%s", why);
    assert_int_equal(leftovers(a->job), 0);
}

/* ---- reference numbers ------------------------------------------------- */

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* Input value of `rank` at index i for test variant `salt`: f32 with a
 * full mantissa in [-8, 8), so sums depend on the order of addition. */
float gen(int rank, uint64_t i, uint32_t salt)
{
    uint32_t h = mix((uint32_t)i * 2654435761U ^ mix((uint32_t)rank * 97U + salt) ^
                     (uint32_t)(i >> 32));
    return (float)((int32_t)(h >> 8) - (1 << 23)) * 0x1p-20f;
}

/* f32 -> bf16, round to nearest even, by picking the nearer of the two
 * neighbours in double arithmetic (independent of the plugin's bit trick). */
uint16_t ref_bf16(float f)
{
    if (f != f)
        return 0x7fc0;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
    uint32_t lo = a & 0xffff0000u;
    float flo;
    memcpy(&flo, &lo, 4);
    int e = (int)((lo >> 23) & 0xff);
    double step = e == 0 ? ldexp(1.0, -133) : ldexp(1.0, e - 127 - 7);
    double x = fabs((double)f), dl = x - (double)flo, dh = (double)flo + step - x;
    uint32_t pick = dl < dh ? lo : dh < dl ? lo + 0x10000u : (((lo >> 16) & 1) ? lo + 0x10000u : lo);
    if (isinf(f))
        pick = 0x7f800000u;
    return (uint16_t)((sign | pick) >> 16);
}

float ref_bf16_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ref_f16(float f) { return dt_ref_f32_to_f16(f); }

/* exact: every f16 value is a float */
float ref_f16_f32(uint16_t u) { return (float)dt_ref_f16_to_double(u); }

/* Element i of rank r's input in dtype dt, as bytes (dt's size) at out. */
void input_elem(void *out, int dt, int rank, uint64_t i, uint32_t salt)
{
    switch (dt) {
    case DT_F32: { float v = gen(rank, i, salt); memcpy(out, &v, 4); break; }
    case DT_BF16: { uint16_t v = ref_bf16(gen(rank, i, salt)); memcpy(out, &v, 2); break; }
    case DT_F16: { uint16_t v = ref_f16(gen(rank, i, salt)); memcpy(out, &v, 2); break; }
    case DT_I32: {
        int32_t v = (int32_t)mix((uint32_t)(i * 31 + (uint64_t)rank * 7 + salt));
        memcpy(out, &v, 4);
        break;
    }
    case DT_U8: *(uint8_t *)out = (uint8_t)mix((uint32_t)(i * 13 + (uint64_t)rank * 5 + salt)); break;
    default: break;
    }
}

/* dst[0..n) = rank's input elements 0..n-1. */
void fill(void *dst, int dt, int rank, uint64_t n, uint32_t salt)
{
    size_t es = dt_dtype_size(dt);
    for (uint64_t i = 0; i < n; i++)
        input_elem((unsigned char *)dst + i * es, dt, rank, i, salt);
}

float widen(const void *p, int dt, uint64_t i)
{
    switch (dt) {
    case DT_F32: return ((const float *)p)[i];
    case DT_BF16: return ref_bf16_f32(((const uint16_t *)p)[i]);
    case DT_F16: return ref_f16_f32(((const uint16_t *)p)[i]);
    default: return 0;
    }
}

/* Reference reduction of input element `idx` over ranks 0..n-1 in rank
 * order, accumulated in f32, narrowed once to dt; returned as bits. */
uint32_t ref_reduce_bits(int dt, int op, int n, uint64_t idx, uint32_t salt)
{
    float acc = 0;
    for (int r = 0; r < n; r++) {
        float v = gen(r, idx, salt);
        float x;
        switch (dt) {
        case DT_BF16: x = ref_bf16_f32(ref_bf16(v)); break;
        case DT_F16: x = ref_f16_f32(ref_f16(v)); break;
        default: x = v; break;
        }
        if (r == 0)
            acc = x;
        else if (op == DT_OP_MAX)
            acc = x > acc ? x : acc;
        else if (op == DT_OP_MIN)
            acc = x < acc ? x : acc;
        else
            acc = acc + x;
    }
    if (op == DT_OP_AVG)
        acc = acc / (float)n;
    uint32_t bits;
    switch (dt) {
    case DT_BF16: return ref_bf16(acc);
    case DT_F16: return ref_f16(acc);
    default: memcpy(&bits, &acc, 4); return bits;
    }
}

uint32_t bits_at(const void *p, int dt, uint64_t i)
{
    if (dt == DT_F32) {
        uint32_t u;
        memcpy(&u, (const float *)p + i, 4);
        return u;
    }
    return ((const uint16_t *)p)[i];
}

const char *op_name(int op)
{
    static const char *names[] = {"sum", "avg", "max", "min"};
    return op >= 0 && op < 4 ? names[op] : "?";
}

/* Compare `got` (n elements) with the reference of input indices
 * base + i; fails the child with the first difference. */
int check_reduced(const void *got, int dt, int op, int nranks, uint64_t n,
                  uint64_t base, uint32_t salt, const char *what)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t want = ref_reduce_bits(dt, op, nranks, base + i, salt);
        uint32_t have = bits_at(got, dt, i);
        if (want != have)
            return dt_mp_fail("%s %s %s: element %llu: got bits 0x%x (%g), want 0x%x",
                              what, dt_dtype_name(dt), op_name(op), (unsigned long long)i,
                              have, (double)widen(got, dt, i), want);
    }
    return 0;
}

/* Compare a plain copy: got[i] == rank `src`'s input element base + i. */
int check_copy(const void *got, int dt, int src, uint64_t n, uint64_t base,
               uint32_t salt, const char *what)
{
    size_t es = dt_dtype_size(dt);
    unsigned char want[8];
    for (uint64_t i = 0; i < n; i++) {
        input_elem(want, dt, src, base + i, salt);
        if (memcmp((const unsigned char *)got + i * es, want, es) != 0)
            return dt_mp_fail("%s %s: element %llu differs from rank %d's input", what,
                              dt_dtype_name(dt), (unsigned long long)i, src);
    }
    return 0;
}

/* ---- segments ------------------------------------------------------------ */

void seg_path_of(char *buf, size_t cap, const char *job)
{
    snprintf(buf, cap, "/dev/shm/dtrain-%s", job);
}

/* "uid 0 (root)": how the plugin names an owner. */
void owner_text(char *buf, size_t cap, uid_t uid)
{
    struct passwd *pw = getpwuid(uid);
    if (pw)
        snprintf(buf, cap, "uid %u (%s)", (unsigned)uid, pw->pw_name);
    else
        snprintf(buf, cap, "uid %u", (unsigned)uid);
}

int wait_for(_Atomic int *word, int value, double limit_s)
{
    for (double t0 = now_s(); atomic_load(word) < value;) {
        if (now_s() - t0 > limit_s)
            return -1;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}
