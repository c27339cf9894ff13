/*
 * core/util/utf8.h - UTF-8 as Unicode defines it (shortest form, no
 * surrogates, nothing above U+10FFFF), the one decoder of the core: what
 * `dtrain plot` passes to gnuplot, and what the tokenizer treats as text
 * (PCRE2 and utf8proc refuse the same sequences).
 */
#ifndef DT_UTIL_UTF8_H
#define DT_UTIL_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid sequence at p[0, n) (1 for ASCII), 0 if none. */
static inline size_t dt_utf8_len(const unsigned char *p, size_t n)
{
    if (n == 0)
        return 0;
    if (p[0] < 0x80)
        return 1;
    size_t len = p[0] >= 0xc2 && p[0] <= 0xdf ? 2 : p[0] >= 0xe0 && p[0] <= 0xef ? 3
               : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f) ||
        (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] > 0x8f))
        return 0;
    return len;
}

/* The code point at p[0, n) and its length in *used; -1 (with *used 1)
 * where no valid sequence starts. */
static inline int32_t dt_utf8_decode(const unsigned char *p, size_t n, size_t *used)
{
    size_t len = dt_utf8_len(p, n);
    *used = len ? len : 1;
    if (!len)
        return -1;
    int32_t cp = len == 1 ? p[0] : (int32_t)(p[0] & (0x7f >> len));
    for (size_t i = 1; i < len; i++)
        cp = (cp << 6) | (p[i] & 0x3f);
    return cp;
}

#endif /* DT_UTIL_UTF8_H */
