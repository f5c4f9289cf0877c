/*
 * forkheld [create]: forks while another thread is inside cuMemMap, as a
 * multi-threaded program may, then in the child calls cuMemMap and
 * cuMemRelease, which must answer (CUDA's answer: a child forked after
 * initialisation cannot use CUDA) instead of waiting for a thread the child
 * does not have. simcuda's hold (export.h) keeps the thread inside the real
 * cuMemMap, past whatever an interposer takes around it, until the fork is
 * done. Without "create" the thread maps no handle (CUDA refuses it once
 * it goes on) and the program makes no call that loads the shim's core;
 * with it, the thread maps one cuMemCreate made.
 *
 * Prints "parent map RC", "forked map RC release RC" (from the child) and
 * how the child ended; a watchdog turns a hang in the child into SIGALRM.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spillway/cuda.h>

#include "export.h"

#define SIZE ((size_t)2 << 20) /* simcuda's granularity */

static CUcontext primary;
static CUdeviceptr range;
static CUmemGenericAllocationHandle handle;
static CUresult held_rc;
static sem_t inside, forked;

static void wait_for(sem_t *s)
{
    while (sem_wait(s) != 0 && errno == EINTR)
        ;
}

/* simcuda runs it at the held cuMemMap's entry: says so, then waits for the fork. */
static void hold_here(void)
{
    sem_post(&inside);
    wait_for(&forked);
}

static void *map_held(void *arg)
{
    (void)arg;
    held_rc = cuCtxSetCurrent(primary);
    if (held_rc == CUDA_SUCCESS)
        held_rc = cuMemMap(range, SIZE, 0, handle, 0);
    return NULL;
}

static int setup(int create)
{
    static const CUuuid table_id = SIMCUDA_EXPORT_TABLE_ID;
    const struct simcuda_export_table *table = NULL;
    CUdevice dev;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&primary, dev) != CUDA_SUCCESS ||
        cuCtxSetCurrent(primary) != CUDA_SUCCESS ||
        cuMemAddressReserve(&range, SIZE, 0, 0, 0) != CUDA_SUCCESS ||
        cuGetExportTable((const void **)&table, &table_id) != CUDA_SUCCESS ||
        table->size < sizeof *table)
        return -1;
    if (create) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        if (cuMemCreate(&handle, SIZE, &prop, 0) != CUDA_SUCCESS)
            return -1;
    }
    table->hold("cuMemMap", hold_here);
    return 0;
}

int main(int argc, char **argv)
{
    if (setup(argc > 1 && strcmp(argv[1], "create") == 0) != 0 || sem_init(&inside, 0, 0) != 0 ||
        sem_init(&forked, 0, 0) != 0) {
        printf("setup failed\n");
        return 1;
    }
    pthread_t mapper;
    if (pthread_create(&mapper, NULL, map_held, NULL) != 0)
        return 1;
    wait_for(&inside);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        alarm(10); /* a hang becomes SIGALRM */
        CUresult map = cuMemMap(range, SIZE, 0, handle, 0);
        printf("forked map %d release %d\n", map, cuMemRelease(handle));
        fflush(stdout);
        _exit(0);
    }
    sem_post(&forked);
    pthread_join(mapper, NULL);
    printf("parent map %d\n", held_rc);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        printf("child killed by signal %d\n", WTERMSIG(status));
    else
        printf("child exit %d\n", WEXITSTATUS(status));
    return 0;
}
