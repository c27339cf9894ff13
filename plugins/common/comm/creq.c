/*
 * plugins/common/comm/creq.c - the request base the in-tree communicators
 * share: its texts, checks and refusals, its allocation and the live list
 * (see creq.h).
 */
#include "common/comm/creq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/tensor.h"

void dt_creq_text(const dt_comm_names_t *g, const dt_creq_t *r, char *buf, size_t cap)
{
    dt_comm_op_desc_t d = dt_creq_desc(r);
    dt_comm_op_text(g, &d, buf, cap);
}

int dt_creq_check_op(const dt_host_v1_t *h, const dt_comm_names_t *g, dt_creq_t *t)
{
    t->esize = dt_dtype_size(t->dtype) ? dt_dtype_size(t->dtype) : 1;
    dt_comm_op_desc_t d = dt_creq_desc(t);
    int st = dt_comm_check_dtype(h, g, &d);
    if (st == DT_OK)
        st = dt_comm_check_reduce(h, g, &d);
    return st;
}

int dt_creq_refuse_broken(const dt_host_v1_t *h, const dt_comm_names_t *g, const dt_creq_t *t,
                          int status, const char *broken_msg)
{
    char desc[256];
    dt_creq_text(g, t, desc, sizeof desc);
    return h->set_error(h, status, "%s: not started: the group failed earlier: %s", desc,
                        broken_msg);
}

int dt_creq_refuse_failed(const dt_host_v1_t *h, const dt_comm_names_t *g, const dt_creq_t *t,
                          int status, const char *text)
{
    char desc[256];
    dt_creq_text(g, t, desc, sizeof desc);
    return h->set_error(h, status, "%s: not started: %s", desc, text);
}

void *dt_creq_new(const dt_host_v1_t *h, const dt_comm_names_t *g, const void *tmpl,
                  size_t size)
{
    void *r = malloc(size);
    if (!r) {
        char desc[256];
        dt_creq_text(g, tmpl, desc, sizeof desc);
        h->set_error(h, DT_ERR_NOMEM, "%s: out of memory for the request", desc);
        return NULL;
    }
    memcpy(r, tmpl, size);
    return r;
}

void dt_creq_live_add(dt_creq_t **live, dt_creq_t *r)
{
    r->live_prev = NULL;
    r->live_next = *live;
    if (*live)
        (*live)->live_prev = r;
    *live = r;
}

void dt_creq_live_remove(dt_creq_t **live, dt_creq_t *r)
{
    if (r->live_prev)
        r->live_prev->live_next = r->live_next;
    else if (*live == r)
        *live = r->live_next;
    if (r->live_next)
        r->live_next->live_prev = r->live_prev;
    r->live_prev = r->live_next = NULL;
}

int dt_creq_drop_live(dt_creq_t **live, void (*drop)(void *ctx, dt_creq_t *r), void *ctx)
{
    int n = 0;
    while (*live) {
        dt_creq_t *r = *live;
        dt_creq_live_remove(live, r);
        drop(ctx, r);
        n++;
    }
    return n;
}

void dt_creq_timeout_text(const char *desc, int64_t ms, int own_limit, const char *who,
                          char *buf, size_t cap)
{
    snprintf(buf, cap, "%s: timed out after %.1f s%s waiting for %s", desc,
             (double)ms / 1000.0, own_limit ? " (the wait's limit)" : "", who);
}
