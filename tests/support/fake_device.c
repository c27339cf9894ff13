/*
 * tests/support/fake_device.c - the blocking fake device (fake_device.h).
 */
#include "fake_device.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_release, g_fail;

static int fk_memcpy(dt_device_t *d, void *dst, const void *src, uint64_t n, int kind,
                     dt_stream_t *s)
{
    (void)d; (void)kind; (void)s;
    pthread_mutex_lock(&g_mu);
    while (!g_release)
        pthread_cond_wait(&g_cv, &g_mu);
    int fail = g_fail;
    pthread_mutex_unlock(&g_mu);
    if (fail)
        return DT_ERR_IO;
    memcpy(dst, src, n);
    return DT_OK;
}
static int fk_host_alloc(dt_device_t *d, uint64_t n, int tag, void **out)
{
    (void)d; (void)tag;
    return (*out = aligned_alloc(64, (n + 63) / 64 * 64 + 64)) ? DT_OK : DT_ERR_NOMEM;
}
static int fk_host_free(dt_device_t *d, void *p) { (void)d; free(p); return DT_OK; }
static int fk_stream_create(dt_device_t *d, dt_stream_t **s)
{ (void)d; *s = (dt_stream_t *)&g_mu; return DT_OK; }
static int fk_stream_destroy(dt_device_t *d, dt_stream_t *s) { (void)d; (void)s; return DT_OK; }
static int fk_stream_sync(dt_device_t *d, dt_stream_t *s) { (void)d; (void)s; return DT_OK; }
static int fk_event_create(dt_device_t *d, dt_event_t **e)
{ (void)d; *e = malloc(8); return *e ? DT_OK : DT_ERR_NOMEM; }
static int fk_event_destroy(dt_device_t *d, dt_event_t *e) { (void)d; free(e); return DT_OK; }
static int fk_event_record(dt_device_t *d, dt_event_t *e, dt_stream_t *s)
{ (void)d; (void)e; (void)s; return DT_OK; }
static int fk_wait_event(dt_device_t *d, dt_stream_t *s, dt_event_t *e)
{ (void)d; (void)e; (void)s; return DT_OK; }

const dt_device_ops_v1_t dt_fake_device = {
    .info = DT_PLUGIN_INFO_NOKEYS(DEVICE, dt_device_ops_v1_t, "fake", "0", "blocking copies"),
    .host_alloc = fk_host_alloc, .host_free = fk_host_free,
    .stream_create = fk_stream_create, .stream_destroy = fk_stream_destroy,
    .stream_sync = fk_stream_sync, .event_create = fk_event_create,
    .event_destroy = fk_event_destroy, .event_record = fk_event_record,
    .stream_wait_event = fk_wait_event, .memcpy_async = fk_memcpy,
};

/* The one instance: it starts with its table, as every device does. */
static struct dt_device {
    const dt_device_ops_v1_t *ops;
} g_dev = {&dt_fake_device};

dt_device_t *dt_fake_device_instance(void) { return &g_dev; }

void dt_fake_device_reset(int fail)
{
    pthread_mutex_lock(&g_mu);
    g_release = 0;
    g_fail = fail;
    pthread_mutex_unlock(&g_mu);
}

void dt_fake_device_release(int on)
{
    pthread_mutex_lock(&g_mu);
    g_release = on;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}
