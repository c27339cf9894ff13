/*
 * core/loader/loader.c - finds plugin modules on an explicit search path,
 * loads them with libltdl, checks their entry and ops table against
 * abi_tables, gives each its host services table once its config table is
 * checked, and calls their cleanup_job.
 *
 * Every refusal has one message that says what to do (loader.h lists
 * them).  Two things libltdl does not give us are done by hand:
 *   - whether the file exists: libltdl says "file not found" for any
 *     failure, so we stat the file first and only then try to load it;
 *   - why the load failed, and unresolved symbols: libltdl binds lazily
 *     and drops dlerror()'s text, so the module is first opened with
 *     dlopen(RTLD_NOW) - which both resolves every symbol now (a plugin
 *     built against another dtrain fails here, not mid-training) and keeps
 *     the loader's own error text - and then through libltdl, which gets the
 *     same, already bound, object.
 * libltdl is not thread-safe; one mutex serialises the loader.
 */
#include "loader/loader.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <ltdl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loader/abi_tables.h"
#include "loader/host_services.h"
#include "util/error.h"
#include "util/fileutil.h"
#include "util/log.h"

/* Where plugins are, set by core/CMakeLists.txt:
 *   DT_BUILD_PLUGIN_DIR     the build tree's plugin folder, searched only by
 *                           a program or library that runs from one of
 *   DT_BUILD_RUN_DIRS       the build tree's output folders (':'-separated);
 *   DT_PLUGIN_DIR_FROM_BIN  the install layout's plugin folder relative to
 *   DT_PLUGIN_DIR_FROM_LIB  its bin and lib folders, searched by an
 *                           installed copy wherever the prefix was put;
 *   DT_INSTALL_PLUGIN_DIR   the configured install folder, only when the
 *                           running file cannot be found. */
#ifndef DT_BUILD_PLUGIN_DIR
#define DT_BUILD_PLUGIN_DIR ""
#endif
#ifndef DT_BUILD_RUN_DIRS
#define DT_BUILD_RUN_DIRS ""
#endif
#ifndef DT_PLUGIN_DIR_FROM_BIN
#define DT_PLUGIN_DIR_FROM_BIN "../lib/dtrain/plugins"
#endif
#ifndef DT_PLUGIN_DIR_FROM_LIB
#define DT_PLUGIN_DIR_FROM_LIB "dtrain/plugins"
#endif
#ifndef DT_INSTALL_PLUGIN_DIR
#define DT_INSTALL_PLUGIN_DIR ""
#endif

/* Highest major looked at to tell "built against ABI N.x". */
#define DT_MAX_PROBE_MAJOR 16u
#define DT_MAX_SEARCH 64
#define LOAD_HINT                                                              \
    "(missing symbols usually mean it was built against another dtrain or a " \
    "library is missing)"

typedef void (*dt_any_fn_t)(void);
typedef const void *(*dt_entry_fn_t)(void);

/* What the loader keeps per plugin beside the public struct. */
typedef struct plugin_box {
    dt_plugin_t pub;
    lt_dlhandle handle;
} plugin_box_t;

static pthread_mutex_t loader_lock = PTHREAD_MUTEX_INITIALIZER;

/* ------------------------------------------------------ search path -- */

struct dt_search_path {
    size_t n;
    const char *dirs[DT_MAX_SEARCH];
    char store[DT_MAX_SEARCH * 256];
    size_t used;
};

/* Append one entry (not NUL-terminated, `len` bytes).  Empty entries and
 * repeats are skipped: a folder named twice is searched once. */
static void sp_add(dt_search_path_t *sp, const char *s, size_t len)
{
    while (len > 1 && s[len - 1] == '/')
        len--;
    if (len == 0 || sp->n == DT_MAX_SEARCH ||
        sp->used + len + 1 > sizeof sp->store)
        return;
    for (size_t i = 0; i < sp->n; i++)
        if (strlen(sp->dirs[i]) == len && memcmp(sp->dirs[i], s, len) == 0)
            return;
    char *dst = sp->store + sp->used;
    memcpy(dst, s, len);
    dst[len] = '\0';
    sp->used += len + 1;
    sp->dirs[sp->n++] = dst;
}

static void sp_add_list(dt_search_path_t *sp, const char *list)
{
    while (list && *list) {
        const char *colon = strchr(list, ':');
        size_t len = colon ? (size_t)(colon - list) : strlen(list);
        sp_add(sp, list, len);
        list = colon ? colon + 1 : NULL;
    }
}

/* The folder of the file this code runs from - the dtrain program, or
 * libdtrain when a program embeds it - symlinks resolved, into `dir`
 * (PATH_MAX bytes); *is_exe says which.  0 when it cannot be told. */
static int running_dir(char *dir, int *is_exe)
{
    Dl_info info;
    struct link_map *lm = NULL;
    char file[PATH_MAX];
    if (!dladdr1((void *)&loader_lock, &info, (void **)&lm, RTLD_DL_LINKMAP) ||
        !lm)
        return 0;
    /* The main program's link map has no name. */
    *is_exe = lm->l_name[0] == '\0';
    if (!realpath(*is_exe ? "/proc/self/exe" : lm->l_name, file))
        return 0;
    char *slash = strrchr(file, '/');
    if (!slash)
        return 0;
    *slash = '\0';
    memcpy(dir, file, (size_t)(slash - file) + 1);
    if (dir[0] == '\0')
        strcpy(dir, "/");
    return 1;
}

/* Whether `dir` (resolved) is one of the build tree's output folders. */
static int in_build_tree(const char *dir)
{
    const char *list = DT_BUILD_RUN_DIRS;
    while (*list) {
        const char *colon = strchr(list, ':');
        size_t len = colon ? (size_t)(colon - list) : strlen(list);
        char one[PATH_MAX], real[PATH_MAX];
        if (len > 0 && len < sizeof one) {
            memcpy(one, list, len);
            one[len] = '\0';
            if (realpath(one, real) && strcmp(real, dir) == 0)
                return 1;
        }
        if (!colon)
            break;
        list = colon + 1;
    }
    return 0;
}

/* `dir` joined with the relative path `rel`, its leading "../" taken off
 * `dir`, into `out` (PATH_MAX bytes; empty when it would not fit). */
static void join_relative(const char *dir, const char *rel, char *out)
{
    char base[PATH_MAX];
    snprintf(base, sizeof base, "%s", dir);
    while (strncmp(rel, "../", 3) == 0 || strcmp(rel, "..") == 0) {
        char *slash = strrchr(base, '/');
        if (slash && slash != base)
            *slash = '\0';
        else
            strcpy(base, "/");
        rel += rel[2] ? 3 : 2;
    }
    while (strncmp(rel, "./", 2) == 0)
        rel += 2;
    int w;
    if (strcmp(rel, ".") == 0 || rel[0] == '\0')
        w = snprintf(out, PATH_MAX, "%s", base);
    else
        w = snprintf(out, PATH_MAX, "%s%s%s", base,
                     strcmp(base, "/") == 0 ? "" : "/", rel);
    if (w < 0 || w >= PATH_MAX)
        out[0] = '\0';
}

/* The folder dtrain's own plugins are in: the build tree's for a build-tree
 * program, else the install layout's beside the running file (so an
 * installed prefix finds its plugins wherever it was installed or moved
 * to, and never the build tree it came from). */
static void sp_add_own(dt_search_path_t *sp)
{
    char dir[PATH_MAX], plugins[PATH_MAX];
    int is_exe = 0;
    if (!running_dir(dir, &is_exe)) {
        sp_add_list(sp, DT_INSTALL_PLUGIN_DIR);
        return;
    }
    if (in_build_tree(dir)) {
        sp_add_list(sp, DT_BUILD_PLUGIN_DIR);
        return;
    }
    join_relative(dir, is_exe ? DT_PLUGIN_DIR_FROM_BIN : DT_PLUGIN_DIR_FROM_LIB,
                  plugins);
    sp_add(sp, plugins, strlen(plugins));
}

int dt_search_path_new(const char *config_dirs, dt_search_path_t **out)
{
    if (!out)
        return dt_err_set(DT_ERR_INVALID, "dt_search_path_new: NULL out");
    dt_search_path_t *sp = calloc(1, sizeof *sp);
    *out = sp;
    if (!sp)
        return dt_err_set(DT_ERR_NOMEM, "plugin search path: out of memory");
    sp_add_list(sp, getenv("DTRAIN_PLUGIN_PATH"));
    sp_add_list(sp, config_dirs);
    sp_add_own(sp);
    return DT_OK;
}

void dt_search_path_free(dt_search_path_t *sp) { free(sp); }

size_t dt_search_path_count(const dt_search_path_t *sp) { return sp ? sp->n : 0; }

const char *dt_search_path_dir(const dt_search_path_t *sp, size_t i)
{
    return sp && i < sp->n ? sp->dirs[i] : NULL;
}

/* "a, b, c": every folder, for "not found in: ..." messages. */
static void sp_list(const dt_search_path_t *sp, char *buf, size_t cap)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sp->n && off < cap; i++) {
        int w = snprintf(buf + off, cap - off, "%s%s", i ? ", " : "",
                         sp->dirs[i]);
        if (w > 0)
            off += (size_t)w;
    }
}

/* ------------------------------------------------------ messages -- */

/* "comm plugin 'shm' at /a/dtrain_shm.so" (kind < 0: "plugin 'shm' ..."). */
static void subject(char *buf, size_t cap, int kind, const char *name,
                    const char *path)
{
    const char *k = dt_kind_name(kind);
    snprintf(buf, cap, "%s%splugin '%s' at %s", k ? k : "", k ? " " : "",
             name, path);
}

/* "1.x" or "2.x, 1.x": the majors this dtrain speaks for `kind`. */
static void majors_text(int kind, char *buf, size_t cap)
{
    uint32_t majors[4];
    size_t n = dt_abi_majors(kind, majors, 4), off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && off < cap; i++) {
        int w = snprintf(buf + off, cap - off, "%s%u.x", i ? ", " : "",
                         (unsigned)majors[i]);
        if (w > 0)
            off += (size_t)w;
    }
}

/* ------------------------------------------------------- modules -- */

static dt_entry_fn_t find_entry(lt_dlhandle h, int kind, uint32_t major)
{
    char sym[64];
    dt_abi_entry_name(kind, major, sym, sizeof sym);
    void *addr = lt_dlsym(h, sym);
    dt_entry_fn_t fn = NULL;
    /* POSIX: a function's address may travel as void *. */
    if (addr)
        memcpy(&fn, &addr, sizeof fn);
    return fn;
}

/* Open `path` (which exists) with every symbol bound now; see the file
 * comment for why dlopen comes first.  Holds one lt_dlinit reference on
 * success, released by close_module. */
static int open_module(int kind, const char *name, const char *path,
                       lt_dlhandle *out)
{
    char subj[4600];
    *out = NULL;
    /* dlopen would block in open() on a FIFO planted at the name, and read
     * a device: only a regular file (a link to one is fine) is loaded */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        subject(subj, sizeof subj, kind, name, path);
        return dt_err_set(DT_ERR_SYSTEM, "%s exists but is not a regular file (%s)", subj,
                          dt_fileutil_file_type(st.st_mode));
    }
    dlerror();
    void *pre = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!pre) {
        const char *e = dlerror();
        if (!e)
            e = "unknown dlopen error";
        /* glibc repeats the path; the message already has it. */
        size_t pl = strlen(path);
        if (strncmp(e, path, pl) == 0 && e[pl] == ':' && e[pl + 1] == ' ')
            e += pl + 2;
        subject(subj, sizeof subj, kind, name, path);
        return dt_err_set(DT_ERR_SYSTEM, "%s exists but failed to load: %s "
                          LOAD_HINT, subj, e);
    }
    if (lt_dlinit() != 0) {
        const char *e = lt_dlerror();
        dlclose(pre);
        return dt_err_set(DT_ERR_SYSTEM, "cannot initialise libltdl: %s",
                          e ? e : "unknown error");
    }
    lt_dladvise adv;
    lt_dlhandle h = NULL;
    if (lt_dladvise_init(&adv) == 0) {
        /* RTLD_LOCAL: two plugins may define the same internal names. */
        lt_dladvise_local(&adv);
        h = lt_dlopenadvise(path, adv);
        lt_dladvise_destroy(&adv);
    }
    dlclose(pre); /* libltdl holds its own reference now */
    if (!h) {
        const char *e = lt_dlerror();
        char msg[512];
        snprintf(msg, sizeof msg, "%s", e ? e : "unknown libltdl error");
        lt_dlexit();
        subject(subj, sizeof subj, kind, name, path);
        return dt_err_set(DT_ERR_SYSTEM, "%s exists but failed to load: %s "
                          LOAD_HINT, subj, msg);
    }
    *out = h;
    return DT_OK;
}

static void close_module(lt_dlhandle h)
{
    if (!h)
        return;
    lt_dlclose(h);
    lt_dlexit();
}

/* The highest major of `kind` the module exports, 0 if none. */
static uint32_t any_major(lt_dlhandle h, int kind)
{
    for (uint32_t m = DT_MAX_PROBE_MAJOR; m >= 1; m--)
        if (find_entry(h, kind, m))
            return m;
    return 0;
}

/* Whether `info`'s struct_size covers the whole info block: before that
 * is known, only abi_major, abi_minor and struct_size may be read. */
static int info_block_present(const dt_plugin_info_t *info)
{
    return info->struct_size >= sizeof(dt_plugin_info_t);
}

/* "built against a newer minor" (debug): methods past ours go unused. */
static void log_newer_minor(const char *subj, const dt_plugin_info_t *info,
                            const dt_abi_layout_t *lay, uint32_t major)
{
    if (info->abi_minor > lay->minor)
        dt_log(DT_LOG_DEBUG, "loader",
               "%s was built against %s ABI %u.%u, newer than this dtrain's "
               "%u.%u; %ss added after %u.%u are not used", subj, lay->abi_name,
               (unsigned)info->abi_major, (unsigned)info->abi_minor,
               (unsigned)major, (unsigned)lay->minor, lay->slot_noun,
               (unsigned)major, (unsigned)lay->minor);
}

/* The slots of `table` (an ops table, or a table one hands out: both start
 * with abi_major, abi_minor, struct_size) against `lay`: struct_size holds
 * every mandatory slot and none of them is NULL. */
static int check_table(const char *subj, const void *table,
                       const dt_abi_layout_t *lay, uint32_t major)
{
    const dt_plugin_info_t *info = table; /* the three shared fields only */
    if (info->struct_size < lay->min_size)
        return dt_err_set(DT_ERR_ABI, "%s: %s is %u bytes "
                          "(info.struct_size), too small for the mandatory "
                          "%ss of %s ABI %u.x (at least %zu bytes, up to "
                          "'%s')", subj, lay->table_noun,
                          (unsigned)info->struct_size, lay->slot_noun,
                          lay->abi_name, (unsigned)major, lay->min_size,
                          lay->mandatory[lay->n_mandatory - 1].name);
    for (size_t i = 0; i < lay->n_mandatory; i++) {
        dt_any_fn_t slot;
        memcpy(&slot, (const char *)table + lay->mandatory[i].offset,
               sizeof slot);
        if (!slot)
            return dt_err_set(DT_ERR_ABI, "%s: mandatory %s '%s' is NULL",
                              subj, lay->slot_noun, lay->mandatory[i].name);
    }
    return DT_OK;
}

/* A table the ops table hands out through the (mandatory, so present)
 * slot sub->slot, checked like the ops table: the device's kernel table,
 * so a device missing a mandatory kernel is refused at load, naming it. */
static int check_subtable(const char *subj, const void *ops,
                          const dt_abi_subtable_t *sub)
{
    const dt_abi_layout_t *lay = sub->layout;
    dt_entry_fn_t get;
    memcpy(&get, (const char *)ops + sub->slot_offset, sizeof get);
    const dt_plugin_info_t *info = get(); /* the three shared fields only */
    if (!info)
        return dt_err_set(DT_ERR_ABI, "%s: '%s' returned no %s (NULL)", subj,
                          sub->slot, lay->table_noun);
    if (info->abi_major != lay->major)
        return dt_err_set(DT_ERR_ABI, "%s: '%s' returned a %s of %s ABI "
                          "%u.%u (info.abi_major), this dtrain speaks %s "
                          "ABI %u.x", subj, sub->slot, lay->table_noun,
                          lay->abi_name, (unsigned)info->abi_major,
                          (unsigned)info->abi_minor, lay->abi_name,
                          (unsigned)lay->major);
    int rc = check_table(subj, info, lay, lay->major);
    if (rc == DT_OK)
        log_newer_minor(subj, info, lay, lay->major);
    return rc;
}

/* Find the entry of `kind` this dtrain speaks (newest first) and check the
 * table it returns.  On success *major and *ops are set. */
static int probe_and_check(int kind, const char *name, const char *path,
                           lt_dlhandle h, uint32_t *major, const void **ops)
{
    char subj[4600], sym[64];
    const char *kn = dt_kind_name(kind);
    subject(subj, sizeof subj, kind, name, path);

    uint32_t majors[4];
    size_t nm = dt_abi_majors(kind, majors, 4);
    dt_entry_fn_t fn = NULL;
    uint32_t m = 0;
    for (size_t i = 0; i < nm && !fn; i++) {
        fn = find_entry(h, kind, majors[i]);
        m = majors[i];
    }

    if (!fn) {
        char speaks[64];
        majors_text(kind, speaks, sizeof speaks);
        uint32_t other = any_major(h, kind);
        if (other)
            return dt_err_set(DT_ERR_ABI, "%s was built against %s ABI %u.x, "
                              "this dtrain speaks %s ABI %s", subj, kn,
                              (unsigned)other, kn, speaks);
        char looked[256];
        size_t off = 0;
        looked[0] = '\0';
        for (size_t i = 0; i < nm && off < sizeof looked; i++) {
            int w = snprintf(looked + off, sizeof looked - off, "%s%s",
                             i ? ", " : "",
                             dt_abi_entry_name(kind, majors[i], sym,
                                               sizeof sym));
            if (w > 0)
                off += (size_t)w;
        }
        /* A plugin of another kind named by mistake is the common case;
         * saying which kind it is saves a round trip. */
        char hint[128] = "";
        for (int k = 0; k < DT_KIND_COUNT; k++) {
            uint32_t km = k == kind ? 0 : any_major(h, k);
            if (km) {
                snprintf(hint, sizeof hint, " (it exports %s: a %s plugin)",
                         dt_abi_entry_name(k, km, sym, sizeof sym),
                         dt_kind_name(k));
                break;
            }
        }
        return dt_err_set(DT_ERR_ABI, "%s exports no dtrain_%s_v<N> entry "
                          "(looked for %s); is it a %s plugin?%s", subj, kn,
                          looked, kn, hint);
    }

    dt_abi_entry_name(kind, m, sym, sizeof sym);
    const void *table = fn();
    if (!table)
        return dt_err_set(DT_ERR_ABI, "%s: entry %s returned NULL", subj, sym);
    const dt_plugin_info_t *info = table;
    const dt_abi_layout_t *lay = dt_abi_layout(kind, m);

    /* struct_size first: until it says the info block is there, only the
     * three fields every table starts with may be read. */
    if (!info_block_present(info))
        return dt_err_set(DT_ERR_ABI, "%s: entry %s returns a table of %u "
                          "bytes (info.struct_size), too small for the info "
                          "block every table starts with (%zu bytes)", subj,
                          sym, (unsigned)info->struct_size,
                          sizeof(dt_plugin_info_t));
    if (info->kind != (uint32_t)kind) {
        const char *ik = dt_kind_name((int)info->kind);
        return dt_err_set(DT_ERR_ABI, "%s: entry %s returns a table of kind "
                          "'%s' (info.kind %u), expected '%s'", subj, sym,
                          ik ? ik : "unknown", (unsigned)info->kind, kn);
    }
    if (info->abi_major != m)
        return dt_err_set(DT_ERR_ABI, "%s: entry %s returns a table declaring "
                          "%s ABI %u.%u (info.abi_major), expected major %u",
                          subj, sym, kn, (unsigned)info->abi_major,
                          (unsigned)info->abi_minor, (unsigned)m);
    int rc = check_table(subj, table, lay, m);
    if (rc != DT_OK)
        return rc;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (!info->name)
        return dt_err_set(DT_ERR_ABI, "%s: file %s declares no name "
                          "(info.name is NULL)", subj, base);
    if (strcmp(info->name, name) != 0)
        return dt_err_set(DT_ERR_ABI, "%s: file %s declares name '%s'", subj,
                          base, info->name);
    if (info->n_config_keys && !info->config_keys)
        return dt_err_set(DT_ERR_ABI, "%s: info declares %u config keys but "
                          "config_keys is NULL", subj,
                          (unsigned)info->n_config_keys);
    log_newer_minor(subj, info, lay, m);
    for (size_t i = 0; i < lay->n_sub; i++)
        if ((rc = check_subtable(subj, table, &lay->sub[i])) != DT_OK)
            return rc;
    *major = m;
    *ops = table;
    return DT_OK;
}

/* Load the module at `path` (known to exist) as plugin `name` of `kind`,
 * without a host table yet.  Caller holds loader_lock. */
static int load_file(int kind, const char *name, const char *path,
                     dt_plugin_t **out)
{
    lt_dlhandle h;
    int rc = open_module(kind, name, path, &h);
    if (rc != DT_OK)
        return rc;
    uint32_t major = 0;
    const void *ops = NULL;
    rc = probe_and_check(kind, name, path, h, &major, &ops);
    if (rc != DT_OK) {
        close_module(h);
        return rc;
    }
    plugin_box_t *box = calloc(1, sizeof *box);
    if (!box) {
        close_module(h);
        return dt_err_set(DT_ERR_NOMEM, "%s plugin '%s': out of memory",
                          dt_kind_name(kind), name);
    }
    dt_plugin_t *p = &box->pub;
    p->kind = kind;
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->path, sizeof p->path, "%s", path);
    p->major = major;
    p->info = ops;
    p->ops = ops;
    p->priv = box;
    box->handle = h;
    dt_log(DT_LOG_DEBUG, "loader", "loaded %s plugin '%s' %s (ABI %u.%u) "
           "from %s", dt_kind_name(kind), name,
           p->info->version ? p->info->version : "?",
           (unsigned)p->info->abi_major, (unsigned)p->info->abi_minor, path);
    *out = p;
    return DT_OK;
}

static void unload_locked(dt_plugin_t *p)
{
    plugin_box_t *box = p->priv;
    dt_host_destroy(p);
    close_module(box->handle);
    free(box);
}

int dt_plugin_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n >= sizeof(((dt_plugin_t *)0)->name))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* ------------------------------------------------- loose permissions -- */

/* Folders already warned about (loader_lock held): once per folder. */
static char warned[DT_MAX_SEARCH][256];
static size_t n_warned;

/* Why `st` lets someone other than us (or root) change what is loaded, or
 * "" when it does not: "writable by group and others (mode 0777)", "owned
 * by uid 1234 (mode 0755)". */
static void loose_why(const struct stat *st, char *buf, size_t cap)
{
    unsigned mode = (unsigned)st->st_mode & 07777;
    const char *w = (st->st_mode & S_IWGRP) && (st->st_mode & S_IWOTH) ? "group and others"
                    : (st->st_mode & S_IWGRP)                          ? "group"
                    : (st->st_mode & S_IWOTH)                          ? "others"
                                                                       : NULL;
    buf[0] = '\0';
    if (w)
        snprintf(buf, cap, "writable by %s (mode %04o)", w, mode);
    else if (st->st_uid != 0 && st->st_uid != geteuid())
        snprintf(buf, cap, "owned by uid %u, not by this user or root (mode %04o)",
                 (unsigned)st->st_uid, mode);
}

/* Warn, as ssh does for keys, when the folder `dir` or the module `path`
 * found in it could be replaced by another user: code loaded from there
 * runs as us.  Loading goes on (shared setups may mean it); once per
 * folder.  Caller holds loader_lock. */
static void warn_loose(int kind, const char *name, const char *dir, const char *path)
{
    for (size_t i = 0; i < n_warned; i++)
        if (strcmp(warned[i], dir) == 0)
            return;
    struct stat st;
    char why[160];
    const char *what = "plugin folder", *where = dir;
    why[0] = '\0';
    if (stat(dir, &st) == 0)
        loose_why(&st, why, sizeof why);
    if (!why[0] && stat(path, &st) == 0) {
        loose_why(&st, why, sizeof why);
        what = "plugin file";
        where = path;
    }
    if (!why[0])
        return;
    if (n_warned < DT_MAX_SEARCH)
        snprintf(warned[n_warned++], sizeof warned[0], "%s", dir);
    dt_log(DT_LOG_WARN, "loader", "warning: %s %s is %s: another user could replace the "
           "%s plugin '%s' loaded from it (chmod go-w, or move it)", what, where, why,
           dt_kind_name(kind), name);
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

int dt_plugin_open(const dt_search_path_t *sp, int kind, const char *name,
                   dt_plugin_t **out)
{
    if (!out)
        return dt_err_set(DT_ERR_INVALID, "dt_plugin_open: NULL out");
    *out = NULL;
    const char *kn = dt_kind_name(kind);
    if (!kn)
        return dt_err_set(DT_ERR_INVALID, "unknown plugin kind %d", kind);
    if (!sp)
        return dt_err_set(DT_ERR_INVALID, "loading %s plugin '%s': no search "
                          "path", kn, name ? name : "(null)");
    if (!dt_plugin_name_ok(name))
        return dt_err_set(DT_ERR_INVALID, "%s plugin name '%s' is not valid "
                          "(1 to 63 letters, digits, '_' or '-')", kn,
                          name ? name : "(null)");

    char path[4096];
    int rc = DT_ERR_NOT_FOUND, found = 0;
    pthread_mutex_lock(&loader_lock);
    for (size_t i = 0; i < sp->n && !found; i++) {
        int w = snprintf(path, sizeof path, "%s/dtrain_%s.so", sp->dirs[i],
                         name);
        /* The first folder holding the file decides, even when that file
         * then fails: silently loading a different copy would hide it. */
        if (w > 0 && (size_t)w < sizeof path && file_exists(path)) {
            found = 1;
            warn_loose(kind, name, sp->dirs[i], path);
            rc = load_file(kind, name, path, out);
        }
    }
    pthread_mutex_unlock(&loader_lock);
    if (!found) {
        char list[DT_ERR_MAX];
        sp_list(sp, list, sizeof list);
        dt_err_set(DT_ERR_NOT_FOUND, "%s plugin '%s' not found in: %s (files "
                   "are named dtrain_<name>.so)", kn, name, list);
    }
    return rc;
}

int dt_plugin_bind(dt_plugin_t *p, const dt_config_t *cfg)
{
    if (!p)
        return dt_err_set(DT_ERR_INVALID, "dt_plugin_bind: NULL plugin");
    const char *kn = dt_kind_name(p->kind);
    if (p->host)
        return dt_err_set(DT_ERR_INVALID, "%s/%s: already has its host table",
                          kn, p->name);
    /* The host table reads only checked values: a table whose schema was
     * not applied would hand the plugin defaults while the file says
     * otherwise. */
    if (cfg && !dt_config_claimed(cfg, p->name))
        return dt_err_set(DT_ERR_INVALID, "%s/%s: config table [%s] was not "
                          "checked against the plugin's keys before binding",
                          kn, p->name, p->name);
    return dt_host_create(p, cfg);
}

int dt_plugin_load(const dt_search_path_t *sp, int kind, const char *name,
                   dt_plugin_t **out)
{
    int rc = dt_plugin_open(sp, kind, name, out);
    if (rc == DT_OK && (rc = dt_plugin_bind(*out, NULL)) != DT_OK) {
        dt_plugin_unload(*out);
        *out = NULL;
    }
    return rc;
}

void dt_plugin_unload(dt_plugin_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&loader_lock);
    unload_locked(p);
    pthread_mutex_unlock(&loader_lock);
}

int dt_plugin_failed(const dt_plugin_t *p, int rc, const char *what)
{
    if (rc == DT_OK || !p)
        return rc;
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%s/%s: ", dt_kind_name(p->kind),
             p->name);
    const char *msg = dt_last_error();
    if (!msg[0])
        return dt_err_set(rc, "%s%s failed (%s) and gave no reason", prefix,
                          what ? what : "a call", dt_status_name(rc));
    if (strncmp(msg, prefix, strlen(prefix)) != 0)
        return dt_err_context(rc, "%s/%s", dt_kind_name(p->kind), p->name);
    return rc;
}

/* The slot of `method` in p's layout, or NULL for an unknown name. */
static const dt_abi_method_t *find_slot(const dt_plugin_t *p,
                                        const char *method, int *mandatory)
{
    const dt_abi_layout_t *lay = dt_abi_layout(p->kind, p->major);
    for (size_t i = 0; lay && method && i < lay->n_mandatory; i++)
        if (strcmp(lay->mandatory[i].name, method) == 0) {
            *mandatory = 1;
            return &lay->mandatory[i];
        }
    for (size_t i = 0; lay && method && i < lay->n_optional; i++)
        if (strcmp(lay->optional[i].name, method) == 0) {
            *mandatory = 0;
            return &lay->optional[i];
        }
    return NULL;
}

int dt_plugin_has_op(const dt_plugin_t *p, const char *method)
{
    int mand = 0;
    const dt_abi_method_t *m = p ? find_slot(p, method, &mand) : NULL;
    if (!m || p->info->struct_size < m->offset + sizeof(dt_any_fn_t))
        return 0;
    dt_any_fn_t slot;
    memcpy(&slot, (const char *)p->ops + m->offset, sizeof slot);
    return slot != NULL;
}

int dt_plugin_require_op(const dt_plugin_t *p, const char *method)
{
    if (!p)
        return dt_err_set(DT_ERR_INVALID, "dt_plugin_require_op: NULL plugin");
    int mand = 0;
    const dt_abi_method_t *m = find_slot(p, method, &mand);
    const char *kn = dt_kind_name(p->kind);
    if (!m)
        return dt_err_set(DT_ERR_INVALID, "%s/%s: '%s' is not a method of "
                          "the %s ABI %u.x", kn, p->name,
                          method ? method : "(null)", kn, (unsigned)p->major);
    if (dt_plugin_has_op(p, method))
        return DT_OK;
    if (p->info->struct_size < m->offset + sizeof(dt_any_fn_t))
        return dt_err_set(DT_ERR_UNSUPPORTED, "%s/%s: optional method '%s' "
                          "is not provided (the plugin's ops table is %u "
                          "bytes and ends before it; built against %s ABI "
                          "%u.%u)", kn, p->name, method,
                          (unsigned)p->info->struct_size, kn,
                          (unsigned)p->info->abi_major,
                          (unsigned)p->info->abi_minor);
    return dt_err_set(DT_ERR_UNSUPPORTED, "%s/%s: optional method '%s' is "
                      "not provided (NULL)", kn, p->name, method);
}

/* The one signature every kind's cleanup_job slot has (comm.h, offload.h). */
typedef int (*dt_cleanup_fn_t)(const dt_host_t *host, const char *job_id);

int dt_plugin_cleanup_job(const dt_plugin_t *p, const char *job_id)
{
    if (!p || !p->host || !job_id || !job_id[0])
        return dt_err_set(DT_ERR_INVALID, "dt_plugin_cleanup_job: %s",
                          !p ? "NULL plugin" : !p->host ? "plugin not bound"
                                                        : "empty job id");
    int mand = 0;
    const dt_abi_method_t *m = find_slot(p, "cleanup_job", &mand);
    if (!m || !dt_plugin_has_op(p, "cleanup_job"))
        return DT_OK; /* nothing of this plugin to remove */
    dt_cleanup_fn_t fn;
    memcpy(&fn, (const char *)p->ops + m->offset, sizeof fn);
    dt_err_clear();
    return dt_plugin_failed(p, fn(p->host, job_id), "cleanup_job");
}

/* ------------------------------------------------------ discovery -- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Plugin name of a module file name ("dtrain_shm.so" -> "shm"), or 0. */
static int module_name(const char *file, char *name, size_t cap)
{
    size_t n = strlen(file);
    if (n <= 10 || strncmp(file, "dtrain_", 7) != 0 ||
        strcmp(file + n - 3, ".so") != 0 || n - 10 >= cap)
        return 0;
    memcpy(name, file + 7, n - 10);
    name[n - 10] = '\0';
    return 1;
}

/* snprintf for listing fields, where cutting a long path is acceptable. */
static void put(char *dst, size_t cap, const char *fmt, ...) DT_PRINTF(3, 4);
static void put(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
}

/* Fill one listing for `path`; never fails (problems go to `why`). */
static void probe_listing(dt_plugin_listing_t *L, const char *name,
                          const char *path)
{
    memset(L, 0, sizeof *L);
    put(L->name, sizeof L->name, "%s", name);
    put(L->path, sizeof L->path, "%s", path);
    L->kind = -1;

    lt_dlhandle h;
    if (open_module(-1, name, path, &h) != DT_OK) {
        put(L->why, sizeof L->why, "%s", dt_last_error());
        return;
    }
    uint32_t major = 0;
    for (int k = 0; k < DT_KIND_COUNT && L->kind < 0; k++) {
        major = any_major(h, k);
        if (major)
            L->kind = k;
    }
    if (L->kind < 0) {
        put(L->why, sizeof L->why, "plugin '%s' at %s exports no "
                 "dtrain_<kind>_v<N> entry; is it a dtrain plugin?", name,
                 path);
        close_module(h);
        return;
    }
    /* What the newest exported table says about itself, even when it is
     * not loadable (so `dtrain plugins` can show "ABI 2.0"). */
    const dt_plugin_info_t *info = find_entry(h, L->kind, major)();
    if (info) {
        L->abi_major = info->abi_major;
        L->abi_minor = info->abi_minor;
        if (info_block_present(info))
            put(L->version, sizeof L->version, "%s",
                info->version ? info->version : "");
    }
    dt_plugin_t *p = NULL;
    if (load_file(L->kind, name, path, &p) == DT_OK) {
        L->loadable = 1;
        L->abi_major = p->info->abi_major;
        L->abi_minor = p->info->abi_minor;
        put(L->version, sizeof L->version, "%s",
                 p->info->version ? p->info->version : "");
        unload_locked(p);
    } else {
        put(L->why, sizeof L->why, "%s", dt_last_error());
    }
    close_module(h);
}

int dt_plugin_discover(const dt_search_path_t *sp, dt_plugin_listing_t **out,
                       size_t *n)
{
    if (!out || !n || !sp)
        return dt_err_set(DT_ERR_INVALID, "dt_plugin_discover: NULL argument");
    *out = NULL;
    *n = 0;
    char *saved = malloc(DT_ERR_MAX);
    if (!saved)
        return dt_err_set(DT_ERR_NOMEM, "discovering plugins: out of memory");
    /* Probing sets messages for every broken module; they belong in the
     * listings, not in the caller's error buffer. */
    snprintf(saved, DT_ERR_MAX, "%s", dt_last_error());

    dt_plugin_listing_t *list = NULL;
    size_t count = 0, cap = 0;
    int rc = DT_OK;
    pthread_mutex_lock(&loader_lock);
    for (size_t d = 0; d < sp->n && rc == DT_OK; d++) {
        DIR *dir = opendir(sp->dirs[d]);
        if (!dir)
            continue; /* a folder that does not exist holds no plugins */
        char **files = NULL;
        size_t nf = 0, fcap = 0;
        struct dirent *e;
        char name[64];
        while ((e = readdir(dir)) != NULL) {
            if (!module_name(e->d_name, name, sizeof name))
                continue;
            if (nf == fcap) {
                fcap = fcap ? 2 * fcap : 16;
                char **grown = realloc(files, fcap * sizeof *files);
                if (!grown) {
                    rc = DT_ERR_NOMEM;
                    break;
                }
                files = grown;
            }
            if (!(files[nf] = strdup(e->d_name))) {
                rc = DT_ERR_NOMEM;
                break;
            }
            nf++;
        }
        closedir(dir);
        /* readdir order is arbitrary; listings are not. */
        if (nf > 1)
            qsort(files, nf, sizeof *files, cmp_str);
        for (size_t f = 0; f < nf && rc == DT_OK; f++) {
            module_name(files[f], name, sizeof name);
            int seen = 0;
            for (size_t i = 0; i < count && !seen; i++)
                seen = strcmp(list[i].name, name) == 0;
            if (seen)
                continue; /* shadowed by an earlier folder, as in loading */
            if (count == cap) {
                cap = cap ? 2 * cap : 16;
                dt_plugin_listing_t *grown = realloc(list, cap * sizeof *list);
                if (!grown) {
                    rc = DT_ERR_NOMEM;
                    break;
                }
                list = grown;
            }
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", sp->dirs[d], files[f]);
            probe_listing(&list[count++], name, path);
        }
        for (size_t f = 0; f < nf; f++)
            free(files[f]);
        free(files);
    }
    pthread_mutex_unlock(&loader_lock);
    if (rc != DT_OK) {
        free(list);
        free(saved);
        return dt_err_set(rc, "discovering plugins: out of memory");
    }
    dt_err_set(DT_OK, "%s", saved);
    free(saved);
    *out = list;
    *n = count;
    return DT_OK;
}
