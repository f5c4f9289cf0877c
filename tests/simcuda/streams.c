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
 * dependency or a late lookup can never touch freed memory. They are reused,
 * oldest first, once more than RETIRED_KEPT of a kind are destroyed and
 * idle (a stream's worker gone, an event's latest record done), so that a
 * long run creating and destroying them holds bounded memory, as CUDA does;
 * sequence numbers and record ids carry on across reuse, so a dependency
 * on the former stream or event is already satisfied. A thread's per-thread
 * stream is destroyed when the thread exits.
 *
 * Stream capture: work submitted to a capturing stream is recorded as a
 * graph node instead of being queued (stream_submit), and cuGraphLaunch
 * submits the nodes again, in recording order, to the launch stream. The
 * rules CUDA documents for capture (modes, forbidden calls, invalidation,
 * cross-stream joins) are enforced here; README.md lists what differs.
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

#define RETIRED_KEPT 64
/* Destroys the exiting thread's per-thread streams (its value: the array). */
static pthread_key_t per_thread_exit;
static pthread_once_t per_thread_exit_once = PTHREAD_ONCE_INIT;

/* Stream capture, below; all but capture_forbids_wait with sim.lock held. */
static CUresult capture_record(struct CUstream_st *s, struct op *op);
static int capture_implicit(int device);
static CUresult capture_forbids_wait(struct CUstream_st *s);
static CUresult capture_wait(struct CUstream_st *s, struct CUevent_st *e, unsigned int flags,
			     int *captured);
static CUresult captured_event(struct CUevent_st *e);
static void capture_leave(struct CUstream_st *s);

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
		if (s->head == NULL) {
			s->worker_exited = 1; /* destroyed and drained */
			break;
		}
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

/* The oldest destroyed stream whose worker is gone, if more than RETIRED_KEPT are. */
static struct CUstream_st *retired_stream(void)
{
	struct CUstream_st *oldest = NULL;
	int n = 0;

	for (struct CUstream_st *s = sim.streams; s != NULL; s = s->next)
		if (s->worker_exited && !s->legacy && s->capture == NULL)
			oldest = s, n++;
	return n > RETIRED_KEPT ? oldest : NULL;
}

CUresult stream_create_locked(int device, unsigned int flags, int legacy, int per_thread,
			      struct CUstream_st **out)
{
	struct CUstream_st *s = legacy ? NULL : retired_stream();
	int reused = s != NULL;
	pthread_attr_t attr;
	pthread_t tid;
	sigset_t all, old;

	if (reused) {
		/* Its operations are done (submitted == completed) and it captures nothing. */
		s->destroyed = s->worker_exited = 0;
		s->cap_last = NULL;
		s->cap_unjoined = 0;
	} else {
		s = calloc(1, sizeof(*s));
		if (s == NULL)
			return CUDA_ERROR_OUT_OF_MEMORY;
		pthread_cond_init(&s->wake, NULL);
	}
	s->magic = STREAM_MAGIC;
	s->device = device;
	s->ctx = NULL;
	s->flags = flags;
	s->legacy = legacy;
	s->per_thread = per_thread;

	/* Workers take no signals: those belong to the application's threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int err = pthread_create(&tid, &attr, worker, s);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (err != 0) {
		if (reused) {
			s->destroyed = s->worker_exited = 1;
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		pthread_cond_destroy(&s->wake);
		free(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (!reused) {
		s->next = sim.streams;
		sim.streams = s;
	}
	*out = s;
	return CUDA_SUCCESS;
}

/* Destroys s: its pending work still runs, then its worker exits (sim.lock held). */
static void stream_destroy_locked(struct CUstream_st *s)
{
	capture_leave(s);
	s->destroyed = 1;
	pthread_cond_signal(&s->wake);
}

/* At a thread's exit, its per-thread streams go as a destroyed stream does:
 * queued work still runs, then the worker exits. */
static void per_thread_streams_exit(void *arg)
{
	struct CUstream_st **streams = arg;

	pthread_mutex_lock(&sim.lock);
	for (int dev = 0; dev < SIMCUDA_MAX_DEVICES; dev++) {
		struct CUstream_st *s = streams[dev];
		if (s != NULL && !s->destroyed)
			stream_destroy_locked(s);
		streams[dev] = NULL;
	}
	pthread_mutex_unlock(&sim.lock);
}

static void per_thread_exit_init(void)
{
	pthread_key_create(&per_thread_exit, per_thread_streams_exit);
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
		if (per_thread_stream[dev] == NULL) {
			pthread_once(&per_thread_exit_once, per_thread_exit_init);
			rc = stream_create_locked(dev, CU_STREAM_DEFAULT, 0, 1, &per_thread_stream[dev]);
			if (rc == CUDA_SUCCESS)
				pthread_setspecific(per_thread_exit, per_thread_stream);
		}
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
	if (s->capture != NULL) { /* recorded, not run: there is nothing to wait for */
		CUresult rc = capture_record(s, op);
		pthread_mutex_unlock(&sim.lock);
		op_free(op);
		if (seq != NULL)
			*seq = 0;
		return rc;
	}
	/* The legacy stream would wait for a capturing blocking stream: CUDA forbids it. */
	if (s->legacy && capture_implicit(s->device)) {
		pthread_mutex_unlock(&sim.lock);
		op_free(op);
		return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
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
		op->event->capture_id = 0; /* recorded outside capture again */
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

void stream_sync_context(const struct CUctx_st *ctx)
{
	pthread_mutex_lock(&sim.lock);
	for (struct CUstream_st *t = sim.streams; t != NULL; t = t->next) {
		uint64_t target = t->submitted;
		while (t->device == ctx->device && (t->ctx == NULL || t->ctx == ctx) && t->completed < target)
			pthread_cond_wait(&sim.progress, &sim.lock);
	}
	pthread_mutex_unlock(&sim.lock);
}

/*
 * Destroying a context destroys its streams and events (cuCtxDestroy). The
 * legacy and per-thread streams are shared by the device's contexts here,
 * so they stay. The caller waited for the context's work, so no record of
 * its events is pending.
 */
void streams_destroy_context(const struct CUctx_st *ctx)
{
	for (struct CUstream_st *t = sim.streams; t != NULL; t = t->next)
		if (t->ctx == ctx && !t->legacy && !t->per_thread && !t->destroyed)
			stream_destroy_locked(t);
	for (struct CUevent_st *e = sim.events; e != NULL; e = e->next)
		if (e->ctx == ctx)
			e->destroyed = 1;
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
	if (rc == CUDA_SUCCESS)
		(*phStream)->ctx = sim_current_ctx();
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
		stream_destroy_locked(hStream);
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
	rc = capture_forbids_wait(s);
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
	rc = capture_forbids_wait(s);
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

/*
 * The context the stream was made in. The legacy and per-thread streams
 * answer the current context, whose default streams they are in CUDA (here
 * they are the device's, shared by its contexts). A stream outliving its
 * created context (CUDA would have destroyed it) answers
 * CUDA_ERROR_CONTEXT_IS_DESTROYED.
 */
SIM_API CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
	struct CUstream_st *s;

	ENTER(ENTER_INIT);
	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (pctx == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct CUctx_st *ctx = s->ctx != NULL ? s->ctx : sim_current_ctx();
	pthread_mutex_unlock(&sim.lock);
	if (!ctx->primary && __atomic_load_n(&ctx->destroyed, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	*pctx = ctx;
	return CUDA_SUCCESS;
}

/* ---- API: events ---- */

/* The oldest destroyed event whose latest record is done, if more than
 * RETIRED_KEPT are; sim.lock held. */
static struct CUevent_st *retired_event(void)
{
	struct CUevent_st *oldest = NULL;
	int n = 0;

	for (struct CUevent_st *e = sim.events; e != NULL; e = e->next)
		if (e->destroyed && e->done_id == e->record_id)
			oldest = e, n++;
	return n > RETIRED_KEPT ? oldest : NULL;
}

/* Whether e was recorded since it was created. */
static int event_recorded(const struct CUevent_st *e)
{
	return e->record_id != e->first_id;
}

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
	int captured = 0;
	if (rc == CUDA_SUCCESS)
		rc = capture_wait(s, hEvent, Flags, &captured);
	/* Waiting for an event that was never recorded waits for nothing. */
	if (rc == CUDA_SUCCESS && !captured && event_recorded(hEvent) &&
	    op_add_dep(op, hEvent->stream, hEvent->seq))
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_unlock(&sim.lock);
	if (rc != CUDA_SUCCESS || captured) {
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
	pthread_mutex_lock(&sim.lock);
	struct CUevent_st *e = retired_event();
	if (e == NULL) {
		e = calloc(1, sizeof(*e));
		if (e == NULL) {
			pthread_mutex_unlock(&sim.lock);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		e->next = sim.events;
		sim.events = e;
	}
	/* Record ids carry on: a late completion of a former record changes nothing. */
	e->first_id = e->done_id = e->record_id;
	e->destroyed = 0;
	e->stream = NULL;
	e->seq = 0;
	e->done_ms = 0;
	e->capture_id = 0;
	e->cap_stream = NULL;
	e->cap_node = NULL;
	e->magic = EVENT_MAGIC;
	e->device = dev;
	e->ctx = sim_current_ctx();
	e->flags = Flags;
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
	if (rc == CUDA_SUCCESS)
		rc = captured_event(hEvent);
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
	if (rc == CUDA_SUCCESS)
		rc = captured_event(hEvent);
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
	if (rc == CUDA_SUCCESS)
		rc = captured_event(hStart);
	if (rc == CUDA_SUCCESS)
		rc = captured_event(hEnd);
	if (rc == CUDA_SUCCESS &&
	    ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING ||
	     !event_recorded(hStart) || !event_recorded(hEnd)))
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

/* ---- stream capture and graphs ---- */

#define GRAPH_MAGIC 0x47525048u
#define GRAPH_EXEC_MAGIC 0x47455845u

/* One recorded operation: what cuGraphLaunch submits again. */
struct CUgraphNode_st {
	enum op_type type;
	int noop;         /* a dependency only: allocation, in-graph free, internal wait */
	uintptr_t dst, src; /* addresses as the application gave them, resolved at each launch */
	int dst_known, src_known; /* they were CUDA allocations when recorded */
	size_t len;
	unsigned char value;
	CUhostFn fn;
	void *user;
	struct CUevent_st *event; /* an external event wait (CU_EVENT_WAIT_EXTERNAL) */
	uint64_t alloc_id;        /* a free of memory allocated outside the capture */
	int location;
};

/* Memory allocated by cuMemAllocAsync during a capture. */
struct graph_alloc {
	uintptr_t base;
	uint64_t id;
	int freed; /* freed in the same capture: the graph owns it until destroyed */
};

struct CUgraph_st {
	uint32_t magic;
	int destroyed; /* the handle; the nodes live while refs > 0 */
	int refs;      /* the handle (or the capture building it) and each executable graph */
	int capturing;
	int device;
	struct CUgraphNode_st **nodes;
	size_t nnodes, cap_nodes;
	struct graph_alloc *allocs;
	size_t nallocs;
	struct CUgraph_st *next;
};

struct CUgraphExec_st {
	uint32_t magic;
	struct CUgraph_st *graph;
	struct CUgraphExec_st *next;
};

/* A capture sequence, freed when it ends; events name theirs by id. */
struct capture {
	uint64_t id;
	CUstreamCaptureMode mode;
	pthread_t owner; /* the thread that began it */
	int active, invalidated;
	struct CUstream_st *origin;
	struct CUgraph_st *graph;
	struct capture *next_active;
};

static struct capture *active_captures;
static uint64_t last_capture_id;
static struct CUgraph_st *graphs;        /* the graphs with a handle or an executable graph */
static struct CUgraphExec_st *graph_execs; /* the executable graphs not destroyed */
static __thread CUstreamCaptureMode thread_capture_mode; /* CU_STREAM_CAPTURE_MODE_GLOBAL */

/* The active capture sequence with this id, or NULL once it has ended. */
static struct capture *active_capture(uint64_t id)
{
	for (struct capture *c = active_captures; c != NULL; c = c->next_active)
		if (c->id == id)
			return c;
	return NULL;
}

static uintptr_t span_addr(const struct span *sp)
{
	return sp->a != NULL ? sp->a->base + sp->off : (uintptr_t)sp->host;
}

static int append_node(struct CUgraph_st *g, struct CUgraphNode_st *n)
{
	if (g->nnodes == g->cap_nodes) {
		size_t cap = g->cap_nodes ? 2 * g->cap_nodes : 16;
		struct CUgraphNode_st **nodes = realloc(g->nodes, cap * sizeof(*nodes));
		if (nodes == NULL)
			return -1;
		g->nodes = nodes;
		g->cap_nodes = cap;
	}
	g->nodes[g->nnodes++] = n;
	return 0;
}

/* Adds n to s's capture as s's latest node. */
static CUresult capture_append(struct CUstream_st *s, struct CUgraphNode_st *n)
{
	if (append_node(s->capture->graph, n) != 0) {
		free(n);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	s->cap_last = n;
	s->cap_unjoined = s != s->capture->origin;
	return CUDA_SUCCESS;
}

static struct graph_alloc *graph_alloc_of(struct CUgraph_st *g, const struct alloc *a)
{
	for (size_t i = 0; i < g->nallocs; i++)
		if (g->allocs[i].id == a->id)
			return &g->allocs[i];
	return NULL;
}

static CUresult capture_record(struct CUstream_st *s, struct op *op)
{
	struct capture *c = s->capture;

	if (c->invalidated) {
		if (op->type == OP_FREE)
			op->alloc->free_pending = 0; /* the free did not happen */
		return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	}
	if (op->type == OP_EVENT) {
		/* A record in capture is a dependency point for other streams, not a node. */
		op->event->capture_id = c->id;
		op->event->cap_stream = s;
		op->event->cap_node = s->cap_last;
		return CUDA_SUCCESS;
	}
	struct CUgraphNode_st *n = calloc(1, sizeof(*n));
	if (n == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	n->type = op->type;
	n->len = op->len;
	n->value = op->value;
	n->fn = op->fn;
	n->user = op->user;
	n->location = op->location;
	switch (op->type) {
	case OP_COPY:
		n->dst = span_addr(&op->dst);
		n->dst_known = op->dst.a != NULL;
		n->src = op->staging != NULL ? op->src_addr : span_addr(&op->src);
		n->src_known = op->src.a != NULL;
		break;
	case OP_MEMSET:
	case OP_PREFETCH:
		n->dst = span_addr(&op->dst);
		n->dst_known = 1;
		break;
	case OP_FREE: {
		struct graph_alloc *ga = graph_alloc_of(c->graph, op->alloc);
		if (ga != NULL) {
			/* Allocated and freed in this capture: the graph keeps the memory. */
			ga->freed = 1;
			op->alloc->free_pending = 0;
			n->noop = 1;
		} else {
			/* Freed at launch; until then the pointer is refused like any freed one. */
			n->dst = op->alloc->base;
			n->alloc_id = op->alloc->id;
		}
		break;
	}
	case OP_HOST_FN:
		break;
	default: /* OP_BARRIER: stream order inside the graph already holds */
		n->noop = 1;
		break;
	}
	return capture_append(s, n);
}

CUresult capture_alloc_refused(const struct CUstream_st *s)
{
	return s->capture != NULL && s->capture->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
							      : CUDA_SUCCESS;
}

CUresult capture_alloc(struct CUstream_st *s, struct alloc *a)
{
	if (s->capture == NULL)
		return CUDA_SUCCESS;
	struct CUgraph_st *g = s->capture->graph;
	struct graph_alloc *allocs = realloc(g->allocs, (g->nallocs + 1) * sizeof(*allocs));
	struct CUgraphNode_st *n = calloc(1, sizeof(*n));
	if (allocs != NULL)
		g->allocs = allocs;
	if (allocs == NULL || n == NULL) {
		free(n);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	g->allocs[g->nallocs++] = (struct graph_alloc){.base = a->base, .id = a->id};
	n->type = OP_BARRIER;
	n->noop = 1;
	return capture_append(s, n);
}

/* Whether a blocking stream of device captures; such captures are invalidated. */
static int capture_implicit(int device)
{
	int found = 0;

	for (struct CUstream_st *t = sim.streams; t != NULL; t = t->next) {
		if (t->capture != NULL && t->device == device && !t->legacy &&
		    !(t->flags & CU_STREAM_NON_BLOCKING)) {
			t->capture->invalidated = 1;
			found = 1;
		}
	}
	return found;
}

static int blocking_capture_on(int device)
{
	for (const struct CUstream_st *t = sim.streams; t != NULL; t = t->next)
		if (t->capture != NULL && t->device == device && !t->legacy &&
		    !(t->flags & CU_STREAM_NON_BLOCKING))
			return 1;
	return 0;
}

/* Synchronising or querying a capturing stream, or the legacy stream beside one, is refused. */
static CUresult capture_forbids_wait(struct CUstream_st *s)
{
	CUresult rc = CUDA_SUCCESS;

	pthread_mutex_lock(&sim.lock);
	if (s->capture != NULL) {
		s->capture->invalidated = 1;
		rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	} else if (s->legacy && capture_implicit(s->device)) {
		rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
	}
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

/* An event whose latest record was made during capture cannot be waited for by the host. */
static CUresult captured_event(struct CUevent_st *e)
{
	if (e->capture_id == 0)
		return CUDA_SUCCESS;
	struct capture *c = active_capture(e->capture_id);
	if (c != NULL)
		c->invalidated = 1;
	return CUDA_ERROR_CAPTURED_EVENT;
}

/*
 * cuStreamWaitEvent where capture is involved; *captured when the wait is
 * only a dependency inside a capture (nothing to queue).
 *  - an event recorded in an active capture: the waiting stream joins that
 *    capture (a fork), or, already in it, depends on the recording stream's
 *    work (a join); waiting from another capture would merge two sequences;
 *  - an event recorded in a capture that has ended: CUDA_ERROR_CAPTURED_EVENT;
 *  - a capturing stream waiting for an event recorded outside capture crosses
 *    the capture's boundary unless the wait is CU_EVENT_WAIT_EXTERNAL, which
 *    records an external wait node.
 */
static CUresult capture_wait(struct CUstream_st *s, struct CUevent_st *e, unsigned int flags,
			     int *captured)
{
	struct capture *c = e->capture_id != 0 ? active_capture(e->capture_id) : NULL;

	if (e->capture_id != 0 && c == NULL) { /* the capture has ended */
		if (s->capture != NULL)
			s->capture->invalidated = 1;
		return CUDA_ERROR_CAPTURED_EVENT;
	}
	if (c != NULL) {
		if (s->capture != NULL && s->capture != c) {
			s->capture->invalidated = 1;
			c->invalidated = 1;
			return CUDA_ERROR_STREAM_CAPTURE_MERGE;
		}
		if (s->legacy) {
			c->invalidated = 1;
			return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
		}
		if (c->invalidated)
			return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
		if (s->capture == NULL) {
			s->capture = c;
			s->cap_last = e->cap_node;
			s->cap_unjoined = 0;
		} else if (s->cap_last == NULL) {
			s->cap_last = e->cap_node;
		}
		if (e->cap_stream != s && e->cap_stream->capture == c &&
		    e->cap_stream->cap_last == e->cap_node)
			e->cap_stream->cap_unjoined = 0;
		*captured = 1;
		return CUDA_SUCCESS;
	}
	if (s->capture == NULL)
		return CUDA_SUCCESS;
	if (s->capture->invalidated)
		return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	if (!event_recorded(e)) { /* never recorded: waits for nothing, crosses nothing */
		*captured = 1;
		return CUDA_SUCCESS;
	}
	if (!(flags & CU_EVENT_WAIT_EXTERNAL)) {
		s->capture->invalidated = 1;
		return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
	}
	struct CUgraphNode_st *n = calloc(1, sizeof(*n));
	if (n == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	n->type = OP_BARRIER;
	n->event = e;
	*captured = 1;
	return capture_append(s, n);
}

/*
 * The calling thread's mode decides (cuThreadExchangeStreamCaptureMode):
 * global: forbidden while this thread has a capture not begun relaxed, or
 * another thread has a global one; thread-local: only this thread's
 * non-relaxed captures count; relaxed: allowed. The captures that forbid the
 * call are invalidated.
 */
CUresult capture_check_unsafe(void)
{
	pthread_t self = pthread_self();
	CUstreamCaptureMode mine = thread_capture_mode;
	int refused = 0;

	pthread_mutex_lock(&sim.lock);
	for (struct capture *c = active_captures; c != NULL; c = c->next_active) {
		int own = pthread_equal(c->owner, self);
		if ((own && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
		     mine != CU_STREAM_CAPTURE_MODE_RELAXED) ||
		    (!own && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
		     mine == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
			c->invalidated = 1;
			refused = 1;
		}
	}
	pthread_mutex_unlock(&sim.lock);
	return refused ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

static void graph_release(struct CUgraph_st *g);
static void graph_free(struct CUgraph_st *g);

/* Drops a reference; the last one frees the graph, its nodes and the memory it owns. */
static void graph_put(struct CUgraph_st *g)
{
	pthread_mutex_lock(&sim.lock);
	int last = --g->refs == 0;
	int owns = g->nallocs > 0;
	pthread_mutex_unlock(&sim.lock);
	if (!last)
		return;
	if (owns)
		stream_sync_device(g->device); /* launches may still use the memory */
	pthread_mutex_lock(&sim.lock);
	graph_release(g);
	graph_free(g);
	pthread_mutex_unlock(&sim.lock);
}

/* Unlinks and frees released graph g (sim.lock held): its handle is refused from now on. */
static void graph_free(struct CUgraph_st *g)
{
	for (struct CUgraph_st **p = &graphs; *p != NULL; p = &(*p)->next) {
		if (*p == g) {
			*p = g->next;
			break;
		}
	}
	free(g);
}

/* The allocation a graph refers to by base and id, if it still exists (sim.lock held). */
static struct alloc *graph_alloc_find(uintptr_t base, uint64_t id)
{
	struct alloc *a = mem_find(base);

	return a != NULL && a->base == base && a->id == id ? a : NULL;
}

/*
 * Frees g's nodes and the memory it owns (sim.lock held, no launch pending).
 * Memory whose free no launch performed is the program's again.
 */
static void graph_release(struct CUgraph_st *g)
{
	for (size_t i = 0; i < g->nallocs; i++) {
		/* A context reset may have freed it already. */
		struct alloc *a = graph_alloc_find(g->allocs[i].base, g->allocs[i].id);
		if (a != NULL)
			mem_release(a);
	}
	for (size_t i = 0; i < g->nnodes; i++) {
		const struct CUgraphNode_st *n = g->nodes[i];
		struct alloc *a = n->type == OP_FREE && !n->noop ? graph_alloc_find(n->dst, n->alloc_id)
								 : NULL;
		if (a != NULL && a->free_pending && a->free_stream == NULL)
			a->free_pending = 0;
	}
	for (size_t i = 0; i < g->nnodes; i++)
		free(g->nodes[i]);
	free(g->nodes);
	free(g->allocs);
	g->nodes = NULL;
	g->allocs = NULL;
	g->nnodes = g->cap_nodes = g->nallocs = 0;
}

static struct CUgraph_st *graph_lookup(CUgraph h)
{
	for (struct CUgraph_st *g = graphs; g != NULL; g = g->next)
		if (g == h)
			return g->magic == GRAPH_MAGIC && !g->destroyed ? g : NULL;
	return NULL;
}

static struct CUgraphExec_st *exec_lookup(CUgraphExec h)
{
	for (struct CUgraphExec_st *x = graph_execs; x != NULL; x = x->next)
		if (x == h)
			return x;
	return NULL;
}

static CUresult begin_capture(CUstream hStream, CUstreamCaptureMode mode)
{
	struct CUstream_st *s;

	if ((unsigned int)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (s->legacy)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot capture */
	struct capture *c = calloc(1, sizeof(*c));
	struct CUgraph_st *g = calloc(1, sizeof(*g));
	if (c == NULL || g == NULL) {
		free(c);
		free(g);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_lock(&sim.lock);
	if (s->capture != NULL) {
		pthread_mutex_unlock(&sim.lock);
		free(c);
		free(g);
		return CUDA_ERROR_ILLEGAL_STATE;
	}
	g->magic = GRAPH_MAGIC;
	g->refs = 1;
	g->capturing = 1;
	g->device = s->device;
	g->next = graphs;
	graphs = g;
	c->id = ++last_capture_id;
	c->mode = mode;
	c->owner = pthread_self();
	c->active = 1;
	c->origin = s;
	c->graph = g;
	c->next_active = active_captures;
	active_captures = c;
	s->capture = c;
	s->cap_last = NULL;
	s->cap_unjoined = 0;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

/* Ends c (sim.lock held): every stream leaves it; memory it did not free is the program's. */
static void capture_finish(struct capture *c)
{
	struct CUgraph_st *g = c->graph;
	size_t kept = 0;

	for (struct CUstream_st *t = sim.streams; t != NULL; t = t->next) {
		if (t->capture == c) {
			t->capture = NULL;
			t->cap_last = NULL;
			t->cap_unjoined = 0;
		}
	}
	for (struct capture **p = &active_captures; *p != NULL; p = &(*p)->next_active) {
		if (*p == c) {
			*p = c->next_active;
			break;
		}
	}
	c->active = 0;
	g->capturing = 0;
	for (size_t i = 0; i < g->nallocs; i++)
		if (g->allocs[i].freed)
			g->allocs[kept++] = g->allocs[i];
	g->nallocs = kept;
}

/*
 * A capturing stream being destroyed invalidates its capture; the capture
 * ends with it if it began there (nobody could end it any more), and the
 * graph is discarded once its last reference goes.
 */
static void capture_leave(struct CUstream_st *s)
{
	struct capture *c = s->capture;

	if (c == NULL)
		return;
	c->invalidated = 1;
	if (c->origin != s) {
		s->capture = NULL;
		s->cap_last = NULL;
		s->cap_unjoined = 0;
		return;
	}
	capture_finish(c);
	/* The capture held the only reference (a graph being captured cannot be
	 * instantiated or destroyed), and it was never launched. */
	c->graph->refs = 0;
	graph_release(c->graph);
	graph_free(c->graph);
	free(c);
}

static CUresult end_capture(CUstream hStream, CUgraph *phGraph)
{
	struct CUstream_st *s;

	if (phGraph == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&sim.lock);
	struct capture *c = s->capture;
	if (c == NULL)
		rc = CUDA_ERROR_ILLEGAL_STATE;
	else if (c->origin != s)
		rc = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
	else if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->owner, pthread_self()))
		rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
	if (rc != CUDA_SUCCESS) {
		pthread_mutex_unlock(&sim.lock);
		return rc;
	}
	int unjoined = 0;
	for (const struct CUstream_st *t = sim.streams; t != NULL; t = t->next)
		unjoined |= t->capture == c && t->cap_unjoined;
	capture_finish(c);
	struct CUgraph_st *g = c->graph;
	rc = c->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
	     : unjoined	    ? CUDA_ERROR_STREAM_CAPTURE_UNJOINED
			    : CUDA_SUCCESS;
	free(c);
	if (rc != CUDA_SUCCESS) {
		g->destroyed = 1;
		*phGraph = NULL;
		pthread_mutex_unlock(&sim.lock);
		graph_put(g);
		return rc;
	}
	*phGraph = g;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

static CUresult capture_info(CUstream hStream, CUstreamCaptureStatus *status, cuuint64_t *id,
			     CUgraph *graph, const CUgraphNode **deps, size_t *ndeps)
{
	struct CUstream_st *s;

	if (status == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&sim.lock);
	/* Documented: the legacy stream beside a capturing blocking stream answers IMPLICIT,
	 * without invalidating the capture. */
	if (s->legacy && blocking_capture_on(s->device)) {
		pthread_mutex_unlock(&sim.lock);
		return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
	}
	struct capture *c = s->capture;
	*status = c == NULL	     ? CU_STREAM_CAPTURE_STATUS_NONE
		  : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
				   : CU_STREAM_CAPTURE_STATUS_ACTIVE;
	if (c != NULL) {
		if (id != NULL)
			*id = c->id;
		if (graph != NULL)
			*graph = c->graph;
		/* The stream's latest node; valid until the next call on the stream. */
		if (deps != NULL)
			*deps = (const CUgraphNode *)&s->cap_last;
		if (ndeps != NULL)
			*ndeps = s->cap_last != NULL;
	}
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
	ENTER(ENTER_INIT);
	return begin_capture(hStream, mode);
}

SIM_API CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	ENTER(ENTER_INIT);
	return end_capture(hStream, phGraph);
}

SIM_API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	ENTER(ENTER_INIT);
	return capture_info(hStream, captureStatus, NULL, NULL, NULL, NULL);
}

SIM_API CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
					   cuuint64_t *id_out, CUgraph *graph_out,
					   const CUgraphNode **dependencies_out,
					   size_t *numDependencies_out)
{
	ENTER(ENTER_INIT);
	return capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out,
			    numDependencies_out);
}

SIM_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	ENTER(ENTER_INIT);
	if (mode == NULL || (unsigned int)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	CUstreamCaptureMode old = thread_capture_mode;
	thread_capture_mode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
					     unsigned long long flags)
{
	const unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
					 CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
					 CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
					 CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;

	ENTER(ENTER_INIT);
	if (phGraphExec == NULL || (flags & ~known))
		return CUDA_ERROR_INVALID_VALUE;
	struct CUgraphExec_st *x = calloc(1, sizeof(*x));
	if (x == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&sim.lock);
	struct CUgraph_st *g = graph_lookup(hGraph);
	if (g == NULL || g->capturing) {
		pthread_mutex_unlock(&sim.lock);
		free(x);
		return CUDA_ERROR_INVALID_VALUE;
	}
	g->refs++; /* the executable graph keeps the nodes and memory past cuGraphDestroy */
	x->magic = GRAPH_EXEC_MAGIC;
	x->graph = g;
	x->next = graph_execs;
	graph_execs = x;
	pthread_mutex_unlock(&sim.lock);
	*phGraphExec = x;
	return CUDA_SUCCESS;
}

/*
 * The operation that replays n on device's stream, its addresses resolved
 * and its virtual-memory access checked now, as a direct call's would be
 * (sim.lock held).
 */
static CUresult node_op(const struct CUgraphNode_st *n, int device, struct op **out)
{
	struct op *op = op_new(n->type);
	CUresult rc = CUDA_SUCCESS;
	struct alloc *a;

	if (op == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->len = n->len;
	op->value = n->value;
	op->fn = n->fn;
	op->user = n->user;
	op->location = n->location;
	switch (n->type) {
	case OP_COPY:
		rc = mem_resolve(n->dst, n->len, n->dst_known, &op->dst);
		if (rc == CUDA_SUCCESS)
			rc = mem_resolve(n->src, n->len, n->src_known, &op->src);
		if (rc == CUDA_SUCCESS &&
		    (!vmm_accessible(&op->dst, n->len, device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) ||
		     !vmm_accessible(&op->src, n->len, device, CU_MEM_ACCESS_FLAGS_PROT_READ)))
			rc = CUDA_ERROR_INVALID_VALUE;
		break;
	case OP_MEMSET:
		rc = mem_resolve(n->dst, n->len, 1, &op->dst);
		if (rc == CUDA_SUCCESS &&
		    !vmm_accessible(&op->dst, n->len, device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
			rc = CUDA_ERROR_INVALID_VALUE;
		break;
	case OP_PREFETCH:
		a = mem_find(n->dst);
		if (a == NULL || a->kind != ALLOC_MANAGED || n->len > a->size - (n->dst - a->base)) {
			rc = CUDA_ERROR_INVALID_VALUE;
			break;
		}
		op->dst.a = a;
		op->dst.host = (char *)a->base;
		op->dst.off = n->dst - a->base;
		break;
	case OP_FREE:
		a = graph_alloc_find(n->dst, n->alloc_id);
		/* Only once, and only if nothing else freed it since the capture. */
		if (a == NULL || !a->free_pending || a->free_stream != NULL) {
			rc = CUDA_ERROR_INVALID_VALUE;
			break;
		}
		op->alloc = a;
		op->dst.host = (char *)a->base;
		break;
	case OP_BARRIER: /* an external event wait: its latest record at launch */
		if (event_lookup(n->event) == CUDA_SUCCESS && event_recorded(n->event) &&
		    n->event->capture_id == 0 && op_add_dep(op, n->event->stream, n->event->seq))
			rc = CUDA_ERROR_OUT_OF_MEMORY;
		break;
	default:
		break;
	}
	if (rc != CUDA_SUCCESS) {
		op_free(op);
		return rc;
	}
	*out = op;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	struct CUstream_st *s;

	ENTER(ENTER_INIT);
	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&sim.lock);
	struct CUgraphExec_st *x = exec_lookup(hGraphExec);
	if (x == NULL) {
		pthread_mutex_unlock(&sim.lock);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	struct CUgraph_st *g = x->graph;
	struct op **ops = calloc(g->nnodes ? g->nnodes : 1, sizeof(*ops));
	size_t nops = 0;
	if (ops == NULL)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	for (size_t i = 0; rc == CUDA_SUCCESS && i < g->nnodes; i++)
		if (!g->nodes[i]->noop)
			rc = node_op(g->nodes[i], s->device, &ops[nops++]);
	if (rc != CUDA_SUCCESS && nops > 0)
		nops--; /* the failed one was not made */
	pthread_mutex_unlock(&sim.lock);
	/* Everything resolved or nothing submitted: a launch never half-runs on bad memory. */
	for (size_t i = 0; i < nops; i++) {
		if (rc == CUDA_SUCCESS)
			rc = stream_submit(s, ops[i], NULL);
		else
			op_free(ops[i]);
	}
	free(ops);
	return rc;
}

SIM_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	ENTER(ENTER_INIT);
	pthread_mutex_lock(&sim.lock);
	struct CUgraphExec_st *x = exec_lookup(hGraphExec);
	for (struct CUgraphExec_st **p = &graph_execs; x != NULL && *p != NULL; p = &(*p)->next) {
		if (*p == x) {
			*p = x->next;
			break;
		}
	}
	pthread_mutex_unlock(&sim.lock);
	if (x == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	graph_put(x->graph);
	free(x);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphDestroy(CUgraph hGraph)
{
	ENTER(ENTER_INIT);
	pthread_mutex_lock(&sim.lock);
	struct CUgraph_st *g = graph_lookup(hGraph);
	if (g != NULL && g->capturing)
		g = NULL; /* the capture still builds it: cuStreamEndCapture hands it out */
	if (g != NULL)
		g->destroyed = 1;
	pthread_mutex_unlock(&sim.lock);
	if (g == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	graph_put(g);
	return CUDA_SUCCESS;
}

/* The per-thread default stream variants. */
PER_THREAD(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture_v2,
	   (CUstream h, CUstreamCaptureMode m), (h, m))
PER_THREAD(cuStreamEndCapture_ptsz, cuStreamEndCapture, (CUstream h, CUgraph *g), (h, g))
PER_THREAD(cuStreamIsCapturing_ptsz, cuStreamIsCapturing,
	   (CUstream h, CUstreamCaptureStatus *st), (h, st))
PER_THREAD(cuStreamGetCaptureInfo_v2_ptsz, cuStreamGetCaptureInfo_v2,
	   (CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
	    const CUgraphNode **d, size_t *n),
	   (h, st, id, g, d, n))
PER_THREAD(cuGraphLaunch_ptsz, cuGraphLaunch, (CUgraphExec x, CUstream h), (x, h))
