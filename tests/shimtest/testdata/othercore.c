/* A core from another build: it reports ABI version OTHER_ABI, or no version
 * at all when built with -DNO_ABI (a core older than the version check). It
 * exports the core's entry points, and each aborts: a front that calls one
 * after the version check failed crashes the program. */
#include <stdint.h>
#include <stdlib.h>

#ifndef NO_ABI
int32_t spillway_core_abi(void) { return OTHER_ABI; }
#endif

#define ENTRY(name)                                                                            \
    int32_t name(void) { abort(); }

ENTRY(spillway_core_init)
ENTRY(spillway_core_malloc)
ENTRY(spillway_core_malloc_managed)
ENTRY(spillway_core_malloc_pitch)
ENTRY(spillway_core_malloc_async)
ENTRY(spillway_core_free)
ENTRY(spillway_core_free_async)
ENTRY(spillway_core_mem_get_info)
ENTRY(spillway_core_device_reset)
ENTRY(spillway_core_device_synchronize)
ENTRY(spillway_core_stream_destroy)
ENTRY(spillway_core_report)
ENTRY(spillway_core_adopt)
