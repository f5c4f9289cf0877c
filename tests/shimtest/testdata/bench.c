/*
 * bench pairs THREADS N SIZE: each of THREADS threads runs N cudaMalloc +
 * cudaFree pairs of SIZE bytes (after a warm-up); prints "pair_ns X", the
 * wall time per pair as each thread saw it.
 * bench first SIZE: initialises the runtime with a call the shim does not
 * interpose, then times the first cudaMalloc; prints "first_ns X".
 * Built with BENCH_DRIVER, the pairs are cuMemAlloc_v2 + cuMemFree_v2 in
 * device 0's primary context, and bench lookups N makes N cuGetProcAddress
 * lookups of driver functions, some interposed and some not, after a first
 * allocation; prints "lookup_ns X", the time per lookup.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <spillway/cuda_runtime.h>

static long pairs;

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}
static size_t size;

#ifdef BENCH_DRIVER
#include <spillway/cuda.h>

static CUcontext context;

static int pair(void)
{
    CUdeviceptr p;
    return cuMemAlloc_v2(&p, size) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS ? -1 : 0;
}

static int lookups(long n)
{
    static const char *const names[] = {"cuMemAlloc", "cuEventRecord", "cuMemFree",
                                        "cuStreamCreate", "cuMemGetInfo", "cuCtxGetCurrent"};
    CUdeviceptr p;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(context) != CUDA_SUCCESS || cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS)
        return 1;
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        void *f = NULL;
        if (cuGetProcAddress(names[i % 6], &f, 12000, 0) != CUDA_SUCCESS || !f)
            return 1;
    }
    printf("lookup_ns %.1f\n", (now_ns() - t0) / (double)n);
    return 0;
}
#else
static int pair(void)
{
    void *p;
    return cudaMalloc(&p, size) != cudaSuccess || cudaFree(p) != cudaSuccess ? -1 : 0;
}
#endif

static pthread_barrier_t start;

static int run_pairs(long n)
{
    for (long i = 0; i < n; i++)
        if (pair() != 0)
            return -1;
    return 0;
}

static void *worker(void *arg)
{
    (void)arg;
#ifdef BENCH_DRIVER
    if (cuCtxSetCurrent(context) != CUDA_SUCCESS)
        exit(1);
#endif
    if (run_pairs(1000) != 0)
        exit(1);
    pthread_barrier_wait(&start);
    if (run_pairs(pairs) != 0)
        exit(1);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "pairs")) {
        int threads = atoi(argv[2]);
        pairs = atol(argv[3]);
        size = (size_t)atol(argv[4]);
        pthread_t t[64];
        if (threads < 1 || threads > 64)
            return 2;
#ifdef BENCH_DRIVER
        if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS)
            return 1;
#endif
        pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
        for (int i = 0; i < threads; i++)
            pthread_create(&t[i], NULL, worker, NULL);
        pthread_barrier_wait(&start);
        double t0 = now_ns();
        for (int i = 0; i < threads; i++)
            pthread_join(t[i], NULL);
        printf("pair_ns %.1f\n", (now_ns() - t0) / (double)pairs);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "first")) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess)
            return 1;
        void *p;
        double t0 = now_ns();
        if (cudaMalloc(&p, (size_t)atol(argv[2])) != cudaSuccess)
            return 1;
        printf("first_ns %.0f\n", now_ns() - t0);
        return 0;
    }
#ifdef BENCH_DRIVER
    if (argc == 3 && !strcmp(argv[1], "lookups"))
        return lookups(atol(argv[2]));
#endif
    fprintf(stderr, "usage: bench pairs THREADS N SIZE | bench first SIZE | bench lookups N\n");
    return 2;
}
