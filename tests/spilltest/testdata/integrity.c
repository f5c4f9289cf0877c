/*
 * integrity SCENARIO: adversarial data-integrity checks of oversubscribed
 * memory, run under the shim with a quota of 64 MiB and whatever the
 * environment sets (virtual memory or not, the spill tier, migration).
 * Every block has a shadow copy on the host that every write also updates;
 * each check reads the whole block back and compares every byte. Writes
 * are patterns unique per block, offset and write, so a byte that lands in
 * the wrong block, at the wrong offset, or from a stale write shows.
 *
 * Prints "pieces NAME DEVICE HOST" (2 MiB pieces of a block that
 * cudaPointerGetAttributes calls device or host/managed memory), one
 * "check WHAT BAD FIRST" per verification (BAD bytes differ, FIRST is the
 * offset of the first, -1 for none), and at the end "done CHECKS BAD",
 * BAD counting the verifications that found a difference, or a failed call.
 * A failed CUDA call prints "fail WHERE RC" and counts as bad.
 *
 * Scenarios:
 *   straddle   a block across device and host granules written across the
 *              granule boundaries (cudaMemcpy, cudaMemset, cudaMemcpyAsync,
 *              cudaMemsetAsync, device-to-device copies from and to device
 *              blocks), then frees and short-lived blocks that make
 *              migration move granules at each cudaDeviceSynchronize;
 *              the writes go on between the moves.
 *   pitch      a cudaMallocPitch block, part spilled, whose rows cross
 *              granule boundaries, written row by row and partial rows,
 *              checked across migrations.
 *   freequeued cudaMemcpyAsync queued behind a held stream that reads a
 *              block, then cudaFree of the block, an allocation of the same
 *              size written at once, and a cudaDeviceSynchronize (the
 *              stream is released by another thread): the queued copies
 *              must read what the block held when they were queued.
 *   asyncreuse cudaMallocAsync/cudaFreeAsync on one held stream while
 *              another stream allocates the same sizes and writes them:
 *              the held stream's late writes must not land in the other
 *              stream's blocks.
 *   threads    8 threads, each with its own stream, allocate, write,
 *              synchronize their stream and verify, keeping some blocks
 *              across rounds, while another thread calls
 *              cudaDeviceSynchronize; a lock keeps the workers' CUDA calls
 *              out of the synchronization (one thread drives the device
 *              while it synchronizes, as migration asks).
 *   freeduring a block freed by another thread while cudaDeviceSynchronize
 *              waits for a held stream: prints "moved 0" if this program
 *              saw nothing to tell (the test reads the report).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <spillway/cuda.h>
#include <spillway/cuda_runtime.h>

#define MIB ((size_t)1 << 20)
#define GRANULE (2 * MIB)

static int checks, bad;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static void die(const char *what)
{
    fprintf(stderr, "integrity: %s\n", what);
    exit(2);
}

static int ok(cudaError_t rc, const char *where)
{
    if (rc == cudaSuccess)
        return 1;
    pthread_mutex_lock(&out_lock);
    printf("fail %s %d\n", where, (int)rc);
    bad++;
    pthread_mutex_unlock(&out_lock);
    return 0;
}

struct blk {
    unsigned char *p;
    size_t size;
    unsigned char *shadow;
    unsigned id;
};

static unsigned next_id = 1;

/* byte is the salt-th write's byte at offset off of block id. */
static unsigned char byte(unsigned id, size_t off, unsigned salt)
{
    uint64_t x = ((uint64_t)id << 40) ^ ((uint64_t)salt << 28) ^ (uint64_t)off;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    return (unsigned char)x;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of host memory");
    return p;
}

static int alloc(struct blk *b, size_t size)
{
    memset(b, 0, sizeof *b);
    if (!ok(cudaMalloc((void **)&b->p, size), "cudaMalloc"))
        return 0;
    b->size = size;
    b->id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
    b->shadow = xmalloc(size);
    memset(b->shadow, 0, size);
    return 1;
}

/* alloc_raw allocates with cuMemAlloc_v2, which the shim does not see:
 * device memory outside the pool and its quota, which stays device memory.
 * A held stream's copy between two spilled blocks would be a host-to-host
 * copy, which returns only once done, and so never behind a held stream. */
static int alloc_raw(struct blk *b, size_t size)
{
    CUdeviceptr p;
    memset(b, 0, sizeof *b);
    if (cuMemAlloc_v2(&p, size) != CUDA_SUCCESS)
        return 0;
    b->p = (unsigned char *)(uintptr_t)p;
    b->size = size;
    b->id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
    b->shadow = xmalloc(size);
    memset(b->shadow, 0, size);
    return 1;
}

static void release_raw(struct blk *b)
{
    if (cuMemFree_v2((CUdeviceptr)(uintptr_t)b->p) != CUDA_SUCCESS)
        ok(cudaErrorInvalidValue, "cuMemFree_v2");
    free(b->shadow);
    memset(b, 0, sizeof *b);
}

static void release(struct blk *b)
{
    ok(cudaFree(b->p), "cudaFree");
    free(b->shadow);
    memset(b, 0, sizeof *b);
}

/* write_at puts the salt-th pattern at [off, off+n) of b: with cudaMemcpy,
 * or cudaMemcpyAsync on s when async. An asynchronous write, memset or copy
 * is waited for (the legacy stream does not wait for a non-blocking one),
 * except one queued with async 2, which the caller orders. */
static void write_at(struct blk *b, size_t off, size_t n, unsigned salt, int async, cudaStream_t s)
{
    if (off + n > b->size)
        die("write out of the block");
    unsigned char *buf = xmalloc(n);
    for (size_t i = 0; i < n; i++)
        buf[i] = byte(b->id, off + i, salt);
    if (async ? ok(cudaMemcpyAsync(b->p + off, buf, n, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync")
              : ok(cudaMemcpy(b->p + off, buf, n, cudaMemcpyHostToDevice), "cudaMemcpy"))
        memcpy(b->shadow + off, buf, n);
    if (async)
        ok(cudaStreamSynchronize(s), "cudaStreamSynchronize"); /* the buffer is staged; the order is kept anyway */
    free(buf);
}

static void set_at(struct blk *b, size_t off, size_t n, int value, int async, cudaStream_t s)
{
    if (off + n > b->size)
        die("memset out of the block");
    if (async ? ok(cudaMemsetAsync(b->p + off, value, n, s), "cudaMemsetAsync")
              : ok(cudaMemset(b->p + off, value, n), "cudaMemset"))
        memset(b->shadow + off, value, n);
    if (async == 1)
        ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

static void copy_at(struct blk *dst, size_t doff, struct blk *src, size_t soff, size_t n, int async, cudaStream_t s)
{
    if (doff + n > dst->size || soff + n > src->size)
        die("copy out of the block");
    if (async ? ok(cudaMemcpyAsync(dst->p + doff, src->p + soff, n, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync D2D")
              : ok(cudaMemcpy(dst->p + doff, src->p + soff, n, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D"))
        memmove(dst->shadow + doff, src->shadow + soff, n);
    if (async == 1)
        ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

/* verify reads b back whole, and across each granule boundary in pieces,
 * and compares every byte with its shadow. */
static void verify(struct blk *b, const char *what)
{
    unsigned char *got = xmalloc(b->size);
    long nbad = 0, first = -1;
    if (ok(cudaMemcpy(got, b->p, b->size, cudaMemcpyDeviceToHost), "cudaMemcpy D2H")) {
        for (size_t i = 0; i < b->size; i++)
            if (got[i] != b->shadow[i]) {
                if (first < 0) {
                    first = (long)i;
                    fprintf(stderr, "integrity: %s id %u at %zu got %02x want %02x fill1 %02x p %p\n", what, b->id, i, got[i], b->shadow[i], byte(b->id, i, 1), (void *)(b->p + i));
                }
                nbad++;
            }
    } else {
        nbad = -1;
    }
    /* Reads that straddle each boundary, unaligned. */
    uintptr_t base = (uintptr_t)b->p;
    for (uintptr_t at = (base | (GRANULE - 1)) + 1; at < base + b->size; at += GRANULE) {
        size_t off = at - base, from = off > 4099 ? off - 4099 : 0, to = off + 3001 < b->size ? off + 3001 : b->size;
        memset(got, 0, to - from);
        if (!ok(cudaMemcpy(got, b->p + from, to - from, cudaMemcpyDeviceToHost), "cudaMemcpy D2H piece"))
            continue;
        for (size_t i = 0; i < to - from; i++)
            if (got[i] != b->shadow[from + i]) {
                if (first < 0)
                    first = (long)(from + i);
                nbad++;
            }
    }
    free(got);
    pthread_mutex_lock(&out_lock);
    checks++;
    if (nbad)
        bad++;
    printf("check %s %ld %ld\n", what, nbad, first);
    pthread_mutex_unlock(&out_lock);
}

/* fill writes the whole block with the salt-th pattern. */
static void fill(struct blk *b, unsigned salt) { write_at(b, 0, b->size, salt, 0, 0); }

/* pieces prints how many 2 MiB pieces of b are device and host memory. */
static void pieces(struct blk *b, const char *name)
{
    int dev = 0, host = 0;
    uintptr_t base = (uintptr_t)b->p;
    for (uintptr_t at = base; at < base + b->size; at = (at | (GRANULE - 1)) + 1) {
        struct cudaPointerAttributes a;
        memset(&a, 0, sizeof a);
        if (!ok(cudaPointerGetAttributes(&a, (void *)at), "cudaPointerGetAttributes"))
            return;
        if (a.type == cudaMemoryTypeDevice)
            dev++;
        else
            host++;
    }
    printf("pieces %s %d %d\n", name, dev, host);
}

static void sync_device(void) { ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

/* A gate that holds a stream: a host function waits until it opens. */
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static int gate_open;

static void hold(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&gate_lock);
    while (!gate_open)
        pthread_cond_wait(&gate_cond, &gate_lock);
    pthread_mutex_unlock(&gate_lock);
}

static void open_gate(void)
{
    pthread_mutex_lock(&gate_lock);
    gate_open = 1;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_lock);
}

static void close_gate(void)
{
    pthread_mutex_lock(&gate_lock);
    gate_open = 0;
    pthread_mutex_unlock(&gate_lock);
}

static void *opener(void *arg)
{
    usleep((useconds_t)(uintptr_t)arg * 1000);
    open_gate();
    return NULL;
}

static pthread_t open_later(unsigned ms)
{
    pthread_t t;
    if (pthread_create(&t, NULL, opener, (void *)(uintptr_t)ms))
        die("pthread_create");
    return t;
}

/* ---- straddle ---- */

#define OLD 15

/* cross writes across every granule boundary inside b, salt apart. */
static void cross(struct blk *b, struct blk *dev, struct blk *other, unsigned salt, cudaStream_t s)
{
    uintptr_t base = (uintptr_t)b->p;
    for (uintptr_t at = (base | (GRANULE - 1)) + 1; at + 8192 < base + b->size; at += GRANULE) {
        size_t off = at - base;
        write_at(b, off - 777, 1333 + 777, salt, 0, 0);
        set_at(b, off - 100, 150, (int)(salt & 0xff) | 1, 0, 0);
        write_at(b, off - 5003, 10007, salt + 1, 1, s);
        set_at(b, off - 33, 65, (int)((salt + 7) & 0xff), 1, s);
        copy_at(b, off - 4096 + 17, dev, 12345, 8191, 0, 0);     /* device block into the straddle */
        copy_at(other, 999, b, off - 2047, 4095, 1, s);          /* the straddle into another block */
        copy_at(b, off - 1, b, off + 4000, 2, 0, 0);             /* within the block, across */
        ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    }
}

static void straddle(size_t bsize)
{
    cudaStream_t s;
    ok(cudaStreamCreate(&s), "cudaStreamCreate"); /* blocking: ordered with the legacy stream */
    struct blk old[OLD], b, t;
    for (int i = 0; i < OLD; i++) {
        if (!alloc(&old[i], 4 * MIB))
            die("allocation");
        fill(&old[i], 1);
    }
    if (!alloc(&b, bsize))
        die("allocation of the straddling block");
    pieces(&b, "straddle");
    fill(&b, 2);
    cross(&b, &old[0], &old[1], 10, s);
    for (int i = 0; i < OLD; i++)
        verify(&old[i], "old-before");
    verify(&b, "straddle-written");
    /* Frees make room: hot host granules of b move to the device. */
    release(&old[14]);
    release(&old[13]);
    sync_device();
    pieces(&b, "straddle-after-free");
    verify(&b, "straddle-promoted");
    cross(&b, &old[2], &old[3], 20, s);
    /* Steps with a short-lived block: room is short, cold granules move to
     * the host, then come back once no step needs the room. */
    for (int step = 0; step < 4; step++) {
        if (!alloc(&t, 20 * MIB))
            die("allocation of a short-lived block");
        fill(&t, 30 + step);
        copy_at(&t, 2 * MIB - 5, &b, 2 * MIB - 7, 4 * MIB, 1, s);
        copy_at(&b, 1, &t, 6 * MIB + 3, 3 * MIB, 0, 0);
        ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        verify(&t, "short-lived");
        release(&t);
        sync_device();
        pieces(&b, "straddle-step");
        for (int i = 0; i < 13; i++)
            verify(&old[i], "old-moved");
        cross(&b, &old[4 + step], &old[5 + step], 40 + 10 * step, s);
        verify(&b, "straddle-step");
        for (int i = 0; i < 13; i++)
            verify(&old[i], "old-written");
    }
    for (int i = 0; i < 3; i++)
        sync_device();
    pieces(&b, "straddle-end");
    verify(&b, "straddle-end");
    for (int i = 0; i < 13; i++)
        verify(&old[i], "old-end");
    for (int i = 0; i < 13; i++)
        release(&old[i]);
    release(&b);
    ok(cudaStreamDestroy(s), "cudaStreamDestroy");
}

/* ---- pitch ---- */

static void pitch(void)
{
    struct blk old[OLD], b, t;
    for (int i = 0; i < OLD; i++) {
        if (!alloc(&old[i], 4 * MIB))
            die("allocation");
        fill(&old[i], 1);
    }
    size_t width = 3000, height = 3000, pt = 0;
    memset(&b, 0, sizeof b);
    if (!ok(cudaMallocPitch((void **)&b.p, &pt, width, height), "cudaMallocPitch"))
        die("cudaMallocPitch");
    b.size = pt * height;
    b.id = next_id++;
    b.shadow = xmalloc(b.size);
    memset(b.shadow, 0, b.size);
    printf("pitch %zu\n", pt);
    pieces(&b, "pitch");
    set_at(&b, 0, b.size, 0, 0, 0);
    cudaStream_t s;
    ok(cudaStreamCreate(&s), "cudaStreamCreate"); /* blocking: ordered with the legacy stream */
    for (int round = 0; round < 4; round++) {
        /* Every row written, alternately whole and as pieces around the
         * middle; rows that hold a granule boundary are memset across it. */
        for (size_t r = 0; r < height; r++) {
            size_t off = r * pt;
            if ((r + round) % 3 == 0)
                write_at(&b, off, width, 100 + round, 0, 0);
            else if ((r + round) % 3 == 1)
                set_at(&b, off + 7, width - 11, (int)(r + round) & 0xff, 1, s);
            uintptr_t row = (uintptr_t)b.p + off;
            if ((row | (GRANULE - 1)) + 1 < row + width) {
                size_t at = ((row | (GRANULE - 1)) + 1) - (uintptr_t)b.p;
                set_at(&b, at - 13, 29, 0xa0 + round, 0, 0);
                write_at(&b, at - 501, 1000, 200 + round, 1, s);
            }
        }
        ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        verify(&b, "pitch-rows");
        if (round == 0) {
            release(&old[14]);
            release(&old[13]);
        } else {
            if (!alloc(&t, 16 * MIB))
                die("allocation of a short-lived block");
            fill(&t, 300 + round);
            copy_at(&b, pt * 100 + 5, &t, 1, 2 * MIB + 77, 0, 0);
            verify(&t, "short-lived");
            release(&t);
        }
        sync_device();
        pieces(&b, "pitch-step");
        verify(&b, "pitch-moved");
    }
    sync_device();
    sync_device();
    verify(&b, "pitch-end");
    for (int i = 0; i < 13; i++) {
        verify(&old[i], "old-end");
        release(&old[i]);
    }
    release(&b);
    ok(cudaStreamDestroy(s), "cudaStreamDestroy");
}

/* ---- freequeued ---- */

static void freequeued(void)
{
    struct blk old[OLD], y;
    for (int i = 0; i < OLD; i++) {
        if (!alloc(&old[i], 4 * MIB))
            die("allocation");
        fill(&old[i], 1);
    }
    if (!alloc_raw(&y, 6 * MIB))
        die("allocation");
    fill(&y, 2);
    cudaStream_t s;
    ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    for (int round = 0; round < 3; round++) {
        struct blk x, z;
        size_t size = 5 * MIB + 4321 * (size_t)(round + 1);
        if (!alloc(&x, size))
            die("allocation");
        pieces(&x, "queued");
        fill(&x, 10 + round);
        struct blk snap;
        if (!alloc_raw(&snap, size))
            die("allocation");
        close_gate();
        ok(cudaLaunchHostFunc(s, hold, NULL), "cudaLaunchHostFunc");
        /* Behind the gate: the whole block into snap, and a piece across
         * its first granule boundary into y. */
        copy_at(&snap, 0, &x, 0, size, 2, s);
        copy_at(&y, 3, &x, 2 * MIB - 1000, 2 * MIB + 2000, 2, s);
        pthread_t t = open_later(1500);
        release(&x);
        /* The same size again, written at once on the legacy stream. */
        if (!alloc(&z, size))
            die("allocation");
        pieces(&z, "after-free");
        fill(&z, 20 + round);
        sync_device();
        pthread_join(t, NULL);
        verify(&snap, "queued-read");
        verify(&y, "queued-copy");
        verify(&z, "reallocated");
        /* A short-lived block and a free: the next synchronization moves. */
        struct blk tmp;
        if (!alloc(&tmp, 12 * MIB))
            die("allocation");
        fill(&tmp, 40 + round);
        verify(&tmp, "short-lived");
        release(&tmp);
        sync_device();
        verify(&z, "reallocated-moved");
        release(&z);
        release_raw(&snap);
    }
    sync_device();
    sync_device();
    verify(&y, "queued-copy-end");
    for (int i = 0; i < OLD; i++) {
        verify(&old[i], "old-end");
        release(&old[i]);
    }
    release_raw(&y);
    ok(cudaStreamDestroy(s), "cudaStreamDestroy");
}

/* ---- asyncreuse ---- */

static void asyncreuse(void)
{
    struct blk old[OLD - 2], y;
    for (int i = 0; i < OLD - 2; i++) {
        if (!alloc(&old[i], 4 * MIB))
            die("allocation");
        fill(&old[i], 1);
    }
    struct blk src;
    if (!alloc_raw(&y, 8 * MIB) || !alloc_raw(&src, 12 * MIB))
        die("allocation");
    fill(&y, 2);
    cudaStream_t a, b;
    ok(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "cudaStreamCreate");
    ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "cudaStreamCreate");
    for (int round = 0; round < 4; round++) {
        size_t size = (3 + 2 * (size_t)round) * MIB + 512 * (size_t)round;
        struct blk x, z;
        memset(&x, 0, sizeof x);
        if (!ok(cudaMallocAsync((void **)&x.p, size, a), "cudaMallocAsync"))
            die("cudaMallocAsync");
        x.size = size;
        x.id = next_id++;
        x.shadow = xmalloc(size);
        pieces(&x, "held-stream");
        close_gate();
        ok(cudaLaunchHostFunc(a, hold, NULL), "cudaLaunchHostFunc");
        /* Behind the gate on a: x written (from device memory: a write
         * from the host into spilled memory would be a host-to-host copy,
         * which returns only once done), copied into y, freed. */
        fill(&src, 50 + round);
        copy_at(&x, 0, &src, 7 * (size_t)round, size, 2, a);
        set_at(&x, 2 * MIB - 5000, 10000, 0x5a + round, 2, a);
        copy_at(&y, 11 * (size_t)round, &x, 2 * MIB - 4096, MIB, 2, a);
        ok(cudaFreeAsync(x.p, a), "cudaFreeAsync");
        free(x.shadow);
        /* On b, the same size, written and read back before a goes on. */
        pthread_t t = open_later(1500);
        memset(&z, 0, sizeof z);
        if (!ok(cudaMallocAsync((void **)&z.p, size, b), "cudaMallocAsync"))
            die("cudaMallocAsync");
        z.size = size;
        z.id = next_id++;
        z.shadow = xmalloc(size);
        printf("reuse %d %d\n", round, z.p == x.p);
        pieces(&z, "other-stream");
        unsigned char *buf = xmalloc(size);
        for (size_t i = 0; i < size; i++)
            buf[i] = z.shadow[i] = byte(z.id, i, 60 + round);
        ok(cudaMemcpyAsync(z.p, buf, size, cudaMemcpyHostToDevice, b), "cudaMemcpyAsync");
        free(buf);
        ok(cudaStreamSynchronize(b), "cudaStreamSynchronize");
        pthread_join(t, NULL);
        ok(cudaStreamSynchronize(a), "cudaStreamSynchronize");
        verify(&z, "other-stream");
        verify(&y, "held-copy");
        sync_device();
        verify(&z, "other-stream-synced");
        ok(cudaFreeAsync(z.p, b), "cudaFreeAsync");
        free(z.shadow);
        sync_device();
    }
    for (int i = 0; i < OLD - 2; i++) {
        verify(&old[i], "old-end");
        release(&old[i]);
    }
    verify(&y, "held-copy-end");
    release_raw(&y);
    release_raw(&src);
    ok(cudaStreamDestroy(a), "cudaStreamDestroy");
    ok(cudaStreamDestroy(b), "cudaStreamDestroy");
}

/* ---- threads ---- */

#define THREADS 8
#define ROUNDS 12
#define KEPT 2

/* drive: workers read-lock it around their CUDA calls, the synchronizing
 * thread write-locks it; writers are preferred, or the workers would
 * starve the synchronizations. */
static pthread_rwlock_t drive;
static int workers_left = THREADS;

static void *worker(void *arg)
{
    unsigned me = (unsigned)(uintptr_t)arg;
    cudaStream_t s;
    pthread_rwlock_rdlock(&drive);
    ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    pthread_rwlock_unlock(&drive);
    struct blk kept[KEPT];
    memset(kept, 0, sizeof kept);
    char what[32];
    for (unsigned round = 0; round < ROUNDS; round++) {
        pthread_rwlock_rdlock(&drive);
        int k = (int)(round % KEPT);
        if (kept[k].p) {
            snprintf(what, sizeof what, "kept-%u", me);
            verify(&kept[k], what);
            release(&kept[k]);
        }
        size_t size = (size_t)(1 + (me + round) % 5) * MIB + 4096 * me + 3 * round;
        if (alloc(&kept[k], size)) {
            write_at(&kept[k], 0, size, round, 1, s);
            write_at(&kept[k], size / 2 - 1, 4099, round + 100, 0, 0);
        }
        /* A short-lived block of this thread, on its stream. */
        struct blk t;
        memset(&t, 0, sizeof t);
        size_t tsize = (size_t)(2 + round % 3) * MIB + me;
        if (ok(cudaMallocAsync((void **)&t.p, tsize, s), "cudaMallocAsync")) {
            t.size = tsize;
            t.id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
            t.shadow = xmalloc(tsize);
            memset(t.shadow, 0, tsize);
            write_at(&t, 0, tsize, round + 200, 1, s);
            for (int j = 0; j < KEPT; j++)
                if (kept[j].p)
                    copy_at(&t, 5, &kept[j], 1, kept[j].size - 1 < tsize - 5 ? kept[j].size - 1 : tsize - 5, 1, s);
            ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
            snprintf(what, sizeof what, "short-%u", me);
            verify(&t, what);
            ok(cudaFreeAsync(t.p, s), "cudaFreeAsync");
            free(t.shadow);
        }
        ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        pthread_rwlock_unlock(&drive);
        usleep(1000);
    }
    pthread_rwlock_rdlock(&drive);
    for (int k = 0; k < KEPT; k++)
        if (kept[k].p) {
            snprintf(what, sizeof what, "kept-end-%u", me);
            verify(&kept[k], what);
            release(&kept[k]);
        }
    ok(cudaStreamDestroy(s), "cudaStreamDestroy");
    pthread_rwlock_unlock(&drive);
    __atomic_fetch_sub(&workers_left, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void threads(void)
{
    struct blk old[12];
    for (int i = 0; i < 12; i++) {
        if (!alloc(&old[i], 4 * MIB))
            die("allocation");
        fill(&old[i], 1);
    }
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&drive, &attr);
    pthread_t w[THREADS];
    for (unsigned i = 0; i < THREADS; i++)
        if (pthread_create(&w[i], NULL, worker, (void *)(uintptr_t)i))
            die("pthread_create");
    int syncs = 0;
    while (__atomic_load_n(&workers_left, __ATOMIC_SEQ_CST) > 0) {
        pthread_rwlock_wrlock(&drive);
        sync_device();
        syncs++;
        pthread_rwlock_unlock(&drive);
        usleep(2000);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(w[i], NULL);
    printf("syncs %d\n", syncs);
    for (int i = 0; i < 12; i++) {
        verify(&old[i], "old-end");
        release(&old[i]);
    }
}

/* ---- freeduring ---- */

static struct blk victim;
static pid_t main_tid;

/* Whether thread tid sleeps (state S in /proc/self/task/TID/stat). */
static int asleep(pid_t tid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        die("/proc/self/task");
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *name_end = strrchr(buf, ')'); /* the name may hold anything */
    return name_end != NULL && name_end[1] == ' ' && name_end[2] == 'S';
}

/* Frees the victim once the main thread waits inside cudaDeviceSynchronize
 * for the held stream (asleep at three looks in a row, not a lock taken on
 * its way there), however long a loaded machine takes it to get there. */
static void *free_victim(void *arg)
{
    (void)arg;
    for (int seen = 0; seen < 3; seen = asleep(main_tid) ? seen + 1 : 0)
        usleep(2000);
    release(&victim);
    open_gate();
    return NULL;
}

static void freeduring(int during)
{
    /* As in TestVMMMigrate: seven blocks of 8 MiB, a 16 MiB block that
     * spills and is freed; the synchronization after would demote. */
    struct blk old[7], t;
    for (int i = 0; i < 7; i++) {
        if (!alloc(&old[i], 8 * MIB))
            die("allocation");
        fill(&old[i], 1);
    }
    if (!alloc(&victim, 64 * 1024))
        die("allocation");
    fill(&victim, 2);
    sync_device();
    if (!alloc(&t, 16 * MIB))
        die("allocation");
    fill(&t, 3);
    verify(&t, "short-lived");
    release(&t);
    cudaStream_t s;
    ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    close_gate();
    ok(cudaLaunchHostFunc(s, hold, NULL), "cudaLaunchHostFunc");
    pthread_t th;
    if (during) {
        main_tid = gettid();
        if (pthread_create(&th, NULL, free_victim, NULL))
            die("pthread_create");
    } else {
        release(&victim);
        th = open_later(500);
    }
    sync_device();
    pthread_join(th, NULL);
    for (int i = 0; i < 7; i++) {
        verify(&old[i], "old-end");
        release(&old[i]);
    }
    ok(cudaStreamDestroy(s), "cudaStreamDestroy");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2)
        die("usage: integrity SCENARIO");
    const char *sc = argv[1];
    if (!strcmp(sc, "straddle"))
        straddle(8 * MIB + 3 * GRANULE / 4 + 333);
    else if (!strcmp(sc, "pitch"))
        pitch();
    else if (!strcmp(sc, "freequeued"))
        freequeued();
    else if (!strcmp(sc, "asyncreuse"))
        asyncreuse();
    else if (!strcmp(sc, "threads"))
        threads();
    else if (!strcmp(sc, "freeduring"))
        freeduring(1);
    else if (!strcmp(sc, "freebefore"))
        freeduring(0);
    else
        die("unknown scenario");
    printf("done %d %d\n", checks, bad);
    return 0;
}
