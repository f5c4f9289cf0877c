/*
 * nvml_hold: allocates device memory and holds it so that NVML can be
 * queried from another process while it is in use.
 *
 * usage: nvml_hold DEVICE BYTES...
 * Allocates each BYTES on DEVICE with cudaMalloc, prints "ready USED" (USED:
 * the bytes this process uses on DEVICE by cudaMemGetInfo, context included),
 * then serves stdin line by line: "free" frees every allocation and prints
 * "freed USED".
 * Exits 0 at end of input; any CUDA failure prints it and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spillway/cuda_runtime.h"

#define MAX_ALLOCATIONS 16

static void check(cudaError_t err, const char *what)
{
	if (err != cudaSuccess) {
		printf("%s: %s (%d)\n", what, cudaGetErrorString(err), (int)err);
		exit(1);
	}
}

static void print_used(const char *what)
{
	size_t free_bytes, total;

	check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
	printf("%s %zu\n", what, total - free_bytes);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	void *ptrs[MAX_ALLOCATIONS];
	int count = argc - 2;
	char line[64];

	if (argc < 3 || count > MAX_ALLOCATIONS) {
		fprintf(stderr, "usage: nvml_hold DEVICE BYTES... (at most %d)\n", MAX_ALLOCATIONS);
		return 2;
	}
	check(cudaSetDevice(atoi(argv[1])), "cudaSetDevice");
	for (int i = 0; i < count; i++)
		check(cudaMalloc(&ptrs[i], strtoull(argv[i + 2], NULL, 10)), "cudaMalloc");
	print_used("ready");

	while (fgets(line, sizeof(line), stdin) != NULL) {
		if (strcmp(line, "free\n") == 0) {
			for (int i = 0; i < count; i++)
				check(cudaFree(ptrs[i]), "cudaFree");
			count = 0;
			print_used("freed");
		}
	}
	return 0;
}
