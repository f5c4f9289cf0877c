/*
 * real.h: the table of the real CUDA functions, filled by the shim's C
 * front (which resolves them) and read by the Go side through interpose.
 * Only interpose calls through it. Its fields come from calls.h, in that
 * file's order: add a function there, as one row at the end.
 */
#ifndef SPILLWAY_REAL_H
#define SPILLWAY_REAL_H

#include <stdint.h>
#include <spillway/cuda_runtime.h>
#include <spillway/cuda.h>
#include <spillway/nvml.h>

struct spillway_real {
    uint32_t size; /* sizeof(struct spillway_real) as the front built it */
#define SPILLWAY_REAL(ret, field, name, params) ret(*field) params;
#define SPILLWAY_INTERPOSED SPILLWAY_REAL
#include "calls.h"
};

#endif /* SPILLWAY_REAL_H */
