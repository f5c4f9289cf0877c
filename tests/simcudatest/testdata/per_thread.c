/*
 * per_thread.c: the runtime's per-thread entry points, as a program built
 * with --default-stream per-thread calls them (`per_thread <case>`): stream
 * 0 is the calling thread's default stream. Pending work is a host function
 * blocked on a pipe, so every check is deterministic.
 */
#define CUDA_API_PER_THREAD_DEFAULT_STREAM
#include <pthread.h>
#include <unistd.h>

#include <spillway/cuda_runtime.h>

#include "check.h"

#define BYTES 4096

struct gate {
	int fds[2];
};

static void gate_init(struct gate *g)
{
	CHECK(pipe(g->fds) == 0);
}

static void gate_wait(void *arg)
{
	struct gate *g = arg;
	char c;
	CHECK(read(g->fds[0], &c, 1) == 1);
}

static void gate_open(struct gate *g)
{
	CHECK(write(g->fds[1], "x", 1) == 1);
}

static struct gate held;
static cudaEvent_t held_done;
static pthread_barrier_t queued;

/* Holds this thread's default stream until the gate opens. */
static void *hold_own_stream(void *arg)
{
	(void)arg;
	OK(cudaLaunchHostFunc(0, gate_wait, &held));
	OK(cudaEventRecord(held_done, 0));
	pthread_barrier_wait(&queued);
	OK(cudaStreamSynchronize(0));
	return NULL;
}

/* Another thread's held default stream does not hold this thread's copies,
 * memsets, allocations, prefetches, event waits and synchronizations: each
 * thread has its own. (Work sent to the legacy stream instead would wait for
 * the held one, and so would this thread's later work.) */
static void case_threads(void)
{
	static unsigned char host[BYTES];
	void *d = NULL, *from_pool = NULL, *managed = NULL;
	cudaMemPool_t pool;
	cudaEvent_t done_here;
	pthread_t holder;

	gate_init(&held);
	CHECK(pthread_barrier_init(&queued, NULL, 2) == 0);
	OK(cudaEventCreate(&held_done));
	CHECK(pthread_create(&holder, NULL, hold_own_stream, NULL) == 0);
	pthread_barrier_wait(&queued);

	OK(cudaMallocAsync(&d, BYTES, 0));
	OK(cudaMemset(d, 0x11, BYTES));
	OK(cudaMemcpy(host, d, BYTES, cudaMemcpyDeviceToHost));
	CHECK(host[0] == 0x11 && host[BYTES - 1] == 0x11);
	OK(cudaDeviceGetDefaultMemPool(&pool, 0));
	OK(cudaMallocFromPoolAsync(&from_pool, BYTES, pool, 0));
	OK(cudaMallocManaged(&managed, BYTES, cudaMemAttachGlobal));
	OK(cudaMemPrefetchAsync(managed, BYTES, 0, 0));
	OK(cudaEventCreate(&done_here));
	OK(cudaEventRecord(done_here, 0));
	OK(cudaStreamWaitEvent(0, done_here, 0));
	OK(cudaMemsetAsync(d, 0x22, BYTES, 0));
	OK(cudaMemcpyAsync(host, d, BYTES, cudaMemcpyDeviceToHost, 0));
	OK(cudaFreeAsync(d, 0));
	OK(cudaFreeAsync(from_pool, 0));
	OK(cudaStreamSynchronize(0));
	CHECK(host[0] == 0x22 && host[BYTES - 1] == 0x22);
	EXPECT(cudaStreamQuery(0), cudaSuccess);
	EXPECT(cudaEventQuery(held_done), cudaErrorNotReady);

	gate_open(&held);
	CHECK(pthread_join(holder, NULL) == 0);
	EXPECT(cudaEventQuery(held_done), cudaSuccess);
	OK(cudaEventDestroy(done_here));
	OK(cudaFree(managed));
}

static void *open_held_soon(void *arg)
{
	(void)arg;
	/* Gives a copy that did not wait the chance to read early; correctness never depends on it. */
	usleep(100 * 1000);
	gate_open(&held);
	return NULL;
}

/* A copy without a stream (_ptds) runs after the work this thread queued on
 * its default stream. */
static void case_own_order(void)
{
	static unsigned char host[BYTES];
	void *d = NULL;
	pthread_t opener;

	gate_init(&held);
	OK(cudaMalloc(&d, BYTES));
	OK(cudaMemset(d, 0, BYTES));
	OK(cudaLaunchHostFunc(0, gate_wait, &held));
	OK(cudaMemsetAsync(d, 0x33, BYTES, 0));
	EXPECT(cudaStreamQuery(0), cudaErrorNotReady);
	CHECK(pthread_create(&opener, NULL, open_held_soon, NULL) == 0);
	OK(cudaMemcpy(host, d, BYTES, cudaMemcpyDeviceToHost));
	CHECK(host[0] == 0x33 && host[BYTES - 1] == 0x33);
	CHECK(pthread_join(opener, NULL) == 0);
	OK(cudaFree(d));
}

static const struct test_case cases[] = {
	{"threads", case_threads},
	{"own_order", case_own_order},
};

int main(int argc, char **argv)
{
	return run_case(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);
}
