/* threads N ITER: N threads allocate and free random sizes (up to 1 MiB,
 * at most 8 blocks each at a time) ITER times. Prints the refusals, the
 * other failures, and cudaMemGetInfo once every block is freed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <spillway/cuda_runtime.h>

static int iterations;
static int refused, failed;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(size_t)arg * 2654435761u + 1;
    void *held[8] = {0};
    int my_refused = 0, my_failed = 0;
    for (int i = 0; i < iterations; i++) {
        int k = rand_r(&seed) % 8;
        if (held[k]) {
            if (cudaFree(held[k]) != cudaSuccess)
                my_failed++;
            held[k] = NULL;
            continue;
        }
        size_t size = 1 + (size_t)rand_r(&seed) % (1 << 20);
        cudaError_t rc = cudaMalloc(&held[k], size);
        if (rc == cudaErrorMemoryAllocation)
            my_refused++;
        else if (rc != cudaSuccess)
            my_failed++;
        if (rc != cudaSuccess)
            held[k] = NULL;
    }
    for (int k = 0; k < 8; k++)
        if (held[k] && cudaFree(held[k]) != cudaSuccess)
            my_failed++;
    pthread_mutex_lock(&lock);
    refused += my_refused;
    failed += my_failed;
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    int n = atoi(argv[1]);
    iterations = atoi(argv[2]);
    pthread_t t[64];
    if (n > 64)
        n = 64;
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, worker, (void *)(size_t)i);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    size_t free = 0, total = 0;
    cudaError_t rc = cudaMemGetInfo(&free, &total);
    printf("refused %d failed %d\ninfo %d %zu %zu\n", refused, failed, rc, free, total);
    return 0;
}
