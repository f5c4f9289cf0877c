/*
 * memory.c - device, managed and pinned host memory of the simulated driver.
 *
 * Every allocation is its own mmap, so no device pointer can ever overlap a
 * live host allocation. A device allocation reserves its address range with
 * PROT_NONE, exactly as a discrete GPU's memory is unreachable from the CPU,
 * and keeps its bytes in a second, lazily backed (MAP_NORESERVE) mapping that
 * only the stream workers touch. Managed and pinned memory are ordinary
 * read-write mappings at the address the application sees; registered host
 * memory (cuMemHostRegister) is the application's own, only recorded here.
 *
 * Capacity is enforced on what is resident on a device: plain allocations,
 * the context's bytes and the managed blocks that live there, plus what the
 * other simcuda processes publish in the state folder, since every process
 * on a GPU shares its memory. Managed blocks
 * move between host and device by the residency model of mem_managed_access
 * and mem_managed_prefetch; when a device fills up, its least recently used
 * managed blocks are evicted to the host, as UVM does, before anything fails.
 * IPC handles (end of file) share a device allocation's bytes with other
 * processes through a memfd.
 */
#define _GNU_SOURCE
#include "driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "state.h"

static size_t page_size(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

/* Rounds v up to a multiple of a; 0 when that overflows. */
static size_t round_up(size_t v, size_t a)
{
	if (v > SIZE_MAX - (a - 1))
		return 0;
	return (v + a - 1) / a * a;
}

static void pool_released(const struct alloc *a);

/* Index of the first allocation whose base is above addr. */
static size_t upper_bound(uintptr_t addr)
{
	size_t lo = 0, hi = sim.nallocs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (sim.allocs[mid]->base <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct alloc *mem_find(uintptr_t addr)
{
	size_t i = upper_bound(addr);

	if (i == 0)
		return NULL;
	struct alloc *a = sim.allocs[i - 1];
	return addr - a->base < a->size ? a : NULL;
}

static int table_insert(struct alloc *a)
{
	if (sim.nallocs == sim.cap_allocs) {
		size_t cap = sim.cap_allocs ? sim.cap_allocs * 2 : 64;
		struct alloc **n = realloc(sim.allocs, cap * sizeof(*n));
		if (n == NULL)
			return -1;
		sim.allocs = n;
		sim.cap_allocs = cap;
	}
	size_t i = upper_bound(a->base);
	memmove(&sim.allocs[i + 1], &sim.allocs[i], (sim.nallocs - i) * sizeof(*sim.allocs));
	sim.allocs[i] = a;
	sim.nallocs++;
	return 0;
}

static void table_remove(struct alloc *a)
{
	size_t i = upper_bound(a->base) - 1;

	memmove(&sim.allocs[i], &sim.allocs[i + 1], (sim.nallocs - i - 1) * sizeof(*sim.allocs));
	sim.nallocs--;
}

struct others_scan {
	int device; /* the index in the state files: sim_device.physical */
	pid_t self;
	uint64_t bytes;
};

static void add_other(const struct simstate_process *proc, void *arg)
{
	struct others_scan *scan = arg;

	if (proc->pid != scan->self && (uint32_t)scan->device < proc->device_count)
		scan->bytes += proc->device_bytes[scan->device];
}

/*
 * Reads the other processes' usage of device. Called without sim.lock (it
 * reads a folder), before an operation that checks capacity.
 */
void mem_refresh_others(int device)
{
	struct others_scan scan = {sim.dev[device].physical, getpid(), 0};

	if (simstate_scan(add_other, &scan) != 0)
		return; /* unreadable folder: keep the last known value */
	pthread_mutex_lock(&sim.lock);
	sim.dev[device].others_bytes = scan.bytes;
	pthread_mutex_unlock(&sim.lock);
}

/* What this process may still use on device, others' usage taken out. */
static uint64_t capacity_left_for_us(int device)
{
	const struct sim_device *d = &sim.dev[device];
	return d->others_bytes < d->capacity ? d->capacity - d->others_bytes : 0;
}

uint64_t mem_used(int device)
{
	const struct sim_device *d = &sim.dev[device];
	return d->plain_bytes + d->ctx_bytes + d->managed_dev_bytes;
}

void mem_usage_changed(int device)
{
	uint64_t used = mem_used(device);

	if (used > sim.dev[device].peak)
		sim.dev[device].peak = used;
	simstate_set_device_bytes(sim.dev[device].physical, used); /* NVML counts by its own index */
}

static size_t block_bytes(const struct alloc *a, size_t i)
{
	size_t start = i * SIM_MANAGED_BLOCK;
	return a->size - start < SIM_MANAGED_BLOCK ? a->size - start : SIM_MANAGED_BLOCK;
}

/* Moves one managed block to location (CU_DEVICE_CPU or a device) and fixes the counters. */
static void block_move(struct alloc *a, size_t i, int location)
{
	struct mblock *b = &a->blocks[i];
	uint64_t bytes = block_bytes(a, i);

	if (b->location == location)
		return;
	if (b->location == CU_DEVICE_CPU)
		sim.dev[a->device].managed_host_bytes -= bytes;
	else
		sim.dev[b->location].managed_dev_bytes -= bytes;
	if (location == CU_DEVICE_CPU)
		sim.dev[a->device].managed_host_bytes += bytes;
	else
		sim.dev[location].managed_dev_bytes += bytes;
	if (b->location != CU_DEVICE_CPU)
		mem_usage_changed(b->location);
	b->location = (int8_t)location;
	if (location != CU_DEVICE_CPU)
		mem_usage_changed(location);
}

int mem_make_room(int device, uint64_t need, const struct alloc *keep)
{
	uint64_t cap = capacity_left_for_us(device);

	while (cap < mem_used(device) || cap - mem_used(device) < need) {
		struct alloc *victim = NULL;
		size_t vblock = 0;
		uint64_t oldest = UINT64_MAX;

		for (size_t i = 0; i < sim.nallocs; i++) {
			struct alloc *a = sim.allocs[i];
			if (a->kind != ALLOC_MANAGED || a == keep)
				continue;
			for (size_t j = 0; j < a->nblocks; j++) {
				if (a->blocks[j].location == device && a->blocks[j].last_use < oldest) {
					oldest = a->blocks[j].last_use;
					victim = a;
					vblock = j;
				}
			}
		}
		if (victim == NULL)
			return -1;
		block_move(victim, vblock, CU_DEVICE_CPU);
	}
	return 0;
}

CUresult mem_alloc(int device, size_t size, enum alloc_kind kind, unsigned int flags,
		   struct alloc **out)
{
	struct sim_device *d = &sim.dev[device];
	size_t map_size = round_up(size, page_size());
	uint64_t charge = 0;

	if (size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (map_size == 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (kind == ALLOC_DEVICE) {
		uint64_t cap = capacity_left_for_us(device);
		charge = round_up(size, SIM_ALLOC_GRANULE);
		if (charge == 0 || charge > cap || d->plain_bytes + d->ctx_bytes > cap - charge)
			return CUDA_ERROR_OUT_OF_MEMORY;
	}

	struct alloc *a = calloc(1, sizeof(*a));
	if (a == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	a->size = size;
	a->map_size = map_size;
	a->kind = kind;
	a->device = device;
	a->ctx = sim_current_ctx();
	if (a->ctx == NULL || a->ctx->device != device)
		a->ctx = sim.dev[device].ctx;
	a->flags = flags;
	a->charge = charge;
	a->id = ++sim.next_id;

	int prot = kind == ALLOC_DEVICE ? PROT_NONE : PROT_READ | PROT_WRITE;
	int mflags = MAP_PRIVATE | MAP_ANONYMOUS | (kind == ALLOC_HOST ? 0 : MAP_NORESERVE);
	void *va = mmap(NULL, map_size, prot, mflags, -1, 0);
	if (va == MAP_FAILED)
		goto oom;
	a->base = (uintptr_t)va;
	a->backing = va;
	if (kind == ALLOC_DEVICE) {
		void *bytes = mmap(NULL, map_size, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (bytes == MAP_FAILED) {
			munmap(va, map_size);
			goto oom;
		}
		a->backing = bytes;
	}
	if (kind == ALLOC_MANAGED) {
		a->nblocks = (size + SIM_MANAGED_BLOCK - 1) / SIM_MANAGED_BLOCK;
		a->blocks = calloc(a->nblocks, sizeof(*a->blocks));
		if (a->blocks == NULL)
			goto unmap;
		for (size_t i = 0; i < a->nblocks; i++) {
			a->blocks[i].location = CU_DEVICE_CPU;
			a->blocks[i].preferred = CU_DEVICE_INVALID;
		}
	}
	if (table_insert(a) != 0)
		goto unmap;
	if (kind == ALLOC_DEVICE && mem_make_room(device, charge, NULL) != 0) {
		table_remove(a);
		goto unmap;
	}

	switch (kind) {
	case ALLOC_DEVICE:
		d->plain_bytes += charge;
		break;
	case ALLOC_MANAGED:
		d->managed_host_bytes += size;
		break;
	case ALLOC_HOST:
		d->pinned_bytes += size;
		break;
	}
	d->live_allocs++;
	mem_usage_changed(device);
	*out = a;
	return CUDA_SUCCESS;

unmap:
	free(a->blocks);
	if (a->backing != va)
		munmap(a->backing, map_size);
	munmap(va, map_size);
oom:
	free(a);
	return CUDA_ERROR_OUT_OF_MEMORY;
}

void mem_release(struct alloc *a)
{
	struct sim_device *d = &sim.dev[a->device];

	table_remove(a);
	switch (a->kind) {
	case ALLOC_DEVICE:
		d->plain_bytes -= a->charge;
		break;
	case ALLOC_MANAGED:
		for (size_t i = 0; i < a->nblocks; i++)
			block_move(a, i, CU_DEVICE_CPU);
		d->managed_host_bytes -= a->size;
		break;
	case ALLOC_HOST:
		*(a->registered ? &d->registered_bytes : &d->pinned_bytes) -= a->size;
		break;
	}
	if (!a->ipc_opened && !a->registered)
		d->live_allocs--;
	if (a->pool != NULL)
		pool_released(a);
	mem_usage_changed(a->device);
	if (a->ipc_exported)
		close(a->ipc_fd);
	if (a->backing != (char *)a->base)
		munmap(a->backing, a->map_size);
	if (!a->registered) /* the application's own memory stays mapped, pageable again */
		munmap((void *)a->base, a->map_size);
	free(a->blocks);
	free(a);
}

/*
 * Frees what destroying or resetting ctx frees. Memory from a pool
 * (cuMemAllocAsync, cuMemAllocFromPoolAsync) is no context's, so a created
 * context's destruction leaves it (cuCtxDestroy: it "need[s] to be
 * destroyed explicitly"); it becomes the device's primary context's, whose
 * reset frees pool memory as a device reset does.
 */
void mem_release_context(const struct CUctx_st *ctx)
{
	array_release_context(ctx);
	for (size_t i = sim.nallocs; i-- > 0;) {
		struct alloc *a = sim.allocs[i];
		if (a->ctx == ctx && a->stream_ordered && !ctx->primary) {
			a->ctx = sim.dev[a->device].ctx;
			continue;
		}
		if (a->ctx == ctx) {
			mem_release(a);
			continue;
		}
		for (size_t j = 0; ctx->primary && a->kind == ALLOC_MANAGED && j < a->nblocks; j++)
			if (a->blocks[j].location == ctx->device)
				block_move(a, j, CU_DEVICE_CPU);
	}
}

/* Block range [*first, *last] covering bytes [off, off+len) of a (len > 0). */
static void block_range(size_t off, size_t len, size_t *first, size_t *last)
{
	*first = off / SIM_MANAGED_BLOCK;
	*last = (off + len - 1) / SIM_MANAGED_BLOCK;
}

/* Migrates a block to a device if room can be made; otherwise it stays where it is. */
static void block_migrate(struct alloc *a, size_t i, int device)
{
	if (a->blocks[i].location == device)
		return;
	if (mem_make_room(device, block_bytes(a, i), a) == 0)
		block_move(a, i, device);
}

void mem_managed_access(struct alloc *a, size_t off, size_t len, int device)
{
	size_t first, last;

	if (len == 0)
		return;
	block_range(off, len, &first, &last);
	for (size_t i = first; i <= last; i++) {
		struct mblock *b = &a->blocks[i];
		b->last_use = ++sim.clock;
		if (b->location == device)
			continue;
		/*
		 * Data already at a preferred location elsewhere stays there and the
		 * device maps it; data away from its preferred location migrates to
		 * the accessing device (cudaMemAdviseSetPreferredLocation).
		 */
		if (b->preferred != CU_DEVICE_INVALID && b->preferred != device &&
		    b->location == b->preferred)
			continue;
		/* Accessed-by without a preference for this device: read in place. */
		if (b->preferred != device && (b->accessed_by & (1u << device)))
			continue;
		block_migrate(a, i, device);
	}
}

void mem_managed_prefetch(struct alloc *a, size_t off, size_t len, int location)
{
	size_t first, last;

	if (len == 0)
		return;
	block_range(off, len, &first, &last);
	for (size_t i = first; i <= last; i++) {
		if (location == CU_DEVICE_CPU) {
			block_move(a, i, CU_DEVICE_CPU);
		} else {
			a->blocks[i].last_use = ++sim.clock;
			block_migrate(a, i, location);
		}
	}
}

CUresult mem_resolve(uintptr_t addr, size_t len, int must_be_known, struct span *out)
{
	struct alloc *a = mem_find(addr);

	memset(out, 0, sizeof(*out));
	if (addr == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (a == NULL) {
		CUresult rc = vmm_resolve(addr, len, out);
		if (rc != CUDA_ERROR_NOT_FOUND)
			return rc;
		if (must_be_known)
			return CUDA_ERROR_INVALID_VALUE;
		out->host = (char *)addr;
		return CUDA_SUCCESS;
	}
	if (a->free_pending || len > a->size - (addr - a->base))
		return CUDA_ERROR_INVALID_VALUE;
	out->a = a;
	out->off = addr - a->base;
	out->host = a->backing + out->off;
	return CUDA_SUCCESS;
}

/* ---- API ---- */

static CUresult alloc_current(CUdeviceptr *dptr, size_t size, enum alloc_kind kind,
			      unsigned int flags)
{
	struct alloc *a;
	int dev;
	CUresult rc = sim_current_device(&dev);

	if (rc == CUDA_SUCCESS)
		rc = capture_check_unsafe(); /* not stream-ordered: unsafe during stream capture */
	if (rc != CUDA_SUCCESS)
		return rc;
	if (kind == ALLOC_DEVICE)
		mem_refresh_others(dev);
	pthread_mutex_lock(&sim.lock);
	rc = mem_alloc(dev, size, kind, flags, &a);
	pthread_mutex_unlock(&sim.lock);
	if (rc == CUDA_SUCCESS)
		*dptr = a->base;
	return rc;
}

SIM_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	ENTER(ENTER_INIT);
	if (dptr == NULL || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	return alloc_current(dptr, bytesize, ALLOC_DEVICE, 0);
}

SIM_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
				    size_t Height, unsigned int ElementSizeBytes)
{
	ENTER(ENTER_INIT);
	if (dptr == NULL || pPitch == NULL || WidthInBytes == 0 || Height == 0 ||
	    (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
		return CUDA_ERROR_INVALID_VALUE;
	size_t pitch = round_up(WidthInBytes, SIM_ALLOC_GRANULE);
	if (pitch == 0 || Height > SIZE_MAX / pitch)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = alloc_current(dptr, pitch * Height, ALLOC_DEVICE, 0);
	if (rc == CUDA_SUCCESS)
		*pPitch = pitch;
	return rc;
}

SIM_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	ENTER(ENTER_INIT);
	if (sim.no_managed)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (dptr == NULL || bytesize == 0 ||
	    (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
		return CUDA_ERROR_INVALID_VALUE;
	return alloc_current(dptr, bytesize, ALLOC_MANAGED, flags);
}

SIM_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	ENTER(ENTER_INIT);
	if (pp == NULL || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	return alloc_current((CUdeviceptr *)pp, bytesize, ALLOC_HOST, 0);
}

SIM_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	ENTER(ENTER_INIT);
	if (pp == NULL || bytesize == 0 ||
	    (Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
				 CU_MEMHOSTALLOC_WRITECOMBINED)))
		return CUDA_ERROR_INVALID_VALUE;
	return alloc_current((CUdeviceptr *)pp, bytesize, ALLOC_HOST, Flags);
}

/* Whether an operation queued or running on any stream reads or writes a. */
static int alloc_in_use(const struct alloc *a)
{
	for (const struct CUstream_st *s = sim.streams; s != NULL; s = s->next)
		for (const struct op *op = s->head; op != NULL; op = op->next)
			if (op->dst.a == a || op->src.a == a)
				return 1;
	return 0;
}

/*
 * cuMemFree of stream-ordered memory does not synchronise: the caller must
 * have finished every access. Freeing it under pending work is a
 * use-after-free on a GPU; here it is refused, loudly, and changes nothing.
 */
static CUresult free_stream_ordered(struct alloc *a)
{
	if (alloc_in_use(a)) {
		fprintf(stderr,
			"simcuda: cuMemFree_v2(%#lx): memory from cuMemAllocAsync is still used by "
			"pending stream work; cuMemFree does not wait for it (free it with "
			"cuMemFreeAsync, or synchronise first)\n",
			(unsigned long)a->base);
		return CUDA_ERROR_ILLEGAL_STATE;
	}
	mem_release(a);
	return CUDA_SUCCESS;
}

/* Whether a is what a free of kinds_mask (registered: an unregistration) releases. */
static int frees_as(const struct alloc *a, unsigned int kinds_mask, int registered)
{
	return (kinds_mask & (1u << a->kind)) && a->registered == registered;
}

/*
 * Frees the allocation that starts at addr and has one of the kinds in
 * kinds_mask (registered: unregisters host memory instead), after all work
 * on its device has finished (as CUDA does), except for cuMemAllocAsync
 * memory, which CUDA frees without waiting. Any other pointer is
 * CUDA_ERROR_INVALID_VALUE, or CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED for an
 * unregistration.
 */
static CUresult free_synchronized(uintptr_t addr, unsigned int kinds_mask, int registered)
{
	CUresult check = capture_check_unsafe(); /* may synchronise: unsafe during stream capture */

	if (check != CUDA_SUCCESS)
		return check;
	for (;;) {
		pthread_mutex_lock(&sim.lock);
		struct alloc *a = mem_find(addr);
		if (a == NULL || a->base != addr || !frees_as(a, kinds_mask, registered) ||
		    a->free_pending || a->ipc_opened) {
			pthread_mutex_unlock(&sim.lock);
			return registered ? CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
					  : CUDA_ERROR_INVALID_VALUE;
		}
		if (a->stream_ordered) {
			CUresult rc = free_stream_ordered(a);
			pthread_mutex_unlock(&sim.lock);
			return rc;
		}
		int dev = a->device;
		pthread_mutex_unlock(&sim.lock);

		CUresult rc = stream_sync_device(dev);
		if (rc != CUDA_SUCCESS)
			return rc;

		pthread_mutex_lock(&sim.lock);
		a = mem_find(addr);
		/* Another thread may have freed or replaced it while we waited: look again. */
		if (a != NULL && a->base == addr && frees_as(a, kinds_mask, registered) &&
		    !a->free_pending && a->device == dev) {
			mem_release(a);
			pthread_mutex_unlock(&sim.lock);
			return CUDA_SUCCESS;
		}
		pthread_mutex_unlock(&sim.lock);
	}
}

/* The owner is found from the pointer: no current context is needed (CUDA frees it the same way). */
SIM_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	ENTER(ENTER_INIT);
	if (dptr == 0)
		return CUDA_ERROR_INVALID_VALUE;
	return free_synchronized(dptr, 1u << ALLOC_DEVICE | 1u << ALLOC_MANAGED, 0);
}

/* Like cuMemFree_v2: the owner is found from the pointer, with no current context. */
SIM_API CUresult cuMemFreeHost(void *p)
{
	ENTER(ENTER_INIT);
	if (p == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return free_synchronized((uintptr_t)p, 1u << ALLOC_HOST, 0);
}

/* ---- registered host memory ---- */

#define REGISTER_FLAGS                                               \
	(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | \
	 CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY)

/*
 * The entry of the allocation table that overlaps [addr, addr+len), or
 * NULL. Entries are sorted and disjoint, so only the last one that starts
 * before the range's end can reach into it.
 */
static struct alloc *table_overlap(uintptr_t addr, size_t len)
{
	size_t i = upper_bound(addr + len - 1);

	if (i == 0)
		return NULL;
	struct alloc *a = sim.allocs[i - 1];
	return a->base + a->map_size > addr ? a : NULL;
}

/* Whether every page of [addr, addr+len) is mapped in this process (msync fails with ENOMEM otherwise). */
static int host_range_mapped(uintptr_t addr, size_t len)
{
	uintptr_t start = addr & ~(uintptr_t)(page_size() - 1);
	return msync((void *)start, addr + len - start, MS_ASYNC) == 0;
}

/*
 * Page-locks existing host memory for device: it becomes pinned memory of
 * the current context, reachable by copies and with the host pointer as its
 * device pointer (unified addressing). The bytes stay where they are and
 * count on no device. With sim.lock held.
 */
static CUresult register_range(int device, uintptr_t addr, size_t size, unsigned int flags)
{
	const struct alloc *other = table_overlap(addr, size);

	if (other != NULL) /* pinned memory is already page-locked; device memory is not the host's */
		return other->kind == ALLOC_HOST ? CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
						 : CUDA_ERROR_INVALID_VALUE;
	if (vmm_overlaps(addr, size))
		return CUDA_ERROR_INVALID_VALUE;
	struct alloc *a = calloc(1, sizeof(*a));
	if (a == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	a->base = addr;
	a->size = size;
	a->map_size = size;
	a->backing = (char *)addr;
	a->kind = ALLOC_HOST;
	a->registered = 1;
	a->device = device;
	a->ctx = sim_current_ctx();
	a->flags = flags;
	a->id = ++sim.next_id;
	if (table_insert(a) != 0) {
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	sim.dev[device].registered_bytes += size;
	return CUDA_SUCCESS;
}

static CUresult host_register(void *p, size_t bytesize, unsigned int Flags)
{
	uintptr_t addr = (uintptr_t)p;
	int dev;

	if (sim.no_host_register)
		return CUDA_ERROR_NOT_SUPPORTED;
	CUresult rc = sim_current_device(&dev);
	if (rc == CUDA_SUCCESS)
		rc = capture_check_unsafe(); /* not stream-ordered, like an allocation */
	if (rc != CUDA_SUCCESS)
		return rc;
	if (p == NULL || bytesize == 0 || addr + bytesize < addr || (Flags & ~REGISTER_FLAGS))
		return CUDA_ERROR_INVALID_VALUE;
	/* No I/O space to map here; read-only registration is not supported
	 * (CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED is 0), as documented. */
	if (Flags & (CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY))
		return CUDA_ERROR_NOT_SUPPORTED;
	if (!host_range_mapped(addr, bytesize))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	rc = register_range(dev, addr, bytesize, Flags);
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
	ENTER(ENTER_INIT);
	return host_register(p, bytesize, Flags);
}

/* The CUDA 4.0 ABI, with the same arguments. */
SIM_API CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
	ENTER(ENTER_INIT);
	return host_register(p, bytesize, Flags);
}

/* Like cuMemFreeHost: waits for the device's work, and needs no current context. */
SIM_API CUresult cuMemHostUnregister(void *p)
{
	ENTER(ENTER_INIT);
	if (sim.no_host_register)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (p == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return free_synchronized((uintptr_t)p, 1u << ALLOC_HOST, 1);
}

SIM_API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
	int dev;

	ENTER(ENTER_INIT);
	CUresult rc = sim_current_device(&dev);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (pdptr == NULL || Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct alloc *a = mem_find((uintptr_t)p);
	rc = (a != NULL && a->kind == ALLOC_HOST) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&sim.lock);
	if (rc == CUDA_SUCCESS)
		*pdptr = (CUdeviceptr)(uintptr_t)p; /* unified addressing: same address */
	return rc;
}

SIM_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	int dev;

	ENTER(ENTER_INIT);
	CUresult rc = sim_current_device(&dev);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (free_bytes == NULL || total == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	mem_refresh_others(dev);
	pthread_mutex_lock(&sim.lock);
	uint64_t used = mem_used(dev) + sim.dev[dev].others_bytes, cap = sim.dev[dev].capacity;
	pthread_mutex_unlock(&sim.lock);
	*free_bytes = used < cap ? cap - used : 0;
	*total = cap;
	return CUDA_SUCCESS;
}

/*
 * Pinned host memory answers too: under unified addressing its device
 * address is its host address, and CUDA reports the host allocation (numba
 * sizes its mapped arrays with this call).
 */
SIM_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	ENTER(ENTER_INIT);
	pthread_mutex_lock(&sim.lock);
	struct alloc *a = mem_find(dptr);
	if (a == NULL)
		a = vmm_find(dptr); /* a cuMemMap mapping, device- or host-located: what was mapped */
	CUresult rc = a != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
	if (rc == CUDA_SUCCESS) {
		if (pbase != NULL)
			*pbase = a->base;
		if (psize != NULL)
			*psize = a->size;
	}
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

/* Whether a is memory of pool whose stream-ordered free is still queued. */
static int queued_pool_free(const struct alloc *a, const struct CUmemPoolHandle_st *pool)
{
	/* A free recorded by stream capture (free_stream NULL) is not queued anywhere. */
	return a->free_pending && a->stream_ordered && a->charge > 0 && a->free_stream != NULL &&
	       a->pool == pool;
}

/*
 * The default pool's reuse policies, all enabled by default
 * (cudaMemPoolReuseFollowEventDependencies, ...AllowOpportunistic,
 * ...AllowInternalDependencies): an allocation that does not fit may take
 * pool memory whose stream-ordered free is still queued. It takes all it can
 * from the allocating stream's own frees, which stream order makes safe, and
 * only what is still missing from other streams' frees, making the allocating
 * stream wait for each of them (the dependencies go into wait). The bytes
 * move from the freed allocation's charge to the new one, so the device is
 * never over capacity. device is the pool's, which need not be the stream's.
 * With sim.lock held; on failure nothing has changed.
 */
static CUresult alloc_from_queued_frees(struct CUstream_st *s, const struct CUmemPoolHandle_st *pool,
					int device, size_t size, struct op *wait, struct alloc **out)
{
	const struct sim_device *d = &sim.dev[device];
	uint64_t charge = round_up(size, SIM_ALLOC_GRANULE), same = 0, other = 0;
	size_t nfrom = 0;

	for (size_t i = 0; i < sim.nallocs; i++) {
		const struct alloc *a = sim.allocs[i];
		if (queued_pool_free(a, pool)) {
			*(a->free_stream == s ? &same : &other) += a->charge;
			nfrom++;
		}
	}
	uint64_t total = d->plain_bytes + d->ctx_bytes + charge, cap = capacity_left_for_us(device);
	uint64_t from_same = same < charge ? same : charge;
	uint64_t from_other = total - from_same > cap ? total - from_same - cap : 0;
	if (charge == 0 || nfrom == 0 || total <= cap || from_other > other)
		return CUDA_ERROR_OUT_OF_MEMORY;

	struct take {
		struct alloc *from;
		uint64_t bytes;
	} *takes = calloc(nfrom, sizeof(*takes));
	size_t ntakes = 0;
	if (takes == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (size_t i = 0; i < sim.nallocs; i++) {
		struct alloc *a = sim.allocs[i];
		if (!queued_pool_free(a, pool))
			continue;
		uint64_t *need = a->free_stream == s ? &from_same : &from_other;
		if (*need == 0)
			continue;
		takes[ntakes].from = a;
		takes[ntakes].bytes = a->charge < *need ? a->charge : *need;
		*need -= takes[ntakes].bytes;
		if (a->free_stream != s && op_add_dep(wait, a->free_stream, a->free_seq) != 0) {
			free(takes);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		ntakes++;
	}
	for (size_t i = 0; i < ntakes; i++) {
		takes[i].from->charge -= takes[i].bytes;
		sim.dev[device].plain_bytes -= takes[i].bytes;
	}
	CUresult rc = mem_alloc(device, size, ALLOC_DEVICE, 0, out);
	for (size_t i = 0; rc != CUDA_SUCCESS && i < ntakes; i++) {
		takes[i].from->charge += takes[i].bytes;
		sim.dev[device].plain_bytes += takes[i].bytes;
	}
	free(takes);
	return rc;
}

/* ---- memory pools of the stream-ordered allocator ---- */

/*
 * A memory pool. Each device has a default one, in default_pools; created
 * ones are on created_pools until cuMemPoolDestroy, and freed once their last
 * allocation is released (CUDA lets a destroyed pool's memory live on until
 * it is freed). Freed memory goes back to the device when its free completes,
 * so reserved and used bytes are the same here. All fields under sim.lock.
 */
struct CUmemPoolHandle_st {
	int device;
	int destroyed;
	uint64_t max_bytes; /* CUmemPoolProps.maxSize; 0: the device's capacity */
	uint64_t release_threshold;
	uint64_t bytes;      /* taken by allocations not yet released */
	uint64_t bytes_high; /* high-water mark of bytes, reset by setting it to 0 */
	size_t live;         /* allocations not yet released */
	struct CUmemPoolHandle_st *next;
};

static struct CUmemPoolHandle_st default_pools[SIMCUDA_MAX_DEVICES];
static struct CUmemPoolHandle_st *created_pools;

static struct CUmemPoolHandle_st *default_pool(int device)
{
	default_pools[device].device = device;
	return &default_pools[device];
}

/* The pool behind handle, or NULL when it is no live pool. With sim.lock held. */
static struct CUmemPoolHandle_st *pool_lookup(CUmemoryPool handle)
{
	for (int i = 0; i < sim.ndev; i++)
		if (handle == &default_pools[i])
			return default_pool(i);
	for (struct CUmemPoolHandle_st *p = created_pools; p != NULL; p = p->next)
		if (p == handle)
			return p;
	return NULL;
}

static uint64_t pool_charge(size_t size)
{
	return round_up(size, SIM_ALLOC_GRANULE);
}

/* Called by mem_release with sim.lock held: a's bytes leave its pool. */
static void pool_released(const struct alloc *a)
{
	struct CUmemPoolHandle_st *p = a->pool;

	p->bytes -= pool_charge(a->size);
	if (--p->live == 0 && p->destroyed)
		free(p);
}

/*
 * cuMemAllocAsync (pool NULL: the current pool of the stream's device) and
 * cuMemAllocFromPoolAsync, whose pool may be another device's: the memory
 * is the pool's device's.
 */
static CUresult stream_ordered_alloc(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				     CUstream hStream)
{
	struct CUstream_st *s;
	struct alloc *a;

	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (dptr == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct CUmemPoolHandle_st *p = pool == NULL ? default_pool(s->device) : pool_lookup(pool);
	rc = p == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
	pthread_mutex_unlock(&sim.lock);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (bytesize == 0) {
		*dptr = 0; /* unlike cuMemAlloc, the pool serves zero bytes with a null pointer */
		return CUDA_SUCCESS;
	}
	struct op *wait = op_new(OP_BARRIER);
	if (wait == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	mem_refresh_others(p->device);
	pthread_mutex_lock(&sim.lock);
	rc = capture_alloc_refused(s);
	if (rc == CUDA_SUCCESS && p->max_bytes != 0 &&
	    (pool_charge(bytesize) == 0 || p->bytes + pool_charge(bytesize) > p->max_bytes))
		rc = CUDA_ERROR_OUT_OF_MEMORY; /* the pool's maxSize, not the device */
	else if (rc == CUDA_SUCCESS) {
		rc = mem_alloc(p->device, bytesize, ALLOC_DEVICE, 0, &a);
		if (rc == CUDA_ERROR_OUT_OF_MEMORY)
			rc = alloc_from_queued_frees(s, p, p->device, bytesize, wait, &a);
	}
	if (rc == CUDA_SUCCESS) {
		a->stream_ordered = 1;
		a->pool = p;
		p->live++;
		p->bytes += pool_charge(bytesize);
		if (p->bytes > p->bytes_high)
			p->bytes_high = p->bytes;
		rc = capture_alloc(s, a); /* on a capturing stream: an allocation node */
		if (rc != CUDA_SUCCESS)
			mem_release(a);
	}
	if (rc == CUDA_SUCCESS)
		*dptr = a->base;
	pthread_mutex_unlock(&sim.lock);
	if (rc != CUDA_SUCCESS || wait->ndeps == 0) {
		op_free(wait);
		return rc;
	}
	/* Memory reused from another stream's free: this stream waits for that free. */
	return stream_submit(s, wait, NULL);
}

SIM_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	ENTER(ENTER_INIT);
	return stream_ordered_alloc(dptr, bytesize, NULL, hStream);
}

SIM_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
					 CUstream hStream)
{
	ENTER(ENTER_INIT);
	if (pool == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return stream_ordered_alloc(dptr, bytesize, pool, hStream);
}

SIM_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	ENTER(ENTER_INIT);
	if (pool == NULL || props == NULL || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	if (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return props->location.type == CU_MEM_LOCATION_TYPE_INVALID ? CUDA_ERROR_INVALID_VALUE
									    : CUDA_ERROR_NOT_SUPPORTED;
	if (!sim_valid_device(props->location.id))
		return CUDA_ERROR_INVALID_DEVICE;
	if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE)
		return CUDA_ERROR_NOT_SUPPORTED; /* IPC of pools: see the README */
	struct CUmemPoolHandle_st *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	p->device = props->location.id;
	p->max_bytes = props->maxSize;
	pthread_mutex_lock(&sim.lock);
	p->next = created_pools;
	created_pools = p;
	pthread_mutex_unlock(&sim.lock);
	*pool = p;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	ENTER(ENTER_INIT);
	pthread_mutex_lock(&sim.lock);
	struct CUmemPoolHandle_st **link = &created_pools;
	while (*link != NULL && *link != pool)
		link = &(*link)->next;
	if (*link == NULL) { /* a default pool, a destroyed one or no pool */
		pthread_mutex_unlock(&sim.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	*link = pool->next;
	pool->destroyed = 1;
	if (pool->live == 0)
		free(pool);
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

static CUresult get_default_pool(CUmemoryPool *pool_out, CUdevice dev)
{
	if (pool_out == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&sim.lock);
	*pool_out = default_pool(dev);
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
	ENTER(ENTER_INIT);
	return get_default_pool(pool_out, dev);
}

/* The current pool is always the default one: there is no cuDeviceSetMemPool. */
SIM_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	ENTER(ENTER_INIT);
	return get_default_pool(pool, dev);
}

/* Freed memory already went back to the device: nothing is left to trim. */
SIM_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
	(void)minBytesToKeep;
	ENTER(ENTER_INIT);
	pthread_mutex_lock(&sim.lock);
	CUresult rc = pool_lookup(pool) != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

static CUresult set_attribute(struct CUmemPoolHandle_st *p, CUmemPool_attribute attr, void *value)
{
	switch (attr) {
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
		/* The reuse policies are always on here: only enabling is honoured. */
		return *(int *)value != 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
		p->release_threshold = *(cuuint64_t *)value;
		return CUDA_SUCCESS;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		/* CUDA only lets the high-water marks be reset, by setting 0. */
		if (*(cuuint64_t *)value != 0)
			return CUDA_ERROR_INVALID_VALUE;
		p->bytes_high = p->bytes;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

static CUresult get_attribute(struct CUmemPoolHandle_st *p, CUmemPool_attribute attr, void *value)
{
	switch (attr) {
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
		*(int *)value = 1;
		return CUDA_SUCCESS;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
		*(cuuint64_t *)value = p->release_threshold;
		return CUDA_SUCCESS;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
		*(cuuint64_t *)value = p->bytes;
		return CUDA_SUCCESS;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		*(cuuint64_t *)value = p->bytes_high;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

/* Runs op on the attribute of pool with sim.lock held; an unknown pool or
 * a NULL value is CUDA_ERROR_INVALID_VALUE. */
static CUresult pool_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value,
			       CUresult (*op)(struct CUmemPoolHandle_st *, CUmemPool_attribute, void *))
{
	if (value == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct CUmemPoolHandle_st *p = pool_lookup(pool);
	CUresult rc = p != NULL ? op(p, attr, value) : CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	ENTER(ENTER_INIT);
	return pool_attribute(pool, attr, value, set_attribute);
}

SIM_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	ENTER(ENTER_INIT);
	return pool_attribute(pool, attr, value, get_attribute);
}

SIM_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	struct CUstream_st *s;

	ENTER(ENTER_INIT);
	CUresult rc = stream_lookup(hStream, &s);
	if (rc != CUDA_SUCCESS || dptr == 0)
		return rc; /* freeing the null pointer of a zero-byte allocation does nothing */
	pthread_mutex_lock(&sim.lock);
	struct alloc *a = mem_find(dptr);
	if (a == NULL || a->base != dptr || a->kind != ALLOC_DEVICE ||
	    a->free_pending || a->ipc_opened) {
		pthread_mutex_unlock(&sim.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	a->free_pending = 1;
	pthread_mutex_unlock(&sim.lock);

	struct op *op = op_new(OP_FREE);
	if (op == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->alloc = a;
	op->dst.host = (char *)a->base; /* to recognise the allocation without touching it */
	return stream_submit(s, op, NULL);
}

/* ---- copies and memsets ---- */

static int device_side(const struct span *s)
{
	return s->a != NULL && s->a->kind != ALLOC_HOST;
}

/*
 * One copy on a stream. async: the *Async entry points (otherwise the
 * synchronous ones, which run on the legacy stream). Host synchronisation
 * follows CUDA's documented rules: pageable sources are staged so the caller
 * may reuse them at once; copies into pageable memory, host-to-host copies
 * and synchronous copies return when done, except synchronous
 * device-to-device copies.
 */
static CUresult copy(uintptr_t dst, uintptr_t src, size_t len, CUstream hStream, int async,
		     int dst_known, int src_known)
{
	struct CUstream_st *s;
	struct op *op;
	uint64_t seq;
	CUresult rc = stream_lookup(async ? hStream : NULL, &s);

	if (rc != CUDA_SUCCESS || len == 0)
		return rc; /* a zero-byte copy does nothing, whatever its pointers */
	op = op_new(OP_COPY);
	if (op == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&sim.lock);
	rc = mem_resolve(dst, len, dst_known, &op->dst);
	if (rc == CUDA_SUCCESS)
		rc = mem_resolve(src, len, src_known, &op->src);
	if (rc == CUDA_SUCCESS &&
	    (!vmm_accessible(&op->dst, len, s->device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE) ||
	     !vmm_accessible(&op->src, len, s->device, CU_MEM_ACCESS_FLAGS_PROT_READ)))
		rc = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&sim.lock);
	if (rc != CUDA_SUCCESS) {
		free(op);
		return rc;
	}
	op->len = len;
	op->src_addr = src;
	if (op->src.a == NULL) {
		op->staging = malloc(len);
		if (op->staging == NULL) {
			free(op);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		memcpy(op->staging, op->src.host, len);
		op->src.host = op->staging;
	}
	int host_to_host = !device_side(&op->dst) && !device_side(&op->src);
	int wait = async ? op->dst.a == NULL || host_to_host
			 : !(device_side(&op->dst) && device_side(&op->src) &&
			     op->dst.a->kind == ALLOC_DEVICE && op->src.a->kind == ALLOC_DEVICE);
	rc = stream_submit(s, op, &seq);
	if (rc == CUDA_SUCCESS && wait)
		stream_wait_seq(s, seq);
	return rc;
}

SIM_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	ENTER(ENTER_INIT);
	return copy(dst, src, ByteCount, NULL, 0, 0, 0);
}

SIM_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
			       CUstream hStream)
{
	ENTER(ENTER_INIT);
	return copy(dst, src, ByteCount, hStream, 1, 0, 0);
}

SIM_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	ENTER(ENTER_INIT);
	return copy(dstDevice, (uintptr_t)srcHost, ByteCount, NULL, 0, 1, 0);
}

SIM_API CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	ENTER(ENTER_INIT);
	return copy((uintptr_t)dstHost, srcDevice, ByteCount, NULL, 0, 0, 1);
}

SIM_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	ENTER(ENTER_INIT);
	return copy(dstDevice, srcDevice, ByteCount, NULL, 0, 1, 1);
}

SIM_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost,
				      size_t ByteCount, CUstream hStream)
{
	ENTER(ENTER_INIT);
	return copy(dstDevice, (uintptr_t)srcHost, ByteCount, hStream, 1, 1, 0);
}

SIM_API CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
				      CUstream hStream)
{
	ENTER(ENTER_INIT);
	return copy((uintptr_t)dstHost, srcDevice, ByteCount, hStream, 1, 0, 1);
}

SIM_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
				      size_t ByteCount, CUstream hStream)
{
	ENTER(ENTER_INIT);
	return copy(dstDevice, srcDevice, ByteCount, hStream, 1, 1, 1);
}

/*
 * The synchronous memset is asynchronous with respect to the host unless
 * its target is pinned host memory or managed memory (CUDA's documented rule).
 */
static CUresult memset_d8(CUdeviceptr dst, unsigned char value, size_t n, CUstream hStream,
			  int async)
{
	struct CUstream_st *s;
	uint64_t seq;
	CUresult rc = stream_lookup(async ? hStream : NULL, &s);

	if (rc != CUDA_SUCCESS || n == 0)
		return rc;
	struct op *op = op_new(OP_MEMSET);
	if (op == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&sim.lock);
	rc = mem_resolve(dst, n, 1, &op->dst);
	if (rc == CUDA_SUCCESS &&
	    !vmm_accessible(&op->dst, n, s->device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
		rc = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&sim.lock);
	if (rc != CUDA_SUCCESS) {
		free(op);
		return rc;
	}
	op->len = n;
	op->value = value;
	int wait = !async && op->dst.a->kind != ALLOC_DEVICE;
	rc = stream_submit(s, op, &seq);
	if (rc == CUDA_SUCCESS && wait)
		stream_wait_seq(s, seq);
	return rc;
}

SIM_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	ENTER(ENTER_INIT);
	return memset_d8(dstDevice, uc, N, NULL, 0);
}

SIM_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
				 CUstream hStream)
{
	ENTER(ENTER_INIT);
	return memset_d8(dstDevice, uc, N, hStream, 1);
}

/* ---- managed memory: advice and prefetch ---- */

/* The managed allocation that holds all of [ptr, ptr+count), or NULL. */
static struct alloc *managed_range(uintptr_t ptr, size_t count)
{
	struct alloc *a = mem_find(ptr);

	if (a == NULL || a->kind != ALLOC_MANAGED || count == 0 || count > a->size - (ptr - a->base))
		return NULL;
	return a;
}

static CUresult location_device(CUmemLocation loc, int *device)
{
	switch (loc.type) {
	case CU_MEM_LOCATION_TYPE_DEVICE:
		*device = loc.id;
		return sim_valid_device(loc.id) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
	case CU_MEM_LOCATION_TYPE_HOST:
		*device = CU_DEVICE_CPU;
		return CUDA_SUCCESS;
	case CU_MEM_LOCATION_TYPE_HOST_NUMA:
	case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
		return CUDA_ERROR_NOT_SUPPORTED; /* simcuda has no NUMA nodes */
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

static CUresult advise(uintptr_t ptr, size_t count, CUmem_advise advice, int device)
{
	int needs_device = advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION ||
			   advice == CU_MEM_ADVISE_SET_ACCESSED_BY ||
			   advice == CU_MEM_ADVISE_UNSET_ACCESSED_BY;

	if (advice < CU_MEM_ADVISE_SET_READ_MOSTLY || advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY)
		return CUDA_ERROR_INVALID_VALUE;
	if (needs_device && device != CU_DEVICE_CPU && !sim_valid_device(device))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&sim.lock);
	struct alloc *a = managed_range(ptr, count);
	if (a == NULL) {
		pthread_mutex_unlock(&sim.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	size_t first, last;
	block_range(ptr - a->base, count, &first, &last);
	for (size_t i = first; i <= last; i++) {
		struct mblock *b = &a->blocks[i];
		uint16_t bit = device >= 0 ? (uint16_t)(1u << device) : 0;
		switch (advice) {
		case CU_MEM_ADVISE_SET_READ_MOSTLY:
			b->read_mostly = 1;
			break;
		case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
			b->read_mostly = 0;
			break;
		case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
			b->preferred = (int8_t)device;
			break;
		case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
			b->preferred = CU_DEVICE_INVALID;
			break;
		case CU_MEM_ADVISE_SET_ACCESSED_BY:
			b->accessed_by |= bit;
			break;
		case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
			b->accessed_by &= (uint16_t)~bit;
			break;
		}
	}
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
			     CUdevice device)
{
	ENTER(ENTER_INIT);
	return advise(devPtr, count, advice, device);
}

SIM_API CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
				CUmemLocation location)
{
	int device = CU_DEVICE_CPU;

	ENTER(ENTER_INIT);
	if (advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION || advice == CU_MEM_ADVISE_SET_ACCESSED_BY ||
	    advice == CU_MEM_ADVISE_UNSET_ACCESSED_BY) {
		CUresult rc = location_device(location, &device);
		if (rc != CUDA_SUCCESS)
			return rc;
	}
	return advise(devPtr, count, advice, device);
}

static CUresult prefetch(uintptr_t ptr, size_t count, int location, CUstream hStream)
{
	struct CUstream_st *s;
	CUresult rc = stream_lookup(hStream, &s);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (location != CU_DEVICE_CPU && !sim_valid_device(location))
		return CUDA_ERROR_INVALID_DEVICE;
	if (location != CU_DEVICE_CPU)
		mem_refresh_others(location);
	pthread_mutex_lock(&sim.lock);
	struct alloc *a = managed_range(ptr, count);
	pthread_mutex_unlock(&sim.lock);
	if (a == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	struct op *op = op_new(OP_PREFETCH);
	if (op == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->dst.a = a;
	op->dst.host = (char *)a->base; /* to recognise the allocation without touching it */
	op->dst.off = ptr - a->base;
	op->len = count;
	op->location = location;
	return stream_submit(s, op, NULL);
}

SIM_API CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
				    CUstream hStream)
{
	ENTER(ENTER_INIT);
	return prefetch(devPtr, count, dstDevice, hStream);
}

SIM_API CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
				       unsigned int flags, CUstream hStream)
{
	int device;

	ENTER(ENTER_INIT);
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = location_device(location, &device);
	if (rc != CUDA_SUCCESS)
		return rc;
	return prefetch(devPtr, count, device, hStream);
}

/* ---- pointer attributes ---- */

/*
 * The range CU_POINTER_ATTRIBUTE_RANGE_START_ADDR and _RANGE_SIZE report
 * for allocation a: its own, but for a cuMemMap mapping the reservation's,
 * the mappable range, as CUDA documents (cuMemGetAddressRange_v2 reports
 * the mapping).
 */
static void attribute_range(const struct alloc *a, uintptr_t *base, size_t *size)
{
	if (!vmm_reservation_of(a, base, size)) {
		*base = a->base;
		*size = a->size;
	}
}

/*
 * One attribute of ptr (whose allocation is a, or NULL). lenient: the
 * cuPointerGetAttributes rule, which reports defaults for unknown memory.
 */
static CUresult pointer_attribute(const struct alloc *a, uintptr_t ptr, CUpointer_attribute attr,
				  void *data, int lenient)
{
	if (a == NULL && !lenient)
		return CUDA_ERROR_INVALID_VALUE;
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = a ? a->ctx : NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = !a ? 0 : a->kind == ALLOC_HOST ? CU_MEMORYTYPE_HOST
								       : CU_MEMORYTYPE_DEVICE;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
		*(CUdeviceptr *)data = a ? ptr : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		if (a != NULL && a->kind == ALLOC_DEVICE && !lenient)
			return CUDA_ERROR_INVALID_VALUE;
		*(void **)data = (a && a->kind != ALLOC_DEVICE) ? (void *)ptr : NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
		*(int *)data = a != NULL && a->kind == ALLOC_MANAGED;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = a ? a->device : CU_DEVICE_INVALID;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
		uintptr_t base = 0;
		size_t size = 0;
		if (a != NULL)
			attribute_range(a, &base, &size);
		if (attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
			*(CUdeviceptr *)data = base;
		else
			*(size_t *)data = size;
		return CUDA_SUCCESS;
	}
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(int *)data = a != NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
		*(unsigned long long *)data = a ? a->id : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
		*(int *)data = 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: /* not cuMemMap memory */
		*(int *)data = a != NULL && a->kind == ALLOC_DEVICE && vmm_find(a->base) != a;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_NOT_SUPPORTED;
	}
}

SIM_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	ENTER(ENTER_INIT);
	if (data == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct alloc *a = mem_find(ptr);
	CUresult rc = pointer_attribute(a ? a : vmm_find(ptr), ptr, attribute, data, 0);
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
					void **data, CUdeviceptr ptr)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(ENTER_INIT);
	if (numAttributes == 0 || attributes == NULL || data == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct alloc *a = mem_find(ptr);
	if (a == NULL)
		a = vmm_find(ptr);
	for (unsigned int i = 0; i < numAttributes && rc == CUDA_SUCCESS; i++)
		if (data[i] != NULL)
			rc = pointer_attribute(a, ptr, attributes[i], data[i], 1);
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

/* ---- the worker side: executing memory operations ---- */

static enum copy_class classify(const struct span *dst, const struct span *src)
{
	int d = device_side(dst), s = device_side(src);
	return d ? (s ? COPY_D2D : COPY_H2D) : (s ? COPY_D2H : COPY_H2H);
}

void mem_execute(struct op *op, int device)
{
	switch (op->type) {
	case OP_COPY:
		memmove(op->dst.host, op->src.host, op->len);
		pthread_mutex_lock(&sim.lock);
		sim.memcpy_bytes[classify(&op->dst, &op->src)] += op->len;
		if (op->dst.a && op->dst.a->kind == ALLOC_MANAGED)
			mem_managed_access(op->dst.a, op->dst.off, op->len, device);
		if (op->src.a && op->src.a->kind == ALLOC_MANAGED)
			mem_managed_access(op->src.a, op->src.off, op->len, device);
		pthread_mutex_unlock(&sim.lock);
		break;
	case OP_MEMSET:
		memset(op->dst.host, op->value, op->len);
		if (op->dst.a->kind == ALLOC_MANAGED) {
			pthread_mutex_lock(&sim.lock);
			mem_managed_access(op->dst.a, op->dst.off, op->len, device);
			pthread_mutex_unlock(&sim.lock);
		}
		break;
	case OP_PREFETCH:
		pthread_mutex_lock(&sim.lock);
		/* The allocation may have been freed since; prefetch only what still exists. */
		if (mem_find((uintptr_t)op->dst.host) == op->dst.a)
			mem_managed_prefetch(op->dst.a, op->dst.off, op->len, op->location);
		pthread_mutex_unlock(&sim.lock);
		break;
	case OP_FREE:
		pthread_mutex_lock(&sim.lock);
		/* A context reset may have freed it already, with everything of its device. */
		if (mem_find((uintptr_t)op->dst.host) == op->alloc) {
			/*
			 * Work still queued on another stream would touch freed memory: a
			 * missing dependency in the program, silent corruption on a GPU.
			 * There is no caller to return an error to, so stop loudly.
			 */
			if (alloc_in_use(op->alloc)) {
				fprintf(stderr,
					"simcuda: cuMemFreeAsync(%#lx) reached its stream while work on "
					"another stream still uses that memory (a missing stream "
					"dependency); aborting\n",
					(unsigned long)op->alloc->base);
				abort();
			}
			mem_release(op->alloc);
		}
		pthread_mutex_unlock(&sim.lock);
		break;
	default:
		break;
	}
}

/*
 * ---- IPC handles ----
 * Device bytes are private to their process until the first
 * cuIpcGetMemHandle of an allocation moves them into a memfd (after the
 * device's work is done), mapped at the same place. The handle names the
 * exporter's pid, the memfd's descriptor and the allocation's id; an
 * importer opens the memfd through /proc/<pid>/fd and maps it, sharing the
 * bytes. The exporter alone is charged for them.
 */
#define IPC_MAGIC 0x31435049534d4953ull /* "SIMSIPC1" */

struct ipc_handle {
	uint64_t magic;
	int32_t pid;
	int32_t fd;
	uint64_t id;
	uint64_t size;
	uint64_t map_size;
};
_Static_assert(sizeof(struct ipc_handle) <= sizeof(CUipcMemHandle), "handle fits CUDA's 64 bytes");

static void ipc_name(char *buf, size_t len, uint64_t id)
{
	snprintf(buf, len, "simcuda-ipc-%llu", (unsigned long long)id);
}

/* Moves a's bytes into a memfd mapped where they were; only resident pages are copied. */
static int ipc_export_locked(struct alloc *a)
{
	char name[64];
	size_t page = page_size(), npages = a->map_size / page;

	ipc_name(name, sizeof(name), a->id);
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0)
		return -1;
	unsigned char *resident = malloc(npages);
	if (resident == NULL || ftruncate(fd, (off_t)a->map_size) != 0 ||
	    mincore(a->backing, a->map_size, resident) != 0)
		goto fail;
	for (size_t i = 0; i < npages; i++)
		if ((resident[i] & 1) &&
		    pwrite(fd, a->backing + i * page, page, (off_t)(i * page)) != (ssize_t)page)
			goto fail;
	if (mmap(a->backing, a->map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
	    MAP_FAILED)
		goto fail;
	free(resident);
	a->ipc_exported = 1;
	a->ipc_fd = fd;
	return 0;
fail:
	free(resident);
	close(fd);
	return -1;
}

SIM_API CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	ENTER(ENTER_INIT);
	if (pHandle == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	for (;;) {
		pthread_mutex_lock(&sim.lock);
		/* Any pointer into the allocation names it, as CUDA's drivers answer an interior one. */
		struct alloc *a = mem_find(dptr);
		if (a == NULL || a->kind != ALLOC_DEVICE || a->free_pending || a->stream_ordered ||
		    a->ipc_opened) {
			pthread_mutex_unlock(&sim.lock);
			return CUDA_ERROR_INVALID_VALUE;
		}
		if (!a->ipc_exported) {
			/* The stream workers must not be moving its bytes while they move. */
			int dev = a->device;
			uint64_t id = a->id;
			pthread_mutex_unlock(&sim.lock);
			CUresult rc = stream_sync_device(dev);
			if (rc != CUDA_SUCCESS)
				return rc;
			pthread_mutex_lock(&sim.lock);
			a = mem_find(dptr);
			if (a == NULL || a->id != id) {
				pthread_mutex_unlock(&sim.lock);
				continue; /* freed or replaced meanwhile: look again */
			}
			if (!a->ipc_exported && ipc_export_locked(a) != 0) {
				pthread_mutex_unlock(&sim.lock);
				return CUDA_ERROR_OUT_OF_MEMORY;
			}
		}
		struct ipc_handle h = {
			.magic = IPC_MAGIC,
			.pid = (int32_t)getpid(),
			.fd = a->ipc_fd,
			.id = a->id,
			.size = a->size,
			.map_size = a->map_size,
		};
		pthread_mutex_unlock(&sim.lock);
		memset(pHandle, 0, sizeof(*pHandle));
		memcpy(pHandle->reserved, &h, sizeof(h));
		return CUDA_SUCCESS;
	}
}

/* Opens the exporter's memfd, checking that it is still the one the handle names. */
static int ipc_open(const struct ipc_handle *h)
{
	char path[64], link[128], want[96], name[64];

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
	ssize_t n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return -1;
	link[n] = '\0';
	ipc_name(name, sizeof(name), h->id);
	snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
	if (strcmp(link, want) != 0)
		return -1;
	int fd = open(path, O_RDWR | O_CLOEXEC);
	struct stat st;
	if (fd >= 0 && (fstat(fd, &st) != 0 || (uint64_t)st.st_size != h->map_size)) {
		close(fd);
		return -1;
	}
	return fd;
}

SIM_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
				       unsigned int Flags)
{
	struct ipc_handle h;
	int dev;

	ENTER(ENTER_INIT);
	CUresult rc = sim_current_device(&dev);
	if (rc != CUDA_SUCCESS)
		return rc;
	memcpy(&h, handle.reserved, sizeof(h));
	if (pdptr == NULL || Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS || h.magic != IPC_MAGIC ||
	    h.size == 0 || h.size > h.map_size)
		return CUDA_ERROR_INVALID_VALUE;
	if (h.pid == (int32_t)getpid())
		return CUDA_ERROR_INVALID_CONTEXT; /* a process cannot open its own handles */
	int fd = ipc_open(&h);
	if (fd < 0)
		return CUDA_ERROR_INVALID_HANDLE; /* the exporter or its allocation is gone */
	struct alloc *a = calloc(1, sizeof(*a));
	void *va = mmap(NULL, h.map_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			-1, 0);
	void *bytes = mmap(NULL, h.map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (a == NULL || va == MAP_FAILED || bytes == MAP_FAILED) {
		if (va != MAP_FAILED)
			munmap(va, h.map_size);
		if (bytes != MAP_FAILED)
			munmap(bytes, h.map_size);
		free(a);
		return CUDA_ERROR_MAP_FAILED;
	}
	a->base = (uintptr_t)va;
	a->size = h.size;
	a->map_size = h.map_size;
	a->backing = bytes;
	a->kind = ALLOC_DEVICE;
	a->device = dev;
	a->ctx = sim_current_ctx();
	a->ipc_opened = 1;
	pthread_mutex_lock(&sim.lock);
	a->id = ++sim.next_id;
	int err = table_insert(a);
	pthread_mutex_unlock(&sim.lock);
	if (err != 0) {
		munmap(va, h.map_size);
		munmap(bytes, h.map_size);
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*pdptr = a->base;
	return CUDA_SUCCESS;
}

/* Unmaps an opened handle once the device's work is done; the exporter's memory stays. */
SIM_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	ENTER(ENTER_INIT);
	for (;;) {
		pthread_mutex_lock(&sim.lock);
		struct alloc *a = mem_find(dptr);
		if (a == NULL || a->base != dptr || !a->ipc_opened) {
			pthread_mutex_unlock(&sim.lock);
			return CUDA_ERROR_INVALID_VALUE;
		}
		int dev = a->device;
		uint64_t id = a->id;
		pthread_mutex_unlock(&sim.lock);
		CUresult rc = stream_sync_device(dev);
		if (rc != CUDA_SUCCESS)
			return rc;
		pthread_mutex_lock(&sim.lock);
		a = mem_find(dptr);
		if (a != NULL && a->id == id) {
			mem_release(a);
			pthread_mutex_unlock(&sim.lock);
			return CUDA_SUCCESS;
		}
		pthread_mutex_unlock(&sim.lock);
	}
}
