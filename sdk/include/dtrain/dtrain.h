/*
 * dtrain/dtrain.h - the whole public plugin SDK in one include.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 */
#ifndef DTRAIN_DTRAIN_H
#define DTRAIN_DTRAIN_H

#include "dtrain/status.h"
#include "dtrain/tensor.h"
#include "dtrain/plugin.h"
#include "dtrain/host.h"
#include "dtrain/device.h"
#include "dtrain/comm.h"
#include "dtrain/offload.h"
#include "dtrain/strategy.h"
#include "dtrain/schedule.h"
#include "dtrain/tensor_parallel.h"
#include "dtrain/model.h"

#define DTRAIN_VERSION_MAJOR 1
#define DTRAIN_VERSION_MINOR 0
#define DTRAIN_VERSION_PATCH 0
#define DTRAIN_VERSION_STRING "1.0.0"

#endif /* DTRAIN_DTRAIN_H */
