/*
 * reloadrace RUNTIME HOOKLIB: after a CUDA library was closed (RUNTIME opened
 * and closed again, so that the shim finds its functions anew), one thread
 * calls cudaMalloc while another is inside dlopen of HOOKLIB, whose
 * constructor calls cudaMalloc too (during_dlopen). Prints "a RC" and
 * "ctor RC"; a watchdog kills the process if they wait on each other.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <unistd.h>

#include <spillway/cuda_runtime.h>

static sem_t in_dlopen;

void during_dlopen(void)
{
    void *p = NULL;
    sem_post(&in_dlopen);
    usleep(200 * 1000); /* the other thread's cudaMalloc starts meanwhile */
    printf("ctor %d\n", cudaMalloc(&p, 4096));
}

static void *other(void *arg)
{
    void *p = NULL;
    (void)arg;
    sem_wait(&in_dlopen);
    printf("a %d\n", cudaMalloc(&p, 4096));
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    void *p = NULL;
    printf("first %d\n", cudaMalloc(&p, 4096));
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h || dlclose(h) != 0)
        return 2;
    alarm(10);
    sem_init(&in_dlopen, 0, 0);
    pthread_t t;
    pthread_create(&t, NULL, other, NULL);
    if (!dlopen(argv[2], RTLD_NOW | RTLD_LOCAL))
        return 2;
    pthread_join(t, NULL);
    return 0;
}
