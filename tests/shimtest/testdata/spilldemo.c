/*
 * spilldemo CHUNKS CHUNK_MIB: a job larger than its device quota.
 *
 *   1. a "step" of temporaries: 100 cudaMallocAsync/cudaFreeAsync pairs on
 *      a stream and 100 cudaMalloc/cudaFree pairs of 4 MiB;
 *   2. CHUNKS chunks of CHUNK_MIB MiB, each filled with its own pattern
 *      (what cudaPointerGetAttributes says each one is is printed);
 *   3. the first quarter of the chunks is freed and the device synchronized,
 *      so that memory spilled to the host can move back;
 *   4. every remaining chunk is read back and checked word by word.
 * The remaining chunks stay allocated at exit. Exits 1 on any CUDA error
 * or corrupted byte, so it is also a test.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <spillway/cuda_runtime.h>

#define CHECK(call)                                                                             \
    do {                                                                                       \
        cudaError_t rc_ = (call);                                                              \
        if (rc_ != cudaSuccess) {                                                              \
            fprintf(stderr, "spilldemo: %s failed: %s\n", #call, cudaGetErrorName(rc_));     \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static const char *kind(void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess)
        return "?";
    switch (a.type) {
    case cudaMemoryTypeDevice: return "device";
    case cudaMemoryTypeManaged: return "managed";
    case cudaMemoryTypeHost: return "host"; /* pinned memory, or the pool's host granules */
    default: return "unregistered";
    }
}

static void fill(uint64_t *buf, size_t words, int chunk)
{
    for (size_t w = 0; w < words; w++)
        buf[w] = ((uint64_t)chunk << 40) ^ (w * 0x9E3779B97F4A7C15ull);
}

static void memory_info(const char *when)
{
    size_t free = 0, total = 0;
    CHECK(cudaMemGetInfo(&free, &total));
    printf("  cudaMemGetInfo %s: free %zu MiB of %zu MiB\n", when, free >> 20, total >> 20);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: spilldemo CHUNKS CHUNK_MIB\n");
        return 2;
    }
    int chunks = atoi(argv[1]);
    size_t bytes = (size_t)atol(argv[2]) << 20, words = bytes / 8;
    if (chunks < 4 || chunks > 1024 || bytes == 0)
        return 2;
    uint64_t *host = malloc(bytes), *back = malloc(bytes);
    void **chunk = calloc((size_t)chunks, sizeof *chunk);
    if (!host || !back || !chunk)
        return 1;

    printf("1. temporaries: 100 cudaMallocAsync/cudaFreeAsync and 100 cudaMalloc/cudaFree of 4 MiB\n");
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    for (int i = 0; i < 100; i++) {
        void *p;
        CHECK(cudaMallocAsync(&p, 4 << 20, s));
        CHECK(cudaMemsetAsync(p, i, 4 << 20, s));
        CHECK(cudaFreeAsync(p, s));
    }
    for (int i = 0; i < 100; i++) {
        void *p;
        CHECK(cudaMalloc(&p, 4 << 20));
        CHECK(cudaFree(p));
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamDestroy(s));

    printf("2. %d chunks of %zu MiB (%zu MiB), each filled with its own pattern\n", chunks,
           bytes >> 20, (bytes >> 20) * (size_t)chunks);
    for (int i = 0; i < chunks; i++) {
        CHECK(cudaMalloc(&chunk[i], bytes));
        fill(host, words, i);
        CHECK(cudaMemcpy(chunk[i], host, bytes, cudaMemcpyHostToDevice));
        printf("  chunk %2d: %s\n", i, kind(chunk[i]));
    }
    memory_info("with every chunk allocated");

    int freed = chunks / 4;
    printf("3. chunks 0-%d freed, then cudaDeviceSynchronize\n", freed - 1);
    for (int i = 0; i < freed; i++)
        CHECK(cudaFree(chunk[i]));
    CHECK(cudaDeviceSynchronize());
    memory_info("after the frees");

    printf("4. chunks %d-%d read back\n", freed, chunks - 1);
    int bad = 0;
    for (int i = freed; i < chunks; i++) {
        CHECK(cudaMemcpy(back, chunk[i], bytes, cudaMemcpyDeviceToHost));
        fill(host, words, i);
        for (size_t w = 0; w < words; w++)
            if (back[w] != host[w]) {
                printf("  chunk %d: word %zu is %#llx, want %#llx\n", i, w,
                       (unsigned long long)back[w], (unsigned long long)host[w]);
                bad++;
                break;
            }
    }
    printf("  %d of %d chunks intact\n", chunks - freed - bad, chunks - freed);
    return bad ? 1 : 0;
}
