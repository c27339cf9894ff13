/*
 * core/ckpt/safetensors_set.c - one model.safetensors or a sharded set
 * with its index, read as one set of tensors (safetensors_set.h).
 */
#include "ckpt/safetensors_set.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "util/error.h"
#include "util/fileutil.h"

typedef struct set_entry {
    const dt_safetensors_tensor_t *t;
    uint32_t shard;
} set_entry_t;

struct dt_safetensors_set {
    size_t n_shards;
    char **paths;                  /* [n_shards] */
    dt_safetensors_reader_t **rd;  /* [n_shards] */
    size_t n;
    set_entry_t *e;                /* [n] */
};

void dt_safetensors_set_close(dt_safetensors_set_t *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_shards; i++) {
        dt_safetensors_close(s->rd[i]);
        free(s->paths[i]);
    }
    free(s->paths);
    free(s->rd);
    free(s->e);
    free(s);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* A shard name an index may give: a plain file name in its folder. */
static int plain_name(const char *name)
{
    return name[0] && name[0] != '.' && !strchr(name, '/') && strlen(name) < NAME_MAX &&
           ends_with(name, ".safetensors");
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Open shard `path` as shard s->n_shards (the path is the set's now). */
static int add_shard(dt_safetensors_set_t *s, char *path)
{
    size_t k = s->n_shards;
    char **paths = realloc(s->paths, (k + 1) * sizeof *paths);
    if (paths)
        s->paths = paths;
    dt_safetensors_reader_t **rd = paths ? realloc(s->rd, (k + 1) * sizeof *rd) : NULL;
    if (!rd) {
        free(path);
        return dt_err_set(DT_ERR_NOMEM, "safetensors: out of memory");
    }
    s->rd = rd;
    s->paths[k] = path;
    s->rd[k] = NULL;
    s->n_shards = k + 1;
    int rc = dt_safetensors_open(path, &s->rd[k]);
    if (rc)
        return rc;
    size_t m = dt_safetensors_count(s->rd[k]);
    set_entry_t *e = realloc(s->e, (s->n + m + 1) * sizeof *e);
    if (!e)
        return dt_err_set(DT_ERR_NOMEM, "safetensors: out of memory");
    s->e = e;
    for (size_t i = 0; i < m; i++)
        s->e[s->n++] = (set_entry_t){dt_safetensors_at(s->rd[k], i), (uint32_t)k};
    return DT_OK;
}

/* Read and parse the index file; *j is its JSON, whose "weight_map" is an
 * object (the caller deletes *j). */
static int read_index(const char *index, cJSON **j)
{
    char *text = NULL;
    size_t len = 0;
    int fd = -1;
    uint64_t size = 0;
    int rc = dt_fileutil_open_input(index, 0, "safetensors index", &fd, &size);
    if (rc)
        return rc;
    char what[PATH_MAX + 32];
    snprintf(what, sizeof what, "safetensors index '%s'", index);
    rc = dt_fileutil_read_fd(fd, size, DT_SAFETENSORS_MAX_INDEX, what, &text, &len);
    close(fd);
    if (rc)
        return rc;
    *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(*j, "weight_map"))) {
        cJSON_Delete(*j);
        *j = NULL;
        return dt_err_set(DT_ERR_DATA, "'%s': not a JSON object with a \"weight_map\" object",
                          index);
    }
    return DT_OK;
}

/* Open the shards the index's weight map names, in the order it first
 * names them: plain file names in the index's folder. */
static int open_index_shards(dt_safetensors_set_t *s, const char *index, const cJSON *map)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", index);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");

    const cJSON *it;
    cJSON_ArrayForEach(it, map)
    {
        if (!cJSON_IsString(it))
            return dt_err_set(DT_ERR_DATA, "'%s': weight_map: tensor '%.200s' maps to a "
                              "non-string", index, it->string);
        if (!plain_name(it->valuestring))
            return dt_err_set(DT_ERR_DATA, "'%s': weight_map: tensor '%.200s' names shard "
                              "'%.200s', which is not a plain *.safetensors file name in the "
                              "index's folder", index, it->string, it->valuestring);
        size_t k = 0;
        while (k < s->n_shards && strcmp(strrchr(s->paths[k], '/') + 1, it->valuestring))
            k++;
        if (k < s->n_shards)
            continue;
        if (s->n_shards == DT_SAFETENSORS_MAX_SHARDS)
            return dt_err_set(DT_ERR_DATA, "'%s': names more than %d shards", index,
                              DT_SAFETENSORS_MAX_SHARDS);
        char *p = join(dir, it->valuestring);
        if (!p)
            return dt_err_set(DT_ERR_NOMEM, "safetensors: out of memory");
        int rc = add_shard(s, p);
        if (rc)
            return rc;
    }
    if (!s->n_shards)
        return dt_err_set(DT_ERR_DATA, "'%s': weight_map is empty", index);
    return DT_OK;
}

/* Every mapped tensor is where the index says, and nowhere else. */
static int check_index_map(const dt_safetensors_set_t *s, const char *index, const cJSON *map)
{
    for (size_t i = 0; i < s->n; i++) {
        const char *name = s->e[i].t->name;
        const char *shard = strrchr(s->paths[s->e[i].shard], '/') + 1;
        const cJSON *to = cJSON_GetObjectItemCaseSensitive(map, name);
        if (!to)
            return dt_err_set(DT_ERR_DATA, "'%s': shard '%s' holds tensor '%.200s', which the "
                              "index's weight_map does not name", index, shard, name);
        if (strcmp(to->valuestring, shard) != 0)
            return dt_err_set(DT_ERR_DATA, "'%s': weight_map: tensor '%.200s' is in shard '%s' "
                              "but the index says '%s'", index, name, shard, to->valuestring);
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, map)
    {
        size_t k = 0;
        while (strcmp(strrchr(s->paths[k], '/') + 1, it->valuestring))
            k++;
        if (!dt_safetensors_find(s->rd[k], it->string))
            return dt_err_set(DT_ERR_DATA, "'%s': weight_map: tensor '%.200s' is not in shard "
                              "'%s'", index, it->string, it->valuestring);
    }
    return DT_OK;
}

static int open_index(dt_safetensors_set_t *s, const char *index)
{
    cJSON *j = NULL;
    int rc = read_index(index, &j);
    if (rc)
        return rc;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    rc = open_index_shards(s, index, map);
    if (!rc)
        rc = check_index_map(s, index, map);
    cJSON_Delete(j);
    return rc;
}

int dt_safetensors_set_open(const char *path, dt_safetensors_set_t **out)
{
    *out = NULL;
    dt_safetensors_set_t *s = calloc(1, sizeof *s);
    if (!s)
        return dt_err_set(DT_ERR_NOMEM, "safetensors: out of memory");
    struct stat st;
    int rc;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        char *index = join(path, DT_SAFETENSORS_INDEX_NAME);
        char *single = join(path, DT_SAFETENSORS_SINGLE_NAME);
        if (!index || !single) {
            free(index);
            free(single);
            dt_safetensors_set_close(s);
            return dt_err_set(DT_ERR_NOMEM, "safetensors: out of memory");
        }
        if (access(index, F_OK) == 0) {
            free(single);
            rc = open_index(s, index);
            free(index);
        } else if (access(single, F_OK) == 0) {
            free(index);
            rc = add_shard(s, single);
        } else {
            rc = dt_err_set(DT_ERR_NOT_FOUND, "'%s' holds neither %s nor %s", path,
                            DT_SAFETENSORS_INDEX_NAME, DT_SAFETENSORS_SINGLE_NAME);
            free(index);
            free(single);
        }
    } else if (ends_with(path, ".index.json")) {
        rc = open_index(s, path);
    } else {
        char *p = strdup(path);
        rc = p ? add_shard(s, p) : dt_err_set(DT_ERR_NOMEM, "safetensors: out of memory");
    }
    if (rc) {
        dt_safetensors_set_close(s);
        return rc;
    }
    *out = s;
    return DT_OK;
}

size_t dt_safetensors_set_count(const dt_safetensors_set_t *s) { return s->n; }

size_t dt_safetensors_set_shards(const dt_safetensors_set_t *s) { return s->n_shards; }

const dt_safetensors_tensor_t *dt_safetensors_set_at(const dt_safetensors_set_t *s, size_t i)
{
    return i < s->n ? s->e[i].t : NULL;
}

const dt_safetensors_tensor_t *dt_safetensors_set_find(const dt_safetensors_set_t *s,
                                                       const char *name)
{
    for (size_t k = 0; k < s->n_shards; k++) {
        const dt_safetensors_tensor_t *t = dt_safetensors_find(s->rd[k], name);
        if (t)
            return t;
    }
    return NULL;
}

static const set_entry_t *entry_of(const dt_safetensors_set_t *s,
                                   const dt_safetensors_tensor_t *t)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->e[i].t == t)
            return &s->e[i];
    return NULL;
}

int dt_safetensors_set_read(dt_safetensors_set_t *s, const dt_safetensors_tensor_t *t,
                            uint64_t first, uint64_t n, void *dst)
{
    const set_entry_t *e = entry_of(s, t);
    if (!e)
        return dt_err_set(DT_ERR_INVALID, "safetensors: tensor is not one of this set's");
    return dt_safetensors_read(s->rd[e->shard], t, first, n, dst);
}

const char *dt_safetensors_set_file(const dt_safetensors_set_t *s,
                                    const dt_safetensors_tensor_t *t)
{
    const set_entry_t *e = entry_of(s, t);
    return e ? s->paths[e->shard] : "?";
}
