/*
 * threads N ITER MAXSIZE: N threads allocate and free blocks of random sizes
 * (log-uniform in [1, MAXSIZE] bytes, at most 8 blocks each at a time)
 * ITER times. A third of the blocks come from cudaMallocAsync on the
 * thread's own stream and go back with cudaFreeAsync on it; the rest use
 * cudaMalloc and cudaFree. Every block is filled with a pattern of its own
 * and checked just before it is freed; every new block is checked against
 * every live block of every thread for overlap.
 *
 * Prints "threads ALLOCS REFUSED FAILED OVERLAPS CORRUPT" and, once every
 * block is freed, "info RC FREE TOTAL" from cudaMemGetInfo.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda_runtime.h>

#define MAXTHREADS 64
#define HELD 8

struct range {
    uintptr_t lo, hi; /* [lo, hi) */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct range live[MAXTHREADS * HELD];
static int nlive;
static int iterations;
static size_t maxsize;
static int allocs, refused, failed, overlaps, corrupt;

static void add_range(uintptr_t p, size_t size)
{
    struct range r = {p, p + (size ? size : 1)};
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nlive; i++) {
        if (r.lo < live[i].hi && live[i].lo < r.hi) {
            overlaps++;
            fprintf(stderr, "threads: [%#" PRIxPTR ", %#" PRIxPTR ") overlaps live [%#" PRIxPTR ", %#" PRIxPTR ")\n",
                    r.lo, r.hi, live[i].lo, live[i].hi);
        }
    }
    live[nlive++] = r;
    pthread_mutex_unlock(&lock);
}

/* remove_range runs before the block is freed: once freed, its address may
 * be handed out again at once. */
static void remove_range(uintptr_t p)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nlive; i++) {
        if (live[i].lo == p) {
            live[i] = live[--nlive];
            break;
        }
    }
    pthread_mutex_unlock(&lock);
}

static void pattern(unsigned char *buf, size_t size, uint64_t seed)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (size_t i = 0; i < size; i += 8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        uint64_t w = x * 0x2545f4914f6cdd1dull;
        memcpy(buf + i, &w, size - i < 8 ? size - i : 8);
    }
}

static size_t random_size(unsigned *seed)
{
    /* log-uniform: a random power of two up to maxsize, then uniform below it */
    int bits = 0;
    while (((size_t)2 << bits) <= maxsize)
        bits++;
    size_t top = (size_t)1 << (rand_r(seed) % (bits + 1));
    size_t size = top + (size_t)rand_r(seed) % top;
    return size > maxsize ? maxsize : size;
}

struct held {
    void *p;
    size_t size;
    uint64_t seed;
    int async;
};

static void *worker(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    unsigned seed = id * 2654435761u + 1;
    struct held held[HELD];
    memset(held, 0, sizeof held);
    int my_allocs = 0, my_refused = 0, my_failed = 0, my_corrupt = 0;
    cudaStream_t stream;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "threads: cudaStreamCreateWithFlags failed\n");
        exit(1);
    }
    unsigned char *want = malloc(maxsize), *got = malloc(maxsize);
    if (!want || !got)
        exit(1);

    for (int i = 0; i <= iterations; i++) {
        int k = rand_r(&seed) % HELD;
        for (int j = 0; j < HELD; j++) {
            /* the last round frees whatever is left */
            if (i < iterations && j != k)
                continue;
            struct held *h = &held[j];
            if (!h->p) {
                if (i == iterations)
                    continue;
                size_t size = random_size(&seed);
                h->async = rand_r(&seed) % 3 == 0;
                h->seed = ((uint64_t)id << 32) | (unsigned)i;
                cudaError_t rc = h->async ? cudaMallocAsync(&h->p, size, stream) : cudaMalloc(&h->p, size);
                if (rc != cudaSuccess) {
                    h->p = NULL;
                    if (rc == cudaErrorMemoryAllocation)
                        my_refused++;
                    else
                        my_failed++;
                    continue;
                }
                my_allocs++;
                h->size = size;
                add_range((uintptr_t)h->p, size);
                pattern(want, size, h->seed);
                rc = h->async ? cudaMemcpyAsync(h->p, want, size, cudaMemcpyHostToDevice, stream)
                              : cudaMemcpy(h->p, want, size, cudaMemcpyHostToDevice);
                if (rc != cudaSuccess)
                    my_failed++;
                continue;
            }
            pattern(want, h->size, h->seed);
            cudaError_t rc = h->async ? cudaMemcpyAsync(got, h->p, h->size, cudaMemcpyDeviceToHost, stream)
                                      : cudaMemcpy(got, h->p, h->size, cudaMemcpyDeviceToHost);
            if (h->async && rc == cudaSuccess)
                rc = cudaStreamSynchronize(stream);
            if (rc != cudaSuccess)
                my_failed++;
            else if (memcmp(want, got, h->size) != 0) {
                my_corrupt++;
                fprintf(stderr, "threads: block %p (%zu bytes) corrupt\n", h->p, h->size);
            }
            remove_range((uintptr_t)h->p);
            rc = h->async ? cudaFreeAsync(h->p, stream) : cudaFree(h->p);
            if (rc != cudaSuccess)
                my_failed++;
            h->p = NULL;
        }
    }
    if (cudaStreamSynchronize(stream) != cudaSuccess || cudaStreamDestroy(stream) != cudaSuccess)
        my_failed++;
    free(want);
    free(got);
    pthread_mutex_lock(&lock);
    allocs += my_allocs;
    refused += my_refused;
    failed += my_failed;
    corrupt += my_corrupt;
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: threads N ITER MAXSIZE\n");
        return 2;
    }
    int n = atoi(argv[1]);
    iterations = atoi(argv[2]);
    maxsize = strtoull(argv[3], NULL, 10);
    if (n < 1 || n > MAXTHREADS || maxsize < 1) {
        fprintf(stderr, "threads: bad arguments\n");
        return 2;
    }
    pthread_t t[MAXTHREADS];
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    size_t free = 0, total = 0;
    cudaError_t rc = cudaMemGetInfo(&free, &total);
    printf("threads %d %d %d %d %d\ninfo %d %zu %zu\n", allocs, refused, failed, overlaps, corrupt, rc, free,
           total);
    return 0;
}
