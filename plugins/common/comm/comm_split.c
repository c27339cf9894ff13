/*
 * plugins/common/comm/comm_split.c - split membership: every rank's {color,
 * key} gathered, the ranks of one color ordered by (key, old rank) (see
 * plugins/common/comm/comm_split.h).
 */
#include "common/comm/comm_split.h"

#include <stdlib.h>
#include <string.h>

#include "dtrain/tensor.h"

int dt_comm_split_check(const dt_host_v1_t *h, const char *gname, int32_t color,
                        dt_comm_t **out)
{
    if (!out)
        return h->set_error(h, DT_ERR_INVALID, "split of group %s: NULL out", gname);
    *out = NULL;
    if (color < 0 && color != DT_COMM_NO_COLOR)
        return h->set_error(h, DT_ERR_INVALID, "split of group %s: color %d must be >= 0 "
                            "or DT_COMM_NO_COLOR", gname, (int)color);
    return DT_OK;
}

static int cmp_member(const void *a, const void *b)
{
    const int32_t *x = a, *y = b; /* {key, old rank} */
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

int32_t dt_comm_split_members(const int32_t *all, int32_t size, int32_t color,
                              int32_t self, int32_t *members, int32_t *new_rank)
{
    int32_t n = 0;
    for (int32_t p = 0; p < size; p++)
        if (all[2 * p] == color) {
            members[2 * n] = all[2 * p + 1];
            members[2 * n + 1] = p;
            n++;
        }
    qsort(members, (size_t)n, sizeof(int32_t) * 2, cmp_member);
    *new_rank = -1;
    for (int32_t i = 0; i < n; i++) {
        members[i] = members[2 * i + 1]; /* i <= 2 i + 1: read before written */
        if (members[i] == self)
            *new_rank = i;
    }
    return n;
}

int dt_comm_split_gather(const dt_host_v1_t *h, dt_comm_all_gather_fn all_gather,
                         dt_comm_t *c, const char *gname, int32_t size, int32_t rank,
                         int32_t color, int32_t key, dt_comm_split_t *s)
{
    memset(s, 0, sizeof *s);
    s->rank = -1;
    int32_t mine[2] = {color, key};
    int32_t *all = malloc(sizeof(int32_t) * 2 * (size_t)size);
    int32_t *members = malloc(sizeof(int32_t) * 2 * (size_t)size);
    if (!all || !members) {
        free(all);
        free(members);
        return h->set_error(h, DT_ERR_NOMEM, "split of group %s: out of memory", gname);
    }
    int st = all_gather(c, mine, all, 2, DT_I32, NULL, NULL);
    if (st != DT_OK || color == DT_COMM_NO_COLOR) {
        free(all);
        free(members);
        return st;
    }
    s->size = dt_comm_split_members(all, size, color, rank, members, &s->rank);
    s->members = members;
    free(all);
    return DT_OK;
}

void dt_comm_split_free(dt_comm_split_t *s)
{
    free(s->members);
    s->members = NULL;
}
