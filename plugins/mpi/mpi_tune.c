/*
 * plugins/mpi/mpi_tune.c - which algorithm Open MPI's nonblocking
 * all-reduce runs.
 *
 * The plugin must start every operation with a nonblocking call (its waits
 * stay bounded), and Open MPI 4.1 serves MPI_Iallreduce from libnbc, whose
 * own choice at 2 ranks times like its binomial tree and takes 1.2x the
 * time of the blocking MPI_Allreduce at 4 MiB, 1.25x at 16 MiB.  libnbc has
 * a ring too, chosen by the control variable
 * coll_libnbc_iallreduce_algorithm (1); measured with bench/mpi_allreduce
 * --nonblocking on the 2-vCPU machine (bench/results/comm.md) it is the
 * fastest of the three from 16 KiB up at 2 ranks and from 512 KiB up at
 * 4, and loses to libnbc's own choice on small buffers at 4 ranks (15 us
 * against 6 at 4 bytes).  So unless the user set that variable (OMPI_MCA_..., mpirun
 * --mca: then it is theirs and left alone), the plugin writes it through
 * MPI's tool interface (MPI_T) before each all-reduce: the ring from
 * [mpi] ring_bytes up, libnbc's own choice below.  Every rank of a group
 * passes the same count, so they all pick the same algorithm; a lock
 * keeps the write and the MPI_Iallreduce after it together when groups
 * run on several threads.  With another MPI, or an Open MPI without the
 * variable, all-reduces start as before.
 */
#include <pthread.h>
#include <string.h>

#include "mpi_internal.h"

#define LIBNBC_IALLREDUCE "coll_libnbc_iallreduce_algorithm"
#define LIBNBC_AUTO 0
#define LIBNBC_RING 1

static pthread_mutex_t g_tune = PTHREAD_MUTEX_INITIALIZER;
static int g_tuning;               /* the variable is ours to write */
static int g_tool;                 /* MPI_T_init_thread succeeded */
static MPI_T_cvar_handle g_handle;
static int g_current = LIBNBC_AUTO; /* what it holds now */

void mpic_tune_up(const dt_host_v1_t *h)
{
    pthread_mutex_lock(&g_tune);
    int provided = 0, idx = -1, count = 0, value = LIBNBC_AUTO;
    if (!g_tool && MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS)
        g_tool = 1;
    if (g_tool && !g_tuning &&
        MPI_T_cvar_get_index(LIBNBC_IALLREDUCE, &idx) == MPI_SUCCESS &&
        MPI_T_cvar_handle_alloc(idx, NULL, &g_handle, &count) == MPI_SUCCESS) {
        if (count == 1 && MPI_T_cvar_read(g_handle, &value) == MPI_SUCCESS &&
            value == LIBNBC_AUTO) {
            g_tuning = 1;
            g_current = LIBNBC_AUTO;
            h->log(h, DT_LOG_DEBUG, "all-reduce: libnbc's ring from [mpi] ring_bytes up");
        } else {
            MPI_T_cvar_handle_free(&g_handle);
            h->log(h, DT_LOG_DEBUG, "all-reduce: %s = %d set by the user: left alone",
                   LIBNBC_IALLREDUCE, value);
        }
    }
    pthread_mutex_unlock(&g_tune);
}

void mpic_tune_down(void)
{
    pthread_mutex_lock(&g_tune);
    if (g_tuning)
        MPI_T_cvar_handle_free(&g_handle);
    if (g_tool)
        MPI_T_finalize();
    g_tuning = g_tool = 0;
    pthread_mutex_unlock(&g_tune);
}

int mpic_iallreduce(const void *send, void *recv, int n, MPI_Datatype dt, MPI_Op op,
                    MPI_Comm comm, uint64_t bytes, uint64_t ring_bytes, MPI_Request *req)
{
    if (!g_tuning)
        return MPI_Iallreduce(send, recv, n, dt, op, comm, req);
    pthread_mutex_lock(&g_tune);
    const int want = ring_bytes > 0 && bytes >= ring_bytes ? LIBNBC_RING : LIBNBC_AUTO;
    int rc = MPI_SUCCESS;
    if (want != g_current && (rc = MPI_T_cvar_write(g_handle, &want)) == MPI_SUCCESS)
        g_current = want;
    /* a failed write leaves libnbc's choice: slower, never wrong */
    rc = MPI_Iallreduce(send, recv, n, dt, op, comm, req);
    pthread_mutex_unlock(&g_tune);
    return rc;
}
