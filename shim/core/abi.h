/*
 * abi.h: the C interface between the shim's front (libspillway.so) and its
 * Go core (libspillway-core.so). The front resolves the real CUDA functions,
 * picks the current device, and calls these entry points; the core decides
 * (quotas, the pool, spilling) and fires the probe points itself, at the
 * events, while a tracer holds the probe semaphore (probes.h). Pointers and
 * streams cross as integers.
 * Every entry point but spillway_core_abi returns a cudaError_t value (the
 * runtime's) or a CUresult (the driver's): calls.h says which.
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
#define SPILLWAY_CORE_ABI 23

/* spillway_core_take's kinds: what the bytes are for. */
#define SPILLWAY_TAKE_CONTEXT 0 /* an allocation in a context the application created */
#define SPILLWAY_TAKE_VMM 1     /* cuMemCreate's physical memory */
/* A runtime allocation in a context the application created: the answer is a
 * cudaError_t, and a refusal becomes the thread's last error. */
#define SPILLWAY_TAKE_RUNTIME 2
/* An allocation from a memory pool the application created: the driver's
 * (a CUresult) and the runtime's (a cudaError_t and its last error). */
#define SPILLWAY_TAKE_POOL 3
#define SPILLWAY_TAKE_RUNTIME_POOL 4
/* A cuMemCreate the quota refused, made host-located instead when the
 * device oversubscribes: bytes of the host limit, not of the quota. */
#define SPILLWAY_TAKE_VMM_HOST 5
/* A CUDA array: the driver's (cuArrayCreate_v2, cuArray3DCreate_v2) and the
 * runtime's (cudaMallocArray, cudaMalloc3DArray: a cudaError_t and its last error). */
#define SPILLWAY_TAKE_ARRAY 6
#define SPILLWAY_TAKE_RUNTIME_ARRAY 7
/* A mipmapped array, the sum of its levels: the driver's (cuMipmappedArrayCreate)
 * and the runtime's (cudaMallocMipmappedArray). */
#define SPILLWAY_TAKE_MIPMAPPED_ARRAY 8
#define SPILLWAY_TAKE_RUNTIME_MIPMAPPED_ARRAY 9
/* Or'ed into a kind: a refusal is not reported (no log line, no probe),
 * as the caller has another way, which reports. */
#define SPILLWAY_TAKE_QUIET 0x100
/* Or'ed into a kind: the calling thread is in the device's primary context,
 * the pool's, so the pool may synchronize to give back what it holds freed. */
#define SPILLWAY_TAKE_IN_PRIMARY 0x200

/* spillway_core_address_range's answers: how the pools hold a pointer. */
#define SPILLWAY_HELD_NOT 0
#define SPILLWAY_HELD_FREE 1
#define SPILLWAY_HELD_BLOCK 2

/*
 * Entry points, looked up by the front with dlsym: spillway_core_<name> has
 * the type spillway_core_<name>_fn, one for each SPILLWAY_ENTRY row of
 * calls.h (which says what each does).
 */
#define SPILLWAY_ENTRY(name, params) typedef int32_t(*spillway_core_##name##_fn) params;
#include "calls.h"

#endif /* SPILLWAY_CORE_ABI_H */
