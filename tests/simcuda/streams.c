/*
 * streams.c - streams, events and host functions of the simulated driver.
 *
 * Every stream owns a worker thread that runs its operations in FIFO order.
 * An operation may carry dependencies, (stream, sequence number) pairs that
 * must have completed before it starts; that is how the legacy default
 * stream's implicit synchronisation and cuStreamWaitEvent are expressed:
 *  - an operation on the legacy stream waits for everything submitted before
 *    it to every blocking stream of the device;
 *  - an operation on a blocking stream waits for everything submitted before
 *    it to the legacy stream; non-blocking streams wait for nothing.
 * Streams and events are never freed, only marked destroyed, so a pending
 * dependency or a late lookup can never touch freed memory.
 */
#define _GNU_SOURCE
#include "driver.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x45564e54u

__thread int sim_in_host_fn;
static __thread struct CUstream_st *per_thread_stream[SIMCUDA_MAX_DEVICES];

struct op *op_new(enum op_type type)
{
	struct op *op = calloc(1, sizeof(*op));

	if (op != NULL)
		op->type = type;
	return op;
}

void op_free(struct op *op)
{
	free(op->deps);
	free(op->staging);
	free(op);
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int deps_done(const struct op *op)
{
	for (int i = 0; i < op->ndeps; i++)
		if (op->deps[i].stream->completed < op->deps[i].seq)
			return 0;
	return 1;
}

static void run_op(struct CUstream_st *s, struct op *op)
{
	switch (op->type) {
	case OP_HOST_FN:
		sim_in_host_fn = 1;
		op->fn(op->user);
		sim_in_host_fn = 0;
		break;
	case OP_EVENT:
		pthread_mutex_lock(&sim.lock);
		if (op->event_id >= op->event->done_id) {
			op->event->done_id = op->event_id;
			op->event->done_ms = now_ms();
		}
		pthread_mutex_unlock(&sim.lock);
		break;
	case OP_BARRIER:
		break; /* its dependencies were the point */
	default:
		mem_execute(op, s->device);
		break;
	}
}

static void *worker(void *arg)
{
	struct CUstream_st *s = arg;

	pthread_mutex_lock(&sim.lock);
	for (;;) {
		while (s->head == NULL && !s->destroyed)
			pthread_cond_wait(&s->wake, &sim.lock);
		if (s->head == NULL)
			break; /* destroyed and drained */
		struct op *op = s->head;
		while (!deps_done(op))
			pthread_cond_wait(&sim.progress, &sim.lock);
		pthread_mutex_unlock(&sim.lock);
		run_op(s, op);
		pthread_mutex_lock(&sim.lock);
		s->head = op->next;
		if (s->head == NULL)
			s->tail = NULL;
		s->completed = op->seq;
		pthread_cond_broadcast(&sim.progress);
		op_free(op);
	}
	pthread_mutex_unlock(&sim.lock);
	return NULL;
}

CUresult stream_create_locked(int device, unsigned int flags, int legacy, int per_thread,
			      struct CUstream_st **out)
{
	struct CUstream_st *s = calloc(1, sizeof(*s));
	pthread_attr_t attr;
	pthread_t tid;
	sigset_t all, old;

	if (s == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	s->magic = STREAM_MAGIC;
	s->device = device;
	s->flags = flags;
	s->legacy = legacy;
	s->per_thread = per_thread;
	pthread_cond_init(&s->wake, NULL);

	/* Workers take no signals: those belong to the application's threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int err = pthread_create(&tid, &attr, worker, s);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (err != 0) {
		pthread_cond_destroy(&s->wake);
		free(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	s->next = sim.streams;
	sim.streams = s;
	*out = s;
	return CUDA_SUCCESS;
}

static int stream_known(const struct CUstream_st *h)
{
	for (const struct CUstream_st *s = sim.streams; s != NULL; s = s->next)
		if (s == h)
			return s->magic == STREAM_MAGIC && !s->destroyed;
	return 0;
}

CUresult stream_lookup(CUstream handle, struct CUstream_st **out)
{
	int dev = 0;
	CUresult rc = CUDA_SUCCESS;

	if (handle == NULL && sim_ptds)
		handle = CU_STREAM_PER_THREAD;
	if (handle == NULL || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
		rc = sim_current_device(&dev);
		if (rc != CUDA_SUCCESS)
			return rc;
	}
	pthread_mutex_lock(&sim.lock);
	if (handle == NULL || handle == CU_STREAM_LEGACY) {
		*out = sim.dev[dev].legacy;
	} else if (handle == CU_STREAM_PER_THREAD) {
		if (per_thread_stream[dev] == NULL)
			rc = stream_create_locked(dev, CU_STREAM_DEFAULT, 0, 1, &per_thread_stream[dev]);
		*out = per_thread_stream[dev];
	} else if (stream_known(handle)) {
		*out = handle;
	} else {
		rc = CUDA_ERROR_INVALID_HANDLE;
	}
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

int op_add_dep(struct op *op, struct CUstream_st *s, uint64_t seq)
{
	struct dep *d = realloc(op->deps, (size_t)(op->ndeps + 1) * sizeof(*d));

	if (d == NULL)
		return -1;
	op->deps = d;
	op->deps[op->ndeps].stream = s;
	op->deps[op->ndeps].seq = seq;
	op->ndeps++;
	return 0;
}

CUresult stream_submit(struct CUstream_st *s, struct op *op, uint64_t *seq)
{
	int err = 0;

	pthread_mutex_lock(&sim.lock);
	if (s->destroyed) {
		pthread_mutex_unlock(&sim.lock);
		op_free(op);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	if (s->legacy) {
		for (struct CUstream_st *t = sim.streams; t != NULL && !err; t = t->next)
			if (t != s && t->device == s->device && !(t->flags & CU_STREAM_NON_BLOCKING) &&
			    t->submitted > t->completed)
				err = op_add_dep(op, t, t->submitted);
	} else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
		struct CUstream_st *legacy = sim.dev[s->device].legacy;
		if (legacy != NULL && legacy->submitted > legacy->completed)
			err = op_add_dep(op, legacy, legacy->submitted);
	}
	if (err) {
		pthread_mutex_unlock(&sim.lock);
		op_free(op);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	op->seq = ++s->submitted;
	if (op->type == OP_EVENT) {
		op->event_id = ++op->event->record_id;
		op->event->stream = s;
		op->event->seq = op->seq;
	}
	if (op->type == OP_FREE) { /* where the free sits, for the pool's reuse (memory.c) */
		op->alloc->free_stream = s;
		op->alloc->free_seq = op->seq;
	}
	if (s->tail != NULL)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	if (seq != NULL)
		*seq = op->seq;
	pthread_cond_signal(&s->wake);
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

void stream_wait_seq(struct CUstream_st *s, uint64_t seq)
{
	pthread_mutex_lock(&sim.lock);
	while (s->completed < seq)
		pthread_cond_wait(&sim.progress, &sim.lock);
	pthread_mutex_unlock(&sim.lock);
}

CUresult stream_sync_device(int device)
{
	pthread_mutex_lock(&sim.lock);
	for (struct CUstream_st *t = sim.streams; t != NULL; t = t->next) {
		uint64_t target = t->submitted;
		while (t->device == device && t->completed < target)
			pthread_cond_wait(&sim.progress, &sim.lock);
	}
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

void streams_destroy_device(int device)
{
	for (struct CUstream_st *t = sim.streams; t != NULL; t = t->next) {
		if (t->device == device && !t->legacy && !t->per_thread && !t->destroyed) {
			t->destroyed = 1;
			pthread_cond_signal(&t->wake);
		}
	}
}

/* ---- API: streams ---- */

SIM_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	int dev;

	ENTER(ENTER_INIT);
	CUresult rc = sim_current_device(&dev);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (phStream == NULL || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	rc = stream_create_locked(dev, Flags, 0, 0, phStream);
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuStreamDestroy_v2(CUstream hStream)
{
	ENTER(ENTER_INIT);
	pthread_mutex_lock(&sim.lock);
	CUresult rc = CUDA_ERROR_INVALID_HANDLE;
	/* Pending work still runs; the worker exits once it has drained the stream. */
	if (hStream != CU_STREAM_LEGACY && hStream != CU_STREAM_PER_THREAD && stream_known(hStream) &&
	    !hStream->legacy && !hStream->per_thread) {
		hStream->destroyed = 1;
		pthread_cond_signal(&hStream->wake);
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuStreamSynchronize(CUstream hStream)
{
	struct CUstream_st *s;
	uint64_t seq;

	ENTER(ENTER_INIT);
	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (s->legacy) {
		/* A marker on the legacy stream also waits for the blocking streams' work. */
		struct op *op = op_new(OP_BARRIER);
		if (op == NULL)
			return CUDA_ERROR_OUT_OF_MEMORY;
		rc = stream_submit(s, op, &seq);
		if (rc != CUDA_SUCCESS)
			return rc;
	} else {
		pthread_mutex_lock(&sim.lock);
		seq = s->submitted;
		pthread_mutex_unlock(&sim.lock);
	}
	stream_wait_seq(s, seq);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamQuery(CUstream hStream)
{
	struct CUstream_st *s;

	ENTER(ENTER_INIT);
	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&sim.lock);
	rc = s->completed == s->submitted ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
	struct CUstream_st *s;

	ENTER(ENTER_INIT);
	if (flags == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = stream_lookup(hStream, &s);
	if (rc == CUDA_SUCCESS)
		*flags = s->flags;
	return rc;
}

/* ---- API: events ---- */

static CUresult event_lookup(CUevent h)
{
	for (const struct CUevent_st *e = sim.events; e != NULL; e = e->next)
		if (e == h)
			return e->magic == EVENT_MAGIC && !e->destroyed ? CUDA_SUCCESS
								       : CUDA_ERROR_INVALID_HANDLE;
	return CUDA_ERROR_INVALID_HANDLE;
}

SIM_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	struct CUstream_st *s;

	ENTER(ENTER_INIT);
	/* There is no stream capture, so an external wait is an ordinary one. */
	if (Flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	struct op *op = op_new(OP_BARRIER);
	if (op == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&sim.lock);
	rc = event_lookup(hEvent);
	/* Waiting for an event that was never recorded waits for nothing. */
	if (rc == CUDA_SUCCESS && hEvent->record_id != 0 && op_add_dep(op, hEvent->stream, hEvent->seq))
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_unlock(&sim.lock);
	if (rc != CUDA_SUCCESS) {
		op_free(op);
		return rc;
	}
	return stream_submit(s, op, NULL);
}

SIM_API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	int dev;
	const unsigned int known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
				   CU_EVENT_INTERPROCESS;

	ENTER(ENTER_INIT);
	CUresult rc = sim_current_device(&dev);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (phEvent == NULL || (Flags & ~known) ||
	    ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
		return CUDA_ERROR_INVALID_VALUE;
	struct CUevent_st *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->magic = EVENT_MAGIC;
	e->device = dev;
	e->flags = Flags;
	pthread_mutex_lock(&sim.lock);
	e->next = sim.events;
	sim.events = e;
	pthread_mutex_unlock(&sim.lock);
	*phEvent = e;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	struct CUstream_st *s;

	ENTER(ENTER_INIT);
	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&sim.lock);
	rc = event_lookup(hEvent);
	/* The event and the stream must belong to the same device (cudaEventRecord). */
	if (rc == CUDA_SUCCESS && hEvent->device != s->device)
		rc = CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_unlock(&sim.lock);
	if (rc != CUDA_SUCCESS)
		return rc;
	struct op *op = op_new(OP_EVENT);
	if (op == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->event = hEvent;
	return stream_submit(s, op, NULL);
}

SIM_API CUresult cuEventQuery(CUevent hEvent)
{
	ENTER(ENTER_INIT);
	pthread_mutex_lock(&sim.lock);
	CUresult rc = event_lookup(hEvent);
	if (rc == CUDA_SUCCESS && hEvent->done_id != hEvent->record_id)
		rc = CUDA_ERROR_NOT_READY;
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuEventSynchronize(CUevent hEvent)
{
	ENTER(ENTER_INIT);
	pthread_mutex_lock(&sim.lock);
	CUresult rc = event_lookup(hEvent);
	if (rc == CUDA_SUCCESS) {
		uint64_t id = hEvent->record_id;
		while (hEvent->done_id < id)
			pthread_cond_wait(&sim.progress, &sim.lock);
	}
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	ENTER(ENTER_INIT);
	if (pMilliseconds == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	CUresult rc = event_lookup(hStart);
	if (rc == CUDA_SUCCESS)
		rc = event_lookup(hEnd);
	if (rc == CUDA_SUCCESS &&
	    ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING ||
	     hStart->record_id == 0 || hEnd->record_id == 0))
		rc = CUDA_ERROR_INVALID_HANDLE;
	if (rc == CUDA_SUCCESS &&
	    (hStart->done_id != hStart->record_id || hEnd->done_id != hEnd->record_id))
		rc = CUDA_ERROR_NOT_READY;
	if (rc == CUDA_SUCCESS)
		*pMilliseconds = (float)(hEnd->done_ms - hStart->done_ms);
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuEventDestroy_v2(CUevent hEvent)
{
	ENTER(ENTER_INIT);
	pthread_mutex_lock(&sim.lock);
	CUresult rc = event_lookup(hEvent);
	if (rc == CUDA_SUCCESS)
		hEvent->destroyed = 1; /* a pending record still completes harmlessly */
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
	struct CUstream_st *s;

	ENTER(ENTER_INIT);
	if (fn == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	struct op *op = op_new(OP_HOST_FN);
	if (op == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->fn = fn;
	op->user = userData;
	return stream_submit(s, op, NULL);
}
