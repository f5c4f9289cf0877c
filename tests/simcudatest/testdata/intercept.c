/*
 * intercept.c - preloaded to prove the runtime never binds driver symbols by
 * name: any call that reaches these definitions instead of the driver's
 * reports itself and aborts.
 */
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

#define TRAP(name, params)                                                   \
	CUresult name params                                                 \
	{                                                                    \
		fprintf(stderr, "INTERCEPTED %s by symbol binding\n", #name); \
		abort();                                                     \
	}

TRAP(cuInit, (unsigned int flags))
TRAP(cuMemAlloc_v2, (CUdeviceptr * p, size_t n))
TRAP(cuMemFree_v2, (CUdeviceptr p))
TRAP(cuDevicePrimaryCtxRetain, (void **ctx, int dev))
