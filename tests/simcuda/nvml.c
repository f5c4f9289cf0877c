/*
 * nvml.c - simcuda's NVML (libnvidia-ml.so.1).
 *
 * Independent of the simulated driver, as the real NVML is: it reads the
 * device configuration (SIMCUDA_DEVICES) itself at initialisation and learns
 * what processes use from the state folder (state.h), where every simcuda
 * process publishes its per-device usage. Memory info and the process lists
 * are computed from the live publishers at each call, so they are always as
 * current as a real GPU's.
 *
 * Only the NVML names are exported; everything else is hidden.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC visibility push(default)
#include "spillway/nvml.h"
#pragma GCC visibility pop

#include "devices.h"
#include "state.h"

_Static_assert(SIMCUDA_MAX_DEVICES <= SIMSTATE_MAX_DEVICES, "every device must fit the state file");

/* MIG is off: the instance ids of every process are "invalid", as NVML documents. */
#define NO_INSTANCE 0xFFFFFFFFu

struct nvmlDevice_st {
	unsigned int index;
};

/*
 * The configuration read at the first nvmlInit. Handles point into devices[];
 * they stay valid until the last nvmlShutdown, as NVML documents.
 */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int init_count; /* nvmlInit calls not yet matched by nvmlShutdown */
static unsigned int device_count;
static struct nvmlDevice_st devices[SIMCUDA_MAX_DEVICES];
static uint64_t capacity[SIMCUDA_MAX_DEVICES];

static int initialised(void)
{
	return __atomic_load_n(&init_count, __ATOMIC_ACQUIRE) > 0;
}

/* Returns the device's index, or -1 when the handle is not one of ours. */
static int device_index(nvmlDevice_t device)
{
	uintptr_t p = (uintptr_t)device, base = (uintptr_t)devices;

	if (p < base || p >= base + sizeof(devices) || (p - base) % sizeof(devices[0]) != 0)
		return -1;
	return device->index < device_count ? (int)device->index : -1;
}

/* Copies s into buf of length bytes, NUL included; NVML reports a short buffer, never truncates. */
static nvmlReturn_t copy_string(const char *s, char *buf, unsigned int length)
{
	size_t n = strlen(s) + 1;

	if (buf == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (length < n)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(buf, s, n);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	(void)flags; /* NO_GPUS and NO_ATTACH change nothing: simcuda always has devices */
	pthread_mutex_lock(&init_lock);
	if (init_count == 0) {
		struct simcuda_devices cfg;
		if (simcuda_devices_load(&cfg) != 0) {
			pthread_mutex_unlock(&init_lock);
			return NVML_ERROR_DRIVER_NOT_LOADED;
		}
		device_count = (unsigned int)cfg.count;
		for (unsigned int i = 0; i < SIMCUDA_MAX_DEVICES; i++) {
			devices[i].index = i;
			capacity[i] = i < device_count ? cfg.capacity[i] : 0;
		}
	}
	__atomic_store_n(&init_count, init_count + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&init_lock);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void)
{
	return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlShutdown(void)
{
	nvmlReturn_t ret = NVML_SUCCESS;

	pthread_mutex_lock(&init_lock);
	if (init_count == 0)
		ret = NVML_ERROR_UNINITIALIZED;
	else
		__atomic_store_n(&init_count, init_count - 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&init_lock);
	return ret;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
	switch (result) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
	case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
	case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
	case NVML_ERROR_TIMEOUT: return "Timeout";
	case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
	case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
	case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
	case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
	case NVML_ERROR_OPERATING_SYSTEM: return "GPU access blocked by the operating system";
	case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
	case NVML_ERROR_IN_USE: return "In use by another client";
	case NVML_ERROR_MEMORY: return "Insufficient Memory";
	case NVML_ERROR_NO_DATA: return "No data";
	case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "vGPU ECC not supported";
	case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
	case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
	case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
	case NVML_ERROR_DEPRECATED: return "Deprecated";
	case NVML_ERROR_NOT_READY: return "Not ready";
	case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
	case NVML_ERROR_INVALID_STATE: return "Invalid state";
	case NVML_ERROR_UNKNOWN: return "Unknown Error";
	}
	return "Unknown Error";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	return copy_string(SIMCUDA_NVML_DRIVER_VERSION, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
	if (cudaDriverVersion == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*cudaDriverVersion = SIMCUDA_DRIVER_VERSION;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
	return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	if (deviceCount == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*deviceCount = device_count;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	if (device == NULL || index >= device_count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &devices[index];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	int i = device_index(device);
	if (i < 0 || index == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*index = (unsigned int)i;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
	char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE];

	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	int i = device_index(device);
	if (i < 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	simcuda_device_name(i, capacity[i], buf, sizeof(buf));
	return copy_string(buf, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];

	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	int i = device_index(device);
	if (i < 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	simcuda_device_uuid_string(i, capacity[i], buf, sizeof(buf));
	return copy_string(buf, uuid, length);
}

/* Usage of one device by the live publishers, gathered by one folder scan. */
struct usage {
	unsigned int ordinal;
	uint64_t total_bytes;
	size_t count, cap;
	struct usage_entry {
		unsigned int pid;
		uint64_t bytes;
	} *procs;
	int out_of_memory;
};

static void add_process(const struct simstate_process *proc, void *arg)
{
	struct usage *u = arg;

	if (u->ordinal >= proc->device_count || proc->device_bytes[u->ordinal] == 0)
		return;
	uint64_t bytes = proc->device_bytes[u->ordinal];
	u->total_bytes += bytes;
	if (u->count == u->cap) {
		size_t cap = u->cap ? 2 * u->cap : 16;
		struct usage_entry *p = realloc(u->procs, cap * sizeof(*p));
		if (p == NULL) {
			u->out_of_memory = 1;
			return;
		}
		u->procs = p;
		u->cap = cap;
	}
	u->procs[u->count].pid = (unsigned int)proc->pid;
	u->procs[u->count].bytes = bytes;
	u->count++;
}

static int by_pid(const void *a, const void *b)
{
	unsigned int x = ((const struct usage_entry *)a)->pid, y = ((const struct usage_entry *)b)->pid;
	return (x > y) - (x < y);
}

/* Fills u for device ordinal; the caller frees u->procs. */
static nvmlReturn_t gather(unsigned int ordinal, struct usage *u)
{
	memset(u, 0, sizeof(*u));
	u->ordinal = ordinal;
	if (simstate_scan(add_process, u) != 0) {
		int denied = errno == EACCES || errno == EPERM;
		free(u->procs);
		return denied ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
	}
	if (u->out_of_memory) {
		free(u->procs);
		return NVML_ERROR_MEMORY;
	}
	qsort(u->procs, u->count, sizeof(u->procs[0]), by_pid);
	return NVML_SUCCESS;
}

/*
 * The device's memory as NVML reports it: total = the whole framebuffer, what
 * CUDA can use (the capacity) plus what the driver reserves; allocated = what
 * the live processes hold, capped at the capacity; free = the rest of the
 * capacity. v1's used is reserved + allocated, v2's allocated alone, as NVML
 * documents: in both, total = reserved + allocated + free.
 */
struct memory_figures {
	uint64_t total, reserved, allocated, free;
};

static nvmlReturn_t memory_info(nvmlDevice_t device, struct memory_figures *m)
{
	struct usage u;

	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	int i = device_index(device);
	if (i < 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = gather((unsigned int)i, &u);
	if (ret != NVML_SUCCESS)
		return ret;
	free(u.procs);
	m->reserved = SIMCUDA_DRIVER_RESERVED_BYTES;
	m->total = capacity[i] + m->reserved;
	m->allocated = u.total_bytes < capacity[i] ? u.total_bytes : capacity[i];
	m->free = capacity[i] - m->allocated;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	struct memory_figures m;

	if (memory == NULL)
		return initialised() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
	nvmlReturn_t ret = memory_info(device, &m);
	if (ret != NVML_SUCCESS)
		return ret;
	memory->total = m.total;
	memory->used = m.reserved + m.allocated;
	memory->free = m.free;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	struct memory_figures m;

	if (memory == NULL)
		return initialised() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
	if (memory->version != nvmlMemory_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	nvmlReturn_t ret = memory_info(device, &m);
	if (ret != NVML_SUCCESS)
		return ret;
	memory->total = m.total;
	memory->reserved = m.reserved;
	memory->used = m.allocated;
	memory->free = m.free;
	return NVML_SUCCESS;
}

/*
 * The process list. nvmlDeviceGetComputeRunningProcesses_v3 is the current
 * entry point; clients built against older NVML (and go-nvml, which looks
 * names up at run time) may call the v1 name, whose entries lack the instance
 * ids, or _v2, whose layout is the current one. The shared header declares
 * only v3, so the older two are declared and exported here.
 */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
} process_info_v1;

#define NVML_EXPORT __attribute__((visibility("default")))
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
							      process_info_v1 *infos);
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
								 nvmlProcessInfo_t *infos);

/*
 * Each call scans the state folder once; when *infoCount is too small it
 * reports the count that scan found, which may differ on the next call as
 * processes come and go (NVML documents the same).
 */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount,
				      process_info_v1 *v1, nvmlProcessInfo_t *current)
{
	struct usage u;
	int have_buffer = v1 != NULL || current != NULL;

	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	int i = device_index(device);
	if (i < 0 || infoCount == NULL || (!have_buffer && *infoCount != 0))
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = gather((unsigned int)i, &u);
	if (ret != NVML_SUCCESS)
		return ret;
	if (u.count > *infoCount) {
		*infoCount = (unsigned int)u.count;
		free(u.procs);
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (size_t k = 0; k < u.count; k++) {
		if (v1 != NULL) {
			v1[k].pid = u.procs[k].pid;
			v1[k].usedGpuMemory = u.procs[k].bytes;
		} else {
			current[k].pid = u.procs[k].pid;
			current[k].usedGpuMemory = u.procs[k].bytes;
			current[k].gpuInstanceId = NO_INSTANCE;
			current[k].computeInstanceId = NO_INSTANCE;
		}
	}
	*infoCount = (unsigned int)u.count;
	free(u.procs);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
						  process_info_v1 *infos)
{
	return running_processes(device, infoCount, infos, NULL);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
						     nvmlProcessInfo_t *infos)
{
	return running_processes(device, infoCount, NULL, infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
						     nvmlProcessInfo_t *infos)
{
	return running_processes(device, infoCount, NULL, infos);
}

/* ---- identity, BAR1, utilisation, sensors, older names ---- */

nvmlReturn_t nvmlInit(void)
{
	return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
	return nvmlDeviceGetCount_v2(deviceCount);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
	return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];

	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	if (uuid == NULL || device == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (unsigned int i = 0; i < device_count; i++) {
		simcuda_device_uuid_string((int)i, capacity[i], buf, sizeof(buf));
		if (strcmp(buf, uuid) == 0) {
			*device = &devices[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

/* The PCI location the driver reports too (CU_DEVICE_ATTRIBUTE_PCI_BUS_ID): bus 0x18 + ordinal. */
#define PCI_FIRST_BUS 0x18u
/* An H100 SXM5's ids: device 0x2330, vendor 0x10de; its subsystem. */
#define PCI_DEVICE_ID 0x233010deu
#define PCI_SUBSYSTEM_ID 0x16c110deu

static nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	int i = device_index(device);
	if (i < 0 || pci == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(pci, 0, sizeof(*pci));
	pci->domain = 0;
	pci->bus = PCI_FIRST_BUS + (unsigned int)i;
	pci->device = 0;
	pci->pciDeviceId = PCI_DEVICE_ID;
	pci->pciSubSystemId = PCI_SUBSYSTEM_ID;
	snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02x:00.0", pci->bus & 0xffu);
	snprintf(pci->busId, sizeof(pci->busId), "00000000:%02x:00.0", pci->bus & 0xffu);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	return pci_info(device, pci);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	return pci_info(device, pci);
}

/* The first layout: a 16-byte bus id first, four reserved words last. */
typedef struct {
	char busId[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	unsigned int reserved[4];
} pci_info_v1;

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, pci_info_v1 *pci);

nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, pci_info_v1 *pci)
{
	nvmlPciInfo_t cur;

	if (pci == NULL)
		return initialised() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
	nvmlReturn_t ret = pci_info(device, &cur);
	if (ret != NVML_SUCCESS)
		return ret;
	memset(pci, 0, sizeof(*pci));
	memcpy(pci->busId, cur.busIdLegacy, sizeof(pci->busId));
	pci->domain = cur.domain;
	pci->bus = cur.bus;
	pci->device = cur.device;
	pci->pciDeviceId = cur.pciDeviceId;
	pci->pciSubSystemId = cur.pciSubSystemId;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
	unsigned int domain, bus, dev, function;
	char end;

	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	if (pciBusId == NULL || device == NULL ||
	    sscanf(pciBusId, "%x:%x:%x.%x%c", &domain, &bus, &dev, &function, &end) != 4)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (domain != 0 || dev != 0 || function != 0 || bus < PCI_FIRST_BUS ||
	    bus - PCI_FIRST_BUS >= device_count)
		return NVML_ERROR_NOT_FOUND;
	*device = &devices[bus - PCI_FIRST_BUS];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	int i = device_index(device);
	if (i < 0 || minorNumber == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*minorNumber = (unsigned int)i;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	if (device_index(device) < 0 || major == NULL || minor == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*major = 9; /* the driver's H100-class attributes */
	*minor = 0;
	return NVML_SUCCESS;
}

/*
 * BAR1 spans the whole framebuffer, the driver's reserve included (the
 * smallest power of two that holds it, as large-BAR data-centre GPUs have);
 * simcuda maps nothing through it.
 */
nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	int i = device_index(device);
	if (i < 0 || bar1Memory == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned long long total = 1;
	while (total < capacity[i] + SIMCUDA_DRIVER_RESERVED_BYTES)
		total <<= 1;
	bar1Memory->bar1Total = total;
	bar1Memory->bar1Used = 0;
	bar1Memory->bar1Free = total;
	return NVML_SUCCESS;
}

/* No kernel ever runs and copies are host memcpy: every engine's utilisation is 0. */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	if (device_index(device) < 0 || utilization == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	utilization->gpu = 0;
	utilization->memory = 0;
	return NVML_SUCCESS;
}

/* NVML's sampling period for the video engines: one second. */
#define VIDEO_SAMPLING_US 1000000u

static nvmlReturn_t video_utilization(nvmlDevice_t device, unsigned int *utilization,
				      unsigned int *samplingPeriodUs)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	if (device_index(device) < 0 || utilization == NULL || samplingPeriodUs == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*utilization = 0;
	*samplingPeriodUs = VIDEO_SAMPLING_US;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
					     unsigned int *samplingPeriodUs)
{
	return video_utilization(device, utilization, samplingPeriodUs);
}

nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
					     unsigned int *samplingPeriodUs)
{
	return video_utilization(device, utilization, samplingPeriodUs);
}

/*
 * simcuda has no sensors: temperature, fan and power answer
 * NVML_ERROR_NOT_SUPPORTED, as NVML does on boards that lack the sensor
 * (a fanless SXM module has no fan speed).
 */
static nvmlReturn_t no_sensor(nvmlDevice_t device, const void *out)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	if (device_index(device) < 0 || out == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
				      unsigned int *temp)
{
	if (sensorType != NVML_TEMPERATURE_GPU)
		return initialised() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
	return no_sensor(device, temp);
}

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
	return no_sensor(device, speed);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
	return no_sensor(device, power);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
	return no_sensor(device, limit);
}

/* simcuda has no graphics contexts: the graphics process list is always empty. */
static nvmlReturn_t graphics_processes(nvmlDevice_t device, unsigned int *infoCount)
{
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	if (device_index(device) < 0 || infoCount == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*infoCount = 0;
	return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device,
							       unsigned int *infoCount,
							       process_info_v1 *infos);
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
								  unsigned int *infoCount,
								  nvmlProcessInfo_t *infos);

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
						   process_info_v1 *infos)
{
	(void)infos;
	return graphics_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
						      nvmlProcessInfo_t *infos)
{
	(void)infos;
	return graphics_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
						      nvmlProcessInfo_t *infos)
{
	(void)infos;
	return graphics_processes(device, infoCount);
}
