/*
 * core/interpose/ledger.c - the collective ledger (ledger.h): the ring and
 * the group table each rank records into, their encoding, and the
 * comparison of the ranks' ledgers that names the first call where they
 * differ.
 */
#include "interpose/ledger.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "interpose/interpose.h"
#include "util/crash.h"
#include "util/error.h"

_Static_assert((DT_LEDGER_K & (DT_LEDGER_K - 1)) == 0, "DT_LEDGER_K is a power of two");

#define LEDGER_MAGIC 0x444c4731u /* "DLG1" */
#define HEADER_BYTES 16
#define GROUP_BYTES 16
#define ENTRY_BYTES 48
_Static_assert(DT_LEDGER_BLOB_MAX ==
                   HEADER_BYTES + DT_LEDGER_GROUPS * GROUP_BYTES + DT_LEDGER_K * ENTRY_BYTES,
               "DT_LEDGER_BLOB_MAX follows the encoding");

typedef struct slot {
    const void *handle; /* NULL: finalized (kept for its key and size) */
    dt_ledger_group_t g;
    uint32_t splits;    /* splits of this group so far */
    int used;
} slot_t;

struct dt_ledger {
    _Atomic uint64_t head;              /* calls recorded */
    dt_ledger_entry_t ring[DT_LEDGER_K];
    slot_t groups[DT_LEDGER_GROUPS];
    int32_t rank, size;
    int joined;                         /* the world group's init succeeded */
    _Atomic int failed;
};

dt_ledger_t *dt_ledger_create(int32_t rank, int32_t size)
{
    dt_ledger_t *l = calloc(1, sizeof *l);
    if (!l) {
        dt_err_set(DT_ERR_NOMEM, "collective ledger: out of memory");
        return NULL;
    }
    atomic_init(&l->head, 0);
    atomic_init(&l->failed, DT_OK);
    l->rank = rank;
    l->size = size;
    return l;
}

void dt_ledger_free(dt_ledger_t *l) { free(l); }

int32_t dt_ledger_rank(const dt_ledger_t *l) { return l->rank; }
int32_t dt_ledger_size(const dt_ledger_t *l) { return l->size; }

/* ---- groups ---- */

static slot_t *find(dt_ledger_t *l, const void *handle)
{
    for (int i = 0; i < DT_LEDGER_GROUPS && l->groups[i].used; i++)
        if (l->groups[i].handle == handle)
            return &l->groups[i];
    return NULL;
}

void dt_ledger_group_add(dt_ledger_t *l, const void *handle, uint32_t key, int32_t rank,
                         int32_t size)
{
    if (!handle)
        return;
    slot_t *s = find(l, handle);
    for (int i = 0; i < DT_LEDGER_GROUPS && !s; i++)
        if (!l->groups[i].used)
            s = &l->groups[i];
    for (int i = 0; i < DT_LEDGER_GROUPS && !s; i++)
        if (!l->groups[i].handle) /* a finalized group's place */
            s = &l->groups[i];
    if (!s)
        return; /* its calls are recorded under DT_LEDGER_UNKNOWN */
    *s = (slot_t){.handle = handle, .g = {.key = key, .rank = rank, .size = size}, .used = 1};
    if (key == DT_LEDGER_WORLD) {
        l->rank = rank;
        l->size = size;
        l->joined = 1;
    }
}

uint32_t dt_ledger_split_key(uint32_t parent, uint32_t split_no, int32_t color)
{
    /* FNV-1a over the three numbers; never the world's or the unknown key */
    uint32_t h = 2166136261u, v[3] = {parent, split_no, (uint32_t)color};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (v[i] >> (8 * b)) & 0xffu;
            h *= 16777619u;
        }
    return h == DT_LEDGER_WORLD || h == DT_LEDGER_UNKNOWN ? 1u : h;
}

uint32_t dt_ledger_split_count(dt_ledger_t *l, const void *handle, uint32_t *parent_key)
{
    slot_t *s = find(l, handle);
    if (!s)
        return 0;
    *parent_key = s->g.key;
    return ++s->splits;
}

void dt_ledger_group_remove(dt_ledger_t *l, const void *handle)
{
    slot_t *s = handle ? find(l, handle) : NULL;
    if (s)
        s->handle = NULL;
}

const void *dt_ledger_world(const dt_ledger_t *l)
{
    for (int i = 0; i < DT_LEDGER_GROUPS && l->groups[i].used; i++)
        if (l->groups[i].g.key == DT_LEDGER_WORLD && l->groups[i].handle)
            return l->groups[i].handle;
    return NULL;
}

/* ---- recording ---- */

void dt_ledger_record(dt_ledger_t *l, const void *handle, int collective, dt_ledger_entry_t *e)
{
    slot_t *s = find(l, handle);
    e->group = s ? s->g.key : DT_LEDGER_UNKNOWN;
    e->seq = s && collective ? ++s->g.calls : 0;
    dt_crash_where_t w;
    dt_crash_where(&w);
    e->step = w.step;
    e->micro = (int32_t)w.micro;
    e->unit = (int32_t)w.unit;
    uint64_t at = atomic_fetch_add_explicit(&l->head, 1, memory_order_relaxed);
    l->ring[at & (DT_LEDGER_K - 1)] = *e;
}

int dt_ledger_failed(const dt_ledger_t *l)
{
    return atomic_load_explicit(&((dt_ledger_t *)l)->failed, memory_order_relaxed);
}

int dt_ledger_joined(const dt_ledger_t *l) { return l->joined; }

void dt_ledger_note_failure(dt_ledger_t *l, int status)
{
    int expect = DT_OK;
    if (status != DT_OK)
        atomic_compare_exchange_strong(&l->failed, &expect, status);
}

/* ---- encoding ---- */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

size_t dt_ledger_encode(const dt_ledger_t *l, uint8_t *out, size_t cap)
{
    if (cap < DT_LEDGER_BLOB_MAX)
        return 0;
    uint32_t ng = 0;
    while (ng < DT_LEDGER_GROUPS && l->groups[ng].used)
        ng++;
    uint64_t head = atomic_load_explicit(&((dt_ledger_t *)l)->head, memory_order_relaxed);
    uint32_t ne = head < DT_LEDGER_K ? (uint32_t)head : DT_LEDGER_K;
    put32(out, LEDGER_MAGIC);
    put32(out + 4, (uint32_t)l->rank);
    put32(out + 8, (uint32_t)l->size);
    uint32_t failed = (uint32_t)dt_ledger_failed(l) & 0xffu;
    put32(out + 12, ng | ne << 8 | failed << 16);
    uint8_t *p = out + HEADER_BYTES;
    for (uint32_t i = 0; i < ng; i++, p += GROUP_BYTES) {
        const dt_ledger_group_t *g = &l->groups[i].g;
        put32(p, g->key);
        put32(p + 4, (uint32_t)g->rank);
        put32(p + 8, (uint32_t)g->size);
        put32(p + 12, g->calls);
    }
    for (uint32_t i = 0; i < ne; i++, p += ENTRY_BYTES) {
        const dt_ledger_entry_t *e = &l->ring[(head - ne + i) & (DT_LEDGER_K - 1)];
        put64(p, e->seq);
        put64(p + 8, e->count);
        put64(p + 16, (uint64_t)e->step);
        put32(p + 24, (uint32_t)e->micro);
        put32(p + 28, (uint32_t)e->unit);
        put32(p + 32, e->group);
        put32(p + 36, (uint32_t)e->peer);
        p[40] = e->slot;
        p[41] = (uint8_t)e->dtype;
        p[42] = (uint8_t)e->reduce_op;
        memset(p + 43, 0, ENTRY_BYTES - 43);
    }
    return (size_t)(p - out);
}

int dt_ledger_decode(const uint8_t *in, size_t bytes, dt_ledger_view_t *v)
{
    memset(v, 0, sizeof *v);
    if (bytes < HEADER_BYTES || get32(in) != LEDGER_MAGIC)
        return dt_err_set(DT_ERR_INVALID, "collective ledger: not a ledger (%zu bytes)", bytes);
    v->rank = (int32_t)get32(in + 4);
    v->size = (int32_t)get32(in + 8);
    v->n_groups = get32(in + 12) & 0xffu;
    v->n_entries = (get32(in + 12) >> 8) & 0xffu;
    v->failed = (int32_t)((get32(in + 12) >> 16) & 0xffu);
    if (v->n_groups > DT_LEDGER_GROUPS || v->n_entries > DT_LEDGER_K ||
        bytes != HEADER_BYTES + v->n_groups * GROUP_BYTES + v->n_entries * ENTRY_BYTES)
        return dt_err_set(DT_ERR_INVALID, "collective ledger: %u groups and %u calls in %zu "
                          "bytes", v->n_groups, v->n_entries, bytes);
    const uint8_t *p = in + HEADER_BYTES;
    for (uint32_t i = 0; i < v->n_groups; i++, p += GROUP_BYTES)
        v->groups[i] = (dt_ledger_group_t){.key = get32(p), .rank = (int32_t)get32(p + 4),
                                           .size = (int32_t)get32(p + 8),
                                           .calls = get32(p + 12)};
    for (uint32_t i = 0; i < v->n_entries; i++, p += ENTRY_BYTES) {
        dt_ledger_entry_t *e = &v->entries[i];
        e->seq = get64(p);
        e->count = get64(p + 8);
        e->step = (int64_t)get64(p + 16);
        e->micro = (int32_t)get32(p + 24);
        e->unit = (int32_t)get32(p + 28);
        e->group = get32(p + 32);
        e->peer = (int32_t)get32(p + 36);
        e->slot = p[40];
        e->dtype = (int8_t)p[41];
        e->reduce_op = (int8_t)p[42];
    }
    return DT_OK;
}

/* ---- text ---- */

typedef struct text {
    char *buf;
    size_t cap, n;
} text_t;

__attribute__((format(printf, 2, 3))) static void add(text_t *t, const char *fmt, ...)
{
    if (t->n >= t->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->buf + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    if (k > 0)
        t->n = t->n + (size_t)k < t->cap ? t->n + (size_t)k : t->cap - 1;
}

static const char *slot_name(unsigned slot)
{
#define LG_NAME(up, field, flags) #field,
    static const char *const names[] = {DT_INTERPOSE_COMM_SLOTS(LG_NAME)};
#undef LG_NAME
    return slot < sizeof names / sizeof names[0] ? names[slot] : "?";
}

static const char *redop_name(int op)
{
    static const char *const n[] = {"sum", "avg", "max", "min"};
    return op >= 0 && op < 4 ? n[op] : "?";
}

/* 4096, 12.3K, 1.2M, 3.4G */
static void count_text(uint64_t c, char *buf, size_t cap)
{
    if (c < 10000) {
        snprintf(buf, cap, "%llu", (unsigned long long)c);
        return;
    }
    const char *unit = "K";
    double v = (double)c / 1e3;
    if (v >= 1000) {
        v /= 1e3;
        unit = "M";
    }
    if (v >= 1000) {
        v /= 1e3;
        unit = "G";
    }
    snprintf(buf, cap, "%.1f%s", v, unit);
}

void dt_ledger_call_text(const dt_ledger_entry_t *e, const char *group_name, char *buf,
                         size_t cap)
{
    text_t t = {buf, cap, 0};
    char cnt[32], gname[32];
    count_text(e->count, cnt, sizeof cnt);
    if (!group_name) {
        snprintf(gname, sizeof gname, "group %08x", e->group);
        group_name = gname;
    }
    add(&t, "%s(", slot_name(e->slot));
    switch (e->slot) {
    case DT_ICOMM_BARRIER:
        break;
    case DT_ICOMM_SPLIT:
        break;
    case DT_ICOMM_SYM_ALLOC:
        add(&t, "%s bytes, ", cnt);
        break;
    default:
        add(&t, "%s, %s, ", dt_dtype_name(e->dtype), cnt);
        if (e->reduce_op >= 0)
            add(&t, "%s, ", redop_name(e->reduce_op));
        if (e->peer >= 0)
            add(&t, "%s %d, ",
                e->slot == DT_ICOMM_BROADCAST || e->slot == DT_ICOMM_REDUCE ? "root" : "peer",
                (int)e->peer);
    }
    add(&t, "%s)", group_name);
}

/* " at step 3, micro-batch 0, unit 2" */
static void where_text(text_t *t, const dt_ledger_entry_t *e)
{
    if (e->step > 0) {
        add(t, " at step %lld", (long long)e->step);
        if (e->micro >= 0)
            add(t, ", micro-batch %d", (int)e->micro);
        if (e->unit >= 0)
            add(t, ", unit %d", (int)e->unit);
    } else if (e->unit >= 0) {
        add(t, " before the first step, at unit %d", (int)e->unit);
    } else {
        add(t, " before the first step");
    }
}

/* "rank 3" / "ranks 0-2, 5" of the ranks with mark[r] == want. */
static void ranks_text(text_t *t, const int *mark, int n, int want)
{
    int count = 0;
    for (int r = 0; r < n; r++)
        count += mark[r] == want;
    add(t, count == 1 ? "rank " : "ranks ");
    int first = 1;
    for (int r = 0; r < n; r++) {
        if (mark[r] != want)
            continue;
        int e = r;
        while (e + 1 < n && mark[e + 1] == want)
            e++;
        add(t, "%s%d", first ? "" : ", ", r);
        if (e > r)
            add(t, e == r + 1 ? ", %d" : "-%d", e);
        first = 0;
        r = e;
    }
}

/* ---- comparing ---- */

static const dt_ledger_group_t *group_of(const dt_ledger_view_t *v, uint32_t key)
{
    for (uint32_t i = 0; i < v->n_groups; i++)
        if (v->groups[i].key == key)
            return &v->groups[i];
    return NULL;
}

static const dt_ledger_entry_t *entry_of(const dt_ledger_view_t *v, uint32_t key, uint64_t seq)
{
    for (uint32_t i = v->n_entries; i-- > 0;)
        if (v->entries[i].group == key && v->entries[i].seq == seq)
            return &v->entries[i];
    return NULL;
}

static int same_call(const dt_ledger_entry_t *a, const dt_ledger_entry_t *b)
{
    if (a->slot != b->slot)
        return 0;
    if (a->slot == DT_ICOMM_SPLIT) /* colors and keys differ by design */
        return 1;
    return a->count == b->count && a->dtype == b->dtype && a->reduce_op == b->reduce_op &&
           a->peer == b->peer;
}

/* The group's name for messages: "world group", "group of ranks 1, 3". */
static void group_name(const dt_ledger_view_t *const *views, int n, uint32_t key, char *buf,
                       size_t cap)
{
    if (key == DT_LEDGER_WORLD) {
        snprintf(buf, cap, "world group");
        return;
    }
    int *mark = calloc((size_t)n, sizeof *mark);
    int32_t size = -1, members = 0;
    for (int r = 0; r < n && mark; r++) {
        const dt_ledger_group_t *g = views[r] ? group_of(views[r], key) : NULL;
        if (g) {
            mark[r] = 1;
            size = g->size;
            members++;
        }
    }
    text_t t = {buf, cap, 0};
    if (!mark || !members) {
        add(&t, "group %08x", key);
    } else {
        add(&t, "group of ");
        ranks_text(&t, mark, n, 1);
        if (size > members)
            add(&t, " and %d more", (int)(size - members));
    }
    free(mark);
}

/* A divergence found in one group: at call `seq` the members' entries
 * (NULL: issued nothing after seq - 1). */
typedef struct found {
    int any;
    uint32_t key;
    uint64_t seq;
    int64_t step;  /* earliest step among the entries */
    int has_none;
    int members;
} found_t;

static int better(const found_t *a, const found_t *b)
{
    if (!b->any)
        return 1;
    if (a->step != b->step)
        return a->step < b->step;
    if (a->has_none != b->has_none)
        return a->has_none < b->has_none;
    return a->members > b->members; /* the wider group: its members wait on it */
}

/* The first call of group `key` where its members differ, or none. */
static found_t diverge_in(const dt_ledger_view_t *const *views, int n, uint32_t key)
{
    found_t f = {0};
    uint64_t start = 1, end = 0;
    int members = 0, size = 0;
    for (int r = 0; r < n; r++) {
        const dt_ledger_group_t *g = views[r] ? group_of(views[r], key) : NULL;
        if (!g)
            continue;
        members++;
        size = g->size > size ? g->size : size;
        uint64_t lo = (uint64_t)g->calls + 1;
        for (uint32_t i = 0; i < views[r]->n_entries; i++) {
            const dt_ledger_entry_t *e = &views[r]->entries[i];
            if (e->group == key && e->seq && e->seq < lo)
                lo = e->seq;
        }
        start = lo > start ? lo : start;
        end = g->calls > end ? g->calls : end;
    }
    if (members < 2)
        return f;
    /* a member gone (it sent no ledger): the group broke under the others
     * wherever each one was, so one stopping a call before another is no
     * divergence; only different calls at one number are */
    int whole = members >= size;
    for (uint64_t s = start; s <= end; s++) {
        const dt_ledger_entry_t *ref = NULL;
        int differ = 0, none = 0;
        int64_t step = INT64_MAX;
        for (int r = 0; r < n; r++) {
            const dt_ledger_group_t *g = views[r] ? group_of(views[r], key) : NULL;
            if (!g)
                continue;
            const dt_ledger_entry_t *e = s <= g->calls ? entry_of(views[r], key, s) : NULL;
            if (s <= g->calls && !e)
                continue; /* no longer kept: not comparable */
            if (e && e->step < step)
                step = e->step;
            none |= !e;
            if (e && !ref)
                ref = e;
            else if (e && !same_call(e, ref))
                differ = 1;
        }
        if (none && ref && whole)
            differ = 1; /* one issued it, another nothing */
        if (differ) {
            f = (found_t){.any = 1, .key = key, .seq = s, .step = step, .has_none = none,
                          .members = members};
            return f;
        }
    }
    return f;
}

/* " (rank 0's last: all_reduce(...) #41 at step 5)"; a point-to-point
 * call has no number */
static void last_text(text_t *t, const dt_ledger_view_t *const *views, int n)
{
    for (int r = 0; r < n; r++) {
        if (!views[r])
            continue;
        if (!views[r]->n_entries) {
            add(t, " (rank %d issued no call)", r);
            return;
        }
        const dt_ledger_entry_t *e = &views[r]->entries[views[r]->n_entries - 1];
        char gn[200], call[320];
        group_name(views, n, e->group, gn, sizeof gn);
        dt_ledger_call_text(e, gn, call, sizeof call);
        add(t, " (rank %d's last: %s", r, call);
        if (e->seq)
            add(t, " #%llu", (unsigned long long)e->seq);
        where_text(t, e);
        add(t, ")");
        return;
    }
}

int dt_ledger_compare(const dt_ledger_view_t *const *views, int n, const char *missing_why,
                      char *out, size_t cap)
{
    text_t t = {out, cap, 0};
    out[0] = '\0';
    int *mark = calloc((size_t)n + 1, sizeof *mark);
    if (!mark) {
        add(&t, "ledger: not compared (out of memory)");
        return DT_LEDGER_AGREE;
    }
    /* every group any rank knows, the first divergence of each */
    found_t best = {0};
    for (int r = 0; r < n; r++) {
        if (!views[r])
            continue;
        for (uint32_t i = 0; i < views[r]->n_groups; i++) {
            uint32_t key = views[r]->groups[i].key;
            int seen = 0;
            for (int q = 0; q < r && !seen; q++)
                seen = views[q] && group_of(views[q], key);
            if (seen || key == DT_LEDGER_UNKNOWN)
                continue;
            found_t f = diverge_in(views, n, key);
            if (f.any && better(&f, &best))
                best = f;
        }
    }
    int rc = DT_LEDGER_AGREE;
    if (best.any) {
        /* the members' calls in classes: mark[r] = class + 1 (0: not a
         * member); classes in order of first appearance */
        const dt_ledger_entry_t *cls[64];
        int n_cls = 0, size_cls[64] = {0};
        uint32_t none_calls = 0; /* the most calls a member issuing nothing had */
        for (int r = 0; r < n; r++) {
            const dt_ledger_group_t *g = views[r] ? group_of(views[r], best.key) : NULL;
            if (!g)
                continue;
            const dt_ledger_entry_t *e =
                best.seq <= g->calls ? entry_of(views[r], best.key, best.seq) : NULL;
            if (best.seq <= g->calls && !e)
                continue;
            if (!e && g->calls > none_calls)
                none_calls = g->calls;
            int c = 0;
            while (c < n_cls && !(cls[c] == e || (cls[c] && e && same_call(cls[c], e))))
                c++;
            if (c == n_cls && n_cls < 64)
                cls[n_cls++] = e;
            if (c < n_cls) {
                mark[r] = c + 1;
                size_cls[c]++;
            }
        }
        /* smallest classes first: the odd one out leads */
        int order[64];
        for (int c = 0; c < n_cls; c++)
            order[c] = c;
        for (int a = 1; a < n_cls; a++)
            for (int b = a; b > 0 && size_cls[order[b]] < size_cls[order[b - 1]]; b--) {
                int x = order[b];
                order[b] = order[b - 1];
                order[b - 1] = x;
            }
        char gn[200];
        group_name(views, n, best.key, gn, sizeof gn);
        add(&t, "ledger: ");
        for (int i = 0; i < n_cls; i++) {
            int c = order[i];
            if (i > 0)
                add(&t, i == n_cls - 1 ? " while " : "; ");
            ranks_text(&t, mark, n, c + 1);
            if (cls[c]) {
                char call[320];
                dt_ledger_call_text(cls[c], gn, call, sizeof call);
                add(&t, " issued %s #%llu", call, (unsigned long long)best.seq);
                where_text(&t, cls[c]);
            } else {
                add(&t, " issued nothing on the %s after #%u", gn, none_calls);
            }
        }
        rc = DT_LEDGER_DIVERGED;
    } else {
        for (int r = 0; r < n; r++)
            mark[r] = views[r] != NULL;
        int present = 0;
        for (int r = 0; r < n; r++)
            present += mark[r];
        add(&t, "ledger: ");
        if (present) {
            ranks_text(&t, mark, n, 1);
            add(&t, present == 1 ? " alone reported its calls" : " issued the same calls");
            last_text(&t, views, n);
        } else {
            add(&t, "no rank reported its calls");
        }
    }
    for (int r = 0; r < n; r++)
        mark[r] = views[r] == NULL;
    int missing = 0, failed = 0;
    for (int r = 0; r < n; r++) {
        missing += mark[r];
        failed |= views[r] && views[r]->failed != 0;
    }
    if (rc == DT_LEDGER_AGREE && !missing && !failed)
        rc = DT_LEDGER_QUIET;
    if (missing) {
        add(&t, "; ");
        ranks_text(&t, mark, n, 1);
        add(&t, " %s", missing_why ? missing_why : "sent no ledger");
    }
    free(mark);
    return rc;
}
