/*
 * entries.c: checks at compile time that the core exports every entry point
 * calls.h lists, with the type abi.h gives it, so that the front's lookup
 * by name can never reach a function of another type.
 */
#include "_cgo_export.h"
#include "abi.h"

#define SPILLWAY_ENTRY(name, params)                                                           \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&spillway_core_##name),             \
                                                spillway_core_##name##_fn),                    \
                   "spillway_core_" #name " differs from its row in calls.h");
#include "calls.h"
