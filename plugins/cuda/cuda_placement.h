/*
 * plugins/cuda/cuda_placement.h - which GPU a rank runs on: the
 * device_index key, else the core's init argument, else the local rank
 * (one GPU per local rank), refused with a config error naming both
 * counts when the machine has too few.  Host-only C with no CUDA call
 * (the caller counts the devices), so tests/unit/plugins/cuda/test_cuda_placement.c
 * checks it on any machine.
 */
#ifndef DT_CUDA_PLACEMENT_H
#define DT_CUDA_PLACEMENT_H

#include <stdint.h>

#include "dtrain/device.h"

/* *out = the device for init args `a` with the key's value `key` (-1:
 * not set) on a machine with `count` (> 0) CUDA devices; DT_OK or
 * DT_ERR_CONFIG with the message set through `host`. */
int cuda_pick_device(const dt_host_v1_t *host, const dt_device_init_v1_t *a,
                     int64_t key, int count, int *out);

#endif /* DT_CUDA_PLACEMENT_H */
