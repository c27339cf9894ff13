/*
 * plugins/common/device/mem_tally.c - a device's memory accounting by tag,
 * its budget refusal and its mem_stats (see
 * plugins/common/device/mem_tally.h).
 */
#include "common/device/mem_tally.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

void dt_mem_tally_add(dt_mem_tally_t *m, int tag, uint64_t bytes)
{
    m->current[tag] += bytes;
    if (m->current[tag] > m->peak[tag])
        m->peak[tag] = m->current[tag];
    m->total_current += bytes;
    if (m->total_current > m->total_peak)
        m->total_peak = m->total_current;
}

void dt_mem_tally_sub(dt_mem_tally_t *m, int tag, uint64_t bytes)
{
    m->current[tag] -= bytes;
    m->total_current -= bytes;
}

void dt_mem_tally_reset_peaks(dt_mem_tally_t *m)
{
    for (int t = 0; t < DT_TAG_CAPACITY; t++)
        m->peak[t] = m->current[t];
    m->total_peak = m->total_current;
}

void dt_mem_tally_stats(const dt_mem_tally_t *dev, const dt_mem_tally_t *pinned,
                        uint64_t limit, dt_mem_stats_t *out)
{
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->n_tags = DT_TAG_COUNT;
    out->limit = limit;
    out->total_current = dev->total_current;
    out->total_peak = dev->total_peak;
    memcpy(out->current, dev->current, sizeof out->current);
    memcpy(out->peak, dev->peak, sizeof out->peak);
    if (pinned) {
        out->pinned_total_current = pinned->total_current;
        out->pinned_total_peak = pinned->total_peak;
        memcpy(out->pinned_current, pinned->current, sizeof out->pinned_current);
        memcpy(out->pinned_peak, pinned->peak, sizeof out->pinned_peak);
    }
}

const char *dt_mem_fmt_bytes(char buf[32], uint64_t b)
{
    if (b < 1024)
        snprintf(buf, 32, "%" PRIu64 " B", b);
    else if (b < (1ull << 20))
        snprintf(buf, 32, "%.1f KiB", (double)b / 1024.0);
    else if (b < (1ull << 30))
        snprintf(buf, 32, "%.1f MiB", (double)b / (1024.0 * 1024.0));
    else
        snprintf(buf, 32, "%.1f GiB", (double)b / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

const char *dt_mem_tally_in_use_text(const dt_mem_tally_t *m, char *buf, size_t cap)
{
    char one[32];
    size_t len = 0;
    if (cap == 0)
        return buf;
    buf[0] = '\0';
    for (int t = 0; t < DT_TAG_COUNT; t++) {
        if (m->current[t] == 0)
            continue;
        int w = snprintf(buf + len, cap - len, "%s%s %s", len ? ", " : "", dt_mem_tag_name(t),
                         dt_mem_fmt_bytes(one, m->current[t]));
        if (w < 0 || (size_t)w >= cap - len)
            break;
        len += (size_t)w;
    }
    if (len == 0)
        snprintf(buf, cap, "nothing");
    return buf;
}

void dt_mem_tally_budget_text(const dt_mem_tally_t *m, uint64_t bytes, int tag,
                              uint64_t limit, char *buf, size_t cap)
{
    char req[32], tot[32], lim[32], tags[512];
    uint64_t total = m->total_current + bytes;
    if (total < bytes) /* wrapped: an absurd request */
        total = UINT64_MAX;
    snprintf(buf, cap,
             "out of memory budget: allocating %s (%" PRIu64 " bytes) for %s "
             "would bring the total to %s, over memory_limit %s (in use: %s)",
             dt_mem_fmt_bytes(req, bytes), bytes, dt_mem_tag_name(tag),
             dt_mem_fmt_bytes(tot, total), dt_mem_fmt_bytes(lim, limit),
             dt_mem_tally_in_use_text(m, tags, sizeof tags));
}
