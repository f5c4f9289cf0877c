/*
 * heldfree.h: the second half of crossfree and defaultfree, once block a
 * of size bytes (device 0) was freed on device 1's stream held at the
 * gate behind a memset of its first CHUNK bytes to 0xAA. Prints:
 *   "Y RC"           cudaDeviceSynchronize on device 0
 *   "B RC ADDR SAME" cudaMalloc of 1 MiB on device 0; SAME: 1 if at a's address
 *   "P RC"           B's first CHUNK bytes written with 0x55
 *   "H RC"           the gate opened, device 1 synchronized
 *   "V RC WRONG"     B's first CHUNK bytes read back; WRONG: bytes that are not 0x55
 *   "C RC"           cudaMalloc of size bytes on device 0
 */
#ifndef SHIMTEST_HELDFREE_H
#define SHIMTEST_HELDFREE_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <spillway/cuda_runtime.h>

#include "gate.h"

#define MIB (1ull << 20)
#define CHUNK 4096

static void reuse_after_held_free(void *a, size_t size)
{
    void *b = NULL, *c = NULL;
    printf("Y %d\n", cudaDeviceSynchronize());
    int rc = cudaMalloc(&b, MIB);
    printf("B %d %lu %d\n", rc, (unsigned long)(uintptr_t)b, rc == cudaSuccess && b == a);

    unsigned char buf[CHUNK];
    memset(buf, 0x55, sizeof buf);
    printf("P %d\n", cudaMemcpy(b, buf, sizeof buf, cudaMemcpyHostToDevice));

    rc = open_gate() == 0 ? cudaSetDevice(1) : cudaErrorUnknown;
    if (rc == cudaSuccess)
        rc = cudaDeviceSynchronize();
    if (rc == cudaSuccess)
        rc = cudaSetDevice(0);
    printf("H %d\n", rc);

    rc = cudaMemcpy(buf, b, sizeof buf, cudaMemcpyDeviceToHost);
    int wrong = 0;
    for (size_t k = 0; k < sizeof buf; k++)
        wrong += buf[k] != 0x55;
    printf("V %d %d\n", rc, wrong);

    printf("C %d\n", cudaMalloc(&c, size));
}

#endif
