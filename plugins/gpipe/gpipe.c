/*
 * plugins/gpipe/gpipe.c - the `gpipe` pipeline schedule: each stage runs
 * every micro-batch's forward, then every backward (GPipe), keeping the
 * activations of all of them in flight; with [pipeline] virtual_stages > 1
 * the same over interleaved chunks.  The order and the transfers are the
 * shared pipeline library's (plugins/pipeline/pipeline.h).
 */
#include "pipeline.h"

PP_SCHEDULE_PLUGIN(gpipe, GPIPE, "gpipe",
                   "pipeline schedule: every forward, then every backward (GPipe)")
