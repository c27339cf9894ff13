/*
 * tests/support/mp_cpu_shm.h - what one forked rank of a plugin test
 * stands on (mp_harness.h runs the ranks): the cpu device with one stream
 * and the shm communicator over every rank, opened with the test host as
 * the core would open them, and closed in the reverse order.
 */
#ifndef DT_TEST_MP_CPU_SHM_H
#define DT_TEST_MP_CPU_SHM_H

#include "dtrain/dtrain.h"
#include "test_host.h"

typedef struct dt_mp_cpu_shm {
    dt_test_host_t dev_host, comm_host;
    dt_device_t *dev;
    dt_stream_t *stream;
    dt_comm_t *world;
} dt_mp_cpu_shm_t;

/* Rank `rank` of `nproc` under job `job`: the device, its stream and the
 * world communicator (timeout 20 s), made by the tables given; DT_OK or the failing call's status
 * (what opened is closed again). */
int dt_mp_cpu_shm_open(dt_mp_cpu_shm_t *e, const dt_device_ops_v1_t *dev_table,
                       const dt_comm_ops_v1_t *comm_table, int rank, int nproc, const char *job);
void dt_mp_cpu_shm_close(dt_mp_cpu_shm_t *e);

#endif /* DT_TEST_MP_CPU_SHM_H */
