/*
 * tests/unit/core/setup/test_resolve.c - the staged resolve (core/setup/resolve.c):
 * the core stage's typed settings and search path (run.plugin_path), one
 * role at a time with the plugin's table checked before its host table
 * reads it, switching a role's plugin, errors that leave the rest usable,
 * the final unclaimed-table check, and every stage at once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "setup/resolve.h"
#include "util/error.h"
#include "util/log.h"
#include "test_assert.h"

#ifndef DT_FAKE_PLUGIN_DIR
#define DT_FAKE_PLUGIN_DIR DT_TEST_BINARY_DIR "/fake-plugins"
#endif

static char path[64];

/* Write `body` after a [run] table that finds the fakes through
 * run.plugin_path (not the environment). */
static const char *config(const char *run_extra, const char *body)
{
    if (path[0])
        unlink(path);
    snprintf(path, sizeof path, "/tmp/dt_resolve_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fprintf(f, "[run]\nplugin_path = \"%s\"\ncomm = \"fake\"\n%s%s", DT_FAKE_PLUGIN_DIR,
            run_extra, body);
    fclose(f);
    return path;
}

static int setup(void **state)
{
    unsetenv("DTRAIN_PLUGIN_PATH");
    dt_log_set_level(DT_LOG_WARN);
    dt_err_clear();
    return 0;
}

static int teardown(void **state)
{
    unlink(path);
    return 0;
}

static void test_core_stage(void **state)
{
    const char *sets[] = {"train.steps=7", "parallel.data=zero"};
    dt_resolved_t r;
    assert_ok(dt_resolve_core(config("", "[train]\nsteps = 3\nlr = 0.5\n"), sets, 2, &r));
    assert_string_equal(r.set.config_path, path);
    assert_int_equal(r.set.train.steps, 7); /* --set beats the file */
    assert_true(r.set.train.lr == 0.5);
    assert_string_equal(r.set.parallel.data, "zero");
    assert_string_equal(r.set.run.comm, "fake");
    /* run.plugin_path leads the search path when the environment names none */
    assert_string_equal(dt_search_path_dir(r.search, 0), DT_FAKE_PLUGIN_DIR);
    for (int i = 0; i < DT_ROLE_COUNT; i++)
        assert_null(r.plugin[i]);
    assert_true(dt_config_claimed(r.cfg, "launch"));
    assert_false(dt_config_claimed(r.cfg, "fake"));

    /* a change after the core stage is seen by the settings */
    assert_ok(dt_resolve_set(&r, "train.steps=9"));
    assert_int_equal(r.set.train.steps, 9);
    assert_status(dt_resolve_set(&r, "train.steps=x"), DT_ERR_CONFIG);
    assert_msg("--set train.steps=x: [train] steps: expected an integer, got string \"x\"");
    assert_int_equal(r.set.train.steps, 9);
    dt_resolved_free(&r);

    /* no file: the core's defaults */
    assert_ok(dt_resolve_core(NULL, NULL, 0, &r));
    assert_string_equal(r.set.config_path, "");
    assert_string_equal(r.set.run.comm, "shm");
    assert_int_equal(r.set.launch.nproc, 1);
    dt_resolved_free(&r);

    /* an unreadable file is the user's input: a config error, all freed */
    assert_status(dt_resolve_core("/nonexistent/x.toml", NULL, 0, &r), DT_ERR_CONFIG);
    assert_msg_starts("cannot open config file '/nonexistent/x.toml': ");
    assert_null(r.cfg);
    assert_null(r.search);
    config("", "[train]\nsteps = 0\n");
    assert_status(dt_resolve_core(path, NULL, 0, &r), DT_ERR_CONFIG);
    assert_msg_has(":5:9: [train] steps = 0 is out of range");
}

static void test_plugin_stage(void **state)
{
    dt_resolved_t r;
    assert_ok(dt_resolve_core(config("", "[fake]\ncount = 7\n"), NULL, 0, &r));
    assert_ok(dt_resolve_plugin(&r, DT_ROLE_COMM, NULL, NULL));
    dt_plugin_t *p = r.plugin[DT_ROLE_COMM];
    assert_non_null(p);
    assert_string_equal(p->name, "fake");
    assert_string_equal(p->path, DT_FAKE_PLUGIN_DIR "/dtrain_fake.so");
    /* its table was checked (defaults filled) before its host table */
    assert_true(dt_config_claimed(r.cfg, "fake"));
    int64_t count = 0;
    const char *s = NULL;
    assert_ok(p->host->cfg_int(p->host, "count", &count));
    assert_int_equal(count, 7);
    assert_ok(p->host->cfg_string(p->host, "greeting", &s));
    assert_string_equal(s, "hello");
    /* the same plugin again: kept */
    assert_ok(dt_resolve_plugin(&r, DT_ROLE_COMM, NULL, NULL));
    assert_ptr_equal(r.plugin[DT_ROLE_COMM], p);
    /* another one: the first is unloaded, the new one has its own table */
    assert_ok(dt_resolve_set(&r, "run.comm=fakesmall"));
    assert_ok(dt_resolve_plugin(&r, DT_ROLE_COMM, NULL, NULL));
    assert_string_equal(r.plugin[DT_ROLE_COMM]->name, "fakesmall");
    assert_true(dt_config_claimed(r.cfg, "fakesmall"));
    /* a role the settings leave unused stays empty */
    assert_ok(dt_resolve_plugin(&r, DT_ROLE_OFFLOAD, NULL, NULL));
    assert_ok(dt_resolve_plugin(&r, DT_ROLE_TENSOR, NULL, NULL));
    assert_null(r.plugin[DT_ROLE_OFFLOAD]);
    assert_null(r.plugin[DT_ROLE_TENSOR]);
    /* a name given by the caller wins over the settings */
    assert_ok(dt_resolve_plugin(&r, DT_ROLE_COMM, "fake", "--comm fake"));
    assert_string_equal(r.plugin[DT_ROLE_COMM]->name, "fake");
    dt_resolved_free(&r);
}

static void test_plugin_errors(void **state)
{
    dt_resolved_t r;
    assert_ok(dt_resolve_core(config("", "[fake]\ncounnt = 2\n"), NULL, 0, &r));
    assert_status(dt_resolve_plugin(&r, DT_ROLE_COMM, NULL, NULL), DT_ERR_CONFIG);
    char want[512];
    snprintf(want, sizeof want, "%s:5:1: unknown key 'counnt' in [fake]; did you mean "
             "'count'?", path);
    assert_msg(want);
    assert_null(r.plugin[DT_ROLE_COMM]);

    /* not installed: a config error naming where the value came from (the
     * --set as typed, not the file), or the caller's words */
    assert_ok(dt_resolve_set(&r, "run.comm=nope"));
    assert_status(dt_resolve_plugin(&r, DT_ROLE_COMM, NULL, NULL), DT_ERR_CONFIG);
    assert_msg_starts("--set run.comm=nope: comm plugin 'nope' not found in: "
                      DT_FAKE_PLUGIN_DIR ", ");
    /* a name no plugin can have is the config's fault too (exit 2) */
    assert_ok(dt_resolve_set(&r, "parallel.data=../../x"));
    assert_status(dt_resolve_plugin(&r, DT_ROLE_DATA, NULL, NULL), DT_ERR_CONFIG);
    assert_msg("--set parallel.data=../../x: strategy plugin name '../../x' is not "
               "valid (1 to 63 letters, digits, '_' or '-')");
    assert_status(dt_resolve_plugin(&r, DT_ROLE_COMM, "nope", "--comm nope"),
                  DT_ERR_CONFIG);
    assert_msg_starts("--comm nope: comm plugin 'nope' not found in: ");
    /* the rest of the resolve is still usable */
    assert_ok(dt_resolve_set(&r, "parallel.data=none"));
    assert_status(dt_resolve_plugin(&r, DT_ROLE_DATA, NULL, NULL), DT_ERR_CONFIG);
    assert_msg("--set parallel.data=none: a data-parallel strategy is required to hold "
               "parameters (use \"ddp\", which is exact for one process)");
    assert_ok(dt_resolve_set(&r, "run.device="));
    assert_status(dt_resolve_plugin(&r, DT_ROLE_DEVICE, NULL, NULL), DT_ERR_CONFIG);
    assert_msg("--set run.device=: run.device is empty: name a device plugin");
    dt_resolved_free(&r);

    /* written in the file: its line and the value as written */
    assert_ok(dt_resolve_core(config("", "[parallel]\ndata = \"../x\"\n"), NULL, 0, &r));
    assert_status(dt_resolve_plugin(&r, DT_ROLE_COMM, NULL, NULL), DT_OK);
    assert_status(dt_resolve_plugin(&r, DT_ROLE_DATA, NULL, NULL), DT_ERR_CONFIG);
    snprintf(want, sizeof want, "%s:5: parallel.data = \"../x\": strategy plugin name "
             "'../x' is not valid (1 to 63 letters, digits, '_' or '-')", path);
    assert_msg(want);
    dt_resolved_free(&r);
}

/* run.name is a folder under out_dir: only a plain name, refused at the
 * core stage with where it was written. */
static void test_run_name(void **state)
{
    dt_resolved_t r;
    const char *bad[] = {"run.name=../../x"};
    assert_status(dt_resolve_core(config("", ""), bad, 1, &r), DT_ERR_CONFIG);
    assert_msg("--set run.name=../../x: run.name must be a plain name, 1 to 64 letters, "
               "digits, '.', '_' or '-', not \".\" or \"..\" (it names the folder "
               "<run.out_dir>/<run.name>)");
    assert_status(dt_resolve_core(config("name = \"..\"\n", ""), NULL, 0, &r), DT_ERR_CONFIG);
    char want[512];
    snprintf(want, sizeof want, "%s:4: run.name = \"..\": run.name must be a plain name, 1 "
             "to 64 letters, digits, '.', '_' or '-', not \".\" or \"..\" (it names the "
             "folder <run.out_dir>/<run.name>)", path);
    assert_msg(want);
    char long_name[80] = "run.name=";
    memset(long_name + 9, 'a', 65);
    const char *too_long[] = {long_name};
    assert_status(dt_resolve_core(config("", ""), too_long, 1, &r), DT_ERR_CONFIG);
    assert_msg_has(": run.name must be a plain name, 1 to 64 letters");
    long_name[9 + 64] = '\0'; /* 64 characters: allowed, as is a dot inside */
    const char *ok[] = {long_name, "run.name=gpt2.v1-b_2"};
    assert_ok(dt_resolve_core(config("", ""), ok, 1, &r));
    dt_resolved_free(&r);
    assert_ok(dt_resolve_core(config("", ""), ok + 1, 1, &r));
    assert_string_equal(r.set.run.name, "gpt2.v1-b_2");
    dt_resolved_free(&r);
}

static void test_every_stage(void **state)
{
    /* cpu and ddp come from the build tree, after run.plugin_path */
    dt_resolved_t r;
    assert_ok(dt_resolve(config("", "[fake]\nverbose = true\n"), NULL, 0, &r));
    assert_string_equal(r.plugin[DT_ROLE_DEVICE]->name, "cpu");
    assert_string_equal(r.plugin[DT_ROLE_COMM]->name, "fake");
    assert_string_equal(r.plugin[DT_ROLE_DATA]->name, "ddp");
    assert_null(r.plugin[DT_ROLE_OFFLOAD]);
    dt_resolved_free(&r);

    /* a table of a plugin the config does not select: checked against the
     * plugin's keys and set aside, not claimed */
    assert_ok(dt_resolve(config("", "[zero]\nstage = 2\n"), NULL, 0, &r));
    assert_string_equal(dt_config_aside(r.cfg, 0), "zero");
    assert_null(dt_config_aside(r.cfg, 1));
    assert_false(dt_config_claimed(r.cfg, "zero"));
    dt_resolved_free(&r);
    const char *zero_set[] = {"zero.stage=3"};
    assert_ok(dt_resolve(config("", ""), zero_set, 1, &r));
    assert_string_equal(dt_config_aside(r.cfg, 0), "zero");
    dt_resolved_free(&r);
    /* ... a typo in it is still an error, a bad value too */
    char want[512];
    assert_status(dt_resolve(config("", "[zero]\nstag = 2\n"), NULL, 0, &r), DT_ERR_CONFIG);
    snprintf(want, sizeof want, "%s:5:1: unknown key 'stag' in [zero]; did you mean 'stage'?",
             path);
    assert_msg(want);
    assert_null(r.cfg);
    assert_status(dt_resolve(config("", "[zero]\nstage = 7\n"), NULL, 0, &r), DT_ERR_CONFIG);
    assert_msg_has(":5:9: [zero] stage = 7 is out of range");
    /* ... and selecting it claims it after all */
    const char *pick_zero[] = {"parallel.data=zero"};
    assert_ok(dt_resolve(config("", "[zero]\nstage = 2\n"), pick_zero, 1, &r));
    assert_null(dt_config_aside(r.cfg, 0));
    assert_true(dt_config_claimed(r.cfg, "zero"));
    dt_resolved_free(&r);

    /* a table no plugin on the search path is named after */
    assert_status(dt_resolve(config("", "[zeroo]\nstage = 2\n"), NULL, 0, &r), DT_ERR_CONFIG);
    snprintf(want, sizeof want, "%s:4:1: unknown table [zeroo]", path);
    assert_msg_starts(want);
    assert_msg_has("(a plugin's table is named after a plugin on the search path)");
    assert_null(r.cfg);

    /* the last stage alone, with the caller's hint */
    assert_ok(dt_resolve_core(path, NULL, 0, &r));
    assert_status(dt_resolve_finish(&r, "only the core's tables here"), DT_ERR_CONFIG);
    assert_msg_has("(only the core's tables here)");
    dt_resolved_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_core_stage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_stage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_stage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_name, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
