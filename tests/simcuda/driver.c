/*
 * driver.c - the simulated CUDA driver's entry, devices, contexts (primary and created),
 * cuGetProcAddress, error strings, fault injection, holding a call (export.h),
 * fork behaviour and the statistics file. Memory lives in memory.c, streams and events in streams.c.
 *
 * Configuration is read once when the library loads: SIMCUDA_DEVICES,
 * SIMCUDA_CONTEXT_BYTES, SIMCUDA_NO_MANAGED, SIMCUDA_NO_VMM, SIMCUDA_NO_HOST_ACCESS,
 * SIMCUDA_NO_HOST_REGISTER, SIMCUDA_PEER, SIMCUDA_FAIL and SIMCUDA_STATS_FILE (see
 * README.md). A malformed value makes cuInit fail with CUDA_ERROR_INVALID_VALUE
 * after printing what is wrong.
 */
#define _GNU_SOURCE
#include "driver.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "export.h"
#include "state.h"

#define CTX_MAGIC 0x43545821u
/* Scheduling flags, CU_CTX_MAP_HOST and CU_CTX_LMEM_RESIZE_TO_MAX: what context flags may hold. */
#define CTX_VALID_FLAGS 0x1fu
#define MAX_FAULTS 32
#define CALL_SLOTS 512
#define MAX_RUNTIMES 4

struct sim sim = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.progress = PTHREAD_COND_INITIALIZER,
};

__thread int sim_ptds;

/* Each thread's context stack (cuCtxPushCurrent/cuCtxPopCurrent); the current context is on top. */
#define CTX_STACK_MAX 64
static __thread struct CUctx_st *ctx_stack[CTX_STACK_MAX];
static __thread int ctx_depth;

/* Configuration read at load time. */
static struct simcuda_devices config_devices;
/*
 * CUDA_VISIBLE_DEVICES: the config_devices index of each ordinal this process
 * sees. Read by cuInit, as CUDA does: a program may set it before its first call.
 */
static int visible[SIMCUDA_MAX_DEVICES];
static int nvisible;
static char config_error[1024];
static struct fault {
	char name[64];
	uint64_t ordinal;
	CUresult code;
} faults[MAX_FAULTS];
static int nfaults;

/* Set in a child forked after initialisation: every call fails at once. */
static int dead_after_fork;
static pid_t load_pid;

/*
 * Call counts of driver functions, by name (the names are __func__ literals).
 * Lock-free, as a real driver's entry is: a slot's name is claimed once by
 * compare-and-swap and its count is an atomic add.
 */
static pthread_mutex_t calls_lock = PTHREAD_MUTEX_INITIALIZER; /* the runtimes' table below */
static struct {
	const char *name;
	uint64_t count;
} calls[CALL_SLOTS];

/* Runtimes' call counters (see export.h). */
static struct {
	const char *const *names;
	uint64_t *counts;
	int n;
} runtimes[MAX_RUNTIMES];
static int nruntimes;

/* name's call counter, its slot claimed on first use. */
static uint64_t *call_counter(const char *name)
{
	unsigned int h = 5381;

	for (const char *p = name; *p; p++)
		h = h * 33 + (unsigned char)*p;
	for (h %= CALL_SLOTS;; h = (h + 1) % CALL_SLOTS) {
		const char *slot = __atomic_load_n(&calls[h].name, __ATOMIC_ACQUIRE);
		/* A lost race leaves the winner's name in slot. */
		int claimed = slot == NULL && __atomic_compare_exchange_n(&calls[h].name, &slot, name, 0,
									   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
		if (claimed || slot == name || strcmp(slot, name) == 0)
			return &calls[h].count;
	}
}

/* The hook export.h's hold armed, and the function whose next call runs it. */
static const char *held_name;
static void (*held_hook)(void);

static void hold(const char *name, void (*hook)(void))
{
	__atomic_store_n(&held_name, name, __ATOMIC_RELAXED);
	__atomic_store_n(&held_hook, hook, __ATOMIC_RELEASE);
}

/* Runs the armed hook if this call of name is the one it waits for; one call takes it. */
static void run_held(const char *name)
{
	void (*hook)(void) = __atomic_load_n(&held_hook, __ATOMIC_ACQUIRE);
	if (hook == NULL || strcmp(__atomic_load_n(&held_name, __ATOMIC_RELAXED), name) != 0 ||
	    !__atomic_compare_exchange_n(&held_hook, &hook, NULL, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
		return;
	hook();
}

static int should_fail(const char *name, uint64_t ordinal)
{
	for (int i = 0; i < nfaults; i++)
		if (faults[i].ordinal == ordinal && strcmp(faults[i].name, name) == 0)
			return faults[i].code;
	return CUDA_SUCCESS;
}

CUresult sim_enter(const char *name, int need, uint64_t **counter)
{
	if (__atomic_load_n(&dead_after_fork, __ATOMIC_RELAXED))
		return CUDA_ERROR_NOT_INITIALIZED;
	uint64_t *count = __atomic_load_n(counter, __ATOMIC_ACQUIRE);
	if (count == NULL) {
		count = call_counter(name);
		__atomic_store_n(counter, count, __ATOMIC_RELEASE);
	}
	uint64_t n = __atomic_add_fetch(count, 1, __ATOMIC_RELAXED);
	run_held(name);
	if (sim_in_host_fn)
		return CUDA_ERROR_NOT_PERMITTED; /* host functions must not call CUDA */
	if ((need & ENTER_INIT) && !__atomic_load_n(&sim.initialized, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_NOT_INITIALIZED;
	return (CUresult)should_fail(name, n);
}

int sim_valid_device(int device)
{
	return device >= 0 && device < sim.ndev;
}

struct CUctx_st *sim_current_ctx(void)
{
	return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
}

CUresult sim_current_device(int *device)
{
	struct CUctx_st *ctx = sim_current_ctx();

	if (ctx == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* Read without sim.lock (a real driver's is a thread-local read); writers store atomically. */
	int active = ctx->primary ? __atomic_load_n(&sim.dev[ctx->device].ctx_active, __ATOMIC_ACQUIRE)
				  : !__atomic_load_n(&ctx->destroyed, __ATOMIC_ACQUIRE);
	if (!active)
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	*device = ctx->device;
	return CUDA_SUCCESS;
}

/* ---- configuration, fork ---- */

static void parse_faults(const char *spec)
{
	char *copy = strdup(spec), *save = NULL;

	if (copy == NULL)
		return;
	for (char *item = strtok_r(copy, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
		char shown[256];
		snprintf(shown, sizeof(shown), "%s", item);
		/* "=<code>" names the error; out-of-memory without one. */
		unsigned long long code = CUDA_ERROR_OUT_OF_MEMORY;
		char *equals = strchr(item, '='), *end;
		if (equals != NULL) {
			*equals = '\0';
			errno = 0;
			code = strtoull(equals + 1, &end, 10);
			if (errno != 0 || end == equals + 1 || *end != '\0' || equals[1] == '-' || code > 999)
				code = CUDA_SUCCESS;
		}
		char *colon = strrchr(item, ':');
		unsigned long long n = 0;
		if (colon != NULL && colon != item && (size_t)(colon - item) < sizeof(faults[0].name)) {
			errno = 0;
			n = strtoull(colon + 1, &end, 10);
			if (errno != 0 || end == colon + 1 || *end != '\0' || colon[1] == '-')
				n = 0;
		}
		if (n == 0 || code == CUDA_SUCCESS || nfaults == MAX_FAULTS) {
			snprintf(config_error, sizeof(config_error),
				 "SIMCUDA_FAIL=\"%s\": bad item \"%s\"; expected a comma-separated list "
				 "of at most %d <function>:<call number>[=<CUresult>] items, the CUresult "
				 "a number from 1 to 999 (out of memory without one), e.g. "
				 "cuMemAlloc_v2:5 or cuCtxSynchronize:2=700",
				 spec, shown, MAX_FAULTS);
			break;
		}
		memcpy(faults[nfaults].name, item, (size_t)(colon - item));
		faults[nfaults].name[colon - item] = '\0';
		faults[nfaults].ordinal = n;
		faults[nfaults].code = (CUresult)code;
		nfaults++;
	}
	free(copy);
}

static void fork_prepare(void)
{
	pthread_mutex_lock(&calls_lock);
	pthread_mutex_lock(&sim.lock);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&sim.lock);
	pthread_mutex_unlock(&calls_lock);
}

/* CUDA cannot be used in a child forked after initialisation: every call fails, none blocks. */
static void fork_child(void)
{
	if (sim.initialized)
		__atomic_store_n(&dead_after_fork, 1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&sim.lock);
	pthread_mutex_unlock(&calls_lock);
}

/* Reads the 0/1 switch name into *on; anything else is the configuration error. */
static void read_switch(const char *name, int *on)
{
	const char *v = getenv(name);
	if (v == NULL || v[0] == '\0' || strcmp(v, "0") == 0)
		return;
	if (strcmp(v, "1") == 0)
		*on = 1;
	else
		snprintf(config_error, sizeof(config_error), "%s=\"%s\": expected 1 or 0", name, v);
}

__attribute__((constructor)) static void load_config(void)
{
	char err[768];
	const char *v;

	load_pid = getpid();
	pthread_atfork(fork_prepare, fork_parent, fork_child);
	if (simcuda_devices_parse(getenv("SIMCUDA_DEVICES"), &config_devices, err, sizeof(err)) != 0)
		snprintf(config_error, sizeof(config_error), "%s", err);
	v = getenv("SIMCUDA_CONTEXT_BYTES");
	if (v != NULL && v[0] != '\0' && simcuda_parse_size(v, &sim.context_bytes) != 0)
		snprintf(config_error, sizeof(config_error),
			 "SIMCUDA_CONTEXT_BYTES=\"%s\": expected an integer optionally followed by "
			 "B, KiB, MiB, GiB or TiB",
			 v);
	read_switch("SIMCUDA_NO_MANAGED", &sim.no_managed);
	read_switch("SIMCUDA_NO_VMM", &sim.no_vmm);
	read_switch("SIMCUDA_NO_HOST_ACCESS", &sim.no_host_access);
	read_switch("SIMCUDA_NO_HOST_REGISTER", &sim.no_host_register);
	read_switch("SIMCUDA_PEER", &sim.peer);
	v = getenv("SIMCUDA_FAIL");
	if (v != NULL && v[0] != '\0')
		parse_faults(v);
}

/* ---- initialisation, versions ---- */

SIM_API CUresult cuInit(unsigned int Flags)
{
	static int reported;
	CUresult rc = CUDA_SUCCESS;

	ENTER(ENTER_ANY);
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	if (config_error[0] != '\0') {
		if (!reported++)
			fprintf(stderr, "simcuda: %s\n", config_error);
		rc = CUDA_ERROR_INVALID_VALUE;
	} else if (!sim.initialized) {
		nvisible = simcuda_visible_devices(&config_devices, getenv("CUDA_VISIBLE_DEVICES"),
						   visible);
		if (nvisible == 0)
			rc = CUDA_ERROR_NO_DEVICE; /* CUDA_VISIBLE_DEVICES hides every device */
		sim.ndev = nvisible;
		for (int i = 0; i < sim.ndev; i++) {
			sim.dev[i].physical = visible[i];
			sim.dev[i].capacity = config_devices.capacity[visible[i]];
			sim.dev[i].ctx = calloc(1, sizeof(struct CUctx_st));
			if (sim.dev[i].ctx == NULL) {
				rc = CUDA_ERROR_OUT_OF_MEMORY;
				break;
			}
			sim.dev[i].ctx->magic = CTX_MAGIC;
			sim.dev[i].ctx->device = i;
			sim.dev[i].ctx->primary = 1;
		}
		if (rc == CUDA_SUCCESS) {
			simstate_open(config_devices.count); /* on failure NVML just does not see us */
			sim.init_pid = getpid();
			__atomic_store_n(&sim.initialized, 1, __ATOMIC_RELEASE);
		}
	}
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

SIM_API CUresult cuDriverGetVersion(int *driverVersion)
{
	ENTER(ENTER_ANY);
	if (driverVersion == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = SIMCUDA_DRIVER_VERSION;
	return CUDA_SUCCESS;
}

/* ---- devices ---- */

SIM_API CUresult cuDeviceGetCount(int *count)
{
	ENTER(ENTER_INIT);
	if (count == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*count = sim.ndev;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	ENTER(ENTER_INIT);
	if (device == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(ordinal))
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	char buf[128];

	ENTER(ENTER_INIT);
	if (name == NULL || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	simcuda_device_name(sim.dev[dev].physical, sim.dev[dev].capacity, buf, sizeof(buf));
	snprintf(name, (size_t)len, "%s", buf);
	return CUDA_SUCCESS;
}

static CUresult device_uuid(CUuuid *uuid, CUdevice dev)
{
	if (uuid == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	simcuda_device_uuid(sim.dev[dev].physical, sim.dev[dev].capacity, (unsigned char *)uuid->bytes);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	ENTER(ENTER_INIT);
	return device_uuid(uuid, dev);
}

SIM_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	ENTER(ENTER_INIT);
	return device_uuid(uuid, dev);
}

SIM_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	ENTER(ENTER_INIT);
	if (bytes == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = sim.dev[dev].capacity;
	return CUDA_SUCCESS;
}

/*
 * Every CUdevice_attribute of CUDA 12.4 (1 to CU_DEVICE_ATTRIBUTE_MAX - 1 =
 * 134), valued as an H100 SXM (compute capability 9.0) reports them, except
 * where simcuda lacks the feature: those say 0 (README.md lists them). The
 * values that depend on the device or the configuration are set in
 * cuDeviceGetAttribute.
 */
#define ATTRIBUTE_MAX 135
static const int h100_attributes[ATTRIBUTE_MAX] = {
	[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK] = 1024,
	[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X] = 1024,
	[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y] = 1024,
	[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z] = 64,
	[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X] = 2147483647,
	[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y] = 65535,
	[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z] = 65535,
	[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK] = 49152,
	[CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY] = 65536,
	[CU_DEVICE_ATTRIBUTE_WARP_SIZE] = 32,
	[CU_DEVICE_ATTRIBUTE_MAX_PITCH] = 2147483647,
	[CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK] = 65536,
	[CU_DEVICE_ATTRIBUTE_CLOCK_RATE] = 1980000,
	[CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT] = 512,
	[CU_DEVICE_ATTRIBUTE_GPU_OVERLAP] = 1,
	[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] = 132,
	[CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT] = 0,
	[CU_DEVICE_ATTRIBUTE_INTEGRATED] = 0,
	[CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY] = 1,
	[CU_DEVICE_ATTRIBUTE_COMPUTE_MODE] = 0, /* CU_COMPUTEMODE_DEFAULT */
	[21] = 131072, /* MAXIMUM_TEXTURE1D_WIDTH */
	[22] = 131072, /* MAXIMUM_TEXTURE2D_WIDTH */
	[23] = 65536,  /* MAXIMUM_TEXTURE2D_HEIGHT */
	[24] = 16384,  /* MAXIMUM_TEXTURE3D_WIDTH */
	[25] = 16384,  /* MAXIMUM_TEXTURE3D_HEIGHT */
	[26] = 16384,  /* MAXIMUM_TEXTURE3D_DEPTH */
	[27] = 32768,  /* MAXIMUM_TEXTURE2D_LAYERED_WIDTH */
	[28] = 32768,  /* MAXIMUM_TEXTURE2D_LAYERED_HEIGHT */
	[29] = 2048,   /* MAXIMUM_TEXTURE2D_LAYERED_LAYERS */
	[30] = 512,    /* SURFACE_ALIGNMENT */
	[CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS] = 1,
	[CU_DEVICE_ATTRIBUTE_ECC_ENABLED] = 1,
	[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID] = 0,
	[CU_DEVICE_ATTRIBUTE_TCC_DRIVER] = 0,
	[CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE] = 2619000,
	[CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH] = 5120,
	[CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE] = 52428800,
	[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR] = 2048,
	[CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT] = 3,
	[CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING] = 1,
	[42] = 32768,  /* MAXIMUM_TEXTURE1D_LAYERED_WIDTH */
	[43] = 2048,   /* MAXIMUM_TEXTURE1D_LAYERED_LAYERS */
	[44] = 0,      /* CAN_TEX2D_GATHER (deprecated) */
	[45] = 32768,  /* MAXIMUM_TEXTURE2D_GATHER_WIDTH */
	[46] = 32768,  /* MAXIMUM_TEXTURE2D_GATHER_HEIGHT */
	[47] = 8192,   /* MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE */
	[48] = 8192,   /* MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE */
	[49] = 32768,  /* MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE */
	[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID] = 0,
	[51] = 32,     /* TEXTURE_PITCH_ALIGNMENT */
	[52] = 32768,  /* MAXIMUM_TEXTURECUBEMAP_WIDTH */
	[53] = 32768,  /* MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH */
	[54] = 2046,   /* MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS */
	[55] = 32768,  /* MAXIMUM_SURFACE1D_WIDTH */
	[56] = 131072, /* MAXIMUM_SURFACE2D_WIDTH */
	[57] = 65536,  /* MAXIMUM_SURFACE2D_HEIGHT */
	[58] = 16384,  /* MAXIMUM_SURFACE3D_WIDTH */
	[59] = 16384,  /* MAXIMUM_SURFACE3D_HEIGHT */
	[60] = 16384,  /* MAXIMUM_SURFACE3D_DEPTH */
	[61] = 32768,  /* MAXIMUM_SURFACE1D_LAYERED_WIDTH */
	[62] = 2048,   /* MAXIMUM_SURFACE1D_LAYERED_LAYERS */
	[63] = 32768,  /* MAXIMUM_SURFACE2D_LAYERED_WIDTH */
	[64] = 32768,  /* MAXIMUM_SURFACE2D_LAYERED_HEIGHT */
	[65] = 2048,   /* MAXIMUM_SURFACE2D_LAYERED_LAYERS */
	[66] = 32768,  /* MAXIMUM_SURFACECUBEMAP_WIDTH */
	[67] = 32768,  /* MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH */
	[68] = 2046,   /* MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS */
	[69] = 268435456, /* MAXIMUM_TEXTURE1D_LINEAR_WIDTH (deprecated) */
	[70] = 131072, /* MAXIMUM_TEXTURE2D_LINEAR_WIDTH */
	[71] = 65000,  /* MAXIMUM_TEXTURE2D_LINEAR_HEIGHT */
	[72] = 2097120, /* MAXIMUM_TEXTURE2D_LINEAR_PITCH */
	[73] = 32768,  /* MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH */
	[74] = 32768,  /* MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT */
	[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR] = 9,
	[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR] = 0,
	[77] = 32768,  /* MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH */
	[CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED] = 1,
	[79] = 1,      /* GLOBAL_L1_CACHE_SUPPORTED */
	[80] = 1,      /* LOCAL_L1_CACHE_SUPPORTED */
	[81] = 233472, /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
	[82] = 65536,  /* MAX_REGISTERS_PER_MULTIPROCESSOR */
	[CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD] = 0,
	[86] = 0,      /* HOST_NATIVE_ATOMIC_SUPPORTED */
	[87] = 2,      /* SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO */
	[CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS] = 0,
	[90] = 1,      /* COMPUTE_PREEMPTION_SUPPORTED */
	[CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM] = 1,
	[92] = 0,      /* CAN_USE_STREAM_MEM_OPS_V1 (deprecated) */
	[93] = 0,      /* CAN_USE_64_BIT_STREAM_MEM_OPS_V1 (deprecated) */
	[94] = 0,      /* CAN_USE_STREAM_WAIT_VALUE_NOR_V1 (deprecated) */
	[95] = 1,      /* COOPERATIVE_LAUNCH */
	[96] = 0,      /* COOPERATIVE_MULTI_DEVICE_LAUNCH (deprecated) */
	[97] = 232448, /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
	[98] = 0,      /* CAN_FLUSH_REMOTE_WRITES */
	[CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED] = 1, /* SIMCUDA_NO_HOST_REGISTER=1 makes it 0 */
	[100] = 0,     /* PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES */
	[CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST] = 0,
	[103] = 0,     /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: answered by vmm.c */
	[104] = 0,     /* HANDLE_TYPE_WIN32_HANDLE_SUPPORTED */
	[105] = 0,     /* HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED */
	[106] = 32,    /* MAX_BLOCKS_PER_MULTIPROCESSOR */
	[107] = 0,     /* GENERIC_COMPRESSION_SUPPORTED */
	[108] = 39321600, /* MAX_PERSISTING_L2_CACHE_SIZE */
	[109] = 134213632, /* MAX_ACCESS_POLICY_WINDOW_SIZE */
	[110] = 0,     /* GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: answered by vmm.c */
	[111] = 1024,  /* RESERVED_SHARED_MEMORY_PER_BLOCK */
	[112] = 0,     /* SPARSE_CUDA_ARRAY_SUPPORTED: no sparse arrays (arrays.c) */
	[113] = 0,     /* READ_ONLY_HOST_REGISTER_SUPPORTED: CU_MEMHOSTREGISTER_READ_ONLY is refused */
	[114] = 0,     /* TIMELINE_SEMAPHORE_INTEROP_SUPPORTED */
	[CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED] = 1,
	[116] = 0,     /* GPU_DIRECT_RDMA_SUPPORTED */
	[117] = 0,     /* GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS */
	[118] = 0,     /* GPU_DIRECT_RDMA_WRITES_ORDERING: none */
	[119] = 0,     /* MEMPOOL_SUPPORTED_HANDLE_TYPES: none (no pool export) */
	[120] = 1,     /* CLUSTER_LAUNCH */
	[121] = 1,     /* DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED: made, never mapped (arrays.c) */
	[122] = 0,     /* CAN_USE_64_BIT_STREAM_MEM_OPS: no stream memory operations */
	[123] = 0,     /* CAN_USE_STREAM_WAIT_VALUE_NOR */
	[124] = 0,     /* DMA_BUF_SUPPORTED */
	[125] = 0,     /* IPC_EVENT_SUPPORTED: no IPC events */
	[126] = 4,     /* MEM_SYNC_DOMAIN_COUNT */
	[127] = 1,     /* TENSOR_MAP_ACCESS_SUPPORTED */
	[128] = 0,     /* HANDLE_TYPE_FABRIC_SUPPORTED */
	[129] = 0,     /* UNIFIED_FUNCTION_POINTERS */
	[130] = 0,     /* NUMA_CONFIG: CU_DEVICE_NUMA_CONFIG_NONE */
	[131] = -1,    /* NUMA_ID: not a NUMA node */
	[132] = 0,     /* MULTICAST_SUPPORTED */
	[133] = 0,     /* MPS_ENABLED */
	[134] = -1,    /* HOST_NUMA_ID: no NUMA */
};

int sim_device_limit(int attrib)
{
	return h100_attributes[attrib];
}

SIM_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	int managed = !sim.no_managed;
	int v;

	ENTER(ENTER_INIT);
	if (pi == NULL || (int)attrib <= 0 || (int)attrib >= ATTRIBUTE_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	if (vmm_device_attribute(attrib, pi))
		return CUDA_SUCCESS;
	switch ((int)attrib) {
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x18 + sim.dev[dev].physical; break;
	case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = managed; break;
	case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = managed; break;
	case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = !sim.no_host_register; break;
	case 85: v = sim.dev[dev].physical; break; /* MULTI_GPU_BOARD_GROUP_ID: one board per device */
	default: v = h100_attributes[attrib]; break;
	}
	*pi = v;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
	ENTER(ENTER_INIT);
	if (major == NULL || minor == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*major = h100_attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
	*minor = h100_attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
	return CUDA_SUCCESS;
}

/* "dddd:bb:dd.f", as CU_DEVICE_ATTRIBUTE_PCI_{DOMAIN,BUS,DEVICE}_ID describe the device. */
SIM_API CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
	ENTER(ENTER_INIT);
	if (pciBusId == NULL || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", 0x18 + sim.dev[dev].physical);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
	unsigned int domain, bus, device, function;
	char end;

	ENTER(ENTER_INIT);
	if (dev == NULL || pciBusId == NULL ||
	    sscanf(pciBusId, "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &end) != 4)
		return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < sim.ndev && domain == 0 && device == 0 && function == 0; i++) {
		if (sim.dev[i].physical == (int)bus - 0x18) {
			*dev = i;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_DEVICE;
}

/*
 * Whether dev can reach peerDev's memory: never, unless SIMCUDA_PEER=1 makes
 * the devices peers, which virtual memory's access grants (cuMemSetAccess for
 * another device) then need. A device is not its own peer.
 */
SIM_API CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
	ENTER(ENTER_INIT);
	if (canAccessPeer == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev) || !sim_valid_device(peerDev))
		return CUDA_ERROR_INVALID_DEVICE;
	*canAccessPeer = sim.peer && dev != peerDev;
	return CUDA_SUCCESS;
}

/* ---- primary contexts ---- */

/* Makes device's primary context active: it takes its bytes and gets its legacy stream. */
static CUresult ctx_activate_locked(int device)
{
	struct sim_device *d = &sim.dev[device];
	uint64_t bytes = sim.context_bytes;
	uint64_t cap = d->others_bytes < d->capacity ? d->capacity - d->others_bytes : 0;

	if (bytes > cap || d->plain_bytes + d->ctx_bytes > cap - bytes ||
	    mem_make_room(device, bytes, NULL) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (d->legacy == NULL) {
		CUresult rc = stream_create_locked(device, CU_STREAM_DEFAULT, 1, 0, &d->legacy);
		if (rc != CUDA_SUCCESS)
			return rc;
	}
	d->ctx_bytes += bytes;
	d->ctx->bytes = bytes;
	__atomic_store_n(&d->ctx_active, 1, __ATOMIC_RELEASE);
	mem_usage_changed(device);
	return CUDA_SUCCESS;
}

/*
 * Destroys device's primary context once its work is done: its allocations,
 * streams and bytes go, as they do when a CUDA context is destroyed.
 * force: cuDevicePrimaryCtxReset, regardless of the reference count, which it
 * leaves alone: a reset does not release anyone's retain, and the holders may
 * still call cuDevicePrimaryCtxRelease (the context stays inactive until the
 * next cuDevicePrimaryCtxRetain).
 */
static void ctx_deactivate(int device, int force)
{
	stream_sync_device(device);
	pthread_mutex_lock(&sim.lock);
	struct sim_device *d = &sim.dev[device];
	if (d->ctx_active && (force || d->ctx_refs == 0)) {
		mem_release_context(d->ctx);
		streams_destroy_context(d->ctx);
		d->ctx_bytes -= d->ctx->bytes;
		d->ctx->bytes = 0;
		__atomic_store_n(&d->ctx_active, 0, __ATOMIC_RELEASE);
		mem_usage_changed(device);
	}
	pthread_mutex_unlock(&sim.lock);
}

SIM_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(ENTER_INIT);
	if (pctx == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	mem_refresh_others(dev);
	pthread_mutex_lock(&sim.lock);
	if (!sim.dev[dev].ctx_active)
		rc = ctx_activate_locked(dev);
	if (rc == CUDA_SUCCESS) {
		sim.dev[dev].ctx_refs++;
		*pctx = sim.dev[dev].ctx;
	}
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

static CUresult primary_release(CUdevice dev)
{
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&sim.lock);
	if (sim.dev[dev].ctx_refs == 0) {
		pthread_mutex_unlock(&sim.lock);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	int last = --sim.dev[dev].ctx_refs == 0;
	pthread_mutex_unlock(&sim.lock);
	if (last)
		ctx_deactivate(dev, 0);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	ENTER(ENTER_INIT);
	return primary_release(dev);
}

SIM_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	ENTER(ENTER_INIT);
	return primary_release(dev);
}

static CUresult primary_reset(CUdevice dev)
{
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	ctx_deactivate(dev, 1);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
	ENTER(ENTER_INIT);
	return primary_reset(dev);
}

SIM_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	ENTER(ENTER_INIT);
	return primary_reset(dev);
}

SIM_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	ENTER(ENTER_INIT);
	if (flags == NULL || active == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&sim.lock);
	*flags = sim.dev[dev].primary_flags;
	*active = sim.dev[dev].ctx_active;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

/* Kept and reported; since CUDA 11 they may change while the context is active. */
SIM_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
	ENTER(ENTER_INIT);
	if ((flags & ~CTX_VALID_FLAGS) || (flags & 7u) == 3u || (flags & 7u) > 4u)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&sim.lock);
	sim.dev[dev].primary_flags = flags;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

/* ---- the context stack, created contexts ---- */

/* Whether ctx is a live context: a primary one (active or not) or an undestroyed created one. */
static int ctx_known_locked(const struct CUctx_st *ctx)
{
	for (int i = 0; i < sim.ndev; i++)
		if (sim.dev[i].ctx == ctx)
			return 1;
	for (const struct CUctx_st *c = sim.contexts; c != NULL; c = c->next)
		if (c == ctx)
			return !c->destroyed;
	return 0;
}

static int ctx_known(const struct CUctx_st *ctx)
{
	pthread_mutex_lock(&sim.lock);
	int known = ctx_known_locked(ctx);
	pthread_mutex_unlock(&sim.lock);
	return known;
}

SIM_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	ENTER(ENTER_INIT);
	if (pctx == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = sim_current_ctx();
	return CUDA_SUCCESS;
}

/* Replaces the top of the stack (pushes onto an empty one); NULL pops. */
SIM_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	ENTER(ENTER_INIT);
	if (ctx == NULL) {
		if (ctx_depth > 0)
			ctx_depth--;
		return CUDA_SUCCESS;
	}
	if (!ctx_known(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_depth == 0)
		ctx_depth = 1;
	ctx_stack[ctx_depth - 1] = ctx;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	ENTER(ENTER_INIT);
	if (ctx == NULL || !ctx_known(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_depth == CTX_STACK_MAX)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = ctx;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	ENTER(ENTER_INIT);
	if (ctx_depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	ctx_depth--;
	if (pctx != NULL)
		*pctx = ctx_stack[ctx_depth];
	return CUDA_SUCCESS;
}

/*
 * How many destroyed created contexts are kept, refused by handle, before
 * the oldest is reused: a program that creates and destroys contexts for
 * ever holds bounded memory, and the context calls that look a handle up
 * stay as fast, as with CUDA, which reuses a destroyed context's memory.
 */
#define CONTEXTS_KEPT 64

/* The oldest destroyed created context, if more than CONTEXTS_KEPT are (sim.lock held). */
static struct CUctx_st *retired_context(void)
{
	struct CUctx_st *oldest = NULL;
	int n = 0;

	for (struct CUctx_st *c = sim.contexts; c != NULL; c = c->next)
		if (c->destroyed)
			oldest = c, n++;
	return n > CONTEXTS_KEPT ? oldest : NULL;
}

/* Creates a context on dev, pushed on the calling thread's stack. */
static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	if (pctx == NULL || (flags & ~CTX_VALID_FLAGS) || (flags & 7u) == 3u || (flags & 7u) > 4u)
		return CUDA_ERROR_INVALID_VALUE;
	if (!sim_valid_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	if (ctx_depth == CTX_STACK_MAX)
		return CUDA_ERROR_OUT_OF_MEMORY;
	mem_refresh_others(dev);
	pthread_mutex_lock(&sim.lock);
	struct sim_device *d = &sim.dev[dev];
	uint64_t bytes = sim.context_bytes;
	uint64_t cap = d->others_bytes < d->capacity ? d->capacity - d->others_bytes : 0;
	CUresult rc = CUDA_SUCCESS;
	if (bytes > cap || d->plain_bytes + d->ctx_bytes > cap - bytes ||
	    mem_make_room(dev, bytes, NULL) != 0)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	else if (d->legacy == NULL)
		rc = stream_create_locked(dev, CU_STREAM_DEFAULT, 1, 0, &d->legacy);
	struct CUctx_st *ctx = rc == CUDA_SUCCESS ? retired_context() : NULL;
	if (rc == CUDA_SUCCESS && ctx == NULL) {
		ctx = calloc(1, sizeof(*ctx));
		if (ctx == NULL) {
			rc = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			ctx->next = sim.contexts;
			sim.contexts = ctx;
		}
	}
	if (rc != CUDA_SUCCESS) {
		pthread_mutex_unlock(&sim.lock);
		return rc;
	}
	ctx->magic = CTX_MAGIC;
	ctx->device = dev;
	ctx->flags = flags;
	ctx->usage = 1;
	ctx->cache_config = ctx->shmem_config = 0;
	memset(ctx->limits, 0, sizeof(ctx->limits));
	ctx->limits_set = 0;
	ctx->bytes = bytes;
	__atomic_store_n(&ctx->destroyed, 0, __ATOMIC_RELEASE);
	d->ctx_bytes += bytes;
	mem_usage_changed(dev);
	pthread_mutex_unlock(&sim.lock);
	ctx_stack[ctx_depth++] = ctx;
	*pctx = ctx;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	ENTER(ENTER_INIT);
	return ctx_create(pctx, flags, dev);
}

/*
 * The execution affinity a context is created with: none, or none that
 * simcuda supports, since it limits SMs only under MPS and simcuda has no
 * SMs to limit (cuDeviceGetExecAffinitySupport would answer 0).
 */
static CUresult exec_affinity(const CUexecAffinityParam *params, int n)
{
	if (n < 0 || (params == NULL) != (n == 0))
		return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < n; i++)
		if (params[i].type < 0 || params[i].type >= CU_EXEC_AFFINITY_TYPE_MAX)
			return CUDA_ERROR_INVALID_VALUE;
	return n == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
}

SIM_API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
				unsigned int flags, CUdevice dev)
{
	ENTER(ENTER_INIT);
	CUresult rc = exec_affinity(paramsArray, numParams);
	return rc != CUDA_SUCCESS ? rc : ctx_create(pctx, flags, dev);
}

/* NULL parameters, or neither affinity nor CIG, make a regular context; CIG (a
 * D3D12 or Vulkan client's shared data) is not supported. */
SIM_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
				unsigned int flags, CUdevice dev)
{
	ENTER(ENTER_INIT);
	if (ctxCreateParams == NULL)
		return ctx_create(pctx, flags, dev);
	if (ctxCreateParams->execAffinityParams != NULL && ctxCreateParams->cigParams != NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (ctxCreateParams->cigParams != NULL)
		return CUDA_ERROR_NOT_SUPPORTED;
	CUresult rc = exec_affinity(ctxCreateParams->execAffinityParams,
				    ctxCreateParams->numExecAffinityParams);
	return rc != CUDA_SUCCESS ? rc : ctx_create(pctx, flags, dev);
}

/* Finds created context ctx (sim.lock held); NULL when it is unknown, destroyed or primary. */
static struct CUctx_st *created_ctx_locked(CUcontext ctx)
{
	for (struct CUctx_st *c = sim.contexts; c != NULL; c = c->next)
		if (c == ctx)
			return c->destroyed ? NULL : c;
	return NULL;
}

/*
 * Destroys a created context once the device's work is done: its
 * allocations, streams, events and bytes go. It leaves the calling thread's stack; other
 * threads that still have it current get CUDA_ERROR_CONTEXT_IS_DESTROYED.
 */
static CUresult ctx_destroy(CUcontext ctx)
{
	pthread_mutex_lock(&sim.lock);
	struct CUctx_st *c = created_ctx_locked(ctx);
	int primary = c == NULL && ctx_known_locked(ctx);
	pthread_mutex_unlock(&sim.lock);
	if (c == NULL)
		return primary ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_INVALID_VALUE;
	stream_sync_device(c->device);
	pthread_mutex_lock(&sim.lock);
	if (c->destroyed) {
		pthread_mutex_unlock(&sim.lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	__atomic_store_n(&c->destroyed, 1, __ATOMIC_RELEASE);
	mem_release_context(c);
	streams_destroy_context(c);
	sim.dev[c->device].ctx_bytes -= c->bytes;
	c->bytes = 0;
	mem_usage_changed(c->device);
	pthread_mutex_unlock(&sim.lock);
	int kept = 0;
	for (int i = 0; i < ctx_depth; i++)
		if (ctx_stack[i] != c)
			ctx_stack[kept++] = ctx_stack[i];
	ctx_depth = kept;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	ENTER(ENTER_INIT);
	return ctx_destroy(ctx);
}

SIM_API CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags)
{
	ENTER(ENTER_INIT);
	struct CUctx_st *cur = sim_current_ctx();
	if (pctx == NULL || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct CUctx_st *c = created_ctx_locked(cur);
	if (c != NULL)
		c->usage++;
	pthread_mutex_unlock(&sim.lock);
	if (c == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	*pctx = c;
	return CUDA_SUCCESS;
}

/* Drops one usage of the current created context; the last one destroys it. */
SIM_API CUresult cuCtxDetach(CUcontext ctx)
{
	ENTER(ENTER_INIT);
	if (ctx == NULL || ctx != sim_current_ctx())
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&sim.lock);
	struct CUctx_st *c = created_ctx_locked(ctx);
	int last = c != NULL && --c->usage == 0;
	pthread_mutex_unlock(&sim.lock);
	if (c == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	return last ? ctx_destroy(ctx) : CUDA_SUCCESS;
}

SIM_API CUresult cuCtxGetFlags(unsigned int *flags)
{
	ENTER(ENTER_INIT);
	struct CUctx_st *ctx = sim_current_ctx();
	if (flags == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (ctx == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&sim.lock);
	*flags = ctx->primary ? sim.dev[ctx->device].primary_flags : ctx->flags;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

/* Contexts made through the _v2 entry points report the 3.2 API, as CUDA's do. */
SIM_API CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
	ENTER(ENTER_INIT);
	if (version == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (ctx == NULL)
		ctx = sim_current_ctx();
	if (ctx == NULL || !ctx_known(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	*version = 3020;
	return CUDA_SUCCESS;
}

/*
 * No kernels run, so the cache and shared memory preferences change nothing;
 * the current context keeps and reports them.
 */
static CUresult ctx_config(int *get, int set, int max, int shared)
{
	struct CUctx_st *ctx = sim_current_ctx();

	if (ctx == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (get == NULL && (set < 0 || set > max))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	int *slot = shared ? &ctx->shmem_config : &ctx->cache_config;
	if (get != NULL)
		*get = *slot;
	else
		*slot = set;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxGetCacheConfig(int *pconfig)
{
	ENTER(ENTER_INIT);
	return pconfig == NULL ? CUDA_ERROR_INVALID_VALUE : ctx_config(pconfig, 0, 0, 0);
}

/* CU_FUNC_CACHE_PREFER_NONE (0) to CU_FUNC_CACHE_PREFER_EQUAL (3). */
SIM_API CUresult cuCtxSetCacheConfig(int config)
{
	ENTER(ENTER_INIT);
	return ctx_config(NULL, config, 3, 0);
}

SIM_API CUresult cuCtxGetSharedMemConfig(int *pConfig)
{
	ENTER(ENTER_INIT);
	return pConfig == NULL ? CUDA_ERROR_INVALID_VALUE : ctx_config(pConfig, 0, 0, 1);
}

/* CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE (0) to _EIGHT_BYTE_BANK_SIZE (2). */
SIM_API CUresult cuCtxSetSharedMemConfig(int config)
{
	ENTER(ENTER_INIT);
	return ctx_config(NULL, config, 2, 1);
}

SIM_API CUresult cuCtxGetDevice(CUdevice *device)
{
	ENTER(ENTER_INIT);
	if (device == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return sim_current_device(device);
}

SIM_API CUresult cuCtxSynchronize(void)
{
	int dev;

	ENTER(ENTER_INIT);
	CUresult rc = sim_current_device(&dev);
	if (rc == CUDA_SUCCESS)
		rc = capture_check_unsafe(); /* unsafe during stream capture */
	if (rc != CUDA_SUCCESS)
		return rc;
	/* The current context's work only: another context's is not its. */
	stream_sync_context(sim_current_ctx());
	return CUDA_SUCCESS;
}

/* ---- error strings ---- */

static const struct {
	CUresult code;
	const char *name, *text;
} errors[] = {
	{CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
	{CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
	{CUDA_ERROR_PROFILER_DISABLED, "CUDA_ERROR_PROFILER_DISABLED", "profiler disabled while using external profiling tool"},
	{CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
	{CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
	{CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{CUDA_ERROR_DEVICE_NOT_LICENSED, "CUDA_ERROR_DEVICE_NOT_LICENSED", "device doesn't have valid Grid license"},
	{CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	{CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
	{CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
	{CUDA_ERROR_UNMAP_FAILED, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"},
	{CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
	{CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
	{CUDA_ERROR_ALREADY_ACQUIRED, "CUDA_ERROR_ALREADY_ACQUIRED", "resource already acquired"},
	{CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
	{CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY",
	 "the provided execution affinity is not supported"},
	{CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid"},
	{CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
	{CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
	{CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
	{CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	{CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
	{CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	{CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
	{CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
	{CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
	{CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
	{CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "cannot set while device is active in this process"},
	{CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
	{CUDA_ERROR_ASSERT, "CUDA_ERROR_ASSERT", "device-side assert triggered"},
	{CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
	{CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
	{CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
	{CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
	{CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	{CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
	{CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
	{CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"},
	{CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
	{CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
	{CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
	{CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
	{CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
	{CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
	{CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_text(CUresult error, const char **pStr, int name)
{
	if (pStr == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++) {
		if (errors[i].code == error) {
			*pStr = name ? errors[i].name : errors[i].text;
			return CUDA_SUCCESS;
		}
	}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult cuGetErrorName(CUresult error, const char **pStr)
{
	ENTER(ENTER_ANY);
	return error_text(error, pStr, 1);
}

SIM_API CUresult cuGetErrorString(CUresult error, const char **pStr)
{
	ENTER(ENTER_ANY);
	return error_text(error, pStr, 0);
}

/* ---- limits, pinned memory flags, peer copies, callbacks, profiler ---- */

/* CUlimit values 0 to 6 and an H100's defaults for them. */
#define LIMIT_COUNT 7
static const size_t default_limits[LIMIT_COUNT] = {
	1024,            /* CU_LIMIT_STACK_SIZE */
	1 << 20,         /* CU_LIMIT_PRINTF_FIFO_SIZE */
	8 << 20,         /* CU_LIMIT_MALLOC_HEAP_SIZE */
	2,               /* CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH */
	2048,            /* CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT */
	32,              /* CU_LIMIT_MAX_L2_FETCH_GRANULARITY */
	0,               /* CU_LIMIT_PERSISTING_L2_CACHE_SIZE */
};

SIM_API CUresult cuCtxGetLimit(size_t *pvalue, int limit)
{
	ENTER(ENTER_INIT);
	struct CUctx_st *ctx = sim_current_ctx();
	if (pvalue == NULL || limit < 0 || limit >= LIMIT_COUNT)
		return CUDA_ERROR_INVALID_VALUE;
	if (ctx == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&sim.lock);
	*pvalue = ctx->limits_set & (1u << limit) ? ctx->limits[limit] : default_limits[limit];
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

/* Kept and reported: no kernel runs to be limited. */
SIM_API CUresult cuCtxSetLimit(int limit, size_t value)
{
	ENTER(ENTER_INIT);
	struct CUctx_st *ctx = sim_current_ctx();
	if (limit < 0 || limit >= LIMIT_COUNT)
		return CUDA_ERROR_INVALID_VALUE;
	if (ctx == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&sim.lock);
	ctx->limits[limit] = value;
	ctx->limits_set |= 1u << limit;
	pthread_mutex_unlock(&sim.lock);
	return CUDA_SUCCESS;
}

SIM_API CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
	ENTER(ENTER_INIT);
	if (pFlags == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&sim.lock);
	struct alloc *a = mem_find((uintptr_t)p);
	/* Only allocated pinned memory answers, as documented: not registered memory. */
	CUresult rc = a != NULL && a->kind == ALLOC_HOST && !a->registered ? CUDA_SUCCESS
									   : CUDA_ERROR_INVALID_VALUE;
	if (rc == CUDA_SUCCESS)
		*pFlags = a->flags;
	pthread_mutex_unlock(&sim.lock);
	return rc;
}

/* With unified addressing a peer copy is an ordinary copy once both contexts are known. */
static CUresult peer_contexts(CUcontext dstContext, CUcontext srcContext)
{
	if (dstContext == NULL || srcContext == NULL || !ctx_known(dstContext) || !ctx_known(srcContext))
		return CUDA_ERROR_INVALID_CONTEXT;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
			      CUcontext srcContext, size_t ByteCount)
{
	ENTER(ENTER_INIT);
	CUresult rc = peer_contexts(dstContext, srcContext);
	return rc != CUDA_SUCCESS ? rc : cuMemcpy(dstDevice, srcDevice, ByteCount);
}

SIM_API CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
				   CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount,
				   CUstream hStream)
{
	ENTER(ENTER_INIT);
	CUresult rc = peer_contexts(dstContext, srcContext);
	return rc != CUDA_SUCCESS ? rc : cuMemcpyAsync(dstDevice, srcDevice, ByteCount, hStream);
}

struct callback {
	CUstreamCallback fn;
	CUstream stream;
	void *user;
};

static void run_callback(void *arg)
{
	struct callback *cb = arg;

	cb->fn(cb->stream, CUDA_SUCCESS, cb->user);
	free(cb);
}

/* A host function with the older callback's signature; errors are synchronous, so status is always success. */
SIM_API CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData,
				     unsigned int flags)
{
	ENTER(ENTER_INIT);
	if (callback == NULL || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct callback *cb = malloc(sizeof(*cb));
	if (cb == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*cb = (struct callback){callback, hStream, userData};
	CUresult rc = cuLaunchHostFunc(hStream, run_callback, cb);
	if (rc != CUDA_SUCCESS)
		free(cb);
	return rc;
}

/* No profiler is ever attached; starting and stopping collection does nothing, as CUDA then does. */
static CUresult profiler_call(void)
{
	return sim_current_ctx() == NULL ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

SIM_API CUresult cuProfilerStart(void)
{
	ENTER(ENTER_INIT);
	return profiler_call();
}

SIM_API CUresult cuProfilerStop(void)
{
	ENTER(ENTER_INIT);
	return profiler_call();
}

/*
 * ---- exported, not simulated ----
 * What Debian's pycuda binds when it loads and what numba's ctypes binding
 * looks up, beyond what simcuda implements: kernels (modules, functions,
 * launches, linking, occupancy), textures, 2D/3D and array copies, 16/32-bit
 * memsets, OpenGL interop, IPC events, peer access. Each
 * returns CUDA_ERROR_NOT_SUPPORTED without looking at its arguments (so one
 * definition serves every signature) and is counted like any call.
 */
#define NOT_SUPPORTED(name)                      \
	SIM_API CUresult name(void);             \
	SIM_API CUresult name(void)              \
	{                                        \
		ENTER(ENTER_INIT);               \
		return CUDA_ERROR_NOT_SUPPORTED; \
	}

NOT_SUPPORTED(cuCtxDisablePeerAccess)
NOT_SUPPORTED(cuCtxEnablePeerAccess)
NOT_SUPPORTED(cuFuncGetAttribute)
NOT_SUPPORTED(cuFuncSetAttribute)
NOT_SUPPORTED(cuFuncSetBlockShape)
NOT_SUPPORTED(cuFuncSetCacheConfig)
NOT_SUPPORTED(cuFuncSetSharedSize)
NOT_SUPPORTED(cuGLCtxCreate_v2)
NOT_SUPPORTED(cuGLInit)
NOT_SUPPORTED(cuGLMapBufferObject_v2)
NOT_SUPPORTED(cuGLRegisterBufferObject)
NOT_SUPPORTED(cuGLUnmapBufferObject)
NOT_SUPPORTED(cuGLUnregisterBufferObject)
NOT_SUPPORTED(cuGraphicsGLRegisterBuffer)
NOT_SUPPORTED(cuGraphicsGLRegisterImage)
NOT_SUPPORTED(cuGraphicsMapResources)
NOT_SUPPORTED(cuGraphicsResourceGetMappedPointer_v2)
NOT_SUPPORTED(cuGraphicsSubResourceGetMappedArray)
NOT_SUPPORTED(cuGraphicsUnmapResources)
NOT_SUPPORTED(cuGraphicsUnregisterResource)
NOT_SUPPORTED(cuIpcGetEventHandle)
NOT_SUPPORTED(cuIpcOpenEventHandle)
NOT_SUPPORTED(cuLaunch)
NOT_SUPPORTED(cuLaunchCooperativeKernel)
NOT_SUPPORTED(cuLaunchGrid)
NOT_SUPPORTED(cuLaunchGridAsync)
NOT_SUPPORTED(cuLaunchKernel)
NOT_SUPPORTED(cuLinkAddData_v2)
NOT_SUPPORTED(cuLinkAddFile_v2)
NOT_SUPPORTED(cuLinkComplete)
NOT_SUPPORTED(cuLinkCreate_v2)
NOT_SUPPORTED(cuLinkDestroy)
NOT_SUPPORTED(cuMemcpy2DAsync_v2)
NOT_SUPPORTED(cuMemcpy2DUnaligned_v2)
NOT_SUPPORTED(cuMemcpy2D_v2)
NOT_SUPPORTED(cuMemcpy3DAsync_v2)
NOT_SUPPORTED(cuMemcpy3DPeer)
NOT_SUPPORTED(cuMemcpy3DPeerAsync)
NOT_SUPPORTED(cuMemcpy3D_v2)
NOT_SUPPORTED(cuMemcpyAtoA_v2)
NOT_SUPPORTED(cuMemcpyAtoD_v2)
NOT_SUPPORTED(cuMemcpyAtoH_v2)
NOT_SUPPORTED(cuMemcpyDtoA_v2)
NOT_SUPPORTED(cuMemcpyHtoA_v2)
NOT_SUPPORTED(cuMemsetD16Async)
NOT_SUPPORTED(cuMemsetD16_v2)
NOT_SUPPORTED(cuMemsetD2D16Async)
NOT_SUPPORTED(cuMemsetD2D16_v2)
NOT_SUPPORTED(cuMemsetD2D32Async)
NOT_SUPPORTED(cuMemsetD2D32_v2)
NOT_SUPPORTED(cuMemsetD2D8Async)
NOT_SUPPORTED(cuMemsetD2D8_v2)
NOT_SUPPORTED(cuMemsetD32Async)
NOT_SUPPORTED(cuMemsetD32_v2)
NOT_SUPPORTED(cuModuleGetFunction)
NOT_SUPPORTED(cuModuleGetGlobal_v2)
NOT_SUPPORTED(cuModuleGetSurfRef)
NOT_SUPPORTED(cuModuleGetTexRef)
NOT_SUPPORTED(cuModuleLoad)
NOT_SUPPORTED(cuModuleLoadData)
NOT_SUPPORTED(cuModuleLoadDataEx)
NOT_SUPPORTED(cuModuleUnload)
NOT_SUPPORTED(cuOccupancyMaxActiveBlocksPerMultiprocessor)
NOT_SUPPORTED(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags)
NOT_SUPPORTED(cuOccupancyMaxPotentialBlockSize)
NOT_SUPPORTED(cuOccupancyMaxPotentialBlockSizeWithFlags)
NOT_SUPPORTED(cuParamSetSize)
NOT_SUPPORTED(cuParamSetTexRef)
NOT_SUPPORTED(cuParamSetf)
NOT_SUPPORTED(cuParamSeti)
NOT_SUPPORTED(cuParamSetv)
NOT_SUPPORTED(cuProfilerInitialize)
NOT_SUPPORTED(cuStreamAttachMemAsync)
NOT_SUPPORTED(cuSurfRefGetArray)
NOT_SUPPORTED(cuSurfRefSetArray)
NOT_SUPPORTED(cuTexRefCreate)
NOT_SUPPORTED(cuTexRefDestroy)
NOT_SUPPORTED(cuTexRefGetAddressMode)
NOT_SUPPORTED(cuTexRefGetAddress_v2)
NOT_SUPPORTED(cuTexRefGetArray)
NOT_SUPPORTED(cuTexRefGetFilterMode)
NOT_SUPPORTED(cuTexRefGetFlags)
NOT_SUPPORTED(cuTexRefGetFormat)
NOT_SUPPORTED(cuTexRefSetAddress2D_v3)
NOT_SUPPORTED(cuTexRefSetAddressMode)
NOT_SUPPORTED(cuTexRefSetAddress_v2)
NOT_SUPPORTED(cuTexRefSetArray)
NOT_SUPPORTED(cuTexRefSetFilterMode)
NOT_SUPPORTED(cuTexRefSetFlags)
NOT_SUPPORTED(cuTexRefSetFormat)

/* ---- per-thread default stream variants ---- */

PER_THREAD(cuMemcpy_ptds, cuMemcpy, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))
PER_THREAD(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2, (CUdeviceptr d, const void *s, size_t n),
	   (d, s, n))
PER_THREAD(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2, (void *d, CUdeviceptr s, size_t n), (d, s, n))
PER_THREAD(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2, (CUdeviceptr d, CUdeviceptr s, size_t n),
	   (d, s, n))
PER_THREAD(cuMemsetD8_v2_ptds, cuMemsetD8_v2, (CUdeviceptr d, unsigned char v, size_t n),
	   (d, v, n))
PER_THREAD(cuMemcpyAsync_ptsz, cuMemcpyAsync,
	   (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h), (d, s, n, h))
PER_THREAD(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2,
	   (CUdeviceptr d, const void *s, size_t n, CUstream h), (d, s, n, h))
PER_THREAD(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2,
	   (void *d, CUdeviceptr s, size_t n, CUstream h), (d, s, n, h))
PER_THREAD(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2,
	   (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream h), (d, s, n, h))
PER_THREAD(cuMemsetD8Async_ptsz, cuMemsetD8Async,
	   (CUdeviceptr d, unsigned char v, size_t n, CUstream h), (d, v, n, h))
PER_THREAD(cuMemPrefetchAsync_ptsz, cuMemPrefetchAsync,
	   (CUdeviceptr p, size_t n, CUdevice dev, CUstream h), (p, n, dev, h))
PER_THREAD(cuMemPrefetchAsync_v2_ptsz, cuMemPrefetchAsync_v2,
	   (CUdeviceptr p, size_t n, CUmemLocation l, unsigned int f, CUstream h), (p, n, l, f, h))
PER_THREAD(cuMemAllocAsync_ptsz, cuMemAllocAsync, (CUdeviceptr * p, size_t n, CUstream h),
	   (p, n, h))
PER_THREAD(cuMemFreeAsync_ptsz, cuMemFreeAsync, (CUdeviceptr p, CUstream h), (p, h))
PER_THREAD(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync,
	   (CUdeviceptr * p, size_t n, CUmemoryPool m, CUstream h), (p, n, m, h))
PER_THREAD(cuStreamSynchronize_ptsz, cuStreamSynchronize, (CUstream h), (h))
PER_THREAD(cuStreamQuery_ptsz, cuStreamQuery, (CUstream h), (h))
PER_THREAD(cuStreamWaitEvent_ptsz, cuStreamWaitEvent, (CUstream h, CUevent e, unsigned int f),
	   (h, e, f))
PER_THREAD(cuStreamGetFlags_ptsz, cuStreamGetFlags, (CUstream h, unsigned int *f), (h, f))
PER_THREAD(cuStreamGetCtx_ptsz, cuStreamGetCtx, (CUstream h, CUcontext *c), (h, c))
PER_THREAD(cuEventRecord_ptsz, cuEventRecord, (CUevent e, CUstream h), (e, h))
PER_THREAD(cuLaunchHostFunc_ptsz, cuLaunchHostFunc, (CUstream h, CUhostFn fn, void *u),
	   (h, fn, u))

/* ---- cuGetProcAddress ---- */

struct proc {
	const char *name; /* base name, as cuGetProcAddress is asked */
	int version;      /* the CUDA version that introduced this ABI */
	void *fn;
	void *per_thread; /* the _ptsz/_ptds variant, or NULL */
};

#define P(name, version, fn) {name, version, (void *)(fn), NULL}
#define PT(name, version, fn, pt) {name, version, (void *)(fn), (void *)(pt)}

static const struct proc procs[] = {
	P("cuInit", 2000, cuInit),
	P("cuDriverGetVersion", 2020, cuDriverGetVersion),
	P("cuGetErrorName", 6000, cuGetErrorName),
	P("cuGetErrorString", 6000, cuGetErrorString),
	P("cuGetProcAddress", 11030, cuGetProcAddress),
	P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
	P("cuGetExportTable", 3000, cuGetExportTable),
	P("cuDeviceGetCount", 2000, cuDeviceGetCount),
	P("cuDeviceGet", 2000, cuDeviceGet),
	P("cuDeviceGetName", 2000, cuDeviceGetName),
	P("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
	P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
	P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
	P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
	P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
	P("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
	P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
	P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
	P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
	P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
	P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
	P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
	P("cuCtxGetDevice", 2000, cuCtxGetDevice),
	P("cuCtxSynchronize", 2000, cuCtxSynchronize),
	P("cuCtxCreate", 3020, cuCtxCreate_v2),
	P("cuCtxCreate", 11040, cuCtxCreate_v3),
	P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
	P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
	P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
	P("cuCtxAttach", 2000, cuCtxAttach),
	P("cuCtxDetach", 2000, cuCtxDetach),
	P("cuCtxGetFlags", 7000, cuCtxGetFlags),
	P("cuCtxGetApiVersion", 3020, cuCtxGetApiVersion),
	P("cuCtxGetCacheConfig", 3020, cuCtxGetCacheConfig),
	P("cuCtxSetCacheConfig", 3020, cuCtxSetCacheConfig),
	P("cuCtxGetSharedMemConfig", 4020, cuCtxGetSharedMemConfig),
	P("cuCtxSetSharedMemConfig", 4020, cuCtxSetSharedMemConfig),
	P("cuCtxGetLimit", 3010, cuCtxGetLimit),
	P("cuCtxSetLimit", 3010, cuCtxSetLimit),
	P("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2),
	P("cuDeviceComputeCapability", 2000, cuDeviceComputeCapability),
	P("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId),
	P("cuDeviceGetByPCIBusId", 4010, cuDeviceGetByPCIBusId),
	P("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
	P("cuMemHostGetFlags", 2030, cuMemHostGetFlags),
	P("cuMemcpyPeer", 4000, cuMemcpyPeer),
	P("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync),
	P("cuStreamAddCallback", 5000, cuStreamAddCallback),
	P("cuProfilerStart", 4000, cuProfilerStart),
	P("cuProfilerStop", 4000, cuProfilerStop),
	P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
	P("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
	P("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
	P("cuMemAlloc", 3020, cuMemAlloc_v2),
	P("cuMemFree", 3020, cuMemFree_v2),
	P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
	P("cuMemAllocManaged", 6000, cuMemAllocManaged),
	P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
	P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
	P("cuMemAllocHost", 3020, cuMemAllocHost_v2),
	P("cuMemHostAlloc", 2020, cuMemHostAlloc),
	P("cuMemFreeHost", 2000, cuMemFreeHost),
	P("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
	P("cuMemHostRegister", 4000, cuMemHostRegister),
	P("cuMemHostRegister", 6050, cuMemHostRegister_v2),
	P("cuMemHostUnregister", 4000, cuMemHostUnregister),
	PT("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
	PT("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
	PT("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync,
	   cuMemAllocFromPoolAsync_ptsz),
	P("cuMemPoolCreate", 11020, cuMemPoolCreate),
	P("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
	P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
	P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
	P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
	P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
	P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
	PT("cuMemcpy", 4000, cuMemcpy, cuMemcpy_ptds),
	PT("cuMemcpyAsync", 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz),
	PT("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds),
	PT("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
	PT("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds),
	PT("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
	PT("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
	PT("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz),
	PT("cuMemsetD8", 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds),
	PT("cuMemsetD8Async", 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz),
	P("cuMemAdvise", 8000, cuMemAdvise),
	P("cuMemAdvise", 12020, cuMemAdvise_v2),
	PT("cuMemPrefetchAsync", 8000, cuMemPrefetchAsync, cuMemPrefetchAsync_ptsz),
	PT("cuMemPrefetchAsync", 12020, cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz),
	P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
	P("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
	P("cuStreamCreate", 2000, cuStreamCreate),
	P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
	PT("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
	PT("cuStreamQuery", 2000, cuStreamQuery, cuStreamQuery_ptsz),
	PT("cuStreamWaitEvent", 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
	PT("cuStreamGetFlags", 5050, cuStreamGetFlags, cuStreamGetFlags_ptsz),
	PT("cuStreamGetCtx", 9020, cuStreamGetCtx, cuStreamGetCtx_ptsz),
	P("cuEventCreate", 2000, cuEventCreate),
	PT("cuEventRecord", 2000, cuEventRecord, cuEventRecord_ptsz),
	P("cuEventQuery", 2000, cuEventQuery),
	P("cuEventSynchronize", 2000, cuEventSynchronize),
	P("cuEventElapsedTime", 2000, cuEventElapsedTime),
	P("cuEventDestroy", 4000, cuEventDestroy_v2),
	PT("cuLaunchHostFunc", 10000, cuLaunchHostFunc, cuLaunchHostFunc_ptsz),
	/* Stream capture and graphs (streams.c). */
	PT("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz),
	PT("cuStreamEndCapture", 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz),
	PT("cuStreamIsCapturing", 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz),
	PT("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2_ptsz),
	P("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
	P("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
	P("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
	PT("cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz),
	P("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
	P("cuGraphDestroy", 10000, cuGraphDestroy),
	/* Virtual memory management (vmm.c). */
	P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
	P("cuMemAddressReserve", 10020, cuMemAddressReserve),
	P("cuMemAddressFree", 10020, cuMemAddressFree),
	P("cuMemCreate", 10020, cuMemCreate),
	P("cuMemRelease", 10020, cuMemRelease),
	P("cuMemMap", 10020, cuMemMap),
	P("cuMemUnmap", 10020, cuMemUnmap),
	P("cuMemSetAccess", 10020, cuMemSetAccess),
	P("cuMemGetAccess", 10020, cuMemGetAccess),
	P("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
	P("cuMemGetAllocationPropertiesFromHandle", 10020, cuMemGetAllocationPropertiesFromHandle),
	P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
	P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
	/* Arrays (arrays.c). */
	P("cuArrayCreate", 3020, cuArrayCreate_v2),
	P("cuArray3DCreate", 3020, cuArray3DCreate_v2),
	P("cuArrayDestroy", 2000, cuArrayDestroy),
	P("cuArrayGetDescriptor", 3020, cuArrayGetDescriptor_v2),
	P("cuArray3DGetDescriptor", 3020, cuArray3DGetDescriptor_v2),
	P("cuArrayGetMemoryRequirements", 11060, cuArrayGetMemoryRequirements),
	P("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
	P("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
	P("cuMipmappedArrayGetLevel", 5000, cuMipmappedArrayGetLevel),
};

static CUresult proc_address(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *status)
{
	const struct proc *best = NULL;
	int known = 0;

	if (symbol == NULL || pfn == NULL || cudaVersion > SIMCUDA_DRIVER_VERSION ||
	    (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
				   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		if (strcmp(procs[i].name, symbol) != 0)
			continue;
		known = 1;
		if (procs[i].version <= cudaVersion && (best == NULL || procs[i].version > best->version))
			best = &procs[i];
	}
	*pfn = NULL;
	if (best != NULL)
		*pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->per_thread
			       ? best->per_thread
			       : best->fn;
	if (status != NULL)
		*status = best ? CU_GET_PROC_ADDRESS_SUCCESS
			       : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
				       : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_SUCCESS;
}

SIM_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
				  cuuint64_t flags)
{
	ENTER(ENTER_ANY);
	CUresult rc = proc_address(symbol, pfn, cudaVersion, flags, NULL);
	/* The first interface reported a miss as an error; the _v2 one reports it in symbolStatus. */
	return rc == CUDA_SUCCESS && *pfn == NULL ? CUDA_ERROR_NOT_FOUND : rc;
}

SIM_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
				     cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	ENTER(ENTER_ANY);
	return proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* ---- the runtime's private table ---- */

static void register_counters(const char *const *names, uint64_t *counts, int n)
{
	pthread_mutex_lock(&calls_lock);
	if (nruntimes < MAX_RUNTIMES) {
		runtimes[nruntimes].names = names;
		runtimes[nruntimes].counts = counts;
		runtimes[nruntimes].n = n;
		nruntimes++;
	}
	pthread_mutex_unlock(&calls_lock);
}

static struct CUctx_st *current_context(int *device)
{
	if (sim_current_device(device) != CUDA_SUCCESS)
		*device = -1;
	return sim_current_ctx();
}

static const struct simcuda_export_table export_table = {
	.size = sizeof(struct simcuda_export_table),
	.register_counters = register_counters,
	.should_fail = should_fail,
	.current_context = current_context,
	.hold = hold,
};

SIM_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
	static const CUuuid id = SIMCUDA_EXPORT_TABLE_ID;

	ENTER(ENTER_ANY);
	if (ppExportTable == NULL || pExportTableId == NULL ||
	    memcmp(pExportTableId->bytes, id.bytes, sizeof(id.bytes)) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	*ppExportTable = &export_table;
	return CUDA_SUCCESS;
}

/* ---- statistics at exit ---- */

static void write_calls(FILE *f)
{
	const char *sep = "";

	for (int i = 0; i < CALL_SLOTS; i++) {
		const char *name = __atomic_load_n(&calls[i].name, __ATOMIC_ACQUIRE);
		if (name != NULL) {
			fprintf(f, "%s\"%s\":%" PRIu64, sep, name,
				__atomic_load_n(&calls[i].count, __ATOMIC_RELAXED));
			sep = ",";
		}
	}
	for (int r = 0; r < nruntimes; r++) {
		for (int i = 0; i < runtimes[r].n; i++) {
			uint64_t n = __atomic_load_n(&runtimes[r].counts[i], __ATOMIC_RELAXED);
			if (n != 0) {
				fprintf(f, "%s\"%s\":%" PRIu64, sep, runtimes[r].names[i], n);
				sep = ",";
			}
		}
	}
}

__attribute__((destructor)) static void write_stats(void)
{
	const char *path = getenv("SIMCUDA_STATS_FILE");

	if (path == NULL || path[0] == '\0' || getpid() != load_pid || dead_after_fork)
		return;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		fprintf(stderr, "simcuda: SIMCUDA_STATS_FILE=\"%s\": %s\n", path, strerror(errno));
		return;
	}
	FILE *f = fdopen(fd, "w");
	if (f == NULL) {
		close(fd);
		return;
	}
	pthread_mutex_lock(&calls_lock);
	pthread_mutex_lock(&sim.lock);
	if (!sim.initialized)
		nvisible = simcuda_visible_devices(&config_devices, getenv("CUDA_VISIBLE_DEVICES"), visible);
	int ndev = sim.initialized ? sim.ndev : nvisible;
	fprintf(f, "{\"devices\":[");
	for (int i = 0; i < ndev; i++) {
		const struct sim_device *d = &sim.dev[i];
		fprintf(f,
			"%s{\"ordinal\":%d,\"capacity_bytes\":%" PRIu64 ",\"device_bytes\":%" PRIu64
			",\"device_bytes_peak\":%" PRIu64 ",\"managed_device_bytes\":%" PRIu64
			",\"managed_host_bytes\":%" PRIu64 ",\"host_pinned_bytes\":%" PRIu64
			",\"host_registered_bytes\":%" PRIu64 ",\"live_allocations\":%" PRIu64
			",\"vmm_physical_bytes\":%" PRIu64 ",\"array_bytes\":%" PRIu64 "}",
			i ? "," : "", i, sim.initialized ? d->capacity : config_devices.capacity[visible[i]],
			sim.initialized ? mem_used(i) : 0, d->peak, d->managed_dev_bytes,
			d->managed_host_bytes, d->pinned_bytes, d->registered_bytes, d->live_allocs,
			d->vmm_bytes, array_device_bytes(i));
	}
	fprintf(f, "],\"calls\":{");
	write_calls(f);
	fprintf(f,
		"},\"memcpy_bytes\":{\"h2d\":%" PRIu64 ",\"d2h\":%" PRIu64 ",\"d2d\":%" PRIu64
		",\"h2h\":%" PRIu64 "}",
		sim.memcpy_bytes[COPY_H2D], sim.memcpy_bytes[COPY_D2H], sim.memcpy_bytes[COPY_D2D],
		sim.memcpy_bytes[COPY_H2H]);
	struct vmm_totals vmm;
	vmm_get_totals(&vmm);
	fprintf(f,
		",\"vmm\":{\"host_physical_bytes\":%" PRIu64 ",\"handles\":%" PRIu64
		",\"reserved_bytes\":%" PRIu64 ",\"mapped_bytes\":%" PRIu64 "}}\n",
		vmm.host_bytes, vmm.handles, vmm.reserved_bytes, vmm.mapped_bytes);
	pthread_mutex_unlock(&sim.lock);
	pthread_mutex_unlock(&calls_lock);
	if (fclose(f) != 0)
		fprintf(stderr, "simcuda: SIMCUDA_STATS_FILE=\"%s\": %s\n", path, strerror(errno));
}
