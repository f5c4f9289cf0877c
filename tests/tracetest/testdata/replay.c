/* replay: replays an allocation trace through the CUDA runtime, touching the
 * memory each step uses, for tracing an oversubscribed job. Run under the
 * shim.
 *
 *   replay TRACE TOUCH_BYTES
 *
 * TRACE is an uncompressed trace in the format of tests/traces (README.md
 * there): "a ID SIZE" cudaMalloc, "A ID SIZE STREAM" cudaMallocAsync,
 * "f ID" cudaFree, "F ID STREAM" cudaFreeAsync, "s" a step's end; lines
 * starting with '#' are comments. Stream 0 is the legacy stream; others are
 * created at first use.
 *
 * Every block is touched when it is allocated (its first TOUCH_BYTES bytes
 * set with cudaMemsetAsync on its stream, or all of it when smaller), and at
 * each step's end every live block is touched again, weights included, before
 * cudaDeviceSynchronize. Before each touch, cudaPointerGetAttributes says
 * whether the shim spilled the memory touched (host or managed memory);
 * pinned memory, and host granules, move only at synchronizations, if at
 * all, so with SPILLWAY_SPILL=pinned the program knows which touches hit
 * spilled memory. spilled_blocks counts the blocks spilled when allocated.
 * At exit it prints
 *
 *   steps=N accesses=A spilled_accesses=S access_bytes=B spilled_access_bytes=SB spilled_blocks=K
 *
 * Exits 1 on a CUDA error or a malformed trace. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda_runtime.h>

#define MAX_STREAMS 64

#define CHECK(call)                                                                        \
	do {                                                                               \
		cudaError_t rc_ = (call);                                                  \
		if (rc_ != cudaSuccess) {                                                  \
			fprintf(stderr, "replay: line %lu: %s failed: %s\n", line_no, #call, \
				cudaGetErrorName(rc_));                                    \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

struct block {
	void *ptr;
	uint64_t size;
	cudaStream_t stream;
	int live;
};

struct counts {
	uint64_t steps, accesses, spilled_accesses, access_bytes, spilled_access_bytes, spilled_blocks;
};

static unsigned long line_no;
static struct block *blocks;
static size_t nblocks;
static cudaStream_t streams[MAX_STREAMS];
static uint64_t touch_bytes;
static struct counts count;

static void fail(const char *what)
{
	fprintf(stderr, "replay: line %lu: %s\n", line_no, what);
	exit(1);
}

static struct block *block_of(uint64_t id)
{
	if (id >= nblocks) {
		size_t n = nblocks ? nblocks : 1024;
		while (n <= id)
			n *= 2;
		struct block *grown = realloc(blocks, n * sizeof *grown);
		if (!grown)
			fail("out of memory");
		memset(grown + nblocks, 0, (n - nblocks) * sizeof *grown);
		blocks = grown;
		nblocks = n;
	}
	return &blocks[id];
}

static cudaStream_t stream_of(uint64_t n)
{
	if (n == 0)
		return 0;
	if (n >= MAX_STREAMS)
		fail("stream number too large");
	if (!streams[n])
		CHECK(cudaStreamCreate(&streams[n]));
	return streams[n];
}

static int on_host(const void *p)
{
	struct cudaPointerAttributes a;
	CHECK(cudaPointerGetAttributes(&a, p));
	return a.type == cudaMemoryTypeHost || a.type == cudaMemoryTypeManaged;
}

/* A touch is spilled when either end of it is (host granules of a block in
 * virtual memory lie anywhere in it), asked at each touch: with
 * SPILLWAY_MIGRATE=1 granules move at synchronizations. */
static int spilled_touch(const struct block *b, uint64_t n)
{
	return on_host((char *)b->ptr) || on_host((char *)b->ptr + n - 1);
}

/* touch sets b's first touch_bytes bytes, counting the access, and returns
 * whether it was spilled (0 when there is nothing to touch). */
static int touch(struct block *b)
{
	uint64_t n = b->size < touch_bytes ? b->size : touch_bytes;
	if (n == 0)
		return 0;
	int spilled = spilled_touch(b, n);
	CHECK(cudaMemsetAsync(b->ptr, (int)(count.steps & 0xff), n, b->stream));
	count.accesses++;
	count.access_bytes += n;
	if (spilled) {
		count.spilled_accesses++;
		count.spilled_access_bytes += n;
	}
	return spilled;
}

static void allocate(uint64_t id, uint64_t size, int async, uint64_t stream)
{
	struct block *b = block_of(id);
	if (b->live)
		fail("allocation of a live ID");
	b->size = size;
	b->stream = stream_of(stream);
	if (async)
		CHECK(cudaMallocAsync(&b->ptr, size, b->stream));
	else
		CHECK(cudaMalloc(&b->ptr, size));
	b->live = 1;
	count.spilled_blocks += touch(b);
}

static void release(uint64_t id, int async, uint64_t stream)
{
	struct block *b = block_of(id);
	if (!b->live)
		fail("free of an ID not live");
	if (async)
		CHECK(cudaFreeAsync(b->ptr, stream_of(stream)));
	else
		CHECK(cudaFree(b->ptr));
	b->live = 0;
}

static void step(void)
{
	for (size_t i = 0; i < nblocks; i++)
		if (blocks[i].live)
			touch(&blocks[i]);
	CHECK(cudaDeviceSynchronize());
	count.steps++;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: replay TRACE TOUCH_BYTES\n");
		return 1;
	}
	touch_bytes = strtoull(argv[2], NULL, 10);
	FILE *f = fopen(argv[1], "r");
	if (!f) {
		perror(argv[1]);
		return 1;
	}
	char text[256];
	while (fgets(text, sizeof text, f)) {
		line_no++;
		uint64_t id, size, stream;
		switch (text[0]) {
		case '#':
			break;
		case 'a':
			if (sscanf(text, "a %" SCNu64 " %" SCNu64, &id, &size) != 2)
				fail("malformed line");
			allocate(id, size, 0, 0);
			break;
		case 'A':
			if (sscanf(text, "A %" SCNu64 " %" SCNu64 " %" SCNu64, &id, &size, &stream) != 3)
				fail("malformed line");
			allocate(id, size, 1, stream);
			break;
		case 'f':
			if (sscanf(text, "f %" SCNu64, &id) != 1)
				fail("malformed line");
			release(id, 0, 0);
			break;
		case 'F':
			if (sscanf(text, "F %" SCNu64 " %" SCNu64, &id, &stream) != 2)
				fail("malformed line");
			release(id, 1, stream);
			break;
		case 's':
			step();
			break;
		default:
			fail("unknown operation");
		}
	}
	if (ferror(f))
		fail("read error");
	fclose(f);
	printf("steps=%" PRIu64 " accesses=%" PRIu64 " spilled_accesses=%" PRIu64 " access_bytes=%" PRIu64
	       " spilled_access_bytes=%" PRIu64 " spilled_blocks=%" PRIu64 "\n",
	       count.steps, count.accesses, count.spilled_accesses, count.access_bytes,
	       count.spilled_access_bytes, count.spilled_blocks);
	return 0;
}
