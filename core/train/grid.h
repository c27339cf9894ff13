/*
 * core/train/grid.h - the 3-D process grid: world = tp x pp x dp.
 *
 * Rank order, as Megatron-LM lays its groups out: tensor parallel
 * fastest, then data parallel, pipeline slowest,
 *
 *     rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank
 *
 * so a tensor-parallel group (two all-reduces per layer in forward and two
 * in backward) is tp consecutive ranks, normally on one machine, and the
 * pipeline's point-to-point traffic, the lightest, is what crosses the
 * widest distance.  Example, 8 ranks at tp 2, pp 2 (so dp 2):
 *
 *     tensor groups    [0, 1] [2, 3] [4, 5] [6, 7]
 *     data groups      [0, 2] [1, 3] [4, 6] [5, 7]
 *     pipeline groups  [0, 4] [1, 5] [2, 6] [3, 7]
 *     embedding groups [0, 4] [1, 5] [2, 6] [3, 7]
 *     model groups     [0, 1, 4, 5] [2, 3, 6, 7]
 *
 * The embedding group holds the first and the last stage of each pipeline
 * group (Megatron's, for the tied input embedding and LM head, whose
 * gradients are summed between the two stages each step); with one stage
 * it is that stage alone, and with pp > 2 the middle stages join none.
 *
 * Every group is formed by the comm plugin's split (a collective over the
 * world): dt_grid_split_args gives this rank's color and key for each
 * group (the key is the rank's place in its group: its coordinate along
 * the group, or 0 for the first stage and 1 for the last in the embedding
 * group, or pp_rank x tp + tp_rank in the model group), dt_grid_split
 * makes all five.  Nothing here
 * allocates; the grid is plain data, the same on every rank but `rank` and
 * the coordinates.
 *
 * The training loop (core/train/train.c) splits the world with it when
 * parallel.pipeline or parallel.tensor > 1: the pipeline schedule runs
 * over the pipeline group, the tensor-parallel scheme over the tensor
 * group, the data strategy over the data group, GPT-2's tied embedding
 * gradient is summed over the embedding group and the gradient norm over
 * the model group.
 */
#ifndef DT_TRAIN_GRID_H
#define DT_TRAIN_GRID_H

#include <stdint.h>

#include "dtrain/comm.h"

/* The groups of the grid, in the order dt_grid_split forms them. */
typedef enum dt_grid_group {
    DT_GRID_TENSOR = 0,    /* same (pp, dp): tp ranks */
    DT_GRID_PIPELINE = 1,  /* same (tp, dp): pp ranks, one per stage */
    DT_GRID_DATA = 2,      /* same (tp, pp): dp ranks */
    DT_GRID_EMBEDDING = 3, /* first and last stage of a pipeline group */
    DT_GRID_MODEL = 4,     /* same dp: the tp x pp ranks holding one model
                            * replica, over which a global gradient norm
                            * is summed */
    DT_GRID_N_GROUPS = 5
} dt_grid_group_t;

typedef struct dt_grid {
    int32_t world, tp, pp, dp;            /* degrees: world = tp * pp * dp */
    int32_t rank;                         /* this rank in the world */
    int32_t tp_rank, pp_rank, dp_rank;    /* its coordinates */
} dt_grid_t;

/* The grid of `world` ranks at tensor degree `tp` and pipeline degree `pp`
 * (the config's parallel.tensor and parallel.pipeline), seen from `rank`.
 * DT_ERR_CONFIG when a degree is < 1 or tp * pp does not divide the world
 * ("parallel.tensor = 2 x parallel.pipeline = 3 = 6 ranks per model
 * replica does not divide the world of 8 ranks"); DT_ERR_INVALID for a
 * world < 1 or a rank outside it. */
int dt_grid_init(dt_grid_t *g, int32_t world, int32_t rank, int64_t tp,
                 int64_t pp);

/* The world rank at coordinates (tp_rank, pp_rank, dp_rank), or -1 when
 * one is outside the grid. */
int32_t dt_grid_rank_at(const dt_grid_t *g, int32_t tp_rank, int32_t pp_rank,
                        int32_t dp_rank);

/* The color and key this rank passes to the comm plugin's split to form
 * group `which` (color DT_COMM_NO_COLOR: the rank joins no such group,
 * a middle stage's embedding group). */
void dt_grid_split_args(const dt_grid_t *g, dt_grid_group_t which,
                        int32_t *color, int32_t *key);

/* The world ranks of this rank's group `which`, in group-rank order, into
 * out[cap]: their count (0 for no group; at most max(tp, pp, dp) and 2
 * for the embedding group).  Only the first `cap` are written. */
int32_t dt_grid_members(const dt_grid_t *g, dt_grid_group_t which,
                        int32_t *out, int32_t cap);

/* "tensor", "pipeline", "data", "embedding", "model". */
const char *dt_grid_group_name(dt_grid_group_t which);

/* Collective over `world` (every rank of it calls this with its grid):
 * split it into this rank's four groups, out[DT_GRID_TENSOR] ...
 * out[DT_GRID_EMBEDDING] (NULL where it joins none).  On failure the
 * groups already made are finalized, every out[] is NULL, and the message
 * names the group ("process grid: splitting the pipeline groups: ..."). */
int dt_grid_split(const dt_grid_t *g, dt_comm_t *world, dt_comm_t *out[DT_GRID_N_GROUPS]);

#endif /* DT_TRAIN_GRID_H */
