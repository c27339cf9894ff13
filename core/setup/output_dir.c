/*
 * core/setup/output_dir.c - the run's output folders, checked at start
 * (output_dir.h).
 */
#include "setup/output_dir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "launch/world.h"
#include "util/error.h"
#include "util/fileutil.h"

/* Create `dir` (named by `key`) and a file in it, then remove the file. */
static int probe_dir(const char *key, const char *value, const char *dir)
{
    int rc = dt_fileutil_mkdir_p(dir);
    if (rc)
        return dt_err_context(rc, "%s = \"%s\": cannot create the run's folder %s", key,
                              value, dir);
    char probe[4096];
    int n = snprintf(probe, sizeof probe, "%s/.dtrain-write-test-XXXXXX", dir);
    if (n < 0 || (size_t)n >= sizeof probe)
        return dt_err_set(DT_ERR_CONFIG, "%s = \"%s\": the path %s is too long", key,
                          value, dir);
    int fd = mkstemp(probe);
    if (fd < 0)
        return dt_err_set(DT_ERR_IO, "%s = \"%s\": cannot write in %s: %s", key, value,
                          dir, strerror(errno));
    close(fd);
    unlink(probe);
    return DT_OK;
}

int dt_setup_output_dir(const dt_settings_t *set)
{
    const int own_ckpt = set->checkpoint.dir[0] != '\0';
    const char *key = own_ckpt ? "checkpoint.dir" : "run.out_dir";
    const char *value = own_ckpt ? set->checkpoint.dir : set->run.out_dir;
    char root[DT_CKPT_ROOT_MAX];
    if (dt_ckpt_root(set, root, sizeof root) != DT_OK) {
        size_t len = own_ckpt ? strlen(value)
                              : strlen(value) + strlen(set->run.name) + strlen("//ckpt");
        return dt_err_set(DT_ERR_CONFIG, "%s = \"%s\": the checkpoint folder %s would be %zu "
                          "bytes, longer than checkpoint paths may be (%d bytes)", key, value,
                          own_ckpt ? "checkpoint.dir" : "<run.out_dir>/<run.name>/ckpt", len,
                          DT_CKPT_ROOT_MAX - 1);
    }
    dt_world_t w;
    int rc = dt_world_from_env(&set->launch, &w);
    if (rc || w.rank != 0)
        return rc;
    char run_dir[DT_CKPT_ROOT_MAX];
    snprintf(run_dir, sizeof run_dir, "%s/%s", set->run.out_dir, set->run.name);
    if ((rc = probe_dir("run.out_dir", set->run.out_dir, run_dir)))
        return rc;
    return own_ckpt ? probe_dir(key, value, value) : DT_OK;
}
