/*
 * abi.h: the C interface between the shim's front (libspillway.so) and its
 * Go core (libspillway-core.so). The front resolves the real CUDA functions,
 * picks the current device, and calls these entry points; the core decides
 * (quotas, the pool, spilling) and fires the probe points itself, at the
 * events, while a tracer holds the probe semaphore (probes.h). Pointers and
 * streams cross as integers.
 * Every entry point but spillway_core_abi returns a cudaError_t value.
 */
#ifndef SPILLWAY_CORE_ABI_H
#define SPILLWAY_CORE_ABI_H

#include <stdint.h>
#include "real.h"
#include "probes.h"

/*
 * Streams cross as their handles, except the per-thread default stream
 * (cudaStreamPerThread), which the front passes as SPILLWAY_PER_THREAD_BIT
 * plus a number unique to the calling thread: it is a different stream in
 * every thread.
 */
#define SPILLWAY_PER_THREAD_BIT (1ull << 63)

/*
 * The version of this interface. The front and the core are separate
 * objects that must come from the same build: raise it with any change the
 * other side would notice (an entry point's signature, a table's layout).
 * The front asks the core for its version before anything else, and passes
 * its own to spillway_core_init, so each side refuses the other's.
 */
#define SPILLWAY_CORE_ABI 1

/* Entry points, looked up by the front with dlsym. */
/* Returns the core's SPILLWAY_CORE_ABI; the front calls it first. */
typedef int32_t (*spillway_core_abi_fn)(void);
/* abi is the front's SPILLWAY_CORE_ABI; the core refuses another. */
typedef int32_t (*spillway_core_init_fn)(int32_t abi, const struct spillway_real *real,
                                         const struct spillway_probes *probes);
typedef int32_t (*spillway_core_malloc_fn)(int32_t device, uint64_t size, uint64_t *ptr);
typedef int32_t (*spillway_core_malloc_managed_fn)(int32_t device, uint64_t size, uint32_t flags,
                                                   uint64_t *ptr);
typedef int32_t (*spillway_core_malloc_pitch_fn)(int32_t device, uint64_t width, uint64_t height,
                                                 uint64_t *ptr, uint64_t *pitch);
typedef int32_t (*spillway_core_malloc_async_fn)(int32_t device, uint64_t size, uint64_t stream,
                                                 uint64_t *ptr);
typedef int32_t (*spillway_core_free_fn)(uint64_t ptr);
typedef int32_t (*spillway_core_free_async_fn)(uint64_t ptr, uint64_t stream);
typedef int32_t (*spillway_core_mem_get_info_fn)(int32_t device, uint64_t *free, uint64_t *total);
typedef int32_t (*spillway_core_device_reset_fn)(int32_t device);
typedef int32_t (*spillway_core_device_synchronize_fn)(int32_t device);
/* Makes the pools forget the stream, then destroys it. */
typedef int32_t (*spillway_core_stream_destroy_fn)(uint64_t stream);
/* Prints the SPILLWAY_REPORT lines; the front calls it at exit. */
typedef int32_t (*spillway_core_report_fn)(void);
/* Hands over an allocation the front passed through while the core was starting. */
typedef int32_t (*spillway_core_adopt_fn)(uint64_t ptr, uint64_t size, int32_t device);

#endif /* SPILLWAY_CORE_ABI_H */
