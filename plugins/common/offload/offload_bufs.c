/*
 * plugins/common/offload/offload_bufs.c - the live buffers of an offload
 * tier: the alloc checks (tag, capacity), marks, numbering, the byte count,
 * and a free that waits for the buffer's transfers.  See
 * plugins/common/offload/offload_bufs.h.
 */
#include "common/offload/offload_bufs.h"

#include <string.h>

void offload_bufs_init(offload_bufs_t *l, offload_queue_t *q, uint32_t magic, const char *section,
                       const char *unit, uint64_t capacity, offload_bufs_release_fn release,
                       void *ctx)
{
    *l = (offload_bufs_t){.q = q, .magic = magic, .section = section, .unit = unit,
                        .capacity = capacity, .release = release, .ctx = ctx};
}

void offload_bufs_usage(offload_bufs_t *l, uint64_t *used, uint32_t *n)
{
    pthread_mutex_lock(&l->q->mu);
    if (used)
        *used = l->used;
    if (n)
        *n = l->n;
    pthread_mutex_unlock(&l->q->mu);
}

int offload_bufs_check(offload_bufs_t *l, uint64_t bytes, uint64_t align, int tag, uint64_t *held)
{
    const dt_host_v1_t *host = l->q->host;
    if (tag < 0 || tag >= DT_TAG_COUNT)
        return host->set_error(host, DT_ERR_INVALID, "alloc: tag %d is not a dt_mem_tag_t "
                               "(0..%d)", tag, DT_TAG_COUNT - 1);
    if (align < 1)
        align = 1;
    if (bytes > UINT64_MAX - (align - 1))
        return host->set_error(host, DT_ERR_NOMEM, "rank %d: alloc: %llu bytes for %s cannot "
                               "be held (rounded up to a multiple of %llu they overflow)",
                               l->q->rank, (unsigned long long)bytes, dt_mem_tag_name(tag),
                               (unsigned long long)align);
    *held = (bytes + align - 1) / align * align;
    uint64_t used;
    uint32_t n;
    offload_bufs_usage(l, &used, &n);
    if (l->capacity && (*held > l->capacity || used > l->capacity - *held))
        return host->set_error(host, DT_ERR_NOMEM,
                               "rank %d: alloc: %llu bytes for %s would bring the tier to %llu "
                               "bytes, over [%s] capacity = %llu (in use: %llu bytes in %u %s)",
                               l->q->rank, (unsigned long long)*held, dt_mem_tag_name(tag),
                               (unsigned long long)(used + *held), l->section,
                               (unsigned long long)l->capacity, (unsigned long long)used, n,
                               l->unit);
    return DT_OK;
}

void offload_bufs_prepare(offload_bufs_t *l, offload_buf_t *b, uint64_t bytes, uint64_t held,
                          int tag)
{
    b->magic = 0;
    b->bytes = bytes;
    b->held = held;
    b->tag = tag;
    b->pending = 0;
    b->prev = b->next = NULL;
    pthread_mutex_lock(&l->q->mu);
    b->id = ++l->next_id;
    pthread_mutex_unlock(&l->q->mu);
}

void offload_bufs_link(offload_bufs_t *l, offload_buf_t *b)
{
    pthread_mutex_lock(&l->q->mu);
    b->magic = l->magic;
    b->prev = NULL;
    b->next = l->head;
    if (l->head)
        l->head->prev = b;
    l->head = b;
    l->used += b->held;
    l->n++;
    pthread_mutex_unlock(&l->q->mu);
}

int offload_bufs_live(offload_bufs_t *l, const void *buf, const char *op)
{
    const offload_buf_t *b = buf;
    if (b && b->magic == l->magic)
        return DT_OK;
    return l->q->host->set_error(l->q->host, DT_ERR_INVALID,
                                 "%s: %p is not a buffer of this tier (or was freed)", op, buf);
}

/* Off the list, unmarked, given back (mu held, or no transfer left). */
static void release(offload_bufs_t *l, offload_buf_t *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        l->head = b->next;
    if (b->next)
        b->next->prev = b->prev;
    l->used -= b->held;
    l->n--;
    b->magic = 0;
    l->release(l->ctx, b);
}

int offload_bufs_free(offload_bufs_t *l, offload_buf_t *b, const char *name)
{
    if (!b)
        return DT_OK;
    int rc = offload_bufs_live(l, b, "free");
    if (rc != DT_OK)
        return rc;
    offload_queue_t *q = l->q;
    pthread_mutex_lock(&q->mu);
    rc = offload_queue_wait_zero_locked(q, &b->pending, -1);
    if (rc == DT_OK)
        release(l, b);
    pthread_mutex_unlock(&q->mu);
    if (rc != DT_OK)
        return q->host->set_error(q->host, rc, "rank %d: free: %s still has transfers running "
                                  "after %lld ms; not freed", q->rank, name,
                                  (long long)q->timeout_ms);
    return DT_OK;
}

int offload_bufs_drain(offload_bufs_t *l)
{
    int rc = DT_OK;
    pthread_mutex_lock(&l->q->mu);
    for (offload_buf_t *b = l->head; b && rc == DT_OK; b = b->next)
        rc = offload_queue_wait_zero_locked(l->q, &b->pending, -1);
    pthread_mutex_unlock(&l->q->mu);
    return rc;
}

void offload_bufs_release_all(offload_bufs_t *l)
{
    while (l->head)
        release(l, l->head);
}
