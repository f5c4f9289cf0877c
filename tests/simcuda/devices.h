/*
 * devices.h - the simulated devices, as SIMCUDA_DEVICES describes them.
 *
 * Shared by the simulated driver (libcuda.so.1) and NVML (libnvidia-ml.so.1),
 * which read the same variable independently, as the real libraries each
 * query the kernel driver. Also the fixed facts both report (versions, names,
 * UUIDs), so the two views of a device always agree.
 *
 * Syntax: a comma-separated list of items "[<count>x]<size>", where <size> is
 * a decimal integer optionally followed by B, KiB, MiB, GiB or TiB (bytes when
 * bare): "16GiB", "2x16GiB", "80GiB,24GiB". Unset or empty: one 16 GiB device.
 */
#ifndef SIMCUDA_DEVICES_H
#define SIMCUDA_DEVICES_H

#include <stddef.h>
#include <stdint.h>

#define SIMCUDA_MAX_DEVICES 16
#define SIMCUDA_DEFAULT_CAPACITY (16ULL << 30)

/*
 * Device memory the driver sets aside for itself on every device: NVML's
 * total (the whole framebuffer) counts it, CUDA's does not (a device's
 * SIMCUDA_DEVICES size is what cuDeviceTotalMem, cudaMemGetInfo and
 * totalGlobalMem report). NVML reports it as reserved (v2) and within used
 * (v1). Real GPUs set aside some hundreds of MiB, depending on the board and
 * the driver, and no setting changes it; so it is fixed here, and an odd
 * size no test allocates, so that code taking one total for the other is
 * always caught.
 */
#define SIMCUDA_DRIVER_RESERVED_BYTES (456ULL << 20)

/* CUDA driver version (cuDriverGetVersion, nvmlSystemGetCudaDriverVersion). */
#define SIMCUDA_DRIVER_VERSION 12040
/* The kernel driver version string NVML reports (a release that ships CUDA 12.4). */
#define SIMCUDA_NVML_DRIVER_VERSION "550.54.15"

struct simcuda_devices {
	int count;
	uint64_t capacity[SIMCUDA_MAX_DEVICES]; /* bytes */
};

/*
 * Parses spec into cfg. Returns 0, or -1 with a message that names the bad
 * item and the valid syntax in err.
 */
int simcuda_devices_parse(const char *spec, struct simcuda_devices *cfg, char *err, size_t errlen);

/*
 * Parses one "<integer>[B|KiB|MiB|GiB|TiB]" size (the syntax of a device
 * size, also used by SIMCUDA_CONTEXT_BYTES). Returns 0, or -1 when malformed.
 */
int simcuda_parse_size(const char *s, uint64_t *bytes);

/*
 * Reads SIMCUDA_DEVICES (default: one 16 GiB device). Returns 0, or -1 after
 * printing why to stderr.
 */
int simcuda_devices_load(struct simcuda_devices *cfg);

/*
 * Applies CUDA_VISIBLE_DEVICES (spec; NULL when unset: every device, in
 * order) to cfg as CUDA does: a comma-separated list of device indices or
 * UUIDs ("GPU-" followed by enough leading characters of the UUID as NVML
 * prints it to name one device), enumerated in the list's order. The first
 * entry that names no device (out of range, malformed, ambiguous, or already
 * listed) ends the list. Fills physical[] with the cfg index of each visible
 * ordinal and returns how many are visible (0 for an empty spec).
 */
int simcuda_visible_devices(const struct simcuda_devices *cfg, const char *spec,
			    int physical[SIMCUDA_MAX_DEVICES]);

/* The device's marketing name, e.g. "simcuda GPU 16GiB". */
void simcuda_device_name(int ordinal, uint64_t capacity, char *buf, size_t size);

/* The device's 16-byte UUID; stable for a given ordinal and capacity. */
void simcuda_device_uuid(int ordinal, uint64_t capacity, unsigned char uuid[16]);

/* The same UUID as NVML prints it: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx". */
void simcuda_device_uuid_string(int ordinal, uint64_t capacity, char *buf, size_t size);

#endif
