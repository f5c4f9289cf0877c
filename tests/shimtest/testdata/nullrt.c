/*
 * A CUDA runtime that does almost nothing, for measuring the shim's own
 * cost: simcuda's allocations map real memory and cost microseconds, which
 * would drown the nanoseconds the interposition adds. Built as
 * libcudart.so.12 by the benchmarks only.
 */
#include <stdint.h>
#include <stdlib.h>

#include <spillway/cuda_runtime.h>

static _Atomic uintptr_t next = 1 << 20;

cudaError_t cudaMalloc(void **p, size_t n) { *p = (void *)(next += (n + 511) / 512 * 512); return cudaSuccess; }
cudaError_t cudaFree(void *p) { (void)p; return cudaSuccess; }
cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int f) { (void)f; return cudaMalloc(p, n); }
cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t w, size_t h) { *pitch = w; return cudaMalloc(p, w * h); }
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { (void)s; return cudaMalloc(p, n); }
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { (void)p; (void)s; return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { *f = *t = (size_t)16 << 30; return cudaSuccess; }
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { (void)d; return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
