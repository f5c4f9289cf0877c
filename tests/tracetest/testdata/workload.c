/* A program with known CUDA activity, for checking a tracer's counts.
 *
 *   workload [-w FD] counts ROUNDS   per round: cudaMalloc(4096), cudaMemcpy
 *                                    H2D 1000, D2H 700, D2D 300, Default 50
 *                                    (async), cuMemAlloc_v2(8192),
 *                                    cuMemcpyHtoD_v2 64, cuMemFree_v2,
 *                                    cudaFree; one probe point of each kind
 *   workload [-w FD] spill PAGES     fires spillway_probe_spill on a fresh
 *                                    host range of PAGES pages, writes every
 *                                    page, then touches as many pages of an
 *                                    unspilled range, then frees both
 *   workload [-w FD] pairs N         N cudaMalloc+cudaFree pairs; prints
 *                                    the nanoseconds they took
 *   workload [-w FD] probes N        fires spillway_probe_sync N times as
 *                                    fast as it can; prints the nanoseconds
 *   workload [-w FD] edges N         spills the unaligned range [p+100,
 *                                    p+3*4096+107) of N fresh pages at p and
 *                                    writes one byte on each of pages 0..4:
 *                                    p+50 (outside), p+4096, p+2*4096,
 *                                    p+3*4096+106 (its last byte, inside),
 *                                    p+4*4096 (outside)
 *   workload [-w FD] accesses N      spills the same range of N fresh pages,
 *                                    then sets and copies ranges around it
 *                                    (see accesses()), synchronizes with
 *                                    cudaDeviceSynchronize and
 *                                    cuCtxSynchronize, promotes the range
 *                                    and sets its first bytes again
 *   workload [-w FD] overfill N      fires spillway_probe_spill on N 512-byte
 *                                    ranges of reserved address space, then
 *                                    spills and frees 8 fresh pages, frees the
 *                                    N ranges, then writes every fresh page
 *
 * With -w it first reads one byte from FD, so that a tracer can attach to
 * the already running process. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef unsigned long long CUdeviceptr;
int cudaMalloc(void **devPtr, size_t size);
int cudaFree(void *devPtr);
int cudaMemcpy(void *dst, const void *src, size_t count, int kind);
int cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, void *stream);
int cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
int cuMemFree_v2(CUdeviceptr dptr);
int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
int cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n);
int cudaMemset(void *devPtr, int value, size_t count);
int cuCtxSynchronize(void);
int cudaDeviceSynchronize(void);
void spillway_probe_alloc(uint64_t ptr, uint64_t size, int32_t device, int32_t tier, int32_t source);
void spillway_probe_free(uint64_t ptr, uint64_t size, int32_t device, int32_t tier);
void spillway_probe_sync(int32_t device, uint64_t freed);
void spillway_probe_spill(uint64_t ptr, uint64_t size, int32_t device, int32_t tier);
void spillway_probe_promote(uint64_t ptr, uint64_t size, int32_t device, int32_t tier);
void spillway_probe_refuse(uint64_t size, int32_t device, uint64_t used, uint64_t quota);

static void check(int rc, const char *what)
{
	if (rc != 0) {
		fprintf(stderr, "%s failed: %d\n", what, rc);
		exit(1);
	}
}

static void counts(long rounds)
{
	static char host[4096];
	for (long i = 0; i < rounds; i++) {
		void *a, *b;
		check(cudaMalloc(&a, 4096), "cudaMalloc");
		check(cudaMalloc(&b, 4096), "cudaMalloc");
		check(cudaMemcpy(a, host, 1000, 1), "cudaMemcpy h2d");
		check(cudaMemcpy(host, a, 700, 2), "cudaMemcpy d2h");
		check(cudaMemcpy(b, a, 300, 3), "cudaMemcpy d2d");
		check(cudaMemcpyAsync(b, a, 50, 4, NULL), "cudaMemcpyAsync default");
		CUdeviceptr d;
		check(cuMemAlloc_v2(&d, 8192), "cuMemAlloc_v2");
		check(cuMemcpyHtoD_v2(d, host, 64), "cuMemcpyHtoD_v2");
		check(cuMemFree_v2(d), "cuMemFree_v2");
		check(cudaFree(a), "cudaFree");
		check(cudaFree(b), "cudaFree");
		spillway_probe_alloc((uintptr_t)a, 4096, 0, 0, 0);
		spillway_probe_alloc((uintptr_t)b, 4096, 0, 0, 1);
		spillway_probe_free((uintptr_t)a, 4096, 0, 0);
		spillway_probe_sync(0, 4096);
		spillway_probe_refuse(1 << 20, 0, 3 << 20, 4 << 20);
	}
}

static char *fresh_pages(long pages)
{
	size_t len = (size_t)pages * 4096;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	madvise(p, len, MADV_NOHUGEPAGE); /* one fault per page */
	return p;
}

static void spill(long pages)
{
	size_t len = (size_t)pages * 4096;
	char *spilled = fresh_pages(pages);
	char *plain = fresh_pages(pages);
	spillway_probe_spill((uintptr_t)spilled, len, 0, 1);
	for (long i = 0; i < pages; i++)
		spilled[i * 4096] = 1;
	for (long i = 0; i < pages; i++)
		plain[i * 4096] = 1;
	spillway_probe_free((uintptr_t)spilled, len, 0, 1);
	munmap(spilled, len);
	munmap(plain, len);
}

static void edges(long pages)
{
	if (pages < 5) {
		fprintf(stderr, "workload: edges needs at least 5 pages\n");
		exit(2);
	}
	char *p = fresh_pages(pages);
	uintptr_t start = (uintptr_t)p + 100, size = 3 * 4096 + 7;
	spillway_probe_spill(start, size, 0, 1);
	p[50] = 1;
	p[4096] = 1;
	p[2 * 4096] = 1;
	p[3 * 4096 + 106] = 1;
	p[4 * 4096] = 1;
	spillway_probe_promote(start, size, 0, 0);
	munmap(p, (size_t)pages * 4096);
}

/* Accesses to the spilled range [p+100, p+3*4096+107): those whose first or
 * last byte is inside touch spilled memory. In order: cudaMemset 16 bytes at
 * its start (spilled), 60 bytes from p+50 (ends inside: spilled), 50 bytes
 * from p+50 (ends just before it: not); cuMemsetD32_v2 of one word at
 * p+3*4096+104 (starts inside: spilled, 4 bytes), two words at its end
 * (not, 8 bytes); cudaMemcpy of 10 bytes from p+200 to the host (spilled),
 * from the host to p+4*4096 (not), and host to host (not an access); after
 * the promotion, 16 bytes at its start again (not). */
static void accesses(long pages)
{
	static char host[64];
	if (pages < 5) {
		fprintf(stderr, "workload: accesses needs at least 5 pages\n");
		exit(2);
	}
	char *p = fresh_pages(pages);
	uintptr_t start = (uintptr_t)p + 100, size = 3 * 4096 + 7;
	spillway_probe_spill(start, size, 0, 1);
	check(cudaMemset(p + 100, 0, 16), "cudaMemset");
	check(cudaMemset(p + 50, 0, 60), "cudaMemset");
	check(cudaMemset(p + 50, 0, 50), "cudaMemset");
	check(cuMemsetD32_v2((CUdeviceptr)(uintptr_t)(p + 3 * 4096 + 104), 0, 1), "cuMemsetD32_v2");
	check(cuMemsetD32_v2((CUdeviceptr)(uintptr_t)(p + 3 * 4096 + 107), 0, 2), "cuMemsetD32_v2");
	check(cudaMemcpy(host, p + 200, 10, 2), "cudaMemcpy d2h");
	check(cudaMemcpy(p + 4 * 4096, host, 10, 1), "cudaMemcpy h2d");
	check(cudaMemcpy(host + 32, host, 10, 0), "cudaMemcpy h2h");
	check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	check(cuCtxSynchronize(), "cuCtxSynchronize");
	spillway_probe_promote(start, size, 0, 0);
	check(cudaMemset(p + 100, 0, 16), "cudaMemset");
	munmap(p, (size_t)pages * 4096);
}

/* N spilled allocations at once, then one more: with N at the probes' limit
 * on spilled allocations, the last one is past it. Its pages are written only
 * once every spill is freed, so none of their faults is in spilled memory. */
static void overfill(long n)
{
	const size_t fake = 512, pages = 8, len = pages * 4096;
	size_t reserved = (size_t)n * fake;
	char *fakes = mmap(NULL, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (fakes == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	for (long i = 0; i < n; i++) {
		spillway_probe_spill((uintptr_t)fakes + i * fake, fake, 0, 1);
		if (i % 8192 == 8191)
			usleep(1000); /* lets the tracer drain its ring buffer */
	}
	char *p = fresh_pages(pages);
	spillway_probe_spill((uintptr_t)p, len, 0, 1);
	spillway_probe_free((uintptr_t)p, len, 0, 1);
	for (long i = 0; i < n; i++) {
		spillway_probe_free((uintptr_t)fakes + i * fake, fake, 0, 1);
		if (i % 8192 == 8191)
			usleep(1000);
	}
	for (size_t i = 0; i < pages; i++)
		p[i * 4096] = 1;
	munmap(p, len);
	munmap(fakes, reserved);
}

static void pairs(long n)
{
	struct timespec start, end;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (long i = 0; i < n; i++) {
		void *p;
		check(cudaMalloc(&p, 256), "cudaMalloc");
		check(cudaFree(p), "cudaFree");
	}
	clock_gettime(CLOCK_MONOTONIC, &end);
	printf("%lld\n", (long long)(end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec));
}

static void probes(long n)
{
	struct timespec start, end;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (long i = 0; i < n; i++)
		spillway_probe_sync(0, (uint64_t)i);
	clock_gettime(CLOCK_MONOTONIC, &end);
	printf("%lld\n", (long long)(end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec));
}

int main(int argc, char **argv)
{
	int arg = 1;
	if (argc > 2 && strcmp(argv[1], "-w") == 0) {
		char c;
		if (read(atoi(argv[2]), &c, 1) != 1) {
			fprintf(stderr, "workload: no go-ahead byte on fd %s\n", argv[2]);
			return 1;
		}
		arg = 3;
	}
	if (argc != arg + 2) {
		fprintf(stderr, "usage: workload [-w FD] counts|spill|edges|accesses|overfill|pairs|probes N\n");
		return 2;
	}
	long n = atol(argv[arg + 1]);
	if (strcmp(argv[arg], "counts") == 0)
		counts(n);
	else if (strcmp(argv[arg], "spill") == 0)
		spill(n);
	else if (strcmp(argv[arg], "edges") == 0)
		edges(n);
	else if (strcmp(argv[arg], "accesses") == 0)
		accesses(n);
	else if (strcmp(argv[arg], "overfill") == 0)
		overfill(n);
	else if (strcmp(argv[arg], "pairs") == 0)
		pairs(n);
	else if (strcmp(argv[arg], "probes") == 0)
		probes(n);
	else {
		fprintf(stderr, "workload: unknown mode %s\n", argv[arg]);
		return 2;
	}
	return 0;
}
