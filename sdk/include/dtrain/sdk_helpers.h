/*
 * dtrain/sdk_helpers.h - the SDK helper library: mechanisms data-parallel
 * strategies share, independent of how they replicate or shard.  One
 * header per concern; this one includes them all, for plugins that want
 * everything:
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 *   dtrain/sdk/ranges.h   even partitions, padded equal shards,
 *                         intersections; the tensor pieces a range of a
 *                         unit's flat space touches
 *   dtrain/sdk/flat.h     one device allocation holding every unit's slice
 *                         (llm.c's malloc_and_point_parameters), with a
 *                         pointer per unit/tensor
 *   dtrain/sdk/buckets.h  grouping units in backward order up to a byte cap
 *   dtrain/sdk/optim.h    AdamW / SGD over a range, tensor by tensor, with
 *                         the right weight decay; the clip coefficient
 *   dtrain/sdk/norm.h     sum of squares to the host; summed across a group
 *   dtrain/sdk/offload.h  optimizer state in an offload tier, updated on
 *                         the host (ZeRO-Offload)
 *   dtrain/sdk/hash.h     a 64-bit content hash of device memory and a
 *                         collective check that every rank holds the same
 *   dtrain/sdk/cfg.h      reading a plugin's config values with defaults
 *   dtrain/sdk/dp.h       the data-parallel core every strategy checks and
 *                         keeps alike (init args, hooks, the step's start
 *                         and norm, state by range, estimate)
 *   dtrain/sdk/replica.h  the replica machinery: replicated flat state,
 *                         bucketed gradient all-reduce overlapped with
 *                         backward, state by range, the init check - what
 *                         ddp, local SGD, DiLoCo or EMA strategies share
 *
 * Link the static library `dtrain_sdk` (libdtrain_sdk.a: CMake target
 * dtrain::dtrain_sdk, which dtrain_add_plugin links for every plugin;
 * pkg-config: `pkg-config --cflags --libs dtrain-sdk`; position
 * independent, hidden visibility, so a plugin linking it still exports
 * only its entry symbol).  These are ordinary C functions compiled into
 * the plugin, not ABI tables: a plugin carries the helpers it was built
 * with, whatever core loads it.  Within a major the headers only grow
 * (new functions, new fields at the end), as its first lines say.
 *
 * Utilities that only one family of in-tree plugins uses (the
 * communicators' message texts and request base, the offload tiers'
 * queue, the devices' memory tally, SHA-256) are not part of the SDK:
 * they live in plugins/common/ and are not installed.
 *
 * Conventions: functions that can fail return a dt_status_t and set the
 * message through `host->set_error`, naming the unit/tensor/range.  When a
 * device or comm call fails, its own message (set by that plugin) is kept
 * and the status returned unchanged; the helper logs its context at
 * DT_LOG_ERROR through `host->log` (the host table cannot prepend context
 * to another plugin's message).  Blocking helpers say so.
 */
#ifndef DTRAIN_SDK_HELPERS_H
#define DTRAIN_SDK_HELPERS_H

#include "dtrain/sdk/buckets.h"
#include "dtrain/sdk/cfg.h"
#include "dtrain/sdk/dp.h"
#include "dtrain/sdk/flat.h"
#include "dtrain/sdk/hash.h"
#include "dtrain/sdk/norm.h"
#include "dtrain/sdk/offload.h"
#include "dtrain/sdk/optim.h"
#include "dtrain/sdk/ranges.h"
#include "dtrain/sdk/replica.h"

#endif /* DTRAIN_SDK_HELPERS_H */
