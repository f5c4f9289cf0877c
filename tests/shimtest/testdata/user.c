/* A library that links the CUDA runtime, as a Python extension module does;
 * programs load it with RTLD_LOCAL so that the runtime is not global. */
#include <stddef.h>

#include <spillway/cuda_runtime.h>

int user_malloc(size_t size, void **p) { return cudaMalloc(p, size); }
int user_free(void *p) { return cudaFree(p); }
int user_mem_get_info(size_t *free, size_t *total) { return cudaMemGetInfo(free, total); }
