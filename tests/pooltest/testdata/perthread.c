/*
 * perthread: cudaStreamPerThread is a different stream in each thread, and
 * CUDA orders nothing between two threads' per-thread streams. Thread A
 * holds its per-thread stream (a host function waiting for a gate), queues
 * a memset of its block behind the hold and frees the block there with
 * cudaFreeAsync, then exits. The main thread allocates a block of the same
 * size on its own per-thread stream, sets it and synchronizes that stream:
 * the synchronization must not wait for thread A's stream. A watchdog
 * thread opens the gate after MS milliseconds, so that a wait ends.
 *
 * Prints "free RC" (thread A's cudaFreeAsync), "alloc RC SAME" (the main
 * thread's cudaMallocAsync, SAME 1 when it got A's block), "sync RC OPEN"
 * (the main thread's cudaStreamSynchronize, OPEN 1 when the gate had
 * opened by its return, which means it waited for A's stream) and
 * "intact 0|1" (the main thread's block holds what it set, once everything
 * ran). Exits 2 on a bad command line.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <spillway/cuda_runtime.h>

#define SIZE (1 << 20)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t opened = PTHREAD_COND_INITIALIZER;
static int gate_open;
static int watchdog_ms;
static void *block_a;

static void open_gate(void)
{
    pthread_mutex_lock(&lock);
    gate_open = 1;
    pthread_cond_broadcast(&opened);
    pthread_mutex_unlock(&lock);
}

static int gate_is_open(void)
{
    pthread_mutex_lock(&lock);
    int open = gate_open;
    pthread_mutex_unlock(&lock);
    return open;
}

/* A host function that holds its stream until the gate opens. */
static void hold(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    while (!gate_open)
        pthread_cond_wait(&opened, &lock);
    pthread_mutex_unlock(&lock);
}

static void *watchdog(void *arg)
{
    (void)arg;
    struct timespec ts = {watchdog_ms / 1000, (long)(watchdog_ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
    open_gate();
    return NULL;
}

static void *thread_a(void *arg)
{
    (void)arg;
    if (cudaMallocAsync(&block_a, SIZE, cudaStreamPerThread) != cudaSuccess ||
        cudaLaunchHostFunc(cudaStreamPerThread, hold, NULL) != cudaSuccess ||
        cudaMemsetAsync(block_a, 0xAA, SIZE, cudaStreamPerThread) != cudaSuccess) {
        printf("setup failed\n");
        exit(1);
    }
    printf("free %d\n", cudaFreeAsync(block_a, cudaStreamPerThread));
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2 || (watchdog_ms = atoi(argv[1])) <= 0)
        return 2;
    pthread_t a, w;
    if (cudaFree(NULL) != cudaSuccess || pthread_create(&w, NULL, watchdog, NULL) != 0 ||
        pthread_detach(w) != 0 || pthread_create(&a, NULL, thread_a, NULL) != 0 ||
        pthread_join(a, NULL) != 0)
        return 1;

    void *b = NULL;
    cudaError_t rc = cudaMallocAsync(&b, SIZE, cudaStreamPerThread);
    printf("alloc %d %d\n", rc, b == block_a);
    if (rc != cudaSuccess || cudaMemsetAsync(b, 0x11, SIZE, cudaStreamPerThread) != cudaSuccess)
        return 1;
    rc = cudaStreamSynchronize(cudaStreamPerThread);
    printf("sync %d %d\n", rc, gate_is_open());

    open_gate();
    unsigned char head[64];
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(head, b, sizeof head, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 1;
    int intact = 1;
    for (size_t i = 0; i < sizeof head; i++)
        intact &= head[i] == 0x11;
    printf("intact %d\n", intact);
    return 0;
}
