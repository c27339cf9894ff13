/*
 * core/config/suggest.c - "did you mean ...?" for misspelt keys, tables,
 * enum values and plugin names.
 *
 * The distance is Levenshtein with adjacent transpositions counted as one
 * edit (optimal string alignment), compared case-insensitively: "trian" is
 * one edit from "train", the most common slip of the hand.  A word that
 * starts a candidate ("warmup" -> "warmup_steps") also counts.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/config.h"

/* Words longer than this are never compared (no key is that long, and it
 * keeps the three rows on the stack). */
#define DT_SUGGEST_MAX_LEN 128

static size_t min3(size_t a, size_t b, size_t c)
{
    size_t m = a < b ? a : b;
    return m < c ? m : c;
}

static size_t osa_distance(const char *a, size_t na, const char *b, size_t nb)
{
    /* Three rolling rows: i-2 (for the transposition), i-1 and i. */
    size_t rows[3][DT_SUGGEST_MAX_LEN + 1];
    size_t *pp = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= nb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = i;
        int ca = tolower((unsigned char)a[i - 1]);
        for (size_t j = 1; j <= nb; j++) {
            int cb = tolower((unsigned char)b[j - 1]);
            size_t cost = ca == cb ? 0 : 1;
            size_t d = min3(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost);
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && pp[j - 2] + 1 < d)
                d = pp[j - 2] + 1;
            cur[j] = d;
        }
        size_t *t = pp;
        pp = prev;
        prev = cur;
        cur = t;
    }
    return prev[nb];
}

/* How many edits still read as a typo rather than another word. */
static size_t max_edits(size_t len)
{
    if (len <= 3)
        return 1;
    if (len <= 8)
        return 2;
    return 3;
}

const char *dt_suggest(const char *word, const char *const *candidates,
                       size_t n)
{
    if (!word || !candidates)
        return NULL;
    size_t nw = strlen(word);
    if (nw == 0 || nw > DT_SUGGEST_MAX_LEN)
        return NULL;
    const char *best = NULL;
    size_t best_d = max_edits(nw) + 1;
    for (size_t i = 0; i < n; i++) {
        const char *cand = candidates[i];
        if (!cand)
            continue;
        size_t nc = strlen(cand);
        if (nc == 0 || nc > DT_SUGGEST_MAX_LEN)
            continue;
        size_t d = osa_distance(word, nw, cand, nc);
        /* A cut-short name ("warmup" for "warmup_steps") is meant too, but
         * ranks behind any real typo match. */
        if (d > max_edits(nw) && nw >= 4 && nw < nc &&
            strncasecmp(cand, word, nw) == 0)
            d = max_edits(nw);
        /* A distance equal to the shorter word's length means nothing was
         * kept ("ab" -> "xy"): not a suggestion. */
        size_t shorter = nw < nc ? nw : nc;
        if (d >= shorter && d > 0)
            continue;
        if (d < best_d) {
            best_d = d;
            best = cand;
        }
    }
    return best;
}
