/*
 * lasterror CASE: what cudaPeekAtLastError and cudaGetLastError report after
 * an interposed call, one line per check: "NAME RC PEEK GET AFTER", where RC
 * is the call's result, PEEK and GET the two queries made after it in that
 * order, and AFTER a second cudaGetLastError (the error must be cleared).
 *
 *   retry    a cudaMalloc that succeeds (run with SIMCUDA_FAIL failing the
 *            pool's first reservation), with no error pending, then again
 *            with cudaErrorInvalidValue pending (from cudaGetDevice(NULL))
 *   marker   a cudaMalloc whose pool polls an event recorded behind work
 *            still running (cudaErrorNotReady inside), then its cudaFree
 *   inflight with SPILLWAY_POOL=0: cudaFreeAsync calls on a held stream,
 *            enough that the core queries their events (not reached)
 *   refuse   a cudaMalloc refused for the quota (run with a 1 MiB quota)
 *   invalid  the same cudaMalloc, refused for an invalid setting
 *   double   a cudaFree of a pointer already freed
 *   stream   cudaMallocAsync and cudaFreeAsync on a destroyed stream, which
 *            the core refuses after its own check of the stream
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <spillway/cuda_runtime.h>

static void report(const char *name, cudaError_t rc)
{
    cudaError_t peek = cudaPeekAtLastError();
    cudaError_t get = cudaGetLastError();
    cudaError_t after = cudaGetLastError();
    printf("%s %d %d %d %d\n", name, rc, peek, get, after);
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t opened = PTHREAD_COND_INITIALIZER;
static int gate_open;

/* A host function that holds its stream until the gate opens. */
static void hold(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    while (!gate_open)
        pthread_cond_wait(&opened, &lock);
    pthread_mutex_unlock(&lock);
}

static void open_gate(void)
{
    pthread_mutex_lock(&lock);
    gate_open = 1;
    pthread_cond_broadcast(&opened);
    pthread_mutex_unlock(&lock);
}

int main(int argc, char **argv)
{
    void *p = NULL, *q = NULL;
    if (argc != 2)
        return 2;
    if (!strcmp(argv[1], "retry")) {
        report("malloc", cudaMalloc(&p, 4096));
        cudaGetDevice(NULL); /* the application's own error, pending */
        report("pending", cudaMalloc(&q, 32 << 20));
    } else if (!strcmp(argv[1], "marker")) {
        cudaStream_t s;
        if (cudaStreamCreate(&s) != cudaSuccess || cudaLaunchHostFunc(s, hold, NULL) != cudaSuccess)
            return 1;
        /* A segment of its own, freed on the held stream: its event is not reached. */
        if (cudaMallocAsync(&p, 12 << 20, s) != cudaSuccess || cudaFreeAsync(p, s) != cudaSuccess)
            return 1;
        report("setup", cudaSuccess);
        report("malloc", cudaMalloc(&q, 12 << 20)); /* misses: polls the event */
        report("free", cudaFree(q));
        open_gate();
        report("sync", cudaStreamSynchronize(s));
    } else if (!strcmp(argv[1], "inflight")) {
        cudaStream_t s;
        cudaError_t rc = cudaSuccess;
        if (cudaStreamCreate(&s) != cudaSuccess || cudaLaunchHostFunc(s, hold, NULL) != cudaSuccess)
            return 1;
        for (int i = 0; i < 100 && rc == cudaSuccess; i++) {
            rc = cudaMallocAsync(&p, 4096, s);
            if (rc == cudaSuccess)
                rc = cudaFreeAsync(p, s);
        }
        report("free", rc);
        open_gate();
        report("sync", cudaStreamSynchronize(s));
    } else if (!strcmp(argv[1], "refuse") || !strcmp(argv[1], "invalid")) {
        report("malloc", cudaMalloc(&p, 2 << 20));
    } else if (!strcmp(argv[1], "double")) {
        if (cudaMalloc(&p, 4096) != cudaSuccess || cudaFree(p) != cudaSuccess)
            return 1;
        report("free", cudaFree(p));
    } else if (!strcmp(argv[1], "stream")) {
        cudaStream_t s;
        if (cudaMalloc(&p, 4096) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess ||
            cudaStreamDestroy(s) != cudaSuccess)
            return 1;
        report("alloc", cudaMallocAsync(&q, 4096, s));
        report("free", cudaFreeAsync(p, s));
    } else {
        return 2;
    }
    return 0;
}
