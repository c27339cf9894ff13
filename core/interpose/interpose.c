/*
 * core/interpose/interpose.c - what every kind's interposer shares: the
 * clock calls are timed with.
 */
#include "interpose/interpose.h"

#include <time.h>

uint64_t dt_interpose_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
