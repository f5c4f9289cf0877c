/*
 * perthread: N threads, one after another, each allocate and free on
 * cudaStreamPerThread and exit; then prints the process's resident memory
 * ("rss KIB") and the result of a last allocation ("m RC").
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda_runtime.h>

static void *worker(void *arg)
{
    (void)arg;
    void *p = NULL;
    if (cudaMallocAsync(&p, 4096, cudaStreamPerThread) == cudaSuccess)
        cudaFreeAsync(p, cudaStreamPerThread);
    return NULL;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kib = atol(line + 6);
    if (f)
        fclose(f);
    return kib;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 100;
    void *p = NULL;
    cudaMalloc(&p, 4096); /* starts the core */
    for (int i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, NULL) != 0)
            return 1;
        pthread_join(t, NULL);
    }
    printf("rss %ld\n", rss_kib());
    printf("m %d\n", cudaMalloc(&p, 4096));
    return 0;
}
