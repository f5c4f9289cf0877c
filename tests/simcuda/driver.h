/*
 * driver.h - internals of the simulated CUDA driver (libcuda.so.1), shared by
 * driver.c (initialisation, devices, contexts, entry points, statistics),
 * memory.c (allocations, copies, managed residency) and streams.c (streams,
 * events, host functions and their worker threads).
 *
 * One process-wide mutex, sim.lock, guards every table below; one condition
 * variable, sim.progress, is broadcast whenever a stream finishes an
 * operation, and everything that waits for device work waits on it. Nothing
 * holds sim.lock while it runs a host function or moves bytes.
 */
#ifndef SIMCUDA_DRIVER_H
#define SIMCUDA_DRIVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "spillway/cuda.h"

#include "devices.h"

#define SIM_API __attribute__((visibility("default")))

/* Managed memory residency is tracked per block of this size (UVM's large page). */
#define SIM_MANAGED_BLOCK ((size_t)2 << 20)
/* Device allocations are charged in multiples of this many bytes. */
#define SIM_ALLOC_GRANULE 512u

enum alloc_kind { ALLOC_DEVICE, ALLOC_MANAGED, ALLOC_HOST };

/* Where a managed block lives, and the advice that steers it. */
struct mblock {
	int8_t location;  /* CU_DEVICE_CPU or a device ordinal */
	int8_t preferred; /* CU_DEVICE_INVALID (none), CU_DEVICE_CPU or a device ordinal */
	uint16_t accessed_by; /* bit per device ordinal */
	uint8_t read_mostly;
	uint64_t last_use; /* sim.clock at the last device access, for eviction order */
};

struct alloc {
	uintptr_t base; /* the address the application sees */
	size_t size;    /* requested bytes */
	size_t map_size;
	char *backing;  /* where the bytes live in this process (== base unless ALLOC_DEVICE) */
	enum alloc_kind kind;
	/* ALLOC_HOST memory the application owns, page-locked by cuMemHostRegister:
	 * never mapped or unmapped here, and map_size == size. */
	int registered;
	int device;     /* device charged / current when allocated */
	struct CUctx_st *ctx; /* the context it was allocated in, freed with it; pool
	                       * memory outlives a created context, then the primary's */
	uint64_t id;
	uint64_t charge; /* bytes charged to device.plain_bytes (ALLOC_DEVICE) */
	unsigned int flags;
	int free_pending; /* a stream-ordered free is queued */
	int stream_ordered; /* made by cuMemAllocAsync (from a pool): cuMemFree does not
	                     * synchronise, and a created context's destruction leaves it */
	struct CUmemPoolHandle_st *pool; /* the memory pool it came from (stream-ordered only) */
	int ipc_exported;   /* its bytes live in ipc_fd, a memfd other processes open */
	int ipc_fd;
	int ipc_opened;     /* a mapping of another process's memory (cuIpcOpenMemHandle_v2) */
	struct CUstream_st *free_stream; /* where the queued stream-ordered free sits */
	uint64_t free_seq;               /* and its sequence number there */
	size_t nblocks;   /* ALLOC_MANAGED only */
	struct mblock *blocks;
};

struct sim_device {
	int physical; /* index in SIMCUDA_DEVICES (and NVML's), whatever CUDA_VISIBLE_DEVICES makes the ordinal */
	uint64_t capacity;
	uint64_t plain_bytes;       /* device allocations (cuMemAlloc*, pitch, async) */
	uint64_t ctx_bytes;         /* taken by the device's live contexts */
	uint64_t managed_dev_bytes; /* managed blocks resident here */
	uint64_t managed_host_bytes; /* managed blocks of allocations made here, on the host */
	uint64_t pinned_bytes;      /* cuMemAllocHost, cuMemHostAlloc */
	uint64_t registered_bytes;  /* cuMemHostRegister: page-locked, never device memory */
	uint64_t vmm_bytes;         /* cuMemCreate physical memory here (vmm.c), part of plain_bytes */
	uint64_t peak;
	uint64_t live_allocs;
	uint64_t others_bytes; /* other processes' usage, as last read from the state folder */
	int ctx_refs;
	int ctx_active;
	unsigned int primary_flags; /* cuDevicePrimaryCtxSetFlags */
	struct CUctx_st *ctx;
	struct CUstream_st *legacy; /* the legacy default stream, made with the first context */
};

/*
 * A context: the device's primary one (sim_device.ctx), or one made with
 * cuCtxCreate. Created contexts are never freed, only marked destroyed, so a
 * stale handle is recognised and refused.
 */
struct CUctx_st {
	uint32_t magic;
	int device;
	int primary;
	int destroyed;      /* created contexts only */
	unsigned int flags; /* created contexts only */
	int usage;          /* cuCtxAttach/cuCtxDetach count of a created context */
	uint64_t bytes;     /* SIMCUDA_CONTEXT_BYTES taken while live */
	int cache_config, shmem_config; /* kept and reported; no kernel uses them */
	size_t limits[7];               /* cuCtxSetLimit values, by CUlimit */
	unsigned int limits_set;        /* bit per CUlimit set */
	struct CUctx_st *next; /* in sim.contexts */
};

struct sim {
	pthread_mutex_t lock;
	pthread_cond_t progress;
	int initialized;
	pid_t init_pid;
	int ndev;
	struct sim_device dev[SIMCUDA_MAX_DEVICES];
	uint64_t context_bytes;
	int no_managed;
	int no_vmm; /* SIMCUDA_NO_VMM=1: the virtual memory management API is unsupported */
	int no_host_access; /* SIMCUDA_NO_HOST_ACCESS=1: cuMemSetAccess refuses host locations */
	int no_host_register; /* SIMCUDA_NO_HOST_REGISTER=1: cuMemHostRegister is unsupported */
	int peer;   /* SIMCUDA_PEER=1: every device can access every other's memory (P2P) */
	uint64_t clock;     /* logical time for managed eviction order */
	uint64_t next_id;   /* allocation ids */
	uint64_t memcpy_bytes[4]; /* indexed by enum copy_class */
	struct alloc **allocs;    /* sorted by base */
	size_t nallocs, cap_allocs;
	struct CUstream_st *streams; /* every stream ever made, newest first */
	struct CUevent_st *events;   /* every event ever made, newest first */
	struct CUctx_st *contexts;   /* every context cuCtxCreate made, newest first */
};

enum copy_class { COPY_H2D, COPY_D2H, COPY_D2D, COPY_H2H };

extern struct sim sim;
extern __thread int sim_in_host_fn;
/* Non-zero inside a _ptsz/_ptds entry point: the NULL stream means the per-thread one. */
extern __thread int sim_ptds;

/* A _ptsz/_ptds entry point: the same call with the per-thread default stream. */
#define PER_THREAD(variant, base, params, args) \
	SIM_API CUresult variant params         \
	{                                       \
		sim_ptds++;                     \
		CUresult rc = base args;        \
		sim_ptds--;                     \
		return rc;                      \
	}

/* Entry of every API function: counts the call, refuses it when the driver
 * cannot serve it, and applies fault injection. counter caches, per call
 * site, where name's count lives, so that a call costs an atomic add. */
enum { ENTER_ANY = 0, ENTER_INIT = 1 };
CUresult sim_enter(const char *name, int need, uint64_t **counter);
#define ENTER(need)                                                              \
	do {                                                                     \
		static uint64_t *enter_counter_;                                 \
		CUresult enter_rc_ = sim_enter(__func__, (need), &enter_counter_); \
		if (enter_rc_ != CUDA_SUCCESS)                                   \
			return enter_rc_;                                        \
	} while (0)

/* The device of the calling thread's current context (CUDA_ERROR_INVALID_CONTEXT when none). */
CUresult sim_current_device(int *device);
/* The calling thread's current context, or NULL. */
struct CUctx_st *sim_current_ctx(void);
int sim_valid_device(int device);
/* The device attribute table's value of attrib (a texture limit: the same on every device). */
int sim_device_limit(int attrib);

/* memory.c; all with sim.lock held. */
struct alloc *mem_find(uintptr_t addr);
void mem_usage_changed(int device);
uint64_t mem_used(int device);
void mem_refresh_others(int device);
int mem_make_room(int device, uint64_t need, const struct alloc *keep);
CUresult mem_alloc(int device, size_t size, enum alloc_kind kind, unsigned int flags,
		   struct alloc **out);
void mem_release(struct alloc *a);
/* Frees every allocation and array made in ctx; for a primary context also evicts managed blocks from its device. */
void mem_release_context(const struct CUctx_st *ctx);
void mem_managed_access(struct alloc *a, size_t off, size_t len, int device);
void mem_managed_prefetch(struct alloc *a, size_t off, size_t len, int location);

/* A resolved operand of a copy or memset. */
struct span {
	char *host;       /* where to read or write in this process */
	struct alloc *a;  /* NULL for pageable host memory */
	size_t off;
};
CUresult mem_resolve(uintptr_t addr, size_t len, int must_be_known, struct span *out);

/*
 * vmm.c: the virtual memory management API. Its mappings are not in
 * sim.allocs; these hooks let memory.c and driver.c see them. With sim.lock held.
 */
/*
 * A span of mapped VMM memory that some device may read; CUDA_ERROR_NOT_FOUND
 * when addr is in no reservation.
 */
CUresult vmm_resolve(uintptr_t addr, size_t len, struct span *out);
/*
 * Whether device has the access need (CU_MEM_ACCESS_FLAGS_PROT_READ or
 * _READWRITE) to all of a span; always true for memory that is not VMM.
 */
int vmm_accessible(const struct span *s, size_t len, int device, unsigned int need);
/* The mapping that holds addr, or NULL. */
struct alloc *vmm_find(uintptr_t addr);
/* For a mapping vmm_find gave: 1, with the base and size of its reservation; else 0. */
int vmm_reservation_of(const struct alloc *a, uintptr_t *base, size_t *size);
/* Whether any reservation overlaps [addr, addr+len). */
int vmm_overlaps(uintptr_t addr, size_t len);
/* Device attributes of the VMM API: 1 with *value set when attrib is one of them. */
int vmm_device_attribute(int attrib, int *value);
struct vmm_totals {
	uint64_t host_bytes;     /* physical bytes of live host-located allocations */
	uint64_t reserved_bytes; /* address space reserved */
	uint64_t mapped_bytes;   /* address space mapped */
	uint64_t handles;        /* live physical allocations */
};
void vmm_get_totals(struct vmm_totals *out);

/* arrays.c; with sim.lock held. */
/* Destroys the arrays made in ctx. */
void array_release_context(const struct CUctx_st *ctx);
/* Bytes the live arrays take on device (part of plain_bytes). */
uint64_t array_device_bytes(int device);

/* streams.c */
enum op_type { OP_COPY, OP_MEMSET, OP_HOST_FN, OP_EVENT, OP_BARRIER, OP_FREE, OP_PREFETCH };
struct op {
	struct op *next;
	enum op_type type;
	uint64_t seq;
	int ndeps;
	struct dep {
		struct CUstream_st *stream;
		uint64_t seq;
	} *deps;
	struct span dst, src;
	size_t len;
	unsigned char value;
	void *staging; /* freed when the op completes */
	CUhostFn fn;
	void *user;
	struct CUevent_st *event;
	uint64_t event_id;
	struct alloc *alloc;
	int location;
	uintptr_t src_addr; /* a copy's source as given, before staging (graph nodes re-read it) */
};

struct CUstream_st {
	uint32_t magic;
	int device;
	/* The context cuStreamCreate made it in, whose synchronization waits for
	 * it and whose destruction or reset destroys it; NULL for the legacy and
	 * per-thread streams, shared by every context of the device here. */
	struct CUctx_st *ctx;
	unsigned int flags;
	int legacy;
	int per_thread;
	int destroyed;
	int worker_exited; /* destroyed, drained, its worker gone: reusable */
	struct op *head, *tail;
	uint64_t submitted, completed;
	pthread_cond_t wake;
	struct CUstream_st *next;
	/* Stream capture (streams.c): the sequence this stream records into, or NULL. */
	struct capture *capture;
	struct CUgraphNode_st *cap_last; /* its latest node: what the next one depends on */
	int cap_unjoined; /* it recorded work that no other stream of the capture waited for */
};

struct CUevent_st {
	uint32_t magic;
	int device; /* current when created; it records only on this device's streams */
	struct CUctx_st *ctx; /* current when created: destroying or resetting it destroys the event */
	unsigned int flags;
	int destroyed;
	uint64_t record_id, done_id;
	uint64_t first_id;          /* record_id when created: recorded once they differ */
	struct CUstream_st *stream; /* of the latest record */
	uint64_t seq;               /* of the latest record's operation */
	double done_ms;             /* CLOCK_MONOTONIC at completion */
	struct CUevent_st *next;
	/* The id of the capture sequence of the latest record when it was
	 * recorded during capture, or 0; the sequence is freed when it ends. */
	uint64_t capture_id;
	struct CUstream_st *cap_stream;  /* the capturing stream it was recorded on */
	struct CUgraphNode_st *cap_node; /* that stream's latest node at the record */
};

/* Runs a copy, memset, prefetch or stream-ordered free on a worker of a stream of device. */
void mem_execute(struct op *op, int device);

CUresult stream_create_locked(int device, unsigned int flags, int legacy, int per_thread,
			      struct CUstream_st **out);
CUresult stream_lookup(CUstream handle, struct CUstream_st **out);
CUresult stream_submit(struct CUstream_st *s, struct op *op, uint64_t *seq);
void stream_wait_seq(struct CUstream_st *s, uint64_t seq);
CUresult stream_sync_device(int device);
/* Waits for the work of ctx: its streams and the device's shared ones. */
void stream_sync_context(const struct CUctx_st *ctx);
/* Destroys the streams and events made in ctx, destroyed or reset (sim.lock held). */
void streams_destroy_context(const struct CUctx_st *ctx);
struct op *op_new(enum op_type type);
void op_free(struct op *op);
/* Makes op, not yet submitted, wait for operation seq of stream s; -1 when out of memory. */
int op_add_dep(struct op *op, struct CUstream_st *s, uint64_t seq);

/*
 * Stream capture (streams.c). capture_check_unsafe: entry of every
 * potentially unsafe call (synchronous allocation and free, context
 * synchronisation): CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the
 * captures that forbid it, when the calling thread's capture mode forbids it.
 * With sim.lock held: capture_alloc_refused answers whether an allocation on
 * s may proceed (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED when its capture is);
 * capture_alloc records a cuMemAllocAsync made on a capturing stream.
 */
CUresult capture_check_unsafe(void);
CUresult capture_alloc_refused(const struct CUstream_st *s);
CUresult capture_alloc(struct CUstream_st *s, struct alloc *a);

#endif
