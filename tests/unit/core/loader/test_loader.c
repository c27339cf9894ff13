/*
 * tests/unit/core/loader/test_loader.c - the plugin loader against the fake plugins
 * (tests/fake_plugins): every way a module can be refused, with its status
 * and exact message (a device's kernel table included); search path order;
 * optional methods past struct_size; several majors; failures that must
 * leave the process running; discovery.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "dtrain/dtrain.h"
#include "loader/abi_tables.h"
#include "loader/host_services.h"
#include "loader/loader.h"
#include "util/error.h"
#include "util/log.h"
#include "test_assert.h"
#include "test_hooks.h"

#ifndef DT_FAKE_PLUGIN_DIR
#define DT_FAKE_PLUGIN_DIR DT_TEST_BINARY_DIR "/fake-plugins"
#endif
#define FAKE DT_FAKE_PLUGIN_DIR
#define HINT                                                                   \
    "(missing symbols usually mean it was built against another dtrain or a " \
    "library is missing)"


static int setup(void **state)
{
    setenv("DTRAIN_PLUGIN_PATH", FAKE, 1);
    dt_abi_set_extra_major(DT_KIND_COMM, 0);
    dt_log_set_level(DT_LOG_WARN);
    dt_err_clear();
    return 0;
}

/* The search path built from the environment as it is now. */
static dt_search_path_t *env_path(const char *config_dirs)
{
    dt_search_path_t *sp = NULL;
    if (dt_search_path_new(config_dirs, &sp) != DT_OK)
        fail_msg("search path: %s", dt_last_error());
    return sp;
}

/* dt_plugin_load on the environment's search path. */
static int load_plugin(int kind, const char *name, dt_plugin_t **out)
{
    dt_search_path_t *sp = env_path(NULL);
    int rc = dt_plugin_load(sp, kind, name, out);
    dt_search_path_free(sp);
    return rc;
}

/* Load `name` as a comm plugin expecting failure `rc`. */
static void expect_load_fail(int kind, const char *name, int rc)
{
    dt_plugin_t *p = (dt_plugin_t *)(uintptr_t)1;
    int got = load_plugin(kind, name, &p);
    if (got != rc)
        fail_msg("loading '%s': status %s, expected %s (%s)", name,
                 dt_status_name(got), dt_status_name(rc), dt_last_error());
    assert_null(p);
}

/* ------------------------------------------------------------ tables -- */

static void test_kind_names(void **state)
{
    const char *names[] = {"device", "comm", "offload", "strategy", "schedule", "tensor",
                           "model"};
    for (int k = 0; k < DT_KIND_COUNT; k++)
        assert_string_equal(dt_kind_name(k), names[k]);
    assert_null(dt_kind_name(DT_KIND_COUNT));
    assert_null(dt_kind_name(-1));
}

static void test_entry_names_match_macro(void **state)
{
    char buf[64];
    assert_string_equal(dt_abi_entry_name(DT_KIND_DEVICE, 1, buf, sizeof buf),
                        DT_ENTRY_STRING(device, 1));
    assert_string_equal(dt_abi_entry_name(DT_KIND_COMM, 1, buf, sizeof buf),
                        DT_ENTRY_STRING(comm, 1));
    assert_string_equal(dt_abi_entry_name(DT_KIND_OFFLOAD, 1, buf, sizeof buf),
                        DT_ENTRY_STRING(offload, 1));
    assert_string_equal(dt_abi_entry_name(DT_KIND_STRATEGY, 12, buf,
                                          sizeof buf),
                        DT_ENTRY_STRING(strategy, 12));
    assert_string_equal(dt_abi_entry_name(DT_KIND_SCHEDULE, 1, buf, sizeof buf),
                        DT_ENTRY_STRING(schedule, 1));
    assert_string_equal(buf, "dtrain_schedule_v1");
    assert_string_equal(dt_abi_entry_name(DT_KIND_TENSOR, 1, buf, sizeof buf),
                        DT_ENTRY_STRING(tensor, 1));
    assert_string_equal(buf, "dtrain_tensor_v1");
    assert_string_equal(dt_abi_entry_name(DT_KIND_MODEL, 1, buf, sizeof buf),
                        DT_ENTRY_STRING(model, 1));
    assert_string_equal(buf, "dtrain_model_v1");
}

/* Every slot after the info block is listed once, in struct order, and
 * the lists end where the struct ends. */
static void test_abi_layouts_cover_structs(void **state)
{
    const size_t fn = sizeof(void (*)(void));
    const size_t sizes[DT_KIND_COUNT] = {
        sizeof(dt_device_ops_v1_t), sizeof(dt_comm_ops_v1_t),
        sizeof(dt_offload_ops_v1_t), sizeof(dt_strategy_ops_v1_t),
        sizeof(dt_schedule_ops_v1_t), sizeof(dt_tensor_ops_v1_t),
        sizeof(dt_model_ops_v1_t)};
    for (int k = 0; k < DT_KIND_COUNT; k++) {
        uint32_t majors[4];
        assert_int_equal(dt_abi_majors(k, majors, 4), 1);
        assert_int_equal(majors[0], 1);
        const dt_abi_layout_t *l = dt_abi_layout(k, 1);
        assert_non_null(l);
        assert_null(dt_abi_layout(k, 2));
        assert_int_equal(l->ops_size, sizes[k]);
        size_t at = sizeof(dt_plugin_info_t);
        for (size_t i = 0; i < l->n_mandatory; i++, at += fn)
            assert_int_equal(l->mandatory[i].offset, at);
        assert_int_equal(l->min_size, at);
        for (size_t i = 0; i < l->n_optional; i++, at += fn)
            assert_int_equal(l->optional[i].offset, at);
        assert_int_equal(at, sizes[k]);
    }
    const dt_abi_layout_t *c = dt_abi_layout(DT_KIND_COMM, 1);
    assert_int_equal(c->n_mandatory, 14);
    assert_string_equal(c->mandatory[3].name, "all_reduce");
    assert_int_equal(c->mandatory[3].offset,
                     offsetof(dt_comm_ops_v1_t, all_reduce));
    assert_int_equal(c->n_optional, 5);
    assert_string_equal(c->optional[0].name, "test");
    assert_string_equal(c->optional[1].name, "cleanup_job");
    assert_string_equal(c->optional[2].name, "sym_alloc");
    assert_string_equal(c->optional[3].name, "sym_free");
    assert_string_equal(c->optional[4].name, "sendrecv");
    assert_int_equal(c->min_size, offsetof(dt_comm_ops_v1_t, test));
    const dt_abi_layout_t *d = dt_abi_layout(DT_KIND_DEVICE, 1);
    assert_int_equal(d->n_mandatory, 21);
    assert_string_equal(d->mandatory[3].name, "kernels");
    assert_string_equal(d->mandatory[8].name, "host_alloc");
    assert_string_equal(d->mandatory[9].name, "host_free");
    assert_string_equal(d->mandatory[20].name, "memset_async");
    assert_int_equal(d->n_optional, 1);
    assert_string_equal(d->optional[0].name, "native_stream");
    /* the device hands out its kernel table through `kernels`, whose
     * layout is its own: after its head, the core set, then the optional
     * kernels, ending where the struct ends */
    assert_int_equal(d->n_sub, 1);
    assert_string_equal(d->sub[0].slot, "kernels");
    assert_int_equal(d->sub[0].slot_offset, offsetof(dt_device_ops_v1_t, kernels));
    const dt_abi_layout_t *k = d->sub[0].layout;
    assert_int_equal(k->major, DT_KERNELS_ABI_MAJOR);
    assert_int_equal(k->minor, DT_KERNELS_ABI_MINOR);
    assert_int_equal(k->ops_size, sizeof(dt_kernels_v1_t));
    size_t at = sizeof(dt_kernels_info_t);
    for (size_t i = 0; i < k->n_mandatory; i++, at += fn)
        assert_int_equal(k->mandatory[i].offset, at);
    assert_int_equal(k->min_size, at);
    for (size_t i = 0; i < k->n_optional; i++, at += fn)
        assert_int_equal(k->optional[i].offset, at);
    assert_int_equal(at, sizeof(dt_kernels_v1_t));
    assert_int_equal(k->n_mandatory, 11);
    assert_string_equal(k->mandatory[0].name, "matmul_forward");
    assert_string_equal(k->mandatory[10].name, "cast");
    assert_int_equal(k->min_size, offsetof(dt_kernels_v1_t, layernorm_forward));
    assert_string_equal(k->optional[0].name, "layernorm_forward");
    assert_string_equal(k->optional[k->n_optional - 1].name, "gqa_attention_backward");
    assert_null(k->sub);
    assert_null(c->sub);
    const dt_abi_layout_t *o = dt_abi_layout(DT_KIND_OFFLOAD, 1);
    assert_string_equal(o->optional[0].name, "host_ptr");
    assert_string_equal(o->optional[1].name, "cleanup_job");
    assert_int_equal(o->n_mandatory, 8);
    const dt_abi_layout_t *s = dt_abi_layout(DT_KIND_STRATEGY, 1);
    assert_string_equal(s->mandatory[s->n_mandatory - 1].name, "estimate");
    assert_int_equal(s->n_optional, 1);
    assert_string_equal(s->optional[0].name, "plan_presets");
    /* a pipeline schedule: its own kind, every slot mandatory */
    const dt_abi_layout_t *sc = dt_abi_layout(DT_KIND_SCHEDULE, 1);
    assert_int_equal(sc->minor, 0);
    assert_int_equal(sc->n_mandatory, 4);
    assert_string_equal(sc->mandatory[0].name, "init");
    assert_string_equal(sc->mandatory[2].name, "assign_stages");
    assert_string_equal(sc->mandatory[3].name, "run");
    assert_int_equal(sc->n_optional, 0);
    assert_int_equal(sc->min_size, sizeof(dt_schedule_ops_v1_t));
    /* a tensor-parallel scheme: its own kind, every slot mandatory */
    const dt_abi_layout_t *tp = dt_abi_layout(DT_KIND_TENSOR, 1);
    assert_int_equal(tp->minor, 0);
    assert_int_equal(tp->n_mandatory, 7);
    assert_string_equal(tp->mandatory[0].name, "init");
    assert_string_equal(tp->mandatory[2].name, "row_forward");
    assert_string_equal(tp->mandatory[3].name, "column_backward_start");
    assert_string_equal(tp->mandatory[4].name, "column_backward_wait");
    assert_string_equal(tp->mandatory[5].name, "embedding_forward");
    assert_string_equal(tp->mandatory[6].name, "xent_reduce");
    assert_int_equal(tp->n_optional, 0);
    assert_int_equal(tp->min_size, sizeof(dt_tensor_ops_v1_t));
    /* a model architecture: its own kind; what a whole-model run needs is
     * mandatory, stages, slots, presets, the decoder and the Hugging Face
     * slots optional */
    const dt_abi_layout_t *md = dt_abi_layout(DT_KIND_MODEL, 1);
    assert_int_equal(md->minor, 0);
    assert_int_equal(md->n_mandatory, 6);
    assert_string_equal(md->mandatory[0].name, "create");
    assert_string_equal(md->mandatory[5].name, "flops_per_token");
    assert_int_equal(md->n_optional, 18);
    assert_string_equal(md->optional[0].name, "stage_forward");
    assert_string_equal(md->optional[7].name, "preset");
    assert_string_equal(md->optional[12].name, "decoder_free");
    assert_string_equal(md->optional[13].name, "hf_architectures");
    assert_string_equal(md->optional[17].name, "hf_import_name");
}

/* --------------------------------------------------------- search path -- */

static void test_search_path_order(void **state)
{
    setenv("DTRAIN_PLUGIN_PATH", "/env/a::/env/b/:", 1);
    dt_search_path_t *sp = env_path("rel/dir::/env/a");
    assert_int_equal(dt_search_path_count(sp), 4);
    assert_string_equal(dt_search_path_dir(sp, 0), "/env/a");
    assert_string_equal(dt_search_path_dir(sp, 1), "/env/b");  /* trailing '/' dropped */
    assert_string_equal(dt_search_path_dir(sp, 2), "rel/dir"); /* relative, as configured */
    /* A program in the build tree: the build tree's plugins, not an
     * install folder (tests/integration/test_sdk_out_of_tree.sh checks
     * the installed copy's). */
    assert_string_equal(dt_search_path_dir(sp, 3), DT_TEST_PLUGIN_DIR);
    assert_null(dt_search_path_dir(sp, 4));
    /* "/env/a" named twice is searched once. */
    dt_search_path_free(sp);

    /* Nothing configured: the build folder only, never cwd. */
    unsetenv("DTRAIN_PLUGIN_PATH");
    sp = env_path(NULL);
    assert_int_equal(dt_search_path_count(sp), 1);
    assert_string_equal(dt_search_path_dir(sp, 0), DT_TEST_PLUGIN_DIR);
    for (size_t i = 0; i < dt_search_path_count(sp); i++) {
        assert_string_not_equal(dt_search_path_dir(sp, i), ".");
        assert_string_not_equal(dt_search_path_dir(sp, i), "");
    }
    dt_search_path_free(sp);

    /* Built once: a later change of the environment does not move it. */
    setenv("DTRAIN_PLUGIN_PATH", "/x:/y", 1);
    sp = env_path(NULL);
    setenv("DTRAIN_PLUGIN_PATH", "/z", 1);
    assert_int_equal(dt_search_path_count(sp), 3);
    assert_string_equal(dt_search_path_dir(sp, 0), "/x");
    dt_search_path_free(sp);
    assert_null(dt_search_path_dir(NULL, 0));
    assert_int_equal(dt_search_path_count(NULL), 0);
}

static void test_not_found_lists_every_folder(void **state)
{
    setenv("DTRAIN_PLUGIN_PATH", FAKE ":/nonexistent/dtrain-x", 1);
    expect_load_fail(DT_KIND_COMM, "shmm", DT_ERR_NOT_FOUND);
    dt_search_path_t *sp = env_path(NULL);
    size_t n = dt_search_path_count(sp);
    assert_int_equal(n, 3);
    char expect[8192];
    size_t off = (size_t)snprintf(expect, sizeof expect,
                                  "comm plugin 'shmm' not found in: ");
    for (size_t i = 0; i < n; i++)
        off += (size_t)snprintf(expect + off, sizeof expect - off, "%s%s",
                                i ? ", " : "", dt_search_path_dir(sp, i));
    snprintf(expect + off, sizeof expect - off,
             " (files are named dtrain_<name>.so)");
    assert_msg(expect);
    assert_msg_has("not found in: " FAKE ", /nonexistent/dtrain-x, "
                   DT_TEST_PLUGIN_DIR " (files");
    dt_search_path_free(sp);
}

static void test_current_dir_only_when_configured(void **state)
{
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(FAKE), 0);
    unsetenv("DTRAIN_PLUGIN_PATH");
    /* dtrain_fake.so is right here, but cwd is not on the path. */
    expect_load_fail(DT_KIND_COMM, "fake", DT_ERR_NOT_FOUND);

    /* Named by the config's run.plugin_path (relative entries allowed). */
    dt_search_path_t *sp = env_path(".");
    dt_plugin_t *p = NULL;
    assert_int_equal(dt_plugin_load(sp, DT_KIND_COMM, "fake", &p), DT_OK);
    assert_string_equal(p->path, "./dtrain_fake.so");
    dt_plugin_unload(p);
    dt_search_path_free(sp);
    assert_int_equal(chdir(cwd), 0);
}

/* Opened plugins have no host table until bound, and bind only to a config
 * whose table was checked against the plugin's keys. */
static void test_bind_after_schema(void **state)
{
    dt_search_path_t *sp = env_path(NULL);
    dt_plugin_t *p = NULL;
    assert_ok(dt_plugin_open(sp, DT_KIND_COMM, "fake", &p));
    assert_null(p->host);
    dt_config_t *cfg = NULL;
    assert_ok(dt_config_load_string("run.toml", "[fake]\ncount = 7\n", &cfg));
    assert_status(dt_plugin_bind(p, cfg), DT_ERR_INVALID);
    assert_msg("comm/fake: config table [fake] was not checked against the "
               "plugin's keys before binding");
    assert_null(p->host);
    assert_ok(dt_config_apply_schema(cfg, "fake", p->info->config_keys,
                                     p->info->n_config_keys));
    assert_ok(dt_plugin_bind(p, cfg));
    assert_non_null(p->host);
    int64_t count = 0;
    assert_ok(p->host->cfg_int(p->host, "count", &count));
    assert_int_equal(count, 7);
    assert_status(dt_plugin_bind(p, cfg), DT_ERR_INVALID);
    assert_msg("comm/fake: already has its host table");
    dt_plugin_unload(p);
    dt_config_free(cfg);

    assert_status(dt_plugin_open(NULL, DT_KIND_COMM, "fake", &p), DT_ERR_INVALID);
    assert_msg("loading comm plugin 'fake': no search path");
    assert_null(p);
    dt_search_path_free(sp);
}

/* ------------------------------------------------------------ loading -- */

static void test_load_valid_and_call(void **state)
{
    dt_plugin_t *p = NULL;
    assert_int_equal(load_plugin(DT_KIND_COMM, "fake", &p), DT_OK);
    assert_non_null(p);
    assert_int_equal(p->kind, DT_KIND_COMM);
    assert_string_equal(p->name, "fake");
    assert_string_equal(p->path, FAKE "/dtrain_fake.so");
    assert_int_equal(p->major, 1);
    assert_string_equal(p->info->name, "fake");
    assert_string_equal(p->info->version, "0.1.0");
    assert_ptr_equal(p->info, p->ops);
    assert_non_null(p->host);
    assert_ptr_equal(p->host->ctx, p);

    const dt_comm_ops_v1_t *ops = p->ops;
    dt_comm_init_v1_t args = {.struct_size = sizeof args, .rank = 0,
                              .size = 1, .local_size = 1, .timeout_ms = 1000};
    dt_comm_t *c = NULL;
    assert_int_equal(ops->init(p->host, &args, &c), DT_OK);
    /* the handle starts with the table it came from (dtrain/comm.h) */
    assert_ptr_equal(dt_comm_ops(c), ops);
    assert_int_equal(dt_plugin_check_instance(p, p->ops, c), DT_OK);
    int32_t rank = -1, size = -1;
    assert_int_equal(ops->rank_size(c, &rank, &size), DT_OK);
    assert_int_equal(rank, 0);
    assert_int_equal(size, 1);
    float send[5] = {1.5f, -2.0f, 3.25f, 1e-3f, 7.0f}, recv[5] = {0};
    dt_comm_req_t *req = NULL;
    assert_int_equal(ops->all_reduce(c, send, recv, 5, DT_F32, DT_OP_SUM, NULL,
                                     &req), DT_OK);
    assert_true(DT_HAS_OP(dt_comm_ops_v1_t, ops, test));
    assert_true(dt_plugin_has_op(p, "test"));
    int done = 0;
    assert_int_equal(ops->test(c, req, &done), DT_OK);
    assert_int_equal(done, 1);
    assert_int_equal(ops->wait(c, req, -1), DT_OK);
    assert_memory_equal(send, recv, sizeof send);

    /* init took its state from the host allocator */
    dt_mem_stats_t st = {.struct_size = sizeof(dt_mem_stats_t)};
    assert_int_equal(dt_plugin_host_mem_stats(p, &st), DT_OK);
    assert_true(st.current[DT_TAG_OTHER] > 0);
    ops->finalize(c);
    assert_int_equal(dt_plugin_host_mem_stats(p, &st), DT_OK);
    assert_int_equal(st.current[DT_TAG_OTHER], 0);
    assert_int_equal(st.total_current, 0);
    assert_true(st.peak[DT_TAG_OTHER] > 0);
    dt_plugin_unload(p);
    dt_plugin_unload(NULL);
}

/* A plugin whose handle does not start with its ops table (the SDK's
 * rule) is refused by name when it hands one out, and the instance is
 * finalized through the plugin's own table: an error, not a crash. */
static void test_handle_without_ops_refused(void **state)
{
    dt_plugin_t *p = NULL;
    assert_int_equal(load_plugin(DT_KIND_COMM, "fakebadhandle", &p), DT_OK);
    const dt_comm_ops_v1_t *ops = p->ops;
    dt_comm_init_v1_t args = {.struct_size = sizeof args, .size = 1, .timeout_ms = 1000};
    dt_comm_t *c = NULL;
    assert_int_equal(ops->init(p->host, &args, &c), DT_OK);
    assert_non_null(c);
    dt_mem_stats_t st = {.struct_size = sizeof(dt_mem_stats_t)};
    assert_int_equal(dt_plugin_host_mem_stats(p, &st), DT_OK);
    assert_true(st.current[DT_TAG_OTHER] > 0);
    assert_int_equal(dt_plugin_check_instance(p, p->ops, c), DT_ERR_INVALID);
    assert_msg("plugin 'fakebadhandle': its dt_comm handle does not start with its ops table "
               "(dtrain/comm.h)");
    assert_int_equal(dt_plugin_host_mem_stats(p, &st), DT_OK);
    assert_int_equal(st.current[DT_TAG_OTHER], 0); /* finalized */
    /* no handle: nothing to check */
    assert_int_equal(dt_plugin_check_instance(p, p->ops, NULL), DT_OK);
    dt_plugin_unload(p);
}

static void test_bad_arguments(void **state)
{
    dt_plugin_t *p = NULL;
    assert_int_equal(load_plugin(7, "fake", &p), DT_ERR_INVALID);
    assert_msg("unknown plugin kind 7");
    expect_load_fail(DT_KIND_COMM, "../fake", DT_ERR_INVALID);
    assert_msg("comm plugin name '../fake' is not valid (1 to 63 letters, "
               "digits, '_' or '-')");
    expect_load_fail(DT_KIND_COMM, "", DT_ERR_INVALID);
    assert_int_equal(load_plugin(DT_KIND_COMM, "fake", NULL),
                     DT_ERR_INVALID);
}

static void test_garbage_file(void **state)
{
    char dir[] = "/tmp/dt_loader_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/dtrain_garbage.so", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 4096; i++)
        fputc((i * 131 + 7) & 0xff, f);
    fclose(f);
    char env[1024];
    snprintf(env, sizeof env, "%s:%s", dir, FAKE);
    setenv("DTRAIN_PLUGIN_PATH", env, 1);

    expect_load_fail(DT_KIND_COMM, "garbage", DT_ERR_SYSTEM);
    char expect[1024];
    snprintf(expect, sizeof expect,
             "comm plugin 'garbage' at %s exists but failed to load: "
             "invalid ELF header " HINT, path);
    assert_msg(expect);
    unlink(path);
    rmdir(dir);
}

static void test_unresolved_symbol(void **state)
{
    /* libltdl binds lazily; the loader must still refuse this at load. */
    expect_load_fail(DT_KIND_COMM, "fakeundef", DT_ERR_SYSTEM);
    assert_msg("comm plugin 'fakeundef' at " FAKE "/dtrain_fakeundef.so "
               "exists but failed to load: undefined symbol: "
               "dt_fake_missing_symbol " HINT);
}

static void test_no_entry(void **state)
{
    expect_load_fail(DT_KIND_COMM, "fakenoentry", DT_ERR_ABI);
    assert_msg("comm plugin 'fakenoentry' at " FAKE "/dtrain_fakenoentry.so "
               "exports no dtrain_comm_v<N> entry (looked for "
               "dtrain_comm_v1); is it a comm plugin?");
}

static void test_plugin_of_another_kind(void **state)
{
    expect_load_fail(DT_KIND_STRATEGY, "fake", DT_ERR_ABI);
    assert_msg("strategy plugin 'fake' at " FAKE "/dtrain_fake.so exports no "
               "dtrain_strategy_v<N> entry (looked for dtrain_strategy_v1); "
               "is it a strategy plugin? (it exports dtrain_comm_v1: a comm "
               "plugin)");
}

static void test_wrong_major(void **state)
{
    expect_load_fail(DT_KIND_COMM, "fakev2", DT_ERR_ABI);
    assert_msg("comm plugin 'fakev2' at " FAKE "/dtrain_fakev2.so was built "
               "against comm ABI 2.x, this dtrain speaks comm ABI 1.x");
}

static void test_null_mandatory_method(void **state)
{
    expect_load_fail(DT_KIND_COMM, "fakenull", DT_ERR_ABI);
    assert_msg("comm plugin 'fakenull' at " FAKE "/dtrain_fakenull.so: "
               "mandatory method 'all_reduce' is NULL");
}

static void test_table_too_small(void **state)
{
    expect_load_fail(DT_KIND_COMM, "faketiny", DT_ERR_ABI);
    char expect[1024];
    snprintf(expect, sizeof expect,
             "comm plugin 'faketiny' at " FAKE "/dtrain_faketiny.so: ops "
             "table is %zu bytes (info.struct_size), too small for the "
             "mandatory methods of comm ABI 1.x (at least %zu bytes, up to "
             "'abort')", offsetof(dt_comm_ops_v1_t, barrier),
             offsetof(dt_comm_ops_v1_t, test));
    assert_msg(expect);
}

/* A table whose struct_size does not even cover the info block is refused
 * before any field past struct_size (kind, name, ...) is read: the table
 * is 12 bytes, so under ASan a read of info.kind is an overflow. */
static void test_info_block_too_small(void **state)
{
    expect_load_fail(DT_KIND_COMM, "fakeinfotiny", DT_ERR_ABI);
    char expect[1024];
    snprintf(expect, sizeof expect,
             "comm plugin 'fakeinfotiny' at " FAKE "/dtrain_fakeinfotiny.so: "
             "entry dtrain_comm_v1 returns a table of 4 bytes "
             "(info.struct_size), too small for the info block every table "
             "starts with (%zu bytes)", sizeof(dt_plugin_info_t));
    assert_msg(expect);
}

/* ------------------------------------------------- the kernel table -- */

/* A device with the core set of kernels loads; its optional kernels read
 * as absent through DT_HAS_OP. */
static void test_device_core_kernels_only(void **state)
{
    dt_plugin_t *p = NULL;
    assert_int_equal(load_plugin(DT_KIND_DEVICE, "fakedev", &p), DT_OK);
    const dt_device_ops_v1_t *ops = p->ops;
    const dt_kernels_v1_t *k = ops->kernels();
    assert_int_equal(k->info.struct_size, sizeof(dt_kernels_v1_t));
    assert_true(DT_HAS_OP(dt_kernels_t, k, cast));
    assert_false(DT_HAS_OP(dt_kernels_t, k, layernorm_forward));
    assert_false(DT_HAS_OP(dt_kernels_t, k, attention_forward));
    assert_false(DT_HAS_OP(dt_kernels_t, k, sgd_update));
    dt_plugin_unload(p);
}

static void test_device_null_mandatory_kernel(void **state)
{
    expect_load_fail(DT_KIND_DEVICE, "fakedevnullk", DT_ERR_ABI);
    assert_msg("device plugin 'fakedevnullk' at " FAKE "/dtrain_fakedevnullk.so: "
               "mandatory kernel 'gelu_backward' is NULL");
}

static void test_device_kernel_table_too_small(void **state)
{
    expect_load_fail(DT_KIND_DEVICE, "fakedevtinyk", DT_ERR_ABI);
    char expect[1024];
    snprintf(expect, sizeof expect,
             "device plugin 'fakedevtinyk' at " FAKE "/dtrain_fakedevtinyk.so: "
             "kernel table is %zu bytes (info.struct_size), too small for the "
             "mandatory kernels of kernel ABI 1.x (at least %zu bytes, up to "
             "'cast')", offsetof(dt_kernels_v1_t, cast),
             offsetof(dt_kernels_v1_t, layernorm_forward));
    assert_msg(expect);
}

static void test_device_without_kernel_table(void **state)
{
    expect_load_fail(DT_KIND_DEVICE, "fakedevnok", DT_ERR_ABI);
    assert_msg("device plugin 'fakedevnok' at " FAKE "/dtrain_fakedevnok.so: "
               "'kernels' returned no kernel table (NULL)");
    expect_load_fail(DT_KIND_DEVICE, "fakedevnullrt", DT_ERR_ABI);
    assert_msg("device plugin 'fakedevnullrt' at " FAKE
               "/dtrain_fakedevnullrt.so: mandatory method 'kernels' is NULL");
}

static void test_device_kernel_table_wrong_major(void **state)
{
    expect_load_fail(DT_KIND_DEVICE, "fakedevk2", DT_ERR_ABI);
    char expect[512];
    snprintf(expect, sizeof expect,
             "device plugin 'fakedevk2' at " FAKE "/dtrain_fakedevk2.so: "
             "'kernels' returned a kernel table of kernel ABI 2.%d "
             "(info.abi_major), this dtrain speaks kernel ABI 1.x",
             DT_KERNELS_ABI_MINOR);
    assert_msg(expect);
}

static void test_kind_mismatch(void **state)
{
    expect_load_fail(DT_KIND_COMM, "fakekind", DT_ERR_ABI);
    assert_msg("comm plugin 'fakekind' at " FAKE "/dtrain_fakekind.so: entry "
               "dtrain_comm_v1 returns a table of kind 'device' (info.kind "
               "0), expected 'comm'");
}

static void test_name_mismatch(void **state)
{
    expect_load_fail(DT_KIND_COMM, "fakemismatch", DT_ERR_ABI);
    assert_msg("comm plugin 'fakemismatch' at " FAKE
               "/dtrain_fakemismatch.so: file dtrain_fakemismatch.so "
               "declares name 'fake'");
}

/* The core's side of an optional method: call it only when present, else
 * fall back (wait blocks where test would poll). */
static int comm_poll(dt_comm_t *c,
                     dt_comm_req_t *req, int *done, int *used_test)
{
    if (DT_HAS_OP(dt_comm_ops_v1_t, dt_comm_ops(c), test)) {
        *used_test = 1;
        return dt_comm_ops(c)->test(c, req, done);
    }
    *used_test = 0;
    int rc = dt_comm_ops(c)->wait(c, req, -1);
    *done = rc == DT_OK;
    return rc;
}

static void test_optional_method_past_struct_size(void **state)
{
    dt_plugin_t *p = NULL;
    assert_int_equal(load_plugin(DT_KIND_COMM, "fakesmall", &p),
                     DT_OK);
    const dt_comm_ops_v1_t *ops = p->ops;
    assert_int_equal(ops->info.struct_size, offsetof(dt_comm_ops_v1_t, test));
    /* The slot holds a pointer (the bytes past a real older table could be
     * anything), but it lies past struct_size: absent. */
    assert_non_null(ops->test);
    assert_false(DT_HAS_OP(dt_comm_ops_v1_t, ops, test));
    assert_false(dt_plugin_has_op(p, "test"));
    assert_true(dt_plugin_has_op(p, "abort"));
    assert_false(dt_plugin_has_op(p, "no_such_method"));
    assert_int_equal(dt_plugin_require_op(p, "abort"), DT_OK);

    dt_err_clear();
    assert_int_equal(dt_plugin_require_op(p, "test"), DT_ERR_UNSUPPORTED);
    char expect[512];
    snprintf(expect, sizeof expect,
             "comm/fakesmall: optional method 'test' is not provided (the "
             "plugin's ops table is %zu bytes and ends before it; built "
             "against comm ABI 1.%d)", offsetof(dt_comm_ops_v1_t, test), DT_COMM_ABI_MINOR);
    assert_msg(expect);
    assert_int_equal(dt_plugin_require_op(p, "tset"), DT_ERR_INVALID);
    assert_msg("comm/fakesmall: 'tset' is not a method of the comm ABI 1.x");

    dt_comm_t *c = NULL;
    dt_comm_init_v1_t args = {.struct_size = sizeof args, .size = 1};
    assert_int_equal(ops->init(p->host, &args, &c), DT_OK);
    dt_comm_req_t *req = NULL;
    assert_int_equal(ops->barrier(c, &req), DT_OK);
    int done = 0, used_test = -1;
    assert_int_equal(comm_poll(c, req, &done, &used_test), DT_OK);
    assert_int_equal(used_test, 0);
    assert_int_equal(done, 1);
    ops->finalize(c);
    dt_plugin_unload(p);

    /* the full table takes the other branch */
    assert_int_equal(load_plugin(DT_KIND_COMM, "fake", &p), DT_OK);
    ops = p->ops;
    assert_int_equal(ops->init(p->host, &args, &c), DT_OK);
    assert_int_equal(ops->barrier(c, &req), DT_OK);
    assert_int_equal(comm_poll(c, req, &done, &used_test), DT_OK);
    assert_int_equal(used_test, 1);
    ops->finalize(c);
    dt_plugin_unload(p);
}

static void test_newer_minor_is_accepted(void **state)
{
    fflush(stderr);
    FILE *cap = tmpfile();
    assert_non_null(cap);
    int saved = dup(2);
    dup2(fileno(cap), 2);
    dt_log_set_level(DT_LOG_DEBUG);
    dt_log_set_rank(-1);
    dt_plugin_t *p = NULL;
    int rc = load_plugin(DT_KIND_COMM, "fakenewer", &p);
    dt_log_set_level(DT_LOG_WARN);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    assert_int_equal(rc, DT_OK);
    assert_int_equal(p->info->abi_minor, DT_COMM_ABI_MINOR + 1);
    assert_true(p->info->struct_size > sizeof(dt_comm_ops_v1_t));
    assert_true(DT_HAS_OP(dt_comm_ops_v1_t, (const dt_comm_ops_v1_t *)p->ops, test));
    dt_plugin_unload(p);

    char log[8192] = "";
    rewind(cap);
    size_t n = fread(log, 1, sizeof log - 1, cap);
    log[n] = '\0';
    fclose(cap);
    char want[512];
    snprintf(want, sizeof want, "[rank ?] loader: comm plugin 'fakenewer' at " FAKE
             "/dtrain_fakenewer.so was built against comm ABI 1.%d, newer than this "
             "dtrain's 1.%d; methods added after 1.%d are not used\n", DT_COMM_ABI_MINOR + 1,
             DT_COMM_ABI_MINOR, DT_COMM_ABI_MINOR);
    if (!strstr(log, want))
        fail_msg("debug log lacks\n  %s\ngot\n  %s", want, log);
}

static void test_two_majors(void **state)
{
    dt_plugin_t *p = NULL;
    assert_int_equal(load_plugin(DT_KIND_COMM, "faketwo", &p), DT_OK);
    assert_int_equal(p->major, 1);
    assert_string_equal(p->info->version, "one");
    dt_plugin_unload(p);

    /* A dtrain that also speaks comm 2 prefers the newest table. */
    dt_abi_set_extra_major(DT_KIND_COMM, 2);
    uint32_t majors[4];
    assert_int_equal(dt_abi_majors(DT_KIND_COMM, majors, 4), 2);
    assert_int_equal(majors[0], 2);
    assert_int_equal(majors[1], 1);
    assert_int_equal(load_plugin(DT_KIND_COMM, "faketwo", &p), DT_OK);
    assert_int_equal(p->major, 2);
    assert_int_equal(p->info->abi_major, 2);
    assert_string_equal(p->info->version, "two");
    dt_plugin_unload(p);
    /* v2-only now loads; v1-only still loads at 1 */
    assert_int_equal(load_plugin(DT_KIND_COMM, "fakev2", &p), DT_OK);
    assert_int_equal(p->major, 2);
    dt_plugin_unload(p);
    assert_int_equal(load_plugin(DT_KIND_COMM, "fake", &p), DT_OK);
    assert_int_equal(p->major, 1);
    dt_plugin_unload(p);
    /* other kinds are unaffected */
    assert_int_equal(dt_abi_majors(DT_KIND_DEVICE, majors, 4), 1);
    expect_load_fail(DT_KIND_COMM, "fakenoentry", DT_ERR_ABI);
    assert_msg_has("(looked for dtrain_comm_v2, dtrain_comm_v1)");

    dt_abi_set_extra_major(DT_KIND_COMM, 0);
    assert_int_equal(load_plugin(DT_KIND_COMM, "faketwo", &p), DT_OK);
    assert_int_equal(p->major, 1);
    dt_plugin_unload(p);
}

/* ------------------------------------------------------ init failures -- */

static dt_config_t *fake_config(const char *text, dt_plugin_t *p)
{
    dt_config_t *cfg = NULL;
    if (dt_config_load_string("run.toml", text, &cfg) != DT_OK)
        fail_msg("config: %s", dt_last_error());
    return cfg;
}

static int init_with(const char *toml, dt_plugin_t **pp, dt_config_t **cp)
{
    dt_config_t *cfg = fake_config(toml, NULL);
    dt_plugin_t *p = NULL;
    dt_search_path_t *sp = env_path(NULL);
    assert_int_equal(dt_plugin_open(sp, DT_KIND_COMM, "fake", &p), DT_OK);
    dt_search_path_free(sp);
    /* As the engine does: validate the plugin's table with its own keys
     * once the plugin (and so its key list) is known, then bind. */
    assert_int_equal(dt_config_apply_schema(cfg, "fake", p->info->config_keys,
                                            p->info->n_config_keys), DT_OK);
    assert_ok(dt_plugin_bind(p, cfg));
    const dt_comm_ops_v1_t *ops = p->ops;
    dt_comm_init_v1_t args = {.struct_size = sizeof args, .size = 1};
    dt_comm_t *c = NULL;
    dt_err_clear();
    int rc = ops->init(p->host, &args, &c);
    if (rc == DT_OK)
        ops->finalize(c);
    *pp = p;
    *cp = cfg;
    return rc;
}

static void test_init_failure_message(void **state)
{
    dt_plugin_t *p;
    dt_config_t *cfg;
    int rc = init_with("[fake]\ninit_fail = \"message\"\n", &p, &cfg);
    assert_int_equal(rc, DT_ERR_SYSTEM);
    assert_int_equal(dt_plugin_failed(p, rc, "init"), DT_ERR_SYSTEM);
    assert_msg("comm/fake: cannot open /dev/fake: No such device");
    dt_plugin_unload(p);
    dt_config_free(cfg);
}

static void test_init_failure_without_message(void **state)
{
    dt_plugin_t *p;
    dt_config_t *cfg;
    int rc = init_with("[fake]\ninit_fail = \"silent\"\n", &p, &cfg);
    assert_int_equal(rc, DT_ERR_SYSTEM);
    assert_string_equal(dt_last_error(), "");
    assert_int_equal(dt_plugin_failed(p, rc, "init"), DT_ERR_SYSTEM);
    assert_msg("comm/fake: init failed (DT_ERR_SYSTEM) and gave no reason");
    dt_plugin_unload(p);
    dt_config_free(cfg);
}

static void test_plugin_failed_prefixing(void **state)
{
    dt_plugin_t *p = NULL;
    assert_int_equal(load_plugin(DT_KIND_COMM, "fake", &p), DT_OK);
    /* a message set without the prefix (e.g. by a library the plugin used)
     * gets it */
    dt_err_set(DT_ERR_IO, "disk full");
    assert_int_equal(dt_plugin_failed(p, DT_ERR_IO, "store"), DT_ERR_IO);
    assert_msg("comm/fake: disk full");
    /* already prefixed: unchanged (no "comm/fake: comm/fake: ") */
    assert_int_equal(dt_plugin_failed(p, DT_ERR_IO, "store"), DT_ERR_IO);
    assert_msg("comm/fake: disk full");
    /* another plugin's prefix is not ours */
    dt_err_set(DT_ERR_REMOTE, "comm/fakex: peer 3 died");
    dt_plugin_failed(p, DT_ERR_REMOTE, "wait");
    assert_msg("comm/fake: comm/fakex: peer 3 died");
    /* DT_OK changes nothing */
    assert_int_equal(dt_plugin_failed(p, DT_OK, "wait"), DT_OK);
    assert_msg("comm/fake: comm/fakex: peer 3 died");
    dt_err_clear();
    assert_int_equal(dt_plugin_failed(p, DT_ERR_TIMEOUT, "barrier"),
                     DT_ERR_TIMEOUT);
    assert_msg("comm/fake: barrier failed (DT_ERR_TIMEOUT) and gave no reason");
    dt_plugin_unload(p);
}

/* ------------------------------------------------------- cleanup_job -- */

/* The loader calls a comm's optional cleanup_job with the plugin's host
 * table (so its config); a plugin without the slot is a no-op. */
static void test_cleanup_job(void **state)
{
    char dir[] = "/tmp/dt_cleanup_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char toml[256], mark[512];
    snprintf(toml, sizeof toml, "[fake]\ncleanup_dir = \"%s\"\n", dir);
    dt_config_t *cfg = fake_config(toml, NULL);
    dt_search_path_t *sp = env_path(NULL);
    dt_plugin_t *p = NULL;
    assert_ok(dt_plugin_open(sp, DT_KIND_COMM, "fake", &p));
    assert_status(dt_plugin_cleanup_job(p, "job-1"), DT_ERR_INVALID);
    assert_msg("dt_plugin_cleanup_job: plugin not bound");
    assert_ok(dt_config_apply_schema(cfg, "fake", p->info->config_keys,
                                     p->info->n_config_keys));
    assert_ok(dt_plugin_bind(p, cfg));
    assert_true(dt_plugin_has_op(p, "cleanup_job"));
    assert_ok(dt_plugin_cleanup_job(p, "job-1"));
    snprintf(mark, sizeof mark, "%s/job-1", dir);
    assert_int_equal(access(mark, F_OK), 0);
    unlink(mark);
    /* a failure comes back with the plugin's prefix */
    assert_status(dt_plugin_cleanup_job(p, "a/b"), DT_ERR_INVALID);
    assert_msg("comm/fake: cleanup of job 'a/b': not a job id");
    assert_status(dt_plugin_cleanup_job(p, ""), DT_ERR_INVALID);
    assert_msg("dt_plugin_cleanup_job: empty job id");
    dt_plugin_unload(p);

    /* fakesmall's table ends before the slot: nothing is called */
    assert_ok(dt_plugin_load(sp, DT_KIND_COMM, "fakesmall", &p));
    assert_false(dt_plugin_has_op(p, "cleanup_job"));
    dt_err_set(DT_ERR_IO, "earlier");
    assert_ok(dt_plugin_cleanup_job(p, "job-2"));
    assert_msg("earlier");
    dt_plugin_unload(p);
    dt_search_path_free(sp);
    dt_config_free(cfg);
    rmdir(dir);
}

/* --------------------------------------------------- process survival -- */

static void test_failures_leave_process_usable(void **state)
{
    static const char *const broken[] = {
        "fakenoentry", "fakev2", "faketiny", "fakenull", "fakekind",
        "fakemismatch", "fakeundef", "nosuchplugin"};
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < DT_ARRAY_LEN(broken); i++) {
            dt_plugin_t *p = NULL;
            int rc = load_plugin(DT_KIND_COMM, broken[i], &p);
            assert_int_not_equal(rc, DT_OK);
            assert_null(p);
            assert_non_null(strstr(dt_last_error(), broken[i]));
        }
    }
    /* load, unload, load again: the module comes back with a fresh state */
    for (int round = 0; round < 3; round++) {
        dt_plugin_t *p = NULL;
        assert_int_equal(load_plugin(DT_KIND_COMM, "fake", &p),
                         DT_OK);
        const dt_comm_ops_v1_t *ops = p->ops;
        dt_comm_t *c = NULL;
        dt_comm_init_v1_t args = {.struct_size = sizeof args, .size = 1};
        assert_int_equal(ops->init(p->host, &args, &c), DT_OK);
        ops->finalize(c);
        dt_plugin_unload(p);
    }
    /* the same plugin twice: separate host tables, unload in any order */
    dt_plugin_t *a = NULL, *b = NULL;
    assert_int_equal(load_plugin(DT_KIND_COMM, "fake", &a), DT_OK);
    assert_int_equal(load_plugin(DT_KIND_COMM, "fake", &b), DT_OK);
    assert_ptr_not_equal(a->host, b->host);
    assert_ptr_equal(a->ops, b->ops); /* one module, one static table */
    dt_plugin_unload(a);
    const dt_comm_ops_v1_t *ops = b->ops;
    dt_comm_t *c = NULL;
    dt_comm_init_v1_t args = {.struct_size = sizeof args, .size = 1};
    assert_int_equal(ops->init(b->host, &args, &c), DT_OK);
    ops->finalize(c);
    dt_plugin_unload(b);
}

/* ---------------------------------------------------------- discovery -- */

static const dt_plugin_listing_t *find_listing(const dt_plugin_listing_t *l,
                                               size_t n, const char *name)
{
    const dt_plugin_listing_t *hit = NULL;
    for (size_t i = 0; i < n; i++)
        if (strcmp(l[i].name, name) == 0) {
            if (hit)
                fail_msg("'%s' listed twice", name);
            hit = &l[i];
        }
    if (!hit)
        fail_msg("'%s' not listed", name);
    return hit;
}

static void test_discover(void **state)
{
    /* A folder before the fakes that holds a garbage module and a garbage
     * file shadowing fakenull: the first occurrence of a name wins. */
    char dir[] = "/tmp/dt_discover_XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *files[] = {"dtrain_garbage.so", "dtrain_fakenull.so",
                           "not_a_plugin.so", "dtrain_.so"};
    for (size_t i = 0; i < DT_ARRAY_LEN(files); i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fputs("this is not an ELF file\n", f);
        fclose(f);
    }
    char env[1024];
    snprintf(env, sizeof env, "%s:%s", dir, FAKE);
    setenv("DTRAIN_PLUGIN_PATH", env, 1);

    dt_err_set(DT_ERR_IO, "an earlier error");
    dt_plugin_listing_t *l = NULL;
    size_t n = 0;
    dt_search_path_t *sp = env_path(NULL);
    assert_int_equal(dt_plugin_discover(sp, &l, &n), DT_OK);
    dt_search_path_free(sp);
    assert_msg("an earlier error"); /* probing failures stay in listings */

    const dt_plugin_listing_t *e = find_listing(l, n, "fake");
    assert_int_equal(e->kind, DT_KIND_COMM);
    assert_int_equal(e->loadable, 1);
    assert_int_equal(e->abi_major, 1);
    assert_int_equal(e->abi_minor, DT_COMM_ABI_MINOR);
    assert_string_equal(e->version, "0.1.0");
    assert_string_equal(e->path, FAKE "/dtrain_fake.so");
    assert_string_equal(e->why, "");

    e = find_listing(l, n, "fakesmall");
    assert_int_equal(e->loadable, 1);
    e = find_listing(l, n, "faketwo");
    assert_int_equal(e->loadable, 1);
    assert_string_equal(e->version, "one");
    e = find_listing(l, n, "fakenewer");
    assert_int_equal(e->loadable, 1);
    assert_int_equal(e->abi_minor, DT_COMM_ABI_MINOR + 1);
    assert_string_equal(e->version, "1.1.0");

    e = find_listing(l, n, "fakev2");
    assert_int_equal(e->kind, DT_KIND_COMM);
    assert_int_equal(e->loadable, 0);
    assert_int_equal(e->abi_major, 2);
    assert_string_equal(e->why, "comm plugin 'fakev2' at " FAKE
                        "/dtrain_fakev2.so was built against comm ABI 2.x, "
                        "this dtrain speaks comm ABI 1.x");
    e = find_listing(l, n, "fakemismatch");
    assert_int_equal(e->kind, DT_KIND_COMM);
    assert_int_equal(e->loadable, 0);
    assert_non_null(strstr(e->why, "declares name 'fake'"));
    e = find_listing(l, n, "fakekind");
    assert_int_equal(e->loadable, 0);
    e = find_listing(l, n, "faketiny");
    assert_int_equal(e->loadable, 0);
    e = find_listing(l, n, "fakeundef");
    assert_int_equal(e->kind, -1);
    assert_int_equal(e->loadable, 0);
    assert_non_null(strstr(e->why, "undefined symbol: dt_fake_missing_symbol"));
    e = find_listing(l, n, "fakenoentry");
    assert_int_equal(e->kind, -1);
    assert_int_equal(e->loadable, 0);
    assert_string_equal(e->why, "plugin 'fakenoentry' at " FAKE
                        "/dtrain_fakenoentry.so exports no "
                        "dtrain_<kind>_v<N> entry; is it a dtrain plugin?");

    /* a table too small for its info block: listed without reading past
     * it (no version), refused with the loader's message */
    e = find_listing(l, n, "fakeinfotiny");
    assert_int_equal(e->kind, DT_KIND_COMM);
    assert_int_equal(e->loadable, 0);
    assert_string_equal(e->version, "");
    assert_non_null(strstr(e->why, "too small for the info block"));

    char path[512];
    e = find_listing(l, n, "fakenull"); /* the shadowing garbage file */
    snprintf(path, sizeof path, "%s/dtrain_fakenull.so", dir);
    assert_string_equal(e->path, path);
    assert_int_equal(e->kind, -1);
    assert_int_equal(e->loadable, 0);
    assert_non_null(strstr(e->why, "exists but failed to load: "));
    e = find_listing(l, n, "garbage");
    assert_int_equal(e->loadable, 0);
    assert_non_null(strstr(e->why, "plugin 'garbage' at "));
    for (size_t i = 0; i < n; i++) {
        assert_string_not_equal(l[i].name, "");        /* dtrain_.so */
        assert_string_not_equal(l[i].name, "not_a_plugin");
    }
    /* the garbage folder comes first and is listed in name order */
    assert_string_equal(l[0].name, "fakenull");
    assert_string_equal(l[1].name, "garbage");
    free(l);

    for (size_t i = 0; i < DT_ARRAY_LEN(files); i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_kind_names, setup),
        cmocka_unit_test_setup(test_entry_names_match_macro, setup),
        cmocka_unit_test_setup(test_abi_layouts_cover_structs, setup),
        cmocka_unit_test_setup(test_search_path_order, setup),
        cmocka_unit_test_setup(test_not_found_lists_every_folder, setup),
        cmocka_unit_test_setup(test_current_dir_only_when_configured, setup),
        cmocka_unit_test_setup(test_bind_after_schema, setup),
        cmocka_unit_test_setup(test_load_valid_and_call, setup),
        cmocka_unit_test_setup(test_bad_arguments, setup),
        cmocka_unit_test_setup(test_garbage_file, setup),
        cmocka_unit_test_setup(test_unresolved_symbol, setup),
        cmocka_unit_test_setup(test_no_entry, setup),
        cmocka_unit_test_setup(test_plugin_of_another_kind, setup),
        cmocka_unit_test_setup(test_wrong_major, setup),
        cmocka_unit_test_setup(test_null_mandatory_method, setup),
        cmocka_unit_test_setup(test_table_too_small, setup),
        cmocka_unit_test_setup(test_device_core_kernels_only, setup),
        cmocka_unit_test_setup(test_device_null_mandatory_kernel, setup),
        cmocka_unit_test_setup(test_device_kernel_table_too_small, setup),
        cmocka_unit_test_setup(test_device_without_kernel_table, setup),
        cmocka_unit_test_setup(test_device_kernel_table_wrong_major, setup),
        cmocka_unit_test_setup(test_kind_mismatch, setup),
        cmocka_unit_test_setup(test_name_mismatch, setup),
        cmocka_unit_test_setup(test_optional_method_past_struct_size, setup),
        cmocka_unit_test_setup(test_newer_minor_is_accepted, setup),
        cmocka_unit_test_setup(test_two_majors, setup),
        cmocka_unit_test_setup(test_handle_without_ops_refused, setup),
        cmocka_unit_test_setup(test_init_failure_message, setup),
        cmocka_unit_test_setup(test_init_failure_without_message, setup),
        cmocka_unit_test_setup(test_plugin_failed_prefixing, setup),
        cmocka_unit_test_setup(test_cleanup_job, setup),
        cmocka_unit_test_setup(test_failures_leave_process_usable, setup),
        cmocka_unit_test_setup(test_discover, setup),
        cmocka_unit_test_setup(test_info_block_too_small, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
