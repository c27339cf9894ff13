/*
 * core/cli/cmd_env.c - `dtrain env`: what this machine offers dtrain, in
 * the spirit of DeepSpeed's ds_report.  Optional libraries (CUDA, NCCL,
 * MPI) are probed with dlopen at run time, so the report is true of this
 * machine rather than of the build machine.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "loader/loader.h"
#include "util/error.h"

void dt_help_env(FILE *f)
{
    fprintf(f, "usage: dtrain env\n\n"
               "Report the build (compiler, BLAS, whether test hooks are compiled in), the\n"
               "machine (cores, memory), optional runtimes found or not (CUDA driver and\n"
               "GPUs, cuBLAS, NCCL, MPI) and every plugin on the search path with whether it\n"
               "loads, or why not.\n");
}

static void *try_open(const char *const *names, const char **which)
{
    for (int i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_LAZY | RTLD_LOCAL);
        if (h) {
            *which = names[i];
            return h;
        }
    }
    *which = NULL;
    return NULL;
}

static void report_lib(const char *label, const char *const *names)
{
    const char *which;
    void *h = try_open(names, &which);
    printf("  %-10s %s%s\n", label, h ? "found: " : "not found", h ? which : "");
    if (h)
        dlclose(h);
}

static void report_gpus(void)
{
    static const char *const names[] = {"libcuda.so.1", "libcuda.so", NULL};
    const char *which;
    void *h = try_open(names, &which);
    if (!h) {
        printf("  %-10s none visible (no NVIDIA driver: libcuda.so.1 not found)\n", "GPUs");
        return;
    }
    typedef int (*init_fn)(unsigned);
    typedef int (*count_fn)(int *);
    init_fn cu_init = (init_fn)dlsym(h, "cuInit");
    count_fn cu_count = (count_fn)dlsym(h, "cuDeviceGetCount");
    int n = 0, rc = -1;
    if (cu_init && cu_count && (rc = cu_init(0)) == 0)
        rc = cu_count(&n);
    if (rc == 0)
        printf("  %-10s %d visible (driver %s)\n", "GPUs", n, which);
    else
        printf("  %-10s none usable (cuInit failed with %d)\n", "GPUs", rc);
    dlclose(h);
}

int dt_cmd_env(int argc, char **argv)
{
    if (argc > 1) {
        fprintf(stderr, "dtrain env: error: unexpected argument '%s'\n", argv[1]);
        return DT_EXIT_USAGE;
    }
    struct utsname u;
    uname(&u);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    printf("dtrain %s\n", DTRAIN_VERSION_STRING);
    printf("build\n  %-10s %s\n  %-10s OpenBLAS %s (cpu plugin)\n", "compiler", DT_C_COMPILER,
           "BLAS", DT_OPENBLAS_VERSION);
    printf("  %-10s device %u.%u, comm %u.%u, offload %u.%u, strategy %u.%u, host %u.%u\n",
           "ABI", DT_DEVICE_ABI_MAJOR, DT_DEVICE_ABI_MINOR, DT_COMM_ABI_MAJOR,
           DT_COMM_ABI_MINOR, DT_OFFLOAD_ABI_MAJOR, DT_OFFLOAD_ABI_MINOR,
           DT_STRATEGY_ABI_MAJOR, DT_STRATEGY_ABI_MINOR, DT_HOST_ABI_MAJOR, DT_HOST_ABI_MINOR);
#ifdef DTRAIN_TEST_HOOKS
    printf("  %-10s test hooks compiled in (DTRAIN_TEST_HOOKS): a test build, not for "
           "production\n", "hooks");
#else
    printf("  %-10s none\n", "hooks");
#endif
    printf("machine\n  %-10s %s %s %s\n  %-10s %ld online\n  %-10s %.1f GiB\n", "system",
           u.sysname, u.release, u.machine, "cores", sysconf(_SC_NPROCESSORS_ONLN), "memory",
           (double)pages * (double)psz / (1024.0 * 1024.0 * 1024.0));
    printf("runtimes\n");
    report_gpus();
    static const char *const cudart[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                         "/usr/local/cuda/lib64/libcudart.so", NULL};
    static const char *const cublas[] = {"libcublas.so", "libcublas.so.13", "libcublas.so.12",
                                         "/usr/local/cuda/lib64/libcublas.so", NULL};
    static const char *const nccl[] = {"libnccl.so.2", "libnccl.so",
                                       "/usr/local/cuda/lib64/libnccl.so.2", NULL};
    static const char *const mpi[] = {"libmpi.so.40", "libmpi.so", NULL};
    report_lib("CUDA", cudart);
    report_lib("cuBLAS", cublas);
    report_lib("NCCL", nccl);
    report_lib("MPI", mpi);

    printf("plugins\n");
    dt_search_path_t *sp = NULL;
    if (dt_search_path_new(NULL, &sp) != DT_OK) {
        printf("  (%s)\n", dt_last_error());
        return DT_EXIT_OK;
    }
    dt_plugin_listing_t *ls = NULL;
    size_t n = 0;
    int found = dt_plugin_discover(sp, &ls, &n) == DT_OK;
    /* the name column as wide as the longest name (offload_nvme is 12) */
    int w = 10;
    for (size_t i = 0; found && i < n; i++)
        if ((int)strlen(ls[i].name) > w)
            w = (int)strlen(ls[i].name);
    for (size_t i = 0; i < dt_search_path_count(sp); i++)
        printf("  %-*s %s\n", w, "search", dt_search_path_dir(sp, i));
    if (found) {
        for (size_t i = 0; i < n; i++) {
            printf("  %-*s %-8s %s\n", w, ls[i].name,
                   ls[i].kind >= 0 ? dt_kind_name(ls[i].kind) : "?",
                   ls[i].loadable ? "loadable" : ls[i].why);
        }
        if (n == 0)
            printf("  (none found)\n");
        free(ls);
    }
    dt_search_path_free(sp);
    return DT_EXIT_OK;
}
