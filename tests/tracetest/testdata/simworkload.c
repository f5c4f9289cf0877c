/* simworkload: known CUDA activity against the simulated CUDA, for the
 * end-to-end tracing tests.
 *
 *   simworkload [-w FD] ROUNDS
 *   simworkload pairs N      N cudaMalloc(256)+cudaFree pairs; prints the
 *                            nanoseconds they took, for benchmarks
 *   simworkload spill N      fires the shim's spillway_probe_spill (found in
 *                            the preloaded front) on N fresh host pages, writes
 *                            each page, then fires spillway_probe_free
 *   simworkload copies       cudaMalloc(4096), cudaMemcpy H2D 4096, cudaFree,
 *                            thousands of times a second until killed; prints
 *                            a line after the first round, for attaching while
 *                            it calls
 *
 * Per round: cudaMalloc twice (4096 bytes), cudaMemcpy H2D 1000, D2H 700,
 * D2D 300, cudaMemcpyAsync with cudaMemcpyDefault 50, then through the
 * driver cuMemAlloc_v2 (8192), cuMemcpyHtoD_v2 64, cuMemcpyDtoH_v2 32,
 * cuMemFree_v2, and cudaFree twice. With -w it first reads one byte from FD,
 * so that a tracer can attach to the running process. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

static void check(int rc, const char *what)
{
	if (rc != 0) {
		fprintf(stderr, "simworkload: %s failed: %d\n", what, rc);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	int arg = 1;
	if (argc > 2 && strcmp(argv[1], "-w") == 0) {
		char c;
		if (read(atoi(argv[2]), &c, 1) != 1) {
			fprintf(stderr, "simworkload: no go-ahead byte on fd %s\n", argv[2]);
			return 1;
		}
		arg = 3;
	}
	if (argc == 3 && strcmp(argv[1], "pairs") == 0) {
		long n = atol(argv[2]);
		struct timespec start, end;
		clock_gettime(CLOCK_MONOTONIC, &start);
		for (long i = 0; i < n; i++) {
			void *p;
			check(cudaMalloc(&p, 256), "cudaMalloc");
			check(cudaFree(p), "cudaFree");
		}
		clock_gettime(CLOCK_MONOTONIC, &end);
		printf("%lld\n", (long long)(end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec));
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "spill") == 0) {
		typedef void (*probe_fn)(uint64_t, uint64_t, int32_t, int32_t);
		probe_fn spill = (probe_fn)dlsym(RTLD_DEFAULT, "spillway_probe_spill");
		probe_fn release = (probe_fn)dlsym(RTLD_DEFAULT, "spillway_probe_free");
		if (!spill || !release) {
			fprintf(stderr, "simworkload: the shim's probe points are not loaded\n");
			return 1;
		}
		long pages = atol(argv[2]);
		size_t len = (size_t)pages * 4096;
		char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED) {
			perror("mmap");
			return 1;
		}
		madvise(p, len, MADV_NOHUGEPAGE);
		spill((uintptr_t)p, len, 0, 1);
		for (long i = 0; i < pages; i++)
			p[i * 4096] = 1;
		release((uintptr_t)p, len, 0, 1);
		return 0;
	}
	if (argc == 2 && strcmp(argv[1], "copies") == 0) {
		static char host[4096];
		for (long i = 0;; i++) {
			void *p;
			check(cudaMalloc(&p, sizeof host), "cudaMalloc");
			check(cudaMemcpy(p, host, sizeof host, cudaMemcpyHostToDevice), "cudaMemcpy h2d");
			check(cudaFree(p), "cudaFree");
			if (i == 0) {
				printf("copying\n");
				fflush(stdout);
			}
			usleep(20); /* thousands of rounds a second, not a whole core */
		}
	}
	if (argc != arg + 1) {
		fprintf(stderr, "usage: simworkload [-w FD] ROUNDS | pairs N | spill N | copies\n");
		return 2;
	}
	long rounds = atol(argv[arg]);
	static char host[4096];
	for (long i = 0; i < rounds; i++) {
		void *a, *b;
		check(cudaMalloc(&a, 4096), "cudaMalloc");
		check(cudaMalloc(&b, 4096), "cudaMalloc");
		check(cudaMemcpy(a, host, 1000, cudaMemcpyHostToDevice), "cudaMemcpy h2d");
		check(cudaMemcpy(host, a, 700, cudaMemcpyDeviceToHost), "cudaMemcpy d2h");
		check(cudaMemcpy(b, a, 300, cudaMemcpyDeviceToDevice), "cudaMemcpy d2d");
		check(cudaMemcpyAsync(b, a, 50, cudaMemcpyDefault, 0), "cudaMemcpyAsync default");
		check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
		CUdeviceptr d;
		check(cuMemAlloc_v2(&d, 8192), "cuMemAlloc_v2");
		check(cuMemcpyHtoD_v2(d, host, 64), "cuMemcpyHtoD_v2");
		check(cuMemcpyDtoH_v2(host, d, 32), "cuMemcpyDtoH_v2");
		check(cuMemFree_v2(d), "cuMemFree_v2");
		check(cudaFree(a), "cudaFree");
		check(cudaFree(b), "cudaFree");
	}
	return 0;
}
