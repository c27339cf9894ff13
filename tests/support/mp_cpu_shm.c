/*
 * tests/support/mp_cpu_shm.c - a forked rank's cpu device and shm world
 * (mp_cpu_shm.h).
 */
#include "mp_cpu_shm.h"

int dt_mp_cpu_shm_open(dt_mp_cpu_shm_t *e, const dt_device_ops_v1_t *dev_table,
                       const dt_comm_ops_v1_t *comm_table, int rank, int nproc, const char *job)
{
    *e = (dt_mp_cpu_shm_t){0};
    dt_test_host_init(&e->dev_host, "device/cpu", NULL);
    dt_test_host_init(&e->comm_host, "comm/shm", NULL);
    const dt_device_init_v1_t di = {.struct_size = sizeof di, .rank = rank, .local_rank = rank,
                                    .local_size = nproc, .device_index = -1};
    int rc = dev_table->init(&e->dev_host.host, &di, &e->dev);
    if (rc == DT_OK)
        rc = dt_device_ops(e->dev)->stream_create(e->dev, &e->stream);
    const dt_comm_init_v1_t ci = {.struct_size = sizeof ci, .rank = rank, .size = nproc,
                                  .local_rank = rank, .local_size = nproc, .job_id = job,
                                  .timeout_ms = 20000};
    if (rc == DT_OK)
        rc = comm_table->init(&e->comm_host.host, &ci, &e->world);
    if (rc != DT_OK)
        dt_mp_cpu_shm_close(e);
    return rc;
}

void dt_mp_cpu_shm_close(dt_mp_cpu_shm_t *e)
{
    if (e->world)
        dt_comm_ops(e->world)->finalize(e->world);
    if (e->stream)
        dt_device_ops(e->dev)->stream_destroy(e->dev, e->stream);
    if (e->dev)
        dt_device_ops(e->dev)->finalize(e->dev);
    e->world = NULL;
    e->stream = NULL;
    e->dev = NULL;
}
