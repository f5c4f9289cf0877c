/*
 * probes.h: the table of probe points (no-op functions defined by the shim's
 * front, for uprobes to attach to) that the Go side fires at the pool's and
 * the tiers' events, and the probe semaphore: a counter the kernel keeps
 * non-zero while a tracer's uprobes are attached (see front.c). Append new
 * fields at the end and never reorder.
 */
#ifndef SPILLWAY_PROBES_H
#define SPILLWAY_PROBES_H

#include <stdint.h>

struct spillway_probes {
    uint32_t size; /* sizeof(struct spillway_probes) as the front built it */
    void (*alloc)(uint64_t ptr, uint64_t size, int32_t device, int32_t tier, int32_t source);
    void (*free)(uint64_t ptr, uint64_t size, int32_t device, int32_t tier);
    void (*sync)(int32_t device, uint64_t freed_bytes_made_reusable);
    void (*spill)(uint64_t ptr, uint64_t size, int32_t device, int32_t tier);
    void (*promote)(uint64_t ptr, uint64_t size, int32_t device, int32_t tier);
    void (*refuse)(uint64_t size, int32_t device, uint64_t used, uint64_t quota);
    /* Added with the semaphore: the probes fire only while it is non-zero. */
    const volatile uint16_t *semaphore;
};

#endif /* SPILLWAY_PROBES_H */
