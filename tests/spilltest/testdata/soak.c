/*
 * soak SECONDS: 8 threads allocate and free for SECONDS under whatever the
 * environment sets (quota, oversubscription, simcuda's fault injection):
 * cudaMalloc, cudaMallocAsync on a stream of their own and on
 * cudaStreamPerThread, cudaMallocManaged, cudaMallocPitch, frees of every
 * kind, synchronizations. Each thread is replaced by a new one every 500
 * rounds, so per-thread state comes and goes. The first and last byte of
 * every block are written when it is allocated and checked when it is freed.
 * Prints "rss T KIB CHEAP_KIB ALLOCS THREADS" once a second (resident
 * memory, the C heap in use by glibc's malloc, allocations so far, threads of
 * the process), then, after freeing everything and synchronizing, "done
 * ALLOCS FAILED CORRUPT" and "core PATH", the Spillway core mapped in the
 * process (none when it runs without Spillway).
 */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <spillway/cuda_runtime.h>

#define THREADS 8
#define HELD 12
#define ROUNDS_PER_THREAD 500

static atomic_long allocs, failed, corrupt;
static atomic_int stop;

struct held {
    unsigned char *p;
    size_t size;
    int kind; /* 0 cudaMalloc, 1 async own stream, 2 async per-thread, 3 managed, 4 pitch */
    unsigned char tag;
};

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void release(struct held *h, cudaStream_t own)
{
    if (!h->p)
        return;
    if (!h->tag)
        goto unchecked;
    unsigned char first = 0, last = 0;
    if (cudaMemcpy(&first, h->p, 1, cudaMemcpyDefault) == cudaSuccess &&
        cudaMemcpy(&last, h->p + h->size - 1, 1, cudaMemcpyDefault) == cudaSuccess &&
        (first != h->tag || last != h->tag))
        atomic_fetch_add(&corrupt, 1);
unchecked:;
    cudaError_t rc;
    switch (h->kind) {
    case 1:
        rc = cudaFreeAsync(h->p, own);
        break;
    case 2:
        rc = cudaFreeAsync(h->p, cudaStreamPerThread);
        break;
    default:
        rc = cudaFree(h->p);
    }
    if (rc != cudaSuccess) /* a refused free leaves the block allocated: try again once */
        rc = cudaFree(h->p);
    h->p = NULL;
}

static void *worker(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    cudaStream_t own = NULL;
    cudaStreamCreate(&own);
    struct held held[HELD] = {0};
    for (int round = 0; round < ROUNDS_PER_THREAD && !atomic_load(&stop); round++) {
        struct held *h = &held[next_rand(&seed) % HELD];
        release(h, own);
        uint64_t r = next_rand(&seed);
        size_t size = 512 + (size_t)(r % (6u << 20));
        int kind = (int)((r >> 32) % 5);
        void *p = NULL;
        size_t pitch = 0;
        cudaError_t rc;
        switch (kind) {
        case 1:
            rc = cudaMallocAsync(&p, size, own);
            break;
        case 2:
            rc = cudaMallocAsync(&p, size, cudaStreamPerThread);
            break;
        case 3:
            rc = cudaMallocManaged(&p, size / 4 + 1, cudaMemAttachGlobal);
            size = size / 4 + 1;
            break;
        case 4:
            rc = cudaMallocPitch(&p, &pitch, 1000, size / 1000 + 1);
            size = pitch * (size / 1000 + 1);
            break;
        default:
            rc = cudaMalloc(&p, size);
        }
        atomic_fetch_add(&allocs, 1);
        if (rc != cudaSuccess || !p) {
            atomic_fetch_add(&failed, 1);
            continue;
        }
        h->p = p;
        h->size = size;
        h->kind = kind;
        h->tag = (unsigned char)(r >> 56) | 1;
        if (cudaMemcpy(h->p, &h->tag, 1, cudaMemcpyDefault) != cudaSuccess ||
            cudaMemcpy(h->p + size - 1, &h->tag, 1, cudaMemcpyDefault) != cudaSuccess)
            h->tag = 0; /* not written: not checked */
        if (round % 97 == 0)
            cudaDeviceSynchronize();
        if (round % 61 == 0)
            cudaStreamSynchronize(own);
    }
    for (int i = 0; i < HELD; i++)
        release(&held[i], own);
    cudaStreamSynchronize(own);
    cudaStreamDestroy(own);
    return NULL;
}

/* The value of a "Name:" line of /proc/self/status, or -1. */
static long status_value(const char *name)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(name);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, name, n) == 0 && line[n] == ':')
            v = atol(line + n + 1);
    if (f)
        fclose(f);
    return v;
}

static void *driver(void *arg)
{
    long slot = (long)(intptr_t)arg;
    while (!atomic_load(&stop)) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, (void *)(intptr_t)(slot + 1 + allocs)) != 0)
            break;
        pthread_join(t, NULL);
    }
    return NULL;
}

/* Prints "core PATH" for the file of Spillway's core mapped in the process. */
static void print_core(void)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps)
        return;
    char line[4096];
    while (fgets(line, sizeof line, maps)) {
        const char *path = strchr(line, '/');
        if (path && strstr(path, "/libspillway-core")) {
            printf("core %s", path);
            break;
        }
    }
    fclose(maps);
}

int main(int argc, char **argv)
{
    int seconds = argc > 1 ? atoi(argv[1]) : 10;
    pthread_t drivers[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&drivers[i], NULL, driver, (void *)(intptr_t)i);
    time_t start = time(NULL);
    while (time(NULL) - start < seconds) {
        sleep(1);
        struct mallinfo2 mi = mallinfo2();
        printf("rss %ld %ld %zu %ld %ld\n", (long)(time(NULL) - start), status_value("VmRSS"),
               (mi.uordblks + mi.hblkhd) >> 10, atomic_load(&allocs), status_value("Threads"));
        fflush(stdout);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < THREADS; i++)
        pthread_join(drivers[i], NULL);
    cudaDeviceSynchronize();
    printf("done %ld %ld %ld\n", atomic_load(&allocs), atomic_load(&failed), atomic_load(&corrupt));
    print_core();
    return 0;
}
