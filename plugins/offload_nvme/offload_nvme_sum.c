/*
 * plugins/offload_nvme/offload_nvme_sum.c - the checksums that guard the
 * tier's files: CRC-32C (Castagnoli, as iSCSI, ext4 and btrfs use) of
 * every 4 KiB block, computed by the worker as a block is written and
 * checked as it is read back (offload_nvme_io.c).
 *
 * CRC-32C rather than zlib's CRC-32 because x86-64 computes it in
 * hardware (SSE4.2 `crc32`, checked at run time), four blocks at once
 * (the instruction's latency is 3 cycles, its throughput one a cycle):
 * 45 GB/s on a 1 MiB buffer in cache, 16.5 GB/s from memory, against
 * 6.3 GB/s for zlib 1.2.13's crc32 in cache, while one worker thread
 * moves 2-3 GB/s; through the tier, zlib's cost two to three times as
 * much (bench/results/offload.md).  Elsewhere a table-driven CRC-32C
 * (slicing by 8), the same values.
 *
 * Test hook (DTRAIN_TEST_HOOKS builds only): DTRAIN_FAULT_NO_CRC32C_HW=1
 * takes the table where the hardware would be used.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "offload_nvme_internal.h"

#define CRC32C_POLY 0x82f63b78u /* reflected */

static uint32_t crc_table[8][256];
static uint32_t zero_sum;
static pthread_once_t sum_once = PTHREAD_ONCE_INIT;

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define NVME_SUM_LE 1 /* the table eight bytes at a time */
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#define NVME_SUM_HW 1 /* SSE4.2 crc32, where the CPU has it */
#endif

#if defined(NVME_SUM_LE) || defined(NVME_SUM_HW)
static inline uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
#endif

/* Slicing by 8 (little-endian hosts; a big-endian one takes bytes one at
 * a time). */
static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
#ifdef NVME_SUM_LE
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v = load64(p) ^ crc;
        crc = crc_table[7][v & 0xff] ^ crc_table[6][(v >> 8) & 0xff] ^
              crc_table[5][(v >> 16) & 0xff] ^ crc_table[4][(v >> 24) & 0xff] ^
              crc_table[3][(v >> 32) & 0xff] ^ crc_table[2][(v >> 40) & 0xff] ^
              crc_table[1][(v >> 48) & 0xff] ^ crc_table[0][v >> 56];
    }
#endif
    for (; n; n--, p++)
        crc = crc_table[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#ifdef NVME_SUM_HW
#include <nmmintrin.h>

static int have_hw; /* the CPU has SSE4.2 (sum_setup) */

/* The hardware's instruction, unless a test asks for the table (test hook
 * builds: DTRAIN_FAULT_NO_CRC32C_HW=1, read at every call, so one test
 * process checks both ways against its own reference). */
static int use_hw(void)
{
#ifdef DTRAIN_TEST_HOOKS
    const char *v = getenv("DTRAIN_FAULT_NO_CRC32C_HW");
    if (v && strcmp(v, "1") == 0)
        return 0;
#endif
    return have_hw;
}

/* Four blocks at once: four independent chains keep the crc32 unit busy. */
__attribute__((target("sse4.2"))) static void crc_hw4(const unsigned char *p, uint32_t *out)
{
    uint64_t a = 0xffffffffu, b = a, c = a, d = a;
    const unsigned char *q = p + NVME_ALIGN, *r = q + NVME_ALIGN, *s = r + NVME_ALIGN;
    for (size_t i = 0; i < NVME_ALIGN; i += 8) {
        a = _mm_crc32_u64(a, load64(p + i));
        b = _mm_crc32_u64(b, load64(q + i));
        c = _mm_crc32_u64(c, load64(r + i));
        d = _mm_crc32_u64(d, load64(s + i));
    }
    out[0] = ~(uint32_t)a, out[1] = ~(uint32_t)b, out[2] = ~(uint32_t)c, out[3] = ~(uint32_t)d;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw1(const unsigned char *p)
{
    uint64_t a = 0xffffffffu;
    for (size_t i = 0; i < NVME_ALIGN; i += 8)
        a = _mm_crc32_u64(a, load64(p + i));
    return ~(uint32_t)a;
}
#endif

static void sum_setup(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#ifdef NVME_SUM_HW
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2");
#endif
    static const unsigned char zeros[NVME_ALIGN];
    zero_sum = crc_sw(0, zeros, sizeof zeros);
}

uint32_t nvme_sum_zero(void)
{
    pthread_once(&sum_once, sum_setup);
    return zero_sum;
}

void nvme_sum_blocks(const void *mem, uint64_t n, uint32_t *out)
{
    pthread_once(&sum_once, sum_setup);
    const unsigned char *p = mem;
    uint64_t i = 0;
#ifdef NVME_SUM_HW
    if (use_hw()) {
        for (; i + 4 <= n; i += 4)
            crc_hw4(p + i * NVME_ALIGN, out + i);
        for (; i < n; i++)
            out[i] = crc_hw1(p + i * NVME_ALIGN);
    }
#endif
    for (; i < n; i++)
        out[i] = crc_sw(0, p + i * NVME_ALIGN, NVME_ALIGN);
}
