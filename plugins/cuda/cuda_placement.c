/*
 * plugins/cuda/cuda_placement.c - see cuda_placement.h.
 */
#include "cuda_placement.h"

int cuda_pick_device(const dt_host_v1_t *host, const dt_device_init_v1_t *a,
                     int64_t key, int count, int *out)
{
    if (key >= 0) {
        if (key >= count)
            return host->set_error(host, DT_ERR_CONFIG,
                                   "init: device_index = %lld but this machine "
                                   "has %d CUDA device%s (0..%d)", (long long)key,
                                   count, count == 1 ? "" : "s", count - 1);
        *out = (int)key;
        return DT_OK;
    }
    if (a->device_index >= 0) {
        if (a->device_index >= count)
            return host->set_error(host, DT_ERR_CONFIG,
                                   "init: device %d was asked for, but this "
                                   "machine has %d CUDA device%s (0..%d)",
                                   a->device_index, count, count == 1 ? "" : "s",
                                   count - 1);
        *out = a->device_index;
        return DT_OK;
    }
    int local_size = a->local_size > 0 ? a->local_size : 1;
    if (local_size > count)
        return host->set_error(host, DT_ERR_CONFIG,
                               "init: %d local ranks on this machine but %d CUDA "
                               "device%s: the cuda device runs one GPU per local "
                               "rank (start at most %d rank%s per machine, or set "
                               "device_index to place ranks yourself)",
                               local_size, count, count == 1 ? "" : "s", count,
                               count == 1 ? "" : "s");
    int local_rank = a->local_rank > 0 ? a->local_rank : 0;
    if (local_rank >= local_size)
        return host->set_error(host, DT_ERR_CONFIG,
                               "init: local rank %d is not below the %d local ranks",
                               local_rank, local_size);
    *out = local_rank;
    return DT_OK;
}
