/*
 * core/cli/run_ledger.c - the collective ledger of every `dtrain run`
 * (run_ledger.h): wrap the comm plugin, and after a failed collective
 * exchange the ledgers and judge them on rank 0.
 */
#include "cli/run_ledger.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/error.h"
#include "util/log.h"

int dt_run_ledger_begin(dt_run_ledger_t *l, dt_resolved_t *r, const dt_world_t *w)
{
    memset(l, 0, sizeof *l);
    l->timeout_s = r->set.launch.timeout_s;
    dt_plugin_t *pl = r->plugin[DT_ROLE_COMM];
    if (!pl)
        return DT_OK;
    if (!(l->ledger = dt_ledger_create(w->rank, w->size)))
        return DT_ERR_NOMEM;
    dt_interpose_hooks_t hooks = dt_interpose_ledger_hooks(l->ledger);
    int rc = dt_interpose_comm_create(pl->ops, &hooks, &l->ic);
    if (rc != DT_OK) {
        dt_run_ledger_end(l);
        return rc;
    }
    /* a diagnosis, not the run's business: without it the run goes on */
    if (w->size > 1 && dt_ledger_xchg_open(w, &l->xchg) != DT_OK) {
        dt_log(DT_LOG_WARN, "ledger", "%s; a failed collective will not be compared",
               dt_last_error());
        dt_err_clear();
    }
    l->comm_plugin = pl;
    l->comm_table = pl->ops;
    pl->ops = dt_interpose_comm_ops(l->ic);
    return DT_OK;
}

/* Rank 0's judge (ledger_exchange.h): decode what came and compare. */
static int judge(void *ctx, const uint8_t *const *blobs, const size_t *sizes, int n,
                 char *text, size_t cap)
{
    int v = DT_LEDGER_AGREE;
    const dt_run_ledger_t *l = ctx;
    dt_ledger_view_t *views = calloc((size_t)n, sizeof *views);
    const dt_ledger_view_t **vp = calloc((size_t)n, sizeof *vp);
    if (!views || !vp) {
        snprintf(text, cap, "ledger: not compared (rank 0 is out of memory)");
    } else {
        for (int r = 0; r < n; r++)
            if (blobs[r] && dt_ledger_decode(blobs[r], sizes[r], &views[r]) == DT_OK &&
                views[r].rank == r)
                vp[r] = &views[r];
        char why[96];
        snprintf(why, sizeof why, "sent no ledger within %g s", l->timeout_s);
        v = dt_ledger_compare(vp, n, why, text, cap);
    }
    free(views);
    free(vp);
    return v;
}

/* "; this rank's last: all_reduce(f32, 4096, sum, world group) #12 at
 * step 5" (a point-to-point call has no number), for a line whose
 * ledgers were not compared. */
static void own_last(const dt_ledger_t *l, char *text, size_t cap)
{
    uint8_t *blob = malloc(DT_LEDGER_BLOB_MAX);
    dt_ledger_view_t *v = malloc(sizeof *v);
    size_t n = blob && v ? dt_ledger_encode(l, blob, DT_LEDGER_BLOB_MAX) : 0;
    if (n && dt_ledger_decode(blob, n, v) == DT_OK) {
        for (uint32_t i = v->n_entries; i-- > 0;) {
            const dt_ledger_entry_t *e = &v->entries[i];
            char gname[64], call[320], num[32] = "";
            int32_t size = -1;
            for (uint32_t g = 0; g < v->n_groups; g++)
                if (v->groups[g].key == e->group)
                    size = v->groups[g].size;
            if (e->group == DT_LEDGER_WORLD)
                snprintf(gname, sizeof gname, "world group");
            else
                snprintf(gname, sizeof gname, "a group of %d ranks", (int)size);
            dt_ledger_call_text(e, gname, call, sizeof call);
            if (e->seq)
                snprintf(num, sizeof num, " #%llu", (unsigned long long)e->seq);
            size_t k = strlen(text);
            snprintf(text + k, cap - k, "; this rank's last: %s%s at step %lld", call, num,
                     (long long)e->step);
            break;
        }
    }
    free(blob);
    free(v);
}

int dt_run_ledger_judge(dt_run_ledger_t *l, int rc, char *text, size_t cap)
{
    if (rc == DT_OK || !l->ledger || !l->xchg || !dt_ledger_joined(l->ledger))
        return -1;
    int failed = dt_ledger_failed(l->ledger) != DT_OK;
    char *saved = strdup(dt_last_error());
    uint8_t *mine = malloc(DT_LEDGER_BLOB_MAX);
    int v = DT_LEDGER_AGREE;
    if (!mine) {
        snprintf(text, cap, "ledger: not compared (out of memory)");
    } else {
        size_t bytes = dt_ledger_encode(l->ledger, mine, DT_LEDGER_BLOB_MAX);
        int verdict = -1, order = 0;
        int xrc = dt_ledger_xchg_run(l->xchg, mine, bytes, l->timeout_s, judge, l, text, cap,
                                     &verdict, &order);
        /* the exchange ends every rank at once; the launcher names the
         * first rank to end, which should be the one that failed first
         * (within its DT_LAUNCH_REPORT_S the others end unprompted) */
        if (xrc == DT_OK && order > 0) {
            struct timespec nap = {0, DT_LEDGER_LATER_MS * 1000000L};
            nanosleep(&nap, NULL);
        }
        if (xrc == DT_OK && (verdict == DT_LEDGER_DIVERGED || verdict == DT_LEDGER_QUIET))
            v = verdict == DT_LEDGER_QUIET ? -1 : verdict;
        else if (xrc != DT_OK && !failed)
            v = -1; /* not compared, and nothing failed in the communicator here */
        else if (xrc != DT_OK)
            own_last(l->ledger, text, cap);
    }
    free(mine);
    if (saved)
        dt_err_set(rc, "%s", saved);
    free(saved);
    return v;
}

void dt_run_ledger_end(dt_run_ledger_t *l)
{
    if (l->comm_plugin)
        l->comm_plugin->ops = l->comm_table;
    dt_interpose_comm_destroy(l->ic);
    dt_ledger_xchg_close(l->xchg);
    dt_ledger_free(l->ledger);
    l->ic = NULL;
    l->xchg = NULL;
    l->ledger = NULL;
    l->comm_plugin = NULL;
}
