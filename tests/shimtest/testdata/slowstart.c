/*
 * slowstart: one thread makes the first CUDA call, which starts loading the
 * core; while that load is still under way (the test makes it never end),
 * the main thread allocates and prints "m RC", then leaves with _exit (the
 * loading thread holds the dynamic loader's lock, which exit would need).
 */
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <spillway/cuda_runtime.h>

static void *first_call(void *arg)
{
    (void)arg;
    void *p = NULL;
    cudaMalloc(&p, 4096);
    return NULL;
}

int main(void)
{
    pthread_t t;
    pthread_create(&t, NULL, first_call, NULL);
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    void *p = NULL;
    printf("m %d\n", cudaMalloc(&p, 2 << 20));
    fflush(stdout);
    _exit(0);
}
