/*
 * churn SEED OPS MAXSIZE PERCENT ASYNC: random allocations in the manner of
 * RMM's random_allocations benchmark, holding live bytes near PERCENT of the
 * quota (cudaMemGetInfo's total). Each operation is an allocation with
 * probability 0.73 while live bytes plus the request stay under the target,
 * otherwise the free of a random live block. Sizes are uniform in
 * [1, MAXSIZE]. With ASYNC=1, half the blocks come from cudaMallocAsync on
 * one of four streams and are freed with cudaFreeAsync on the same stream.
 *
 * A refusal is unjustified when the live bytes (rounded to 512, the pool's
 * alignment) plus the request fit in the quota.
 * Prints "churn REQUESTS REFUSED UNJUSTIFIED FAILED PEAKLIVE QUOTA".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <spillway/cuda_runtime.h>

#define STREAMS 4

struct block {
    void *p;
    size_t size;
    int stream; /* -1: cudaMalloc */
};

static uint64_t rng;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static size_t aligned(size_t n) { return (n + 511) & ~(size_t)511; }

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: churn SEED OPS MAXSIZE PERCENT ASYNC\n");
        return 2;
    }
    rng = strtoull(argv[1], NULL, 10) * 0x9e3779b97f4a7c15ull + 1;
    long ops = atol(argv[2]);
    size_t maxsize = strtoull(argv[3], NULL, 10);
    int percent = atoi(argv[4]), async = atoi(argv[5]);

    size_t avail = 0, quota = 0;
    if (cudaMemGetInfo(&avail, &quota) != cudaSuccess) {
        fprintf(stderr, "churn: cudaMemGetInfo failed\n");
        return 1;
    }
    size_t target = quota / 100 * percent;
    cudaStream_t streams[STREAMS];
    for (int i = 0; i < STREAMS; i++)
        if (cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking) != cudaSuccess)
            return 1;

    size_t cap = target / 512 + 16;
    struct block *live = calloc(cap, sizeof *live);
    size_t nlive = 0, live_bytes = 0, peak = 0;
    long requests = 0, refused = 0, unjustified = 0, failed = 0;
    for (long i = 0; i < ops; i++) {
        size_t size = 1 + next() % maxsize;
        int alloc = nlive == 0 || ((next() % 100) < 73 && live_bytes + aligned(size) <= target);
        if (alloc && nlive < cap) {
            struct block b = {NULL, size, async && next() % 2 ? (int)(next() % STREAMS) : -1};
            requests++;
            cudaError_t rc = b.stream < 0 ? cudaMalloc(&b.p, size) : cudaMallocAsync(&b.p, size, streams[b.stream]);
            if (rc == cudaSuccess) {
                live[nlive++] = b;
                live_bytes += aligned(size);
                if (live_bytes > peak)
                    peak = live_bytes;
            } else if (rc == cudaErrorMemoryAllocation) {
                refused++;
                if (live_bytes + aligned(size) <= quota)
                    unjustified++;
            } else {
                failed++;
            }
            continue;
        }
        size_t j = next() % nlive;
        struct block b = live[j];
        live[j] = live[--nlive];
        live_bytes -= aligned(b.size);
        cudaError_t rc = b.stream < 0 ? cudaFree(b.p) : cudaFreeAsync(b.p, streams[b.stream]);
        if (rc != cudaSuccess)
            failed++;
    }
    for (size_t j = 0; j < nlive; j++) {
        cudaError_t rc = live[j].stream < 0 ? cudaFree(live[j].p) : cudaFreeAsync(live[j].p, streams[live[j].stream]);
        if (rc != cudaSuccess)
            failed++;
    }
    if (cudaDeviceSynchronize() != cudaSuccess)
        failed++;
    printf("churn %ld %ld %ld %ld %zu %zu\n", requests, refused, unjustified, failed, peak, quota);
    free(live);
    return 0;
}
