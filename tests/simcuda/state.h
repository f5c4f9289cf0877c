/*
 * state.h - the simcuda state folder: how processes publish their device
 * memory usage so that the simulated NVML can report every process at once.
 *
 * Layout. The folder is $SIMCUDA_STATE_DIR, or /dev/shm/simcuda-<uid> when
 * unset or empty; it is created with mode 0700 (an existing one is made 0700)
 * and must be owned by the caller. Each process that initialises the
 * simulated driver publishes one file in it, named "<pid>-<starttime>"
 * (starttime: field 22 of /proc/<pid>/stat), of the fixed binary layout
 * struct simstate_file below (native byte order; start_time at offset 24). The name pins one process
 * incarnation, so a reused pid never inherits a stale file and removing a
 * stale file can never remove a live one. Files are created under a temporary
 * name, filled in, and renamed into place: a reader sees complete files only.
 *
 * Writers store usage with relaxed 64-bit atomic stores into their MAP_SHARED
 * mapping; readers map files read-only and load with atomic loads, so a value
 * is never torn. A file whose process is gone (no /proc entry, a zombie, or a
 * different start time) is ignored and may be unlinked by any reader or by a
 * new writer. Liveness assumes one pid namespace for writers and readers.
 */
#ifndef SIMCUDA_STATE_H
#define SIMCUDA_STATE_H

#include <stdint.h>

#define SIMSTATE_MAGIC 0x54534353u /* "SCST" little-endian */
#define SIMSTATE_VERSION 1u
#define SIMSTATE_MAX_DEVICES 64
#define SIMSTATE_FILE_BYTES 4096u

struct simstate_file {
	uint32_t magic;          /* SIMSTATE_MAGIC */
	uint32_t version;        /* SIMSTATE_VERSION */
	uint32_t file_bytes;     /* SIMSTATE_FILE_BYTES */
	uint32_t device_count;   /* entries of device_bytes in use */
	int32_t pid;
	uint32_t reserved;
	uint64_t start_time;     /* clock ticks after boot, /proc/<pid>/stat field 22 */
	uint64_t device_bytes[SIMSTATE_MAX_DEVICES]; /* accessed atomically only */
};

/*
 * Writer side (the driver). simstate_open publishes this process's file with
 * device_count devices at zero usage; call it once at driver initialisation.
 * It returns 0, or -1 with errno set when the folder or file cannot be made
 * (then simstate_set_device_bytes does nothing and the process is invisible to
 * NVML); the reason goes to stderr. device_count must be in
 * 1..SIMSTATE_MAX_DEVICES. The file is removed at normal exit. A forked child
 * starts detached: its stores go nowhere until it calls simstate_open itself.
 */
int simstate_open(int device_count);

/*
 * Publishes the device's current used bytes (an absolute value, not a delta).
 * A relaxed atomic store: cheap enough to call after every change. Ordinals
 * outside the published range are ignored.
 */
void simstate_set_device_bytes(int ordinal, uint64_t bytes);

/*
 * Reader side (NVML). simstate_dir writes the folder path into buf and
 * returns 0, or -1 when it does not fit.
 */
int simstate_dir(char *buf, unsigned long size);

/* One live process's usage, as simstate_scan reports it. */
struct simstate_process {
	int32_t pid;
	uint32_t device_count;
	uint64_t device_bytes[SIMSTATE_MAX_DEVICES];
};

/*
 * Calls fn (unless NULL) once for every live process that publishes usage,
 * and unlinks the files of dead ones. Returns 0, or -1 with errno set when the folder exists
 * but cannot be read; a missing folder means no processes and returns 0.
 */
int simstate_scan(void (*fn)(const struct simstate_process *proc, void *arg), void *arg);

#endif
