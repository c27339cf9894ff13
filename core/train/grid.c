/*
 * core/train/grid.c - the 3-D process grid (grid.h): coordinates of a
 * rank at tp x pp x dp in Megatron's order (tp fastest, pp slowest), and
 * the colors and keys that split the world into the tensor, pipeline,
 * data, embedding and model groups.
 */
#include "train/grid.h"

#include <stddef.h>

#include "dtrain/status.h"
#include "util/error.h"

int dt_grid_init(dt_grid_t *g, int32_t world, int32_t rank, int64_t tp,
                 int64_t pp)
{
    if (world < 1 || rank < 0 || rank >= world)
        return dt_err_set(DT_ERR_INVALID, "process grid: rank %d of a world "
                          "of %d rank%s", (int)rank, (int)world, world == 1 ? "" : "s");
    if (tp < 1 || pp < 1)
        return dt_err_set(DT_ERR_CONFIG, "parallel.tensor = %lld and "
                          "parallel.pipeline = %lld: both must be at least 1",
                          (long long)tp, (long long)pp);
    if (tp > world || pp > world || world % (tp * pp) != 0)
        return dt_err_set(DT_ERR_CONFIG, "parallel.tensor = %lld x "
                          "parallel.pipeline = %lld = %lld ranks per model "
                          "replica does not divide the world of %d rank%s",
                          (long long)tp, (long long)pp,
                          (long long)(tp * pp), (int)world, world == 1 ? "" : "s");
    g->world = world;
    g->tp = (int32_t)tp;
    g->pp = (int32_t)pp;
    g->dp = world / (int32_t)(tp * pp);
    g->rank = rank;
    g->tp_rank = rank % g->tp;
    g->dp_rank = rank / g->tp % g->dp;
    g->pp_rank = rank / (g->tp * g->dp);
    return DT_OK;
}

int32_t dt_grid_rank_at(const dt_grid_t *g, int32_t tp_rank, int32_t pp_rank,
                        int32_t dp_rank)
{
    if (tp_rank < 0 || tp_rank >= g->tp || pp_rank < 0 || pp_rank >= g->pp ||
        dp_rank < 0 || dp_rank >= g->dp)
        return -1;
    return (pp_rank * g->dp + dp_rank) * g->tp + tp_rank;
}

/* Whether this rank's stage is in an embedding group: first or last. */
static int in_embedding(const dt_grid_t *g)
{
    return g->pp_rank == 0 || g->pp_rank == g->pp - 1;
}

void dt_grid_split_args(const dt_grid_t *g, dt_grid_group_t which,
                        int32_t *color, int32_t *key)
{
    /* color: the coordinates the group's members share, numbered densely;
     * key: the coordinate along the group. */
    switch (which) {
    case DT_GRID_TENSOR:
        *color = g->pp_rank * g->dp + g->dp_rank;
        *key = g->tp_rank;
        return;
    case DT_GRID_DATA:
        *color = g->pp_rank * g->tp + g->tp_rank;
        *key = g->dp_rank;
        return;
    case DT_GRID_PIPELINE:
    case DT_GRID_EMBEDDING: /* the pipeline group's first and last stage */
        if (which == DT_GRID_EMBEDDING && !in_embedding(g))
            break;
        *color = g->dp_rank * g->tp + g->tp_rank;
        *key = which == DT_GRID_EMBEDDING ? (g->pp_rank > 0) : g->pp_rank;
        return;
    case DT_GRID_MODEL:
        *color = g->dp_rank;
        *key = g->pp_rank * g->tp + g->tp_rank;
        return;
    case DT_GRID_N_GROUPS:
        break;
    }
    *color = DT_COMM_NO_COLOR;
    *key = 0;
}

int32_t dt_grid_members(const dt_grid_t *g, dt_grid_group_t which,
                        int32_t *out, int32_t cap)
{
    int32_t n = 0;
#define PUT(r)                                                                 \
    do {                                                                       \
        if (n < cap)                                                           \
            out[n] = (r);                                                      \
        n++;                                                                   \
    } while (0)
    switch (which) {
    case DT_GRID_TENSOR:
        for (int32_t k = 0; k < g->tp; k++)
            PUT(dt_grid_rank_at(g, k, g->pp_rank, g->dp_rank));
        break;
    case DT_GRID_PIPELINE:
        for (int32_t k = 0; k < g->pp; k++)
            PUT(dt_grid_rank_at(g, g->tp_rank, k, g->dp_rank));
        break;
    case DT_GRID_DATA:
        for (int32_t k = 0; k < g->dp; k++)
            PUT(dt_grid_rank_at(g, g->tp_rank, g->pp_rank, k));
        break;
    case DT_GRID_EMBEDDING:
        if (!in_embedding(g))
            break;
        PUT(dt_grid_rank_at(g, g->tp_rank, 0, g->dp_rank));
        if (g->pp > 1)
            PUT(dt_grid_rank_at(g, g->tp_rank, g->pp - 1, g->dp_rank));
        break;
    case DT_GRID_MODEL:
        for (int32_t k = 0; k < g->pp; k++)
            for (int32_t t = 0; t < g->tp; t++)
                PUT(dt_grid_rank_at(g, t, k, g->dp_rank));
        break;
    case DT_GRID_N_GROUPS:
        break;
    }
#undef PUT
    return n;
}

const char *dt_grid_group_name(dt_grid_group_t which)
{
    static const char *const names[DT_GRID_N_GROUPS] = {
        [DT_GRID_TENSOR] = "tensor",
        [DT_GRID_PIPELINE] = "pipeline",
        [DT_GRID_DATA] = "data",
        [DT_GRID_EMBEDDING] = "embedding",
        [DT_GRID_MODEL] = "model",
    };
    return (unsigned)which < DT_GRID_N_GROUPS ? names[which] : "?";
}

int dt_grid_split(const dt_grid_t *g, dt_comm_t *world, dt_comm_t *out[DT_GRID_N_GROUPS])
{
    for (int i = 0; i < DT_GRID_N_GROUPS; i++)
        out[i] = NULL;
    for (int i = 0; i < DT_GRID_N_GROUPS; i++) {
        int32_t color, key;
        dt_grid_split_args(g, (dt_grid_group_t)i, &color, &key);
        int rc = dt_comm_ops(world)->split(world, color, key, &out[i]);
        if (rc) {
            out[i] = NULL;
            for (int k = 0; k < i; k++)
                if (out[k]) {
                    dt_comm_ops(out[k])->finalize(out[k]);
                    out[k] = NULL;
                }
            return dt_err_context(rc, "process grid: splitting the %s groups",
                                  dt_grid_group_name((dt_grid_group_t)i));
        }
    }
    return DT_OK;
}
