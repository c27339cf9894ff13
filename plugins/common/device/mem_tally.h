/*
 * plugins/common/device/mem_tally.h - a device's memory accounting by tag:
 * bytes live and their peaks per dt_mem_tag_t and in total, the budget
 * refusal that lists what is in use, and the dt_mem_stats_t a device's
 * mem_stats returns, so that every device plugin (cpu, cuda, third-party
 * ones) counts and says it the same way:
 *
 *     out of memory budget: allocating 3.0 MiB (3145728 bytes) for grads
 *     would bring the total to 4.0 MiB, over memory_limit 3.5 MiB (in use:
 *     params 1.0 MiB)
 *
 * Pure bookkeeping: nothing allocated, not thread safe (the device holds
 * its allocator's lock around every call).  Tags are the caller's to
 * check (0 <= tag < DT_TAG_COUNT) before they reach a tally.
 *
 * In-tree only, not installed: part of dtrain_common_device, the static,
 * hidden-visibility library the in-tree device plugins link
 * (plugins/common/CMakeLists.txt); it changes with them and follows the SDK
 * helpers' conventions (dtrain/sdk_helpers.h).
 */
#ifndef DT_COMMON_MEM_TALLY_H
#define DT_COMMON_MEM_TALLY_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One kind of memory (device memory, or pinned host memory), in bytes the
 * callers asked for.  Zero-initialise it to start. */
typedef struct dt_mem_tally {
    uint64_t current[DT_TAG_CAPACITY]; /* live now, per tag */
    uint64_t peak[DT_TAG_CAPACITY];    /* highest current[tag] */
    uint64_t total_current;            /* sum of current */
    uint64_t total_peak;               /* highest total_current (not the sum
                                        * of peaks) */
} dt_mem_tally_t;

/* `bytes` of `tag` allocated: current, total and their peaks. */
void dt_mem_tally_add(dt_mem_tally_t *m, int tag, uint64_t bytes);
/* `bytes` of `tag` freed (as many as were added for the block). */
void dt_mem_tally_sub(dt_mem_tally_t *m, int tag, uint64_t bytes);
/* Every peak := its current (the device's mem_reset_peaks). */
void dt_mem_tally_reset_peaks(dt_mem_tally_t *m);

/* What a device's mem_stats returns: device memory from `dev`, pinned host
 * memory from `pinned` (NULL: none), the budget `limit` (0: none),
 * n_tags = DT_TAG_COUNT and struct_size = sizeof *out. */
void dt_mem_tally_stats(const dt_mem_tally_t *dev, const dt_mem_tally_t *pinned,
                        uint64_t limit, dt_mem_stats_t *out);

/* "512 B", "4.0 KiB", "12.5 MiB", "3.2 GiB" into buf; returns buf. */
const char *dt_mem_fmt_bytes(char buf[32], uint64_t bytes);

/* What is in use, tag by tag, into buf (cut to cap): "params 1.0 MiB,
 * grads 3.0 MiB", or "nothing" when no tag holds bytes; returns buf. */
const char *dt_mem_tally_in_use_text(const dt_mem_tally_t *m, char *buf, size_t cap);

/* The budget refusal of `bytes` for `tag` over `limit`, into buf (cut to
 * cap): "out of memory budget: allocating 3.0 MiB (3145728 bytes) for
 * grads would bring the total to 4.0 MiB, over memory_limit 3.5 MiB (in
 * use: params 1.0 MiB)"; "(in use: nothing)" when no tag holds bytes. */
void dt_mem_tally_budget_text(const dt_mem_tally_t *m, uint64_t bytes, int tag,
                              uint64_t limit, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* DT_COMMON_MEM_TALLY_H */
