/*
 * tests/support/cuda_probe.h - whether this machine has a CUDA device, asked
 * the way the cuda plugin asks (cudaGetDeviceCount of libcudart, opened
 * with dlopen so that tests build without a CUDA toolkit), and the exit
 * code with which a test tells ctest it was skipped.
 */
#ifndef DT_TEST_CUDA_PROBE_H
#define DT_TEST_CUDA_PROBE_H

#include <stddef.h>

/* ctest reports a test that exits with this as skipped (SKIP_RETURN_CODE,
 * set where the tests are registered). */
#define DT_TEST_SKIP_CODE 77

/* The number of CUDA devices.  0 when there is none, with `why` set to
 * "no CUDA device: cudaGetDeviceCount: <cudaGetErrorString> (<name>)",
 * "no CUDA device: cudaGetDeviceCount found none" or "no CUDA device:
 * libcudart not found (<dlerror>)"; `why` may be NULL. */
int dt_test_cuda_devices(char *why, size_t n);

/* `bytes` of CUDA managed memory (cudaMallocManaged): a device pointer the
 * host may also read and write while no kernel runs, so device-
 * parametrized tests fill inputs and read results in place as they do on
 * the cpu device.  NULL on failure.  Free with dt_test_cuda_managed_free. */
void *dt_test_cuda_managed_alloc(size_t bytes);
void dt_test_cuda_managed_free(void *p);

#endif /* DT_TEST_CUDA_PROBE_H */
