/*
 * plugins/shm/shm_reduce.h - the elementwise reduction kernels and copies
 * the collectives run (shm_reduce.c).  Pure arithmetic on buffers: nothing
 * here knows about groups or segments.
 */
#ifndef DT_SHM_REDUCE_H
#define DT_SHM_REDUCE_H

#include <stddef.h>

/* dst[i] = op over srcs[0..n-1][i] in that order, accumulated in f32 for
 * f32/bf16/f16 (rounded once to nearest even), f64 for f64, wrapping
 * integer arithmetic for integers.  AVG divides the sum by `group`
 * (integers: unsupported, checked earlier).  dst may alias any src.
 * (count) elements each; dtype a dt_dtype_t, op a dt_reduce_op_t. */
void shm_reduce(void *dst, const void *const *srcs, int nsrc, size_t count,
                int dtype, int op, int group);
/* shm_reduce into dst, and the same result copied into dst2 (a user
 * buffer, may be NULL) while it is hot; `streaming` as in shm_copy_out. */
void shm_reduce2(void *dst, void *dst2, const void *const *srcs, int nsrc, size_t count,
                 int dtype, int op, int group, int streaming);
/* memcpy src into dst (shared memory) and, when dst2 is not NULL, into
 * dst2 (a user buffer) from the freshly written, cache-hot dst. */
void shm_copy2(void *dst, void *dst2, const void *src, size_t n, int streaming);
/* memcpy into a user buffer; `streaming` (for messages far larger than
 * the caches) uses non-temporal stores where the CPU has them. */
void shm_copy_out(void *dst, const void *src, size_t n, int streaming);
/* Messages at least this large are copied out with streaming stores. */
#define SHM_STREAM_MIN (16ull << 20)

#endif /* DT_SHM_REDUCE_H */
