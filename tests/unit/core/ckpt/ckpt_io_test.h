/*
 * tests/unit/core/ckpt/ckpt_io_test.h - what the files of test_ckpt_io share
 * (ckpt_io_fixture.c, and env_child of ckpt_io_fileutil.c), and the cases
 * each file holds, which test_ckpt_io.c lists.
 */
#ifndef DT_TEST_CKPT_IO_TEST_H
#define DT_TEST_CKPT_IO_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dtrain/tensor.h"
#include "ckpt/ckpt_io.h"
#include "ckpt/ckpt_tools.h"
#include "util/fileutil.h"
#include "util/error.h"
#include "test_assert.h"
#include "test_hooks.h"
#include "safetensors_read.h"

#include <cjson/cJSON.h>

extern char g_dir[256]; /* this run's folder (setup) */

/* An entry of a test checkpoint. */
typedef struct {
    const char *name;
    int dtype;
    uint64_t numel;
    int ndim;
    int64_t shape[2];
} ent_spec_t;

#define RANKS 3 /* the 3-rank checkpoint's ranks */

/* ckpt_io_fixture.c: the 3-rank checkpoint, its values and its manifest */
void check_ckpt(const char *dir, uint64_t step, int seed);
void edit_manifest(const char *dir, void (*edit)(cJSON *));
void fill(size_t e, uint64_t off, uint64_t n, int seed, void *dst);
cJSON *first_seg(cJSON *j, const char *entry);
uint64_t json_u64(const cJSON *o, const char *key);
void rank_range(uint64_t n, int r, uint64_t *off, uint64_t *cnt);
void reseal(const char *dir);
void rewrite_manifest(const char *dir, void (*edit)(cJSON *), int sealed);
int save(const char *root, uint64_t step, int seed);
int shard_write(dt_ckpt_writer_t *w, const char *entry, int dtype, uint64_t offset,
                uint64_t count, const void *data);
void subdir(char *buf, size_t cap, const char *name);
dt_ckpt_block_t blk2(uint64_t base, uint64_t r, uint64_t c, uint64_t r0,
                     uint64_t nr, uint64_t c0, uint64_t nc);
/* ckpt_io_fileutil.c: the child test_fault_env starts (--env-child DIR) */
int env_child(void);

/* ---- the cases, by file ---- */
/* ckpt_io_fileutil.c */
void test_crc32(void **state);
void test_mkdir_rm(void **state);
void test_atomic_write(void **state);
void test_atomic_write_enospc(void **state);
void test_atomic_write_planted_links(void **state);
void test_atomic_write_not_regular(void **state);
void test_output_modes(void **state);
void test_open_output(void **state);
void test_mkdir_parent(void **state);
void test_fault_env(void **state);

/* ckpt_io_write_read.c */
void test_roundtrip_3ranks(void **state);
void test_python_reads_checkpoint(void **state);
void test_disk_full(void **state);
void test_latest_and_prune(void **state);
void test_json_u64(void **state);
void test_old_format_fixture(void **state);

/* ckpt_io_corruption.c */
void test_checksum_mismatch(void **state);
void test_missing_marker(void **state);
void test_missing_and_truncated_shard(void **state);
void test_manifest_inconsistent(void **state);
void test_manifest_checksum(void **state);
void test_ckpt_members_not_regular(void **state);
void test_open_incomplete_warns(void **state);
void test_tensor_table(void **state);
void test_manifest_writer_checks(void **state);
void test_links_in_ckpt_root(void **state);

/* ckpt_io_resharding.c */
void test_blocks_read_as_ranges(void **state);
void test_ranges_read_as_blocks(void **state);
void test_block_errors(void **state);

#endif
