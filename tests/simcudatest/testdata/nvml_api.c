/*
 * nvml_api: checks simcuda's NVML entry points from C, where the cases
 * go-nvml cannot express (NULL pointers, short buffers, foreign handles,
 * struct versions, the older process-list layouts) can be passed.
 *
 * Also checks that NVML and the CUDA runtime describe every device alike.
 *
 * usage: nvml_api BYTES   allocate BYTES on device 0, then check everything
 *        nvml_api init    only call nvmlInit_v2 and print its result
 * Prints one "FAIL ..." line per failed check and "ok" when all pass.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spillway/cuda_runtime.h"
#include "spillway/nvml.h"

/* The older process-list entry points (not in the shared header). */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
} process_info_v1;
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t, unsigned int *, process_info_v1 *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);

static int failures;

#define EXPECT(call, want)                                                                      \
	do {                                                                                    \
		nvmlReturn_t got_ = (call);                                                     \
		if (got_ != (want)) {                                                           \
			printf("FAIL line %d: %s = %d (%s), want %s\n", __LINE__, #call, (int)got_, \
			       nvmlErrorString(got_), #want);                                   \
			failures++;                                                             \
		}                                                                               \
	} while (0)

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			printf("FAIL line %d: %s\n", __LINE__, #cond);           \
			failures++;                                              \
		}                                                                \
	} while (0)

static void uninitialised(void)
{
	unsigned int count = 0;
	nvmlDevice_t dev;
	char buf[96];

	EXPECT(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
	EXPECT(nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
	EXPECT(nvmlDeviceGetHandleByIndex_v2(0, &dev), NVML_ERROR_UNINITIALIZED);
	EXPECT(nvmlSystemGetDriverVersion(buf, sizeof(buf)), NVML_ERROR_UNINITIALIZED);
}

static void arguments(void)
{
	unsigned int count = 0, index = 99;
	nvmlDevice_t dev, foreign = (nvmlDevice_t)&count;
	char buf[96];
	nvmlMemory_t mem;
	nvmlMemory_v2_t mem2;

	EXPECT(nvmlDeviceGetCount_v2(NULL), NVML_ERROR_INVALID_ARGUMENT);
	EXPECT(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
	CHECK(count >= 1);
	EXPECT(nvmlDeviceGetHandleByIndex_v2(count, &dev), NVML_ERROR_INVALID_ARGUMENT);
	EXPECT(nvmlDeviceGetHandleByIndex_v2(0, NULL), NVML_ERROR_INVALID_ARGUMENT);
	EXPECT(nvmlDeviceGetHandleByIndex_v2(0, &dev), NVML_SUCCESS);
	EXPECT(nvmlDeviceGetIndex(dev, &index), NVML_SUCCESS);
	CHECK(index == 0);
	EXPECT(nvmlDeviceGetIndex(dev, NULL), NVML_ERROR_INVALID_ARGUMENT);
	EXPECT(nvmlDeviceGetIndex(foreign, &index), NVML_ERROR_INVALID_ARGUMENT);

	EXPECT(nvmlDeviceGetName(dev, NULL, sizeof(buf)), NVML_ERROR_INVALID_ARGUMENT);
	EXPECT(nvmlDeviceGetName(foreign, buf, sizeof(buf)), NVML_ERROR_INVALID_ARGUMENT);
	EXPECT(nvmlDeviceGetName(dev, buf, sizeof(buf)), NVML_SUCCESS);
	EXPECT(nvmlDeviceGetName(dev, buf, (unsigned int)strlen(buf)), NVML_ERROR_INSUFFICIENT_SIZE);
	EXPECT(nvmlDeviceGetName(dev, buf, (unsigned int)strlen(buf) + 1), NVML_SUCCESS);

	EXPECT(nvmlDeviceGetUUID(dev, NULL, sizeof(buf)), NVML_ERROR_INVALID_ARGUMENT);
	EXPECT(nvmlDeviceGetUUID(foreign, buf, sizeof(buf)), NVML_ERROR_INVALID_ARGUMENT);
	EXPECT(nvmlDeviceGetUUID(dev, buf, NVML_DEVICE_UUID_V2_BUFFER_SIZE), NVML_SUCCESS);
	CHECK(strlen(buf) == 40 && strncmp(buf, "GPU-", 4) == 0);
	EXPECT(nvmlDeviceGetUUID(dev, buf, 40), NVML_ERROR_INSUFFICIENT_SIZE);

	EXPECT(nvmlSystemGetDriverVersion(NULL, sizeof(buf)), NVML_ERROR_INVALID_ARGUMENT);
	EXPECT(nvmlSystemGetDriverVersion(buf, 1), NVML_ERROR_INSUFFICIENT_SIZE);
	EXPECT(nvmlSystemGetDriverVersion(buf, NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE), NVML_SUCCESS);

	EXPECT(nvmlDeviceGetMemoryInfo(dev, NULL), NVML_ERROR_INVALID_ARGUMENT);
	EXPECT(nvmlDeviceGetMemoryInfo(foreign, &mem), NVML_ERROR_INVALID_ARGUMENT);
	EXPECT(nvmlDeviceGetMemoryInfo_v2(dev, NULL), NVML_ERROR_INVALID_ARGUMENT);
	mem2.version = 1;
	EXPECT(nvmlDeviceGetMemoryInfo_v2(dev, &mem2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
	mem2.version = nvmlMemory_v2;
	EXPECT(nvmlDeviceGetMemoryInfo_v2(foreign, &mem2), NVML_ERROR_INVALID_ARGUMENT);

	CHECK(strcmp(nvmlErrorString(NVML_ERROR_INSUFFICIENT_SIZE), "Insufficient Size") == 0);
	CHECK(strcmp(nvmlErrorString((nvmlReturn_t)12345), "Unknown Error") == 0);
}

/*
 * NVML's CUDA version, device count, names and UUIDs are the runtime's; its
 * total is the runtime's and the driver's reserve together, as on a GPU, and
 * its free is the runtime's (this process is the only one on the devices).
 */
static void agrees_with_runtime(void)
{
	unsigned int count = 0;
	int cuda_count = 0, cuda_version = 0, nvml_version = 0;

	CHECK(cudaDriverGetVersion(&cuda_version) == cudaSuccess);
	EXPECT(nvmlSystemGetCudaDriverVersion(&nvml_version), NVML_SUCCESS);
	CHECK(nvml_version == cuda_version);
	nvml_version = 0;
	EXPECT(nvmlSystemGetCudaDriverVersion_v2(&nvml_version), NVML_SUCCESS);
	CHECK(nvml_version == cuda_version);
	EXPECT(nvmlSystemGetCudaDriverVersion(NULL), NVML_ERROR_INVALID_ARGUMENT);

	EXPECT(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
	CHECK(cudaGetDeviceCount(&cuda_count) == cudaSuccess && (unsigned int)cuda_count == count);
	for (unsigned int i = 0; i < count; i++) {
		struct cudaDeviceProp prop;
		nvmlDevice_t dev;
		nvmlMemory_t mem;
		nvmlMemory_v2_t mem2 = {.version = nvmlMemory_v2};
		size_t cuda_free = 0, cuda_total = 0;
		char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE], want[64];
		const unsigned char *b = (const unsigned char *)prop.uuid.bytes;

		CHECK(cudaGetDeviceProperties(&prop, (int)i) == cudaSuccess);
		CHECK(cudaSetDevice((int)i) == cudaSuccess && cudaMemGetInfo(&cuda_free, &cuda_total) == cudaSuccess);
		EXPECT(nvmlDeviceGetHandleByIndex_v2(i, &dev), NVML_SUCCESS);
		EXPECT(nvmlDeviceGetName(dev, name, sizeof(name)), NVML_SUCCESS);
		EXPECT(nvmlDeviceGetUUID(dev, uuid, sizeof(uuid)), NVML_SUCCESS);
		EXPECT(nvmlDeviceGetMemoryInfo(dev, &mem), NVML_SUCCESS);
		EXPECT(nvmlDeviceGetMemoryInfo_v2(dev, &mem2), NVML_SUCCESS);
		snprintf(want, sizeof(want),
			 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
			 b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
		if (strcmp(name, prop.name) != 0 || strcmp(uuid, want) != 0) {
			printf("FAIL device %u: NVML says %s %s, the runtime %s %s\n", i, name, uuid, prop.name, want);
			failures++;
		}
		if (mem2.reserved == 0 || mem.total != prop.totalGlobalMem + mem2.reserved ||
		    mem2.total != mem.total || cuda_total != prop.totalGlobalMem || mem.free != cuda_free ||
		    mem2.free != cuda_free) {
			printf("FAIL device %u: NVML says total %llu (v2 %llu, of it %llu reserved) free %llu (v2 %llu), "
			       "the runtime total %zu (cudaMemGetInfo %zu) free %zu\n",
			       i, mem.total, mem2.total, mem2.reserved, mem.free, mem2.free, prop.totalGlobalMem,
			       cuda_total, cuda_free);
			failures++;
		}
	}
}

/* This process holds bytes on device 0: every layout must list exactly it. */
static void processes(unsigned long long bytes)
{
	nvmlDevice_t dev;
	unsigned int count;
	nvmlProcessInfo_t infos[4];
	process_info_v1 infos_v1[4];
	nvmlMemory_t mem;
	nvmlMemory_v2_t mem2 = {.version = nvmlMemory_v2};
	unsigned int pid = (unsigned int)getpid();

	EXPECT(nvmlDeviceGetHandleByIndex_v2(0, &dev), NVML_SUCCESS);

	EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(dev, NULL, infos), NVML_ERROR_INVALID_ARGUMENT);
	count = 1;
	EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(dev, &count, NULL), NVML_ERROR_INVALID_ARGUMENT);
	count = 0;
	EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(dev, &count, NULL), NVML_ERROR_INSUFFICIENT_SIZE);
	CHECK(count == 1);
	count = 0;
	EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(dev, &count, infos), NVML_ERROR_INSUFFICIENT_SIZE);
	CHECK(count == 1);

	memset(infos, 0, sizeof(infos));
	count = 4;
	EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(dev, &count, infos), NVML_SUCCESS);
	CHECK(count == 1 && infos[0].pid == pid && infos[0].usedGpuMemory == bytes);
	CHECK(infos[0].gpuInstanceId == 0xFFFFFFFFu && infos[0].computeInstanceId == 0xFFFFFFFFu);

	memset(infos, 0, sizeof(infos));
	count = 4;
	EXPECT(nvmlDeviceGetComputeRunningProcesses_v2(dev, &count, infos), NVML_SUCCESS);
	CHECK(count == 1 && infos[0].pid == pid && infos[0].usedGpuMemory == bytes);
	CHECK(infos[0].gpuInstanceId == 0xFFFFFFFFu && infos[0].computeInstanceId == 0xFFFFFFFFu);

	/* v1 entries are 16 bytes: a second slot must stay untouched. */
	memset(infos_v1, 0xAB, sizeof(infos_v1));
	count = 4;
	EXPECT(nvmlDeviceGetComputeRunningProcesses(dev, &count, infos_v1), NVML_SUCCESS);
	CHECK(count == 1 && infos_v1[0].pid == pid && infos_v1[0].usedGpuMemory == bytes);
	CHECK(infos_v1[1].pid == 0xABABABABu);

	/* v1's used counts the driver's reserve, v2's does not: v2 reports it apart. */
	EXPECT(nvmlDeviceGetMemoryInfo_v2(dev, &mem2), NVML_SUCCESS);
	CHECK(mem2.used == bytes && mem2.reserved > 0 && mem2.free + mem2.reserved + mem2.used == mem2.total);
	EXPECT(nvmlDeviceGetMemoryInfo(dev, &mem), NVML_SUCCESS);
	CHECK(mem.used == mem2.reserved + bytes && mem.free + mem.used == mem.total);
	CHECK(mem2.total == mem.total && mem2.free == mem.free);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: nvml_api BYTES | nvml_api init\n");
		return 2;
	}
	if (strcmp(argv[1], "init") == 0) {
		nvmlReturn_t ret = nvmlInit_v2();
		printf("nvmlInit_v2 = %d\n", (int)ret);
		return 0;
	}

	unsigned long long bytes = strtoull(argv[1], NULL, 10);
	void *ptr;
	cudaError_t err = cudaMalloc(&ptr, bytes);
	if (err != cudaSuccess) {
		printf("FAIL cudaMalloc(%llu) = %d\n", bytes, (int)err);
		return 1;
	}

	uninitialised();
	EXPECT(nvmlInit_v2(), NVML_SUCCESS);
	EXPECT(nvmlInitWithFlags(0), NVML_SUCCESS); /* reference counted */
	arguments();
	agrees_with_runtime();
	processes(bytes);
	EXPECT(nvmlShutdown(), NVML_SUCCESS);
	{
		unsigned int count;
		/* Still initialised once. */
		EXPECT(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
	}
	EXPECT(nvmlShutdown(), NVML_SUCCESS);
	uninitialised();

	if (failures == 0)
		printf("ok\n");
	return failures == 0 ? 0 : 1;
}
