/*
 * tests/support/fake_device.h - a device whose copies block until the
 * test releases them (then copy, or fail with DT_ERR_IO), so an offload
 * tier's test holds requests in flight and sees waits time out.  Streams
 * and events are no-ops; host memory is aligned_alloc.  One per process.
 */
#ifndef DT_TEST_FAKE_DEVICE_H
#define DT_TEST_FAKE_DEVICE_H

#include "dtrain/device.h"

extern const dt_device_ops_v1_t dt_fake_device;
/* The instance (it starts with &dt_fake_device, dtrain/device.h). */
dt_device_t *dt_fake_device_instance(void);
/* Copies block from now on, and once released fail when `fail`. */
void dt_fake_device_reset(int fail);
/* on: blocked and later copies go ahead; 0: they block again. */
void dt_fake_device_release(int on);

#endif
