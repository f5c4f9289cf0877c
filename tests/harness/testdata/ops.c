/*
 * ops: runs the CUDA operations named on its command line, one output line
 * each, so that tests can script a program under the shim. Blocks live in
 * numbered slots; a stream is named by its index (0: the legacy default
 * stream, 1.. the streams made with S).
 *
 *   m SIZE            cudaMalloc                       -> "m RC SLOT ADDR"
 *   a SIZE STREAM     cudaMallocAsync                  -> "a RC SLOT ADDR"
 *   D SIZE            cuMemAlloc_v2, the driver API the shim does not see
 *                                                      -> "D RC SLOT ADDR"
 *   N COUNT SIZE      COUNT cudaMalloc of SIZE, each filled with its slot
 *                     number as seed                   -> "N OK FAILED LASTRC"
 *   f SLOT            cudaFree                         -> "f RC"
 *   F SLOT STREAM     cudaFreeAsync                    -> "F RC"
 *   n                 cudaFree(NULL)                   -> "n RC"
 *   I SLOT OFFSET     cudaFree of a pointer inside the block -> "I RC"
 *   w SLOT SEED       fill the block with SEED's pattern (cudaMemcpy)   -> "w RC"
 *   W SLOT SEED STREAM  the same with cudaMemcpyAsync on STREAM          -> "W RC"
 *   z SLOT BYTE STREAM  cudaMemsetAsync of the whole block on STREAM     -> "z RC"
 *   v SLOT SEED       read the block back (cudaMemcpy) -> "v RC INTACT"
 *   V                 verify every live filled slot    -> "V CHECKED BAD"
 *   t SLOT            cudaPointerGetAttributes         -> "t RC TYPE DEVICE"
 *   C SLOT SEED       fill the block with SEED's pattern as a CUDA-aware
 *                     library does: each 2 MiB piece (a granule of virtual
 *                     memory) that cudaPointerGetAttributes calls host memory
 *                     with the CPU (memcpy at the address), the others with
 *                     cudaMemcpy                       -> "C RC HOST"
 *   c SLOT SEED       read with the CPU the pieces that cudaPointerGetAttributes
 *                     calls host memory, comparing them with SEED's pattern
 *                                                      -> "c RC HOST INTACT"
 *   i                 cudaMemGetInfo                   -> "i RC FREE TOTAL"
 *   d DEV             cudaSetDevice                    -> "d RC"
 *   r                 cudaDeviceReset                  -> "r RC"
 *   s                 cudaDeviceSynchronize            -> "s RC"
 *   S                 cudaStreamCreateWithFlags(cudaStreamNonBlocking) -> "S RC STREAM"
 *   y STREAM          cudaStreamSynchronize            -> "y RC"
 *   b STREAM          a host function that holds STREAM until the gate opens -> "b RC"
 *   k STREAM          a host function that counts one  -> "k RC"
 *   K                 the count so far                 -> "K N"
 *   g                 open the gate                    -> "g 1"
 *   G MS              open the gate from another thread after MS ms, unless
 *                     it is open by then               -> "G 0"
 *
 * SIZE takes K, M, G suffixes (binary). A failed allocation takes no slot
 * (SLOT -1). Exit status 2 means a bad command line.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#define SLOTS 4096
#define STREAMS 16

struct slot {
    void *p;
    size_t size;
    unsigned seed; /* 0: never filled */
    int live;
};

static struct slot slot[SLOTS];
static int nslots;
static cudaStream_t stream[STREAMS];
static int nstreams = 1; /* stream 0 is the legacy default stream */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t opened = PTHREAD_COND_INITIALIZER;
static int gate_open;
static int counted;

static void die(const char *what, const char *arg)
{
    fprintf(stderr, "ops: %s %s\n", what, arg ? arg : "");
    exit(2);
}

static size_t size_arg(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'K': v <<= 10; break;
    case 'M': v <<= 20; break;
    case 'G': v <<= 30; break;
    case 0: break;
    default: die("bad size", s);
    }
    return (size_t)v;
}

static int slot_arg(const char *s)
{
    int k = atoi(s);
    if (k < 0 || k >= nslots)
        die("no slot", s);
    return k;
}

static cudaStream_t stream_arg(const char *s)
{
    int k = atoi(s);
    if (k < 0 || k >= nstreams)
        die("no stream", s);
    return stream[k];
}

static int keep(void *p, size_t size)
{
    if (nslots == SLOTS)
        die("out of slots", NULL);
    slot[nslots] = (struct slot){.p = p, .size = size, .live = 1};
    return nslots++;
}

/* pattern fills buf with SEED's bytes: every 8-byte word differs from its
 * neighbours and from the same word of any other seed. */
static void pattern(unsigned char *buf, size_t size, unsigned seed)
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

static cudaError_t fill(int k, unsigned seed, cudaStream_t s, int async)
{
    unsigned char *buf = malloc(slot[k].size ? slot[k].size : 1);
    if (!buf)
        die("out of host memory", NULL);
    pattern(buf, slot[k].size, seed);
    /* An asynchronous copy from pageable memory stages the source at the
     * call, so the buffer may be freed at once. */
    cudaError_t rc = async ? cudaMemcpyAsync(slot[k].p, buf, slot[k].size, cudaMemcpyHostToDevice, s)
                           : cudaMemcpy(slot[k].p, buf, slot[k].size, cudaMemcpyHostToDevice);
    free(buf);
    if (rc == cudaSuccess)
        slot[k].seed = seed;
    return rc;
}

static int intact(int k, unsigned seed, cudaError_t *rc)
{
    size_t size = slot[k].size ? slot[k].size : 1;
    unsigned char *want = malloc(size), *got = malloc(size);
    if (!want || !got)
        die("out of host memory", NULL);
    pattern(want, slot[k].size, seed);
    *rc = cudaMemcpy(got, slot[k].p, slot[k].size, cudaMemcpyDeviceToHost);
    int ok = *rc == cudaSuccess && memcmp(want, got, slot[k].size) == 0;
    free(want);
    free(got);
    return ok;
}

/* The piece of virtual memory whose placement one pointer query answers. */
#define GRANULE ((uintptr_t)2 << 20)

/*
 * by_type writes (write) or checks SEED's pattern in block k piece by piece,
 * each piece ending at a 2 MiB boundary: the CPU reaches the pieces that
 * cudaPointerGetAttributes calls host memory, at their address, as a
 * CUDA-aware library would; cudaMemcpy writes the others, which checks skip.
 * *host counts the host pieces, *intact those of them that read back right.
 */
static cudaError_t by_type(int k, unsigned seed, int write, int *host, int *intact)
{
    size_t size = slot[k].size;
    unsigned char *want = malloc(size ? size : 1);
    if (!want)
        die("out of host memory", NULL);
    pattern(want, size, seed);
    uintptr_t base = (uintptr_t)slot[k].p;
    cudaError_t rc = cudaSuccess;
    *host = *intact = 0;
    for (size_t off = 0; off < size && rc == cudaSuccess;) {
        uintptr_t at = base + off;
        size_t n = ((at | (GRANULE - 1)) + 1) - at;
        if (n > size - off)
            n = size - off;
        struct cudaPointerAttributes attr;
        memset(&attr, 0, sizeof attr);
        rc = cudaPointerGetAttributes(&attr, (void *)at);
        if (rc == cudaSuccess && attr.type == cudaMemoryTypeHost) {
            (*host)++;
            if (write)
                memcpy((void *)at, want + off, n);
            else if (memcmp((void *)at, want + off, n) == 0)
                (*intact)++;
        } else if (rc == cudaSuccess && write) {
            rc = cudaMemcpy((void *)at, want + off, n, cudaMemcpyHostToDevice);
        }
        off += n;
    }
    free(want);
    if (write && rc == cudaSuccess)
        slot[k].seed = seed;
    return rc;
}

static void hold(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    while (!gate_open)
        pthread_cond_wait(&opened, &lock);
    pthread_mutex_unlock(&lock);
}

static void count(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    counted++;
    pthread_mutex_unlock(&lock);
}

static void open_gate(void)
{
    pthread_mutex_lock(&lock);
    gate_open = 1;
    pthread_cond_broadcast(&opened);
    pthread_mutex_unlock(&lock);
}

/* opener opens the gate after a delay, or returns early if it is already
 * open. It is a safety net against a deadlock: programs that must wait for
 * the gate inside a CUDA call (a synchronizing free) are released by it. */
static void *opener(void *arg)
{
    long ms = (long)(intptr_t)arg;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += ms / 1000;
    deadline.tv_nsec += (ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&lock);
    while (!gate_open && pthread_cond_timedwait(&opened, &lock, &deadline) == 0)
        ;
    gate_open = 1;
    pthread_cond_broadcast(&opened);
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void need(int i, int n, int argc, char **argv)
{
    if (i + n >= argc)
        die("missing arguments for", argv[i]);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        void *p = NULL;
        cudaError_t rc;
        if (!strcmp(op, "m")) {
            need(i, 1, argc, argv);
            size_t size = size_arg(argv[++i]);
            rc = cudaMalloc(&p, size);
            printf("m %d %d %" PRIuPTR "\n", rc, rc ? -1 : keep(p, size), (uintptr_t)p);
        } else if (!strcmp(op, "a")) {
            need(i, 2, argc, argv);
            size_t size = size_arg(argv[i + 1]);
            cudaStream_t s = stream_arg(argv[i + 2]);
            i += 2;
            rc = cudaMallocAsync(&p, size, s);
            printf("a %d %d %" PRIuPTR "\n", rc, rc ? -1 : keep(p, size), (uintptr_t)p);
        } else if (!strcmp(op, "D")) {
            need(i, 1, argc, argv);
            size_t size = size_arg(argv[++i]);
            CUdeviceptr d = 0;
            CUresult r = cuMemAlloc_v2(&d, size);
            printf("D %d %d %" PRIuPTR "\n", r, r ? -1 : keep((void *)(uintptr_t)d, size), (uintptr_t)d);
        } else if (!strcmp(op, "N")) {
            need(i, 2, argc, argv);
            int n = atoi(argv[i + 1]), ok = 0, failed = 0;
            size_t size = size_arg(argv[i + 2]);
            i += 2;
            rc = cudaSuccess;
            for (int j = 0; j < n; j++) {
                p = NULL;
                cudaError_t r = cudaMalloc(&p, size);
                if (r == cudaSuccess) {
                    int k = keep(p, size);
                    r = fill(k, (unsigned)k + 1, 0, 0);
                }
                if (r == cudaSuccess)
                    ok++;
                else
                    failed++, rc = r;
            }
            printf("N %d %d %d\n", ok, failed, rc);
        } else if (!strcmp(op, "f") || !strcmp(op, "F")) {
            need(i, op[0] == 'F' ? 2 : 1, argc, argv);
            int k = slot_arg(argv[++i]);
            rc = op[0] == 'F' ? cudaFreeAsync(slot[k].p, stream_arg(argv[++i])) : cudaFree(slot[k].p);
            if (rc == cudaSuccess)
                slot[k].live = 0;
            printf("%s %d\n", op, rc);
        } else if (!strcmp(op, "n")) {
            printf("n %d\n", cudaFree(NULL));
        } else if (!strcmp(op, "I")) {
            need(i, 2, argc, argv);
            int k = slot_arg(argv[i + 1]);
            size_t off = size_arg(argv[i + 2]);
            i += 2;
            printf("I %d\n", cudaFree((char *)slot[k].p + off));
        } else if (!strcmp(op, "w") || !strcmp(op, "W")) {
            need(i, op[0] == 'W' ? 3 : 2, argc, argv);
            int k = slot_arg(argv[i + 1]);
            unsigned seed = (unsigned)atoi(argv[i + 2]);
            i += 2;
            cudaStream_t s = op[0] == 'W' ? stream_arg(argv[++i]) : 0;
            printf("%s %d\n", op, fill(k, seed, s, op[0] == 'W'));
        } else if (!strcmp(op, "z")) {
            need(i, 3, argc, argv);
            int k = slot_arg(argv[i + 1]);
            int byte = atoi(argv[i + 2]);
            cudaStream_t s = stream_arg(argv[i + 3]);
            i += 3;
            printf("z %d\n", cudaMemsetAsync(slot[k].p, byte, slot[k].size, s));
        } else if (!strcmp(op, "v")) {
            need(i, 2, argc, argv);
            int k = slot_arg(argv[i + 1]);
            unsigned seed = (unsigned)atoi(argv[i + 2]);
            i += 2;
            int ok = intact(k, seed, &rc);
            printf("v %d %d\n", rc, ok);
        } else if (!strcmp(op, "V")) {
            int checked = 0, bad = 0;
            for (int k = 0; k < nslots; k++) {
                if (!slot[k].live || !slot[k].seed)
                    continue;
                checked++;
                if (!intact(k, slot[k].seed, &rc)) {
                    bad++;
                    fprintf(stderr, "ops: slot %d (%zu bytes at %p, seed %u) corrupt, rc %d\n", k,
                            slot[k].size, slot[k].p, slot[k].seed, rc);
                }
            }
            printf("V %d %d\n", checked, bad);
        } else if (!strcmp(op, "t")) {
            need(i, 1, argc, argv);
            int k = slot_arg(argv[++i]);
            struct cudaPointerAttributes attr;
            memset(&attr, 0, sizeof attr);
            rc = cudaPointerGetAttributes(&attr, slot[k].p);
            printf("t %d %d %d\n", rc, (int)attr.type, attr.device);
        } else if (!strcmp(op, "C") || !strcmp(op, "c")) {
            need(i, 2, argc, argv);
            int k = slot_arg(argv[i + 1]);
            unsigned seed = (unsigned)atoi(argv[i + 2]);
            i += 2;
            int host, good;
            rc = by_type(k, seed, op[0] == 'C', &host, &good);
            if (op[0] == 'C')
                printf("C %d %d\n", rc, host);
            else
                printf("c %d %d %d\n", rc, host, good);
        } else if (!strcmp(op, "i")) {
            size_t free = 0, total = 0;
            rc = cudaMemGetInfo(&free, &total);
            printf("i %d %zu %zu\n", rc, free, total);
        } else if (!strcmp(op, "d")) {
            need(i, 1, argc, argv);
            printf("d %d\n", cudaSetDevice(atoi(argv[++i])));
        } else if (!strcmp(op, "r")) {
            printf("r %d\n", cudaDeviceReset());
        } else if (!strcmp(op, "s")) {
            printf("s %d\n", cudaDeviceSynchronize());
        } else if (!strcmp(op, "S")) {
            if (nstreams == STREAMS)
                die("out of streams", NULL);
            rc = cudaStreamCreateWithFlags(&stream[nstreams], cudaStreamNonBlocking);
            printf("S %d %d\n", rc, rc ? -1 : nstreams++);
        } else if (!strcmp(op, "y")) {
            need(i, 1, argc, argv);
            printf("y %d\n", cudaStreamSynchronize(stream_arg(argv[++i])));
        } else if (!strcmp(op, "b") || !strcmp(op, "k")) {
            need(i, 1, argc, argv);
            cudaStream_t s = stream_arg(argv[++i]);
            printf("%s %d\n", op, cudaLaunchHostFunc(s, op[0] == 'b' ? hold : count, NULL));
        } else if (!strcmp(op, "K")) {
            pthread_mutex_lock(&lock);
            printf("K %d\n", counted);
            pthread_mutex_unlock(&lock);
        } else if (!strcmp(op, "g")) {
            open_gate();
            printf("g 1\n");
        } else if (!strcmp(op, "G")) {
            need(i, 1, argc, argv);
            pthread_t t;
            long ms = atol(argv[++i]);
            if (pthread_create(&t, NULL, opener, (void *)(intptr_t)ms) != 0 || pthread_detach(t) != 0)
                die("cannot start the gate opener", NULL);
            printf("G 0\n");
        } else {
            die("bad operation", op);
        }
        fflush(stdout);
    }
    return 0;
}
