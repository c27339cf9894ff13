/*
 * plugins/mpi/mpi_reduce.c - how the MPI communicator reduces: dtrain
 * dtypes as MPI datatypes, MPI's built-in ops for f32, f64 and integers,
 * user-defined ops for bf16 and f16 (MPI has no 16-bit floats), and the
 * division that makes a sum an average (MPI has no avg).
 *
 * bf16 / f16: each combine of two partial results converts both to f32,
 * applies the op in f32 and rounds once to nearest even (dtrain/half.h,
 * the conversions every plugin shares).  With 2 ranks that is exactly the
 * shm communicator's "accumulate in f32, round once"; with N ranks MPI's
 * algorithm combines N - 1 times, each rounding its partial sum, so the
 * result may differ from the f32-accumulated sum by up to (N - 1) half-ulp
 * roundings of the partial sums (the unit tests' tolerance).
 *
 * u8 / u16 sums are user-defined ops too, wrapping as comm.h's integer
 * arithmetic does: Open MPI 4.1.4's AVX op component saturates MPI_SUM on
 * MPI_UINT8_T / MPI_UINT16_T in its vector loop (tests/unit/plugins/mpi/test_mpi.c
 * found 30001 + 35546 = 65535 from element 2539 of a 6561-element sum on).
 */
#include <string.h>

#include "dtrain/half.h"
#include "mpi_internal.h"

/* 16-bit floats travel as this 2-byte type; the user ops know which
 * format they reduce from the op itself. */
static MPI_Datatype g_half = MPI_DATATYPE_NULL;
/* [0]: bf16, [1]: f16; by DT_OP_SUM / MAX / MIN */
static MPI_Op g_ops[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                             {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};

static inline float max_f(float a, float b) { return b > a || b != b ? b : a; }
static inline float min_f(float a, float b) { return b < a || b != b ? b : a; }

/* inout[i] = in[i] OP inout[i] in f32, rounded once. */
#define HALF_OP(name, to_f32, from_f32, EXPR)                                  \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt)        \
    {                                                                          \
        (void)dt;                                                              \
        const uint16_t *x = in;                                                \
        uint16_t *y = inout;                                                   \
        for (int i = 0; i < *len; i++) {                                       \
            float a = to_f32(x[i]), b = to_f32(y[i]);                          \
            y[i] = from_f32(EXPR);                                             \
        }                                                                      \
    }
HALF_OP(bf16_sum, dt_bf16_to_f32, dt_f32_to_bf16, a + b)
HALF_OP(bf16_max, dt_bf16_to_f32, dt_f32_to_bf16, max_f(a, b))
HALF_OP(bf16_min, dt_bf16_to_f32, dt_f32_to_bf16, min_f(a, b))
HALF_OP(f16_sum, dt_f16_to_f32, dt_f32_to_f16, a + b)
HALF_OP(f16_max, dt_f16_to_f32, dt_f32_to_f16, max_f(a, b))
HALF_OP(f16_min, dt_f16_to_f32, dt_f32_to_f16, min_f(a, b))

/* inout[i] = in[i] + inout[i], wrapping. */
#define WRAP_SUM(name, T)                                                      \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt)        \
    {                                                                          \
        (void)dt;                                                              \
        const T *x = in;                                                       \
        T *y = inout;                                                          \
        for (int i = 0; i < *len; i++)                                         \
            y[i] = (T)(x[i] + y[i]);                                           \
    }
WRAP_SUM(u8_sum, uint8_t)
WRAP_SUM(u16_sum, uint16_t)
static MPI_Op g_u8_sum = MPI_OP_NULL, g_u16_sum = MPI_OP_NULL;

int mpic_reduce_setup(void)
{
    static MPI_User_function *const fns[2][3] = {{bf16_sum, bf16_max, bf16_min},
                                                  {f16_sum, f16_max, f16_min}};
    int rc = MPI_Type_contiguous(2, MPI_BYTE, &g_half);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_commit(&g_half);
    for (int f = 0; f < 2 && rc == MPI_SUCCESS; f++)
        for (int o = 0; o < 3 && rc == MPI_SUCCESS; o++)
            rc = MPI_Op_create(fns[f][o], 1, &g_ops[f][o]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Op_create(u8_sum, 1, &g_u8_sum);
    if (rc == MPI_SUCCESS)
        rc = MPI_Op_create(u16_sum, 1, &g_u16_sum);
    return rc;
}

void mpic_reduce_teardown(void)
{
    for (int f = 0; f < 2; f++)
        for (int o = 0; o < 3; o++)
            if (g_ops[f][o] != MPI_OP_NULL)
                MPI_Op_free(&g_ops[f][o]);
    if (g_u8_sum != MPI_OP_NULL)
        MPI_Op_free(&g_u8_sum);
    if (g_u16_sum != MPI_OP_NULL)
        MPI_Op_free(&g_u16_sum);
    if (g_half != MPI_DATATYPE_NULL)
        MPI_Type_free(&g_half);
}

MPI_Datatype mpic_datatype(int dtype)
{
    switch (dtype) {
    case DT_F32: return MPI_FLOAT;
    case DT_F64: return MPI_DOUBLE;
    case DT_BF16:
    case DT_F16: return g_half;
    case DT_I32: return MPI_INT32_T;
    case DT_I64: return MPI_INT64_T;
    case DT_U16: return MPI_UINT16_T;
    case DT_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}

int mpic_reduce_op(int dtype, int op, MPI_Op *out)
{
    int slot;
    switch (op) {
    case DT_OP_SUM: slot = 0; break;
    case DT_OP_AVG: slot = 0; break;
    case DT_OP_MAX: slot = 1; break;
    case DT_OP_MIN: slot = 2; break;
    default: return DT_ERR_INVALID;
    }
    int is_float = dtype == DT_F32 || dtype == DT_F64 || dtype == DT_BF16 || dtype == DT_F16;
    if (op == DT_OP_AVG && !is_float)
        return DT_ERR_UNSUPPORTED;
    if (dtype == DT_BF16 || dtype == DT_F16) {
        *out = g_ops[dtype == DT_F16][slot];
        return DT_OK;
    }
    if (slot == 0 && (dtype == DT_U8 || dtype == DT_U16)) {
        *out = dtype == DT_U8 ? g_u8_sum : g_u16_sum;
        return DT_OK;
    }
    static const MPI_Op builtin[3] = {MPI_SUM, MPI_MAX, MPI_MIN};
    *out = builtin[slot];
    return DT_OK;
}

void mpic_avg_divide(void *buf, uint64_t count, int dtype, int group)
{
    const float fg = (float)group;
    switch (dtype) {
    case DT_F32: {
        float *p = buf;
        for (uint64_t i = 0; i < count; i++)
            p[i] /= fg;
        break;
    }
    case DT_F64: {
        double *p = buf;
        for (uint64_t i = 0; i < count; i++)
            p[i] /= (double)group;
        break;
    }
    case DT_BF16: {
        uint16_t *p = buf;
        for (uint64_t i = 0; i < count; i++)
            p[i] = dt_f32_to_bf16(dt_bf16_to_f32(p[i]) / fg);
        break;
    }
    case DT_F16: {
        uint16_t *p = buf;
        for (uint64_t i = 0; i < count; i++)
            p[i] = dt_f32_to_f16(dt_f16_to_f32(p[i]) / fg);
        break;
    }
    default: break; /* integers: refused before starting */
    }
}
