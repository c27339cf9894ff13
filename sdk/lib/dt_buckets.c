/*
 * sdk/lib/dt_buckets.c - units grouped in backward order into buckets of
 * at most a byte cap, one collective each.  Pure arithmetic.
 */
#include "dtrain/sdk/buckets.h"

uint32_t dt_bucket_plan(const uint64_t *unit_bytes, uint32_t n_units,
                        uint64_t cap_bytes, dt_bucket_span_t *out,
                        uint32_t *bucket_of_unit)
{
    uint32_t nb = 0;
    for (uint32_t k = n_units; k-- > 0;) {
        if (nb == 0 || (out[nb - 1].bytes > 0 && out[nb - 1].bytes + unit_bytes[k] > cap_bytes)) {
            out[nb] = (dt_bucket_span_t){.unit_lo = k, .unit_hi = k, .bytes = 0};
            nb++;
        }
        out[nb - 1].unit_lo = k;
        out[nb - 1].bytes += unit_bytes[k];
        if (bucket_of_unit)
            bucket_of_unit[k] = nb - 1;
    }
    return nb;
}
