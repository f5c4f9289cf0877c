/*
 * vmm.c - CUDA's virtual memory management API in the simulated driver:
 * address reservations (cuMemAddressReserve), physical allocations behind
 * generic handles (cuMemCreate), the mappings between them (cuMemMap) and
 * their access rights (cuMemSetAccess), with the rules of the CUDA 12.4
 * driver API reference.
 *
 * A reservation is a PROT_NONE anonymous mapping at the address the
 * application sees, aligned to the granularity, plus a second PROT_NONE
 * "view" of the same size that only the stream workers use. A physical
 * allocation is a memfd of its size. Mapping a handle maps that memfd
 * MAP_SHARED|MAP_FIXED at both places: at the application's address it stays
 * PROT_NONE (the CPU faults on device memory, as on a discrete GPU) unless
 * host-located memory is made CPU-accessible; in the view it is read-write,
 * so a copy spanning several adjacent mappings sees contiguous bytes, and
 * every mapping of one handle shares its contents. Unmapping puts PROT_NONE
 * anonymous memory back, so the range stays reserved.
 *
 * Device-located physical memory counts in the device's plain_bytes (so in
 * device_bytes, capacity checks and NVML) from cuMemCreate until it is freed:
 * when its handle has been released and no mapping of it is left. Host-located
 * memory (CU_MEM_LOCATION_TYPE_HOST_NUMA) counts on no device.
 *
 * Shareable handles are POSIX file descriptors: an export is a duplicate of
 * the memfd, whose name records where the memory lives (the device's index
 * in SIMCUDA_DEVICES, which every process shares whatever its
 * CUDA_VISIBLE_DEVICES), so a process that imports it maps the same bytes. Imported memory counts in the process that
 * created it, never in the importer.
 *
 * Every table here is guarded by sim.lock. SIMCUDA_NO_VMM=1 (sim.no_vmm)
 * makes every call return CUDA_ERROR_NOT_SUPPORTED.
 */
#define _GNU_SOURCE
#include "driver.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* cuMemGetAllocationGranularity's answer, minimum and recommended alike (a GPU's large page). */
#define VMM_GRANULE ((size_t)2 << 20)

/*
 * Device attributes answered here, by their CUdevice_attribute values:
 * CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED (103),
 * ..._WIN32_HANDLE_SUPPORTED (104), ..._WIN32_KMT_HANDLE_SUPPORTED (105),
 * CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED (107),
 * CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED (110) and
 * CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED (128).
 */
enum {
	ATTR_POSIX_FD_HANDLES = 103,
	ATTR_WIN32_HANDLES = 104,
	ATTR_WIN32_KMT_HANDLES = 105,
	ATTR_GENERIC_COMPRESSION = 107,
	ATTR_RDMA_WITH_VMM = 110,
	ATTR_FABRIC_HANDLES = 128,
};

struct handle {
	CUmemGenericAllocationHandle id; /* never reused, so a stale handle is refused */
	int fd;                          /* memfd holding the bytes */
	size_t size;
	CUmemAllocationProp prop;
	int device;    /* where the memory lives: a device ordinal, or -1 for the host */
	int charged;   /* made here by cuMemCreate, so counted here (not imported) */
	ino_t inode;   /* of the memfd, to recognise our own exports on import */
	int refs;      /* cuMemCreate + cuMemRetainAllocationHandle - cuMemRelease */
	size_t nmaps;  /* live mappings */
	struct handle *next;
};

struct reservation;

struct mapping {
	struct alloc view; /* base and size as mapped; what pointer queries report */
	struct reservation *res;
	struct handle *handle;
	unsigned char access[SIMCUDA_MAX_DEVICES]; /* CUmemAccess_flags per device */
	unsigned char host_access;                 /* for host-located memory: the CPU's */
	struct mapping *next;
};

struct reservation {
	uintptr_t base;
	size_t size;
	char *view; /* where the workers reach mapped bytes: view + (addr - base) */
	struct mapping *maps;
	struct reservation *next;
};

static struct handle *handles;
static struct reservation *reservations;
static CUmemGenericAllocationHandle next_handle_id;
static uint64_t host_bytes, reserved_bytes, mapped_bytes, live_handles;

static CUresult enter_vmm(void)
{
	return sim.no_vmm ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS;
}

#define ENTER_VMM()                                      \
	do {                                             \
		ENTER(ENTER_INIT);                       \
		CUresult vmm_rc_ = enter_vmm();          \
		if (vmm_rc_ != CUDA_SUCCESS)             \
			return vmm_rc_;                  \
	} while (0)

static int aligned(uintptr_t v, size_t a)
{
	return v % a == 0;
}

/* ---- lookups, with sim.lock held ---- */

static struct handle *handle_find(CUmemGenericAllocationHandle id)
{
	for (struct handle *h = handles; h != NULL; h = h->next)
		if (h->id == id)
			return h;
	return NULL;
}

static struct reservation *reservation_find(uintptr_t addr)
{
	for (struct reservation *r = reservations; r != NULL; r = r->next)
		if (addr - r->base < r->size)
			return r;
	return NULL;
}

static struct mapping *mapping_find(const struct reservation *r, uintptr_t addr)
{
	for (struct mapping *m = r ? r->maps : NULL; m != NULL; m = m->next)
		if (addr - m->view.base < m->view.size)
			return m;
	return NULL;
}

/* Whether any mapping of r overlaps [addr, addr+len). */
static int range_has_mapping(const struct reservation *r, uintptr_t addr, size_t len)
{
	for (const struct mapping *m = r->maps; m != NULL; m = m->next)
		if (m->view.base < addr + len && addr < m->view.base + m->view.size)
			return 1;
	return 0;
}

/*
 * Whether [addr, addr+len) is exactly a run of whole, adjacent mappings (what
 * cuMemUnmap and cuMemSetAccess accept). The run may cross from one
 * reservation into the next when they are adjacent, as NVIDIA's samples that
 * grow a range by reserving right after it do.
 */
static int whole_mappings(uintptr_t addr, size_t len)
{
	struct reservation *r = NULL;

	if (len == 0 || addr + len < addr)
		return 0;
	for (uintptr_t at = addr; at < addr + len;) {
		if ((r == NULL || at >= r->base + r->size) && (r = reservation_find(at)) == NULL)
			return 0;
		struct mapping *m = mapping_find(r, at);
		if (m == NULL || m->view.base != at || m->view.size > addr + len - at)
			return 0;
		at += m->view.size;
	}
	return 1;
}

/*
 * Visits, as r, each reservation of [addr, addr+len), a range whole_mappings
 * accepted: the one at addr, then each adjacent one the range continues into.
 */
#define EACH_RESERVATION(r, addr, len)                                                     \
	for (struct reservation *r = reservation_find(addr); r != NULL;                     \
	     r = r->base + r->size < (addr) + (len) ? reservation_find(r->base + r->size) : NULL)

/* The strongest access any device (or the CPU) has to m. */
static unsigned int any_access(const struct mapping *m)
{
	unsigned int flags = m->host_access;

	for (int d = 0; d < sim.ndev; d++)
		flags |= m->access[d];
	return flags;
}

/* ---- hooks for memory.c and driver.c ---- */

CUresult vmm_resolve(uintptr_t addr, size_t len, struct span *out)
{
	struct reservation *r = reservation_find(addr);

	if (r == NULL)
		return CUDA_ERROR_NOT_FOUND;
	if (len > r->size - (addr - r->base))
		return CUDA_ERROR_INVALID_VALUE;
	struct mapping *first = mapping_find(r, addr);
	for (uintptr_t at = addr; at < addr + len;) {
		struct mapping *m = mapping_find(r, at);
		/* Unmapped, or mapped without access: a GPU would fault. */
		if (m == NULL || !(any_access(m) & CU_MEM_ACCESS_FLAGS_PROT_READ))
			return CUDA_ERROR_INVALID_VALUE;
		at = m->view.base + m->view.size;
	}
	if (first == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	out->a = &first->view;
	out->off = addr - first->view.base;
	out->host = r->view + (addr - r->base);
	return CUDA_SUCCESS;
}

int vmm_accessible(const struct span *s, size_t len, int device, unsigned int need)
{
	if (s->a == NULL)
		return 1;
	struct reservation *r = reservation_find(s->a->base);
	if (r == NULL || mapping_find(r, s->a->base) != (struct mapping *)s->a)
		return 1; /* not VMM memory */
	uintptr_t addr = s->a->base + s->off;
	for (uintptr_t at = addr; at < addr + len;) {
		struct mapping *m = mapping_find(r, at);
		if (m == NULL || (m->access[device] & need) != need)
			return 0;
		at = m->view.base + m->view.size;
	}
	return 1;
}

struct alloc *vmm_find(uintptr_t addr)
{
	struct mapping *m = mapping_find(reservation_find(addr), addr);
	return m ? &m->view : NULL;
}

int vmm_reservation_of(const struct alloc *a, uintptr_t *base, size_t *size)
{
	if (a == NULL || vmm_find(a->base) != a)
		return 0;
	const struct mapping *m = (const struct mapping *)a; /* a is m->view, its first member */
	*base = m->res->base;
	*size = m->res->size;
	return 1;
}

int vmm_overlaps(uintptr_t addr, size_t len)
{
	for (const struct reservation *r = reservations; r != NULL; r = r->next)
		if (r->base < addr + len && addr < r->base + r->size)
			return 1;
	return 0;
}

int vmm_device_attribute(int attrib, int *value)
{
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
		*value = !sim.no_vmm;
		return 1;
	case ATTR_POSIX_FD_HANDLES:
	case ATTR_RDMA_WITH_VMM: /* the flag is accepted; nothing here does RDMA */
		*value = !sim.no_vmm;
		return 1;
	case ATTR_WIN32_HANDLES: /* not on Linux */
	case ATTR_WIN32_KMT_HANDLES:
	case ATTR_GENERIC_COMPRESSION: /* cuMemCreate never grants compression */
	case ATTR_FABRIC_HANDLES:
		*value = 0;
		return 1;
	default:
		return 0;
	}
}

void vmm_get_totals(struct vmm_totals *out)
{
	out->host_bytes = host_bytes;
	out->reserved_bytes = reserved_bytes;
	out->mapped_bytes = mapped_bytes;
	out->handles = live_handles;
}

/* ---- properties ---- */

/*
 * Checks prop as cuMemCreate and cuMemGetAllocationGranularity do; sets
 * *device to the device to charge, or -1 for host-located memory. CUDA 12.4
 * places physical memory on a device or on a host NUMA node; a plain HOST or
 * HOST_NUMA_CURRENT location is refused (later versions accept HOST).
 */
static CUresult check_prop(const CUmemAllocationProp *prop, int *device)
{
	if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	switch (prop->location.type) {
	case CU_MEM_LOCATION_TYPE_DEVICE:
		if (!sim_valid_device(prop->location.id))
			return CUDA_ERROR_INVALID_DEVICE;
		*device = prop->location.id;
		break;
	case CU_MEM_LOCATION_TYPE_HOST_NUMA:
		if (prop->location.id != 0) /* no NUMA here: the only node is 0 */
			return CUDA_ERROR_INVALID_VALUE;
		*device = -1;
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	unsigned int types = prop->requestedHandleTypes;
	if (types & ~(unsigned int)(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_WIN32 |
				    CU_MEM_HANDLE_TYPE_WIN32_KMT | CU_MEM_HANDLE_TYPE_FABRIC))
		return CUDA_ERROR_INVALID_VALUE;
	if (types & ~(unsigned int)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED; /* the device reports only POSIX file descriptors */
	/* Compression is a hint CUDA grants where the device compresses (none here:
	 * cuMemCreate records COMP_NONE); a special usage (a sparse tile pool) is refused. */
	if ((prop->allocFlags.compressionType != CU_MEM_ALLOCATION_COMP_NONE &&
	     prop->allocFlags.compressionType != CU_MEM_ALLOCATION_COMP_GENERIC) ||
	    prop->allocFlags.usage != 0)
		return CUDA_ERROR_NOT_SUPPORTED;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
					       CUmemAllocationGranularity_flags option)
{
	int device;

	ENTER_VMM();
	if (granularity == NULL || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
				    option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = check_prop(prop, &device);
	if (rc != CUDA_SUCCESS)
		return rc;
	*granularity = VMM_GRANULE;
	return CUDA_SUCCESS;
}

/* ---- address reservations ---- */

/* A PROT_NONE range of size bytes aligned to align, at hint if that is free; NULL on failure. */
static void *map_reserved(size_t size, size_t align, uintptr_t hint)
{
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

	if (hint != 0 && aligned(hint, align)) {
		void *p = mmap((void *)hint, size, PROT_NONE, flags | MAP_FIXED_NOREPLACE, -1, 0);
		if (p == (void *)hint)
			return p;
		if (p != MAP_FAILED)
			munmap(p, size); /* a kernel that took it as a plain hint */
	}
	if (size > SIZE_MAX - align)
		return NULL;
	char *p = mmap(NULL, size + align, PROT_NONE, flags, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	uintptr_t start = ((uintptr_t)p + align - 1) / align * align;
	if (start > (uintptr_t)p)
		munmap(p, start - (uintptr_t)p);
	size_t tail = (uintptr_t)p + size + align - (start + size);
	if (tail > 0)
		munmap((void *)(start + size), tail);
	return (void *)start;
}

SIM_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
				     CUdeviceptr addr, unsigned long long flags)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	ENTER_VMM();
	/* Size and address are multiples of the host page size; alignment a power of two or 0. */
	if (ptr == NULL || size == 0 || size % page != 0 || addr % page != 0 || flags != 0 ||
	    (alignment & (alignment - 1)) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	size_t align = alignment > VMM_GRANULE ? alignment : VMM_GRANULE;
	struct reservation *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	void *base = map_reserved(size, align, addr);
	void *view = base ? map_reserved(size, page, 0) : NULL;
	if (view == NULL) {
		if (base != NULL)
			munmap(base, size);
		free(r);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	r->base = (uintptr_t)base;
	r->size = size;
	r->view = view;
	pthread_mutex_lock(&sim.lock);
	r->next = reservations;
	reservations = r;
	reserved_bytes += size;
	pthread_mutex_unlock(&sim.lock);
	*ptr = r->base;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER_VMM();
	pthread_mutex_lock(&sim.lock);
	struct reservation **link = &reservations;
	while (*link != NULL && (*link)->base != ptr)
		link = &(*link)->next;
	struct reservation *r = *link;
	/* The whole reservation, as reserved, with nothing mapped in it any more. */
	if (r == NULL || r->size != size || r->maps != NULL) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		*link = r->next;
		reserved_bytes -= size;
	}
	pthread_mutex_unlock(&sim.lock);
	if (rc == CUDA_SUCCESS) {
		munmap((void *)r->base, r->size);
		munmap(r->view, r->size);
		free(r);
	}
	return rc;
}

/* ---- physical memory ---- */

/* memfd names: MEMFD_DEVICE followed by the device's SIMCUDA_DEVICES index, or MEMFD_HOST. */
#define MEMFD_DEVICE "simcuda-vmm-device-"
#define MEMFD_HOST "simcuda-vmm-host"

/* A handle for the memfd fd (which it takes over), not yet in the table; NULL when out of memory. */
static struct handle *handle_new(int fd, size_t size, const CUmemAllocationProp *prop, int device)
{
	struct stat st;
	struct handle *h = calloc(1, sizeof(*h));

	if (h == NULL || fstat(fd, &st) != 0) {
		close(fd);
		free(h);
		return NULL;
	}
	h->fd = fd;
	h->inode = st.st_ino;
	h->size = size;
	h->prop = *prop;
	h->prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE; /* not granted */
	h->device = device;
	h->refs = 1;
	return h;
}

/* Gives h its id and puts it in the table. */
static void handle_insert(struct handle *h)
{
	h->id = ++next_handle_id;
	h->next = handles;
	handles = h;
	live_handles++;
}

SIM_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
			     const CUmemAllocationProp *prop, unsigned long long flags)
{
	int device;

	ENTER_VMM();
	if (handle == NULL || flags != 0 || size == 0 || size % VMM_GRANULE != 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = check_prop(prop, &device);
	if (rc != CUDA_SUCCESS)
		return rc;
	/* The name tells an importing process where the memory lives. */
	char name[32];
	snprintf(name, sizeof(name), device >= 0 ? MEMFD_DEVICE "%d" : MEMFD_HOST,
		 device >= 0 ? sim.dev[device].physical : 0);
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
		if (fd >= 0)
			close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	struct handle *h = handle_new(fd, size, prop, device);
	if (h == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	h->charged = 1;

	if (device >= 0)
		mem_refresh_others(device);
	pthread_mutex_lock(&sim.lock);
	if (device >= 0) {
		/* Physical memory takes device capacity now, as on a GPU; managed bytes make room. */
		struct sim_device *d = &sim.dev[device];
		uint64_t cap = d->others_bytes < d->capacity ? d->capacity - d->others_bytes : 0;
		if (size > cap || d->plain_bytes + d->ctx_bytes > cap - size ||
		    mem_make_room(device, size, NULL) != 0) {
			pthread_mutex_unlock(&sim.lock);
			close(h->fd);
			free(h);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		d->plain_bytes += size;
		d->vmm_bytes += size;
		mem_usage_changed(device);
	} else {
		host_bytes += size;
	}
	handle_insert(h);
	*handle = h->id;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

/* Frees h's memory once it is both released and unmapped everywhere. */
static void handle_maybe_free(struct handle *h)
{
	if (h->refs > 0 || h->nmaps > 0)
		return;
	struct handle **link = &handles;
	while (*link != h)
		link = &(*link)->next;
	*link = h->next;
	if (h->charged && h->device >= 0) {
		sim.dev[h->device].plain_bytes -= h->size;
		sim.dev[h->device].vmm_bytes -= h->size;
		mem_usage_changed(h->device);
	} else if (h->charged) {
		host_bytes -= h->size;
	}
	live_handles--;
	close(h->fd);
	free(h);
}

SIM_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	ENTER_VMM();
	pthread_mutex_lock(&sim.lock);
	struct handle *h = handle_find(handle);
	if (h == NULL || h->refs == 0) {
		pthread_mutex_unlock(&sim.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	h->refs--;
	handle_maybe_free(h);
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	ENTER_VMM();
	if (handle == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct mapping *m = mapping_find(reservation_find((uintptr_t)addr), (uintptr_t)addr);
	if (m != NULL) {
		m->handle->refs++;
		*handle = m->handle->id;
	}
	pthread_mutex_unlock(&sim.lock);
	return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
							CUmemGenericAllocationHandle handle)
{
	ENTER_VMM();
	if (prop == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct handle *h = handle_find(handle);
	if (h != NULL)
		*prop = h->prop;
	pthread_mutex_unlock(&sim.lock);
	return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Exports a POSIX file descriptor (the caller's to close) for a handle created to allow it. */
SIM_API CUresult cuMemExportToShareableHandle(void *shareableHandle,
					      CUmemGenericAllocationHandle handle,
					      CUmemAllocationHandleType handleType,
					      unsigned long long flags)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER_VMM();
	if (shareableHandle == NULL || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&sim.lock);
	struct handle *h = handle_find(handle);
	if (h == NULL || h->refs == 0 || !(h->prop.requestedHandleTypes & handleType)) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			rc = CUDA_ERROR_OPERATING_SYSTEM;
		else
			*(int *)shareableHandle = fd;
	}
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

/*
 * Where the memory of a simcuda memfd lives (from its name): in *device, this
 * process's ordinal for it, or -1 for the host. CUDA_ERROR_INVALID_VALUE when
 * fd is no simcuda allocation, CUDA_ERROR_INVALID_DEVICE when its device is
 * not visible here.
 */
static CUresult memfd_location(int fd, int *device)
{
	char link[64], target[128];
	int n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t len = readlink(link, target, sizeof(target) - 1);
	if (len < 0)
		return CUDA_ERROR_INVALID_VALUE;
	target[len] = '\0';
	if (strncmp(target, "/memfd:" MEMFD_HOST " ", strlen("/memfd:" MEMFD_HOST " ")) == 0) {
		*device = -1;
		return CUDA_SUCCESS;
	}
	if (sscanf(target, "/memfd:" MEMFD_DEVICE "%d (deleted)", &n) != 1)
		return CUDA_ERROR_INVALID_VALUE;
	for (int d = 0; d < sim.ndev; d++) {
		if (sim.dev[d].physical == n) {
			*device = d;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_DEVICE;
}

/*
 * Imports a POSIX file descriptor exported by this or another simcuda
 * process (the descriptor stays the caller's). Our own export gives back a
 * new reference to the same handle; another process's gives a handle whose
 * memory counts in that process, not here.
 */
SIM_API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
						void *osHandle,
						CUmemAllocationHandleType shHandleType)
{
	int fd = (int)(intptr_t)osHandle, device;
	struct stat st;

	ENTER_VMM();
	if (handle == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (fstat(fd, &st) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = memfd_location(fd, &device);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (st.st_size <= 0 || (size_t)st.st_size % VMM_GRANULE != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	for (struct handle *h = handles; h != NULL; h = h->next) {
		if (h->inode == st.st_ino) { /* still alive: released but mapped is enough */
			h->refs++;
			*handle = h->id;
			pthread_mutex_unlock(&sim.lock);
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&sim.lock);
	int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (own < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = device >= 0 ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST_NUMA;
	prop.location.id = device >= 0 ? device : 0;
	struct handle *h = handle_new(own, (size_t)st.st_size, &prop, device);
	if (h == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&sim.lock);
	handle_insert(h);
	*handle = h->id;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

/* ---- mappings ---- */

/* Maps [off, off+size) of fd at addr with prot, replacing what is there; 0 or -1. */
static int map_fixed(void *addr, size_t size, int prot, int fd, size_t off)
{
	return mmap(addr, size, prot, MAP_SHARED | MAP_FIXED, fd, (off_t)off) == addr ? 0 : -1;
}

/* Puts reserved, inaccessible address space back at [addr, addr+size). */
static void unmap_to_reserved(void *addr, size_t size)
{
	if (mmap(addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
		 -1, 0) != addr)
		abort(); /* cannot happen for a range we own; continuing would corrupt the table */
}

SIM_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			  CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	ENTER_VMM();
	/* "offset: currently must be zero" (the CUDA Driver API reference). */
	if (flags != 0 || size == 0 || !aligned(ptr, VMM_GRANULE) || !aligned(size, VMM_GRANULE) ||
	    offset != 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct mapping *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&sim.lock);
	struct handle *h = handle_find(handle);
	struct reservation *r = reservation_find(ptr);
	CUresult rc = CUDA_SUCCESS;
	/* The range lies in one reservation, is not mapped yet, and the handle holds the bytes. */
	if (h == NULL || h->refs == 0 || r == NULL || size > r->size - (ptr - r->base) ||
	    range_has_mapping(r, ptr, size) || size > h->size)
		rc = CUDA_ERROR_INVALID_VALUE;
	else if (map_fixed((void *)ptr, size, PROT_NONE, h->fd, 0) != 0)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	else if (map_fixed(r->view + (ptr - r->base), size, PROT_READ | PROT_WRITE, h->fd, 0) != 0) {
		unmap_to_reserved((void *)ptr, size);
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (rc != CUDA_SUCCESS) {
		pthread_mutex_unlock(&sim.lock);
		free(m);
		return rc;
	}
	/* Every new mapping starts without access (cuMemSetAccess grants it). */
	m->view.base = ptr;
	m->view.size = size;
	m->view.map_size = size;
	m->view.backing = r->view + (ptr - r->base);
	m->view.kind = h->device >= 0 ? ALLOC_DEVICE : ALLOC_HOST;
	m->view.device = h->device >= 0 ? h->device : 0;
	m->view.id = ++sim.next_id;
	m->res = r;
	m->handle = h;
	m->next = r->maps;
	r->maps = m;
	h->nmaps++;
	mapped_bytes += size;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

/* Whether queued or running stream work reads or writes any mapping of r. */
static int reservation_in_use(const struct reservation *r)
{
	for (const struct CUstream_st *s = sim.streams; s != NULL; s = s->next) {
		for (const struct op *op = s->head; op != NULL; op = op->next) {
			for (const struct mapping *m = r->maps; m != NULL; m = m->next)
				if (op->dst.a == &m->view || op->src.a == &m->view)
					return 1;
		}
	}
	return 0;
}

/*
 * Unmaps a run of whole mappings. Like CUDA's, it is synchronous: it first
 * waits for stream work that touches the reservation. A handle released
 * before loses its memory here, with its last mapping.
 */
SIM_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	ENTER_VMM();
	pthread_mutex_lock(&sim.lock);
	/* Looked up again after every wait: another thread may have changed the table. */
	for (;;) {
		if (!whole_mappings(ptr, size)) {
			pthread_mutex_unlock(&sim.lock);
			return CUDA_ERROR_INVALID_VALUE;
		}
		int busy = 0;
		EACH_RESERVATION(r, ptr, size)
			busy = busy || reservation_in_use(r);
		if (!busy)
			break;
		pthread_cond_wait(&sim.progress, &sim.lock);
	}
	EACH_RESERVATION(r, ptr, size)
	{
		for (struct mapping **link = &r->maps; *link != NULL;) {
			struct mapping *m = *link;
			if (m->view.base < ptr || m->view.base >= ptr + size) {
				link = &m->next;
				continue;
			}
			*link = m->next;
			unmap_to_reserved((void *)m->view.base, m->view.size);
			unmap_to_reserved(m->view.backing, m->view.size);
			mapped_bytes -= m->view.size;
			m->handle->nmaps--;
			handle_maybe_free(m->handle);
			free(m);
		}
	}
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

/* ---- access ---- */

static int valid_access_flags(unsigned int flags)
{
	return flags == CU_MEM_ACCESS_FLAGS_PROT_NONE || flags == CU_MEM_ACCESS_FLAGS_PROT_READ ||
	       flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

static int host_location(const CUmemLocation *loc)
{
	return loc->type == CU_MEM_LOCATION_TYPE_HOST || loc->type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
	       loc->type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

/* Checks one access descriptor against the mappings of [ptr, ptr+size) of r. */
static CUresult check_access_desc(const CUmemAccessDesc *desc, const struct reservation *r,
				  uintptr_t ptr, size_t size)
{
	if (!valid_access_flags(desc->flags))
		return CUDA_ERROR_INVALID_VALUE;
	if (desc->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
		if (!sim_valid_device(desc->location.id))
			return CUDA_ERROR_INVALID_DEVICE;
		/* Another device's memory is reachable by a peer only (SIMCUDA_PEER=1). */
		for (const struct mapping *m = r->maps; m != NULL; m = m->next)
			if (m->view.base >= ptr && m->view.base < ptr + size && m->handle->device >= 0 &&
			    m->handle->device != desc->location.id && !sim.peer)
				return CUDA_ERROR_INVALID_DEVICE;
		return CUDA_SUCCESS;
	}
	/* A driver that cannot map virtual memory for the CPU (SIMCUDA_NO_HOST_ACCESS=1). */
	if (!host_location(&desc->location) || sim.no_host_access)
		return CUDA_ERROR_INVALID_VALUE;
	/* The CPU reaches host-located memory only: device memory cannot be mapped for it. */
	for (const struct mapping *m = r->maps; m != NULL; m = m->next)
		if (m->view.base >= ptr && m->view.base < ptr + size && m->handle->device >= 0)
			return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

static int host_prot(unsigned int flags)
{
	return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
	       : flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
							   : PROT_NONE;
}

SIM_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
				size_t count)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER_VMM();
	if (desc == NULL || count == 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	/* The range must be fully mapped: whole mappings, no gaps. */
	if (!whole_mappings(ptr, size))
		rc = CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < count && rc == CUDA_SUCCESS; i++)
		EACH_RESERVATION(r, ptr, size)
			if (rc == CUDA_SUCCESS)
				rc = check_access_desc(&desc[i], r, ptr, size);
	for (size_t i = 0; i < count && rc == CUDA_SUCCESS; i++) {
		EACH_RESERVATION(r, ptr, size)
		{
			for (struct mapping *m = r->maps; m != NULL; m = m->next) {
				if (m->view.base < ptr || m->view.base >= ptr + size)
					continue;
				if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
					m->access[desc[i].location.id] = (unsigned char)desc[i].flags;
				} else {
					m->host_access = (unsigned char)desc[i].flags;
					mprotect((void *)m->view.base, m->view.size,
						 host_prot(desc[i].flags));
				}
			}
		}
	}
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
				CUdeviceptr ptr)
{
	ENTER_VMM();
	if (flags == NULL || location == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (location->type == CU_MEM_LOCATION_TYPE_DEVICE && !sim_valid_device(location->id))
		return CUDA_ERROR_INVALID_DEVICE;
	if (location->type != CU_MEM_LOCATION_TYPE_DEVICE && !host_location(location))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct mapping *m = mapping_find(reservation_find(ptr), ptr);
	if (m != NULL)
		*flags = location->type == CU_MEM_LOCATION_TYPE_DEVICE ? m->access[location->id]
								       : m->host_access;
	pthread_mutex_unlock(&sim.lock);
	return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
