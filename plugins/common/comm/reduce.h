/*
 * plugins/common/comm/reduce.h - the elementwise reduction kernels and copies a
 * host-memory communicator's collectives run (shm, tcp).  Pure arithmetic
 * on buffers: nothing here knows about groups, segments or sockets.
 *
 * In-tree only, not installed: part of dtrain_common_comm, the static,
 * hidden-visibility library the in-tree communicators link
 * (plugins/common/CMakeLists.txt); it changes with them and follows the SDK
 * helpers' conventions (dtrain/sdk_helpers.h).
 */
#ifndef DT_COMMON_REDUCE_H
#define DT_COMMON_REDUCE_H

#include <stddef.h>

/* dst[i] = op over srcs[0..n-1][i] in that order, accumulated in f32 for
 * f32/bf16/f16 (rounded once to nearest even), f64 for f64, wrapping
 * integer arithmetic for integers.  AVG divides the sum by `group`
 * (integers: unsupported, checked earlier).  dst may alias any src.
 * (count) elements each; dtype a dt_dtype_t, op a dt_reduce_op_t. */
void dt_reduce(void *dst, const void *const *srcs, int nsrc, size_t count,
                int dtype, int op, int group);
/* dt_reduce into dst, and the same result copied into dst2 (a user
 * buffer, may be NULL) while it is hot; `streaming` as in dt_reduce_copy_out. */
void dt_reduce2(void *dst, void *dst2, const void *const *srcs, int nsrc, size_t count,
                 int dtype, int op, int group, int streaming);
/* memcpy src into dst (shared memory) and, when dst2 is not NULL, into
 * dst2 (a user buffer) from the freshly written, cache-hot dst. */
void dt_reduce_copy2(void *dst, void *dst2, const void *src, size_t n, int streaming);
/* memcpy into a user buffer; `streaming` (for messages far larger than
 * the caches) uses non-temporal stores where the CPU has them. */
void dt_reduce_copy_out(void *dst, const void *src, size_t n, int streaming);
/* Messages at least this large are copied out with streaming stores. */
#define DT_REDUCE_STREAM_MIN (16ull << 20)

#endif /* DT_COMMON_REDUCE_H */
