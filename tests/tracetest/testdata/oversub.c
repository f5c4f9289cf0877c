/* oversub: a job larger than its quota, for tracing the shim's pool and
 * oversubscription on simcuda. Run under the shim.
 *
 *   oversub spill CHUNKS CHUNK_MIB
 *       1. 50 cudaMalloc/cudaFree pairs of 1 MiB, then cudaDeviceSynchronize;
 *       2. CHUNKS chunks of CHUNK_MIB MiB. Those the shim spilled to the host
 *          (cudaPointerGetAttributes says managed or host) are written from
 *          the CPU, one word in every page, with huge pages off for them so
 *          that each page faults exactly once; the others are filled with
 *          cudaMemcpy from the host, then copy their first page to their
 *          second (device to device) and back to the host;
 *       3. the first half of the chunks is freed and the device
 *          synchronized, so that spilled chunks move back to the device;
 *       4. the rest is freed.
 *       The spilled pages are not read again, so that a page reclaimed in
 *       between cannot fault a second time.
 *       Prints "spilled_chunks=N touched_pages=P h2d=B d2h=B d2d=B", the last
 *       three being the bytes it copied.
 *   oversub refuse MIB
 *       allocates MIB MiB, then MIB MiB again, which the quota is expected
 *       to refuse with cudaErrorMemoryAllocation; prints "refused=BYTES".
 *
 * Exits 1 on an unexpected CUDA result. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <spillway/cuda_runtime.h>

#define CHECK(call)                                                                        \
	do {                                                                               \
		cudaError_t rc_ = (call);                                                  \
		if (rc_ != cudaSuccess) {                                                  \
			fprintf(stderr, "oversub: %s failed: %s\n", #call,                  \
				cudaGetErrorName(rc_));                                    \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

/* spilled reports whether p is host memory the CPU may write: managed or
 * mapped pinned memory, which is what the shim spills to. */
static int spilled(void *p)
{
	struct cudaPointerAttributes a;
	CHECK(cudaPointerGetAttributes(&a, p));
	return a.type == cudaMemoryTypeManaged || a.type == cudaMemoryTypeHost;
}

static int spill_mode(int chunks, size_t bytes)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t pages = bytes / page;
	void **chunk = calloc((size_t)chunks, sizeof *chunk);
	char *host = calloc(1, bytes);
	if (!chunk || !host || bytes % page != 0 || bytes < 2 * page)
		return 1;

	for (int i = 0; i < 50; i++) {
		void *p;
		CHECK(cudaMalloc(&p, 1 << 20));
		CHECK(cudaFree(p));
	}
	CHECK(cudaDeviceSynchronize());

	int spilled_chunks = 0;
	long touched_pages = 0;
	size_t h2d = 0, d2h = 0, d2d = 0;
	for (int i = 0; i < chunks; i++) {
		CHECK(cudaMalloc(&chunk[i], bytes));
		if (!spilled(chunk[i])) {
			CHECK(cudaMemcpy(chunk[i], host, bytes, cudaMemcpyHostToDevice));
			CHECK(cudaMemcpy((char *)chunk[i] + page, chunk[i], page, cudaMemcpyDeviceToDevice));
			CHECK(cudaMemcpy(host, (char *)chunk[i] + page, page, cudaMemcpyDeviceToHost));
			h2d += bytes;
			d2d += page;
			d2h += page;
			continue;
		}
		/* Fails harmlessly where huge pages are not built in. */
		madvise(chunk[i], bytes, MADV_NOHUGEPAGE);
		volatile uint64_t *w = chunk[i];
		for (size_t p = 0; p < pages; p++)
			w[p * (page / sizeof *w)] = ((uint64_t)i << 40) | p;
		spilled_chunks++;
		touched_pages += (long)pages;
	}
	CHECK(cudaDeviceSynchronize());

	for (int i = 0; i < chunks / 2; i++)
		CHECK(cudaFree(chunk[i]));
	CHECK(cudaDeviceSynchronize());

	for (int i = chunks / 2; i < chunks; i++)
		CHECK(cudaFree(chunk[i]));
	CHECK(cudaDeviceSynchronize());
	printf("spilled_chunks=%d touched_pages=%ld h2d=%zu d2h=%zu d2d=%zu\n", spilled_chunks, touched_pages,
	       h2d, d2h, d2d);
	return 0;
}

static int refuse_mode(size_t bytes)
{
	void *a, *b;
	CHECK(cudaMalloc(&a, bytes));
	cudaError_t rc = cudaMalloc(&b, bytes);
	if (rc != cudaErrorMemoryAllocation) {
		fprintf(stderr, "oversub: the second cudaMalloc of %zu bytes returned %s, want cudaErrorMemoryAllocation\n",
			bytes, cudaGetErrorName(rc));
		return 1;
	}
	CHECK(cudaFree(a));
	printf("refused=%zu\n", bytes);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "spill") == 0) {
		int chunks = atoi(argv[2]);
		size_t bytes = (size_t)atol(argv[3]) << 20;
		if (chunks >= 2 && chunks <= 1024 && bytes > 0)
			return spill_mode(chunks, bytes);
	}
	if (argc == 3 && strcmp(argv[1], "refuse") == 0) {
		size_t bytes = (size_t)atol(argv[2]) << 20;
		if (bytes > 0)
			return refuse_mode(bytes);
	}
	fprintf(stderr, "usage: oversub spill CHUNKS CHUNK_MIB | oversub refuse MIB\n");
	return 2;
}
