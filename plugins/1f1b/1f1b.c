/*
 * plugins/1f1b/1f1b.c - the `1f1b` pipeline schedule: warm-up forwards,
 * then one forward one backward, then the remaining backwards
 * (PipeDream-Flush, Megatron's default), a stage keeping at most the
 * stage count of micro-batches in flight; with [pipeline] virtual_stages
 * > 1 Megatron's interleaved 1F1B.  The order and the transfers are the
 * shared pipeline library's (plugins/pipeline/pipeline.h).
 */
#include "pipeline.h"

PP_SCHEDULE_PLUGIN(one_f_one_b, 1F1B, "1f1b",
                   "pipeline schedule: one forward one backward (1F1B), interleaved with "
                   "virtual_stages")
