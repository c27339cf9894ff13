/*
 * tests/support/cuda_probe.c - see cuda_probe.h.
 */
#include <dlfcn.h>
#include <stdio.h>

#include "cuda_probe.h"

/* libcudart, the copy the cuda plugin loads (its soname) first; never
 * closed (libcudart may not unload). */
static void *cudart(void)
{
    static const char *const names[] = {"libcudart.so.13", "libcudart.so",
                                        "/usr/local/cuda/lib64/libcudart.so", NULL};
    static void *h;
    for (int i = 0; names[i] && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    return h;
}

void *dt_test_cuda_managed_alloc(size_t bytes)
{
    typedef int (*fn)(void **, size_t, unsigned);
    fn f = cudart() ? (fn)dlsym(cudart(), "cudaMallocManaged") : NULL;
    void *p = NULL;
    /* 1 = cudaMemAttachGlobal */
    return f && f(&p, bytes ? bytes : 1, 1) == 0 ? p : NULL;
}

void dt_test_cuda_managed_free(void *p)
{
    typedef int (*fn)(void *);
    fn f = cudart() ? (fn)dlsym(cudart(), "cudaFree") : NULL;
    if (f && p)
        f(p);
}

int dt_test_cuda_devices(char *why, size_t n)
{
    char dummy[8];
    if (!why) {
        why = dummy;
        n = sizeof dummy;
    }
    void *h = cudart();
    if (!h) {
        snprintf(why, n, "no CUDA device: libcudart not found (%s)", dlerror());
        return 0;
    }
    typedef int (*count_fn)(int *);
    typedef const char *(*str_fn)(int);
    count_fn count = (count_fn)dlsym(h, "cudaGetDeviceCount");
    str_fn str = (str_fn)dlsym(h, "cudaGetErrorString");
    str_fn name = (str_fn)dlsym(h, "cudaGetErrorName");
    if (!count || !str || !name) {
        snprintf(why, n, "no CUDA device: libcudart lacks cudaGetDeviceCount");
        return 0;
    }
    int devs = 0, e = count(&devs);
    if (e != 0) {
        snprintf(why, n, "no CUDA device: cudaGetDeviceCount: %s (%s)", str(e),
                 name(e));
        return 0;
    }
    if (devs == 0)
        snprintf(why, n, "no CUDA device: cudaGetDeviceCount found none");
    return devs;
}
