/*
 * tests/support/cuda_probe.c - see cuda_probe.h.
 */
#include <dlfcn.h>
#include <stdio.h>

#include "cuda_probe.h"

int dt_test_cuda_devices(char *why, size_t n)
{
    static const char *const names[] = {"libcudart.so", "libcudart.so.13",
                                        "/usr/local/cuda/lib64/libcudart.so", NULL};
    char dummy[8];
    if (!why) {
        why = dummy;
        n = sizeof dummy;
    }
    void *h = NULL;
    for (int i = 0; names[i] && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
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
        return 0; /* the handle stays open: libcudart may not unload */
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
