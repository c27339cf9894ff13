/*
 * plugins/cpu/cpu_peak.c - the cpu device's peak f32 FLOP/s, the
 * denominator of MFU, measured once per process rather than guessed.
 *
 * Why measured: FLOP per cycle and the clock both vary by part in ways
 * the CPU does not report.  An AVX2 + FMA core may have two 256-bit FMA
 * pipes (Haswell on, Zen 2 on: 32 FLOP a cycle) or two 128-bit ones that
 * split each 256-bit FMA (Zen 1: 16); an AVX-512 core may run a 512-bit
 * FMA at full rate (64), at half (Zen 4, one-port Xeons: 32); and the
 * clock that matters is the one reached under load, not the nominal one
 * in /proc/cpuinfo.  The old estimate (two FMAs of the widest width a
 * cycle at the nominal clock) read MFU 0.48 on a Zen 1 core where a
 * measured FMA loop gives 0.79, and understated the peak of a boosting
 * AVX-512 core by its boost.
 *
 * How: independent chains of register-only FMAs in inline assembly (so
 * the loop is the same at -O0, under sanitizers and with any compiler),
 * 14 chains - more than latency x pipes on any part named above - of the
 * widest vectors the CPU offers, AVX-512 and AVX2 both where it has both
 * (the faster counts); short trials for a few milliseconds and the best
 * one kept, so a trial another process interrupted does not count.  The
 * operands are zeros: no denormals, no exceptions.  One thread is
 * measured; the device's peak is that times its threads.  Elsewhere (no
 * AVX2 + FMA, not x86-64) the old estimate stands: one 4-wide add and one
 * 4-wide multiply a cycle at the nominal clock.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_internal.h"

#define PEAK_CHAINS 14     /* independent FMAs in flight per iteration */
#define PEAK_ITERS 16384   /* iterations per trial (~30-60 us) */
#define PEAK_WINDOW_S 0.004 /* trials run this long per vector width */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* The same 14 FMAs on registers 0-13 (multiplying 14 by 15), n times. */
#define FMA14(r)                                                                      \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "0\n\t"                                  \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "1\n\t"                                  \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "2\n\t"                                  \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "3\n\t"                                  \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "4\n\t"                                  \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "5\n\t"                                  \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "6\n\t"                                  \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "7\n\t"                                  \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "8\n\t"                                  \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "9\n\t"                                  \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "10\n\t"                                 \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "11\n\t"                                 \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "12\n\t"                                 \
    "vfmadd231ps %%" r "14, %%" r "15, %%" r "13\n\t"

#define VEC_CLOBBERS                                                                  \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",   \
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc"

/* vxorps on an xmm register zeroes the whole ymm/zmm register. */
#define ZERO16                                                                        \
    "vxorps %%xmm0, %%xmm0, %%xmm0\n\tvxorps %%xmm1, %%xmm1, %%xmm1\n\t"              \
    "vxorps %%xmm2, %%xmm2, %%xmm2\n\tvxorps %%xmm3, %%xmm3, %%xmm3\n\t"              \
    "vxorps %%xmm4, %%xmm4, %%xmm4\n\tvxorps %%xmm5, %%xmm5, %%xmm5\n\t"              \
    "vxorps %%xmm6, %%xmm6, %%xmm6\n\tvxorps %%xmm7, %%xmm7, %%xmm7\n\t"              \
    "vxorps %%xmm8, %%xmm8, %%xmm8\n\tvxorps %%xmm9, %%xmm9, %%xmm9\n\t"              \
    "vxorps %%xmm10, %%xmm10, %%xmm10\n\tvxorps %%xmm11, %%xmm11, %%xmm11\n\t"        \
    "vxorps %%xmm12, %%xmm12, %%xmm12\n\tvxorps %%xmm13, %%xmm13, %%xmm13\n\t"        \
    "vxorps %%xmm14, %%xmm14, %%xmm14\n\tvxorps %%xmm15, %%xmm15, %%xmm15\n\t"

static void fma_zmm(uint64_t n)
{
    __asm__ volatile(ZERO16 "1:\n\t" FMA14("zmm") "dec %0\n\t"
                            "jnz 1b\n\t"
                            "vzeroupper\n\t"
                     : "+r"(n)
                     :
                     : VEC_CLOBBERS);
}

static void fma_ymm(uint64_t n)
{
    __asm__ volatile(ZERO16 "1:\n\t" FMA14("ymm") "dec %0\n\t"
                            "jnz 1b\n\t"
                            "vzeroupper\n\t"
                     : "+r"(n)
                     :
                     : VEC_CLOBBERS);
}

/* The best FLOP/s of `kernel` (lanes f32 lanes a vector) over trials. */
static double best_rate(void (*kernel)(uint64_t), int lanes)
{
    const double flop = (double)PEAK_ITERS * PEAK_CHAINS * lanes * 2.0;
    double best = 0, start = now_s();
    for (int trials = 0; trials < 8 || now_s() - start < PEAK_WINDOW_S; trials++) {
        double t0 = now_s();
        kernel(PEAK_ITERS);
        double dt = now_s() - t0;
        if (dt > 0 && flop / dt > best)
            best = flop / dt;
    }
    return best;
}
#endif

/* Nominal clock in GHz, for the estimate where nothing is measured: the
 * maximum from cpufreq when the kernel exposes it, else the current "cpu
 * MHz" of /proc/cpuinfo, else 2 GHz. */
static double nominal_ghz(void)
{
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
    if (f) {
        double khz = 0;
        int ok = fscanf(f, "%lf", &khz) == 1;
        fclose(f);
        if (ok && khz > 0)
            return khz / 1e6;
    }
    f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[256];
        double mhz = 0;
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "cpu MHz", 7) == 0) {
                const char *colon = strchr(line, ':');
                if (colon)
                    mhz = strtod(colon + 1, NULL);
                break;
            }
        fclose(f);
        if (mhz > 0)
            return mhz / 1e3;
    }
    return 2.0;
}

static double peak_per_thread;
static const char *peak_how;
static pthread_once_t peak_once = PTHREAD_ONCE_INIT;

static void measure_peak(void)
{
    double best = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        best = best_rate(fma_ymm, 8);
        peak_how = "measured: AVX2 FMA loop";
    }
    if (__builtin_cpu_supports("avx512f")) {
        double z = best_rate(fma_zmm, 16);
        if (z > best) {
            best = z;
            peak_how = "measured: AVX-512 FMA loop";
        }
    }
#endif
    if (!(best > 0)) {
        best = nominal_ghz() * 1e9 * 8.0;
        peak_how = "estimated: 8 FLOP a cycle at the nominal clock";
    }
    peak_per_thread = best;
}

double cpu_peak_flops_per_thread(const char **how)
{
    pthread_once(&peak_once, measure_peak);
    if (how)
        *how = peak_how;
    return peak_per_thread;
}
