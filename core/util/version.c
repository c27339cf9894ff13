/*
 * core/util/version.c - the version of this libdtrain build.
 */
#include "dtrain/dtrain.h"

__attribute__((visibility("default"))) const char *dt_version(void)
{
    return DTRAIN_VERSION_STRING;
}
