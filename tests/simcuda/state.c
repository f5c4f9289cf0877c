/*
 * state.c - the simcuda state folder (see state.h for the design).
 *
 * Writer: the driver publishes one mapped file per process and stores its
 * per-device usage into it. Reader: NVML walks the folder, keeps the files of
 * live processes and removes the files of dead ones. Liveness is decided from
 * /proc/<pid>/stat: a missing entry, a zombie, or a start time other than the
 * one in the file's name means the publisher is gone.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

_Static_assert(offsetof(struct simstate_file, start_time) == 24, "state file layout is fixed");
_Static_assert(offsetof(struct simstate_file, device_bytes) % 8 == 0, "usage words must be aligned");
_Static_assert(sizeof(struct simstate_file) <= SIMSTATE_FILE_BYTES, "state file too small");

/* This process's published file, or NULL when none. */
static struct simstate_file *published;
static int published_count;
static pid_t published_pid;
static char published_path[4096];
static int registered; /* exit and fork handlers installed */

int simstate_dir(char *buf, unsigned long size)
{
	const char *env = getenv("SIMCUDA_STATE_DIR");
	int n;

	if (env != NULL && env[0] != '\0')
		n = snprintf(buf, size, "%s", env);
	else
		n = snprintf(buf, size, "/dev/shm/simcuda-%u", (unsigned)getuid());
	return (n < 0 || (unsigned long)n >= size) ? -1 : 0;
}

/*
 * Reads the state and start time (fields 3 and 22) of /proc/<pid>/stat.
 * Returns 0, or -1 when the process does not exist or the entry is unreadable.
 */
static int proc_stat(pid_t pid, char *state, uint64_t *start_time)
{
	char path[64], buf[1024];
	ssize_t len;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	len = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (len <= 0)
		return -1;
	buf[len] = '\0';

	/* The command name (field 2) may hold spaces and parentheses: skip to its last ')'. */
	char *p = strrchr(buf, ')');
	if (p == NULL || p[1] != ' ')
		return -1;
	p += 2;
	*state = *p;
	for (int field = 3; field < 22; field++) {
		p = strchr(p, ' ');
		if (p == NULL)
			return -1;
		p++;
	}
	char *end;
	errno = 0;
	unsigned long long v = strtoull(p, &end, 10);
	if (errno != 0 || end == p)
		return -1;
	*start_time = v;
	return 0;
}

static int process_alive(pid_t pid, uint64_t start_time)
{
	char state;
	uint64_t actual;

	if (proc_stat(pid, &state, &actual) != 0)
		return 0;
	return state != 'Z' && state != 'X' && state != 'x' && actual == start_time;
}

/*
 * Creates the folder with mode 0700, or makes an existing one of ours private
 * (a test's temporary folder is typically 0755). A folder of another user, or
 * anything but a directory, is refused.
 */
static int ensure_dir(const char *dir)
{
	struct stat st;

	if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
		fprintf(stderr, "simcuda: cannot create state folder %s (SIMCUDA_STATE_DIR): %s\n",
			dir, strerror(errno));
		return -1;
	}
	if (lstat(dir, &st) != 0) {
		fprintf(stderr, "simcuda: state folder %s (SIMCUDA_STATE_DIR): %s\n", dir, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
		fprintf(stderr,
			"simcuda: state folder %s (SIMCUDA_STATE_DIR) must be a directory owned by uid %u; "
			"it is %s owned by uid %u\n",
			dir, (unsigned)geteuid(), S_ISDIR(st.st_mode) ? "a directory" : "not a directory",
			(unsigned)st.st_uid);
		errno = EACCES;
		return -1;
	}
	if ((st.st_mode & 077) != 0 && chmod(dir, 0700) != 0) {
		fprintf(stderr, "simcuda: cannot make state folder %s (SIMCUDA_STATE_DIR) private: %s\n",
			dir, strerror(errno));
		return -1;
	}
	return 0;
}

/* Removes this process's file when it exits; a forked child must not remove its parent's. */
static void unpublish(void)
{
	if (published != NULL && getpid() == published_pid)
		unlink(published_path);
}

/* A forked child is a different process: it must never store into its parent's file. */
static void forget_in_child(void)
{
	__atomic_store_n(&published, NULL, __ATOMIC_RELAXED);
}

int simstate_open(int device_count)
{
	char dir[4000], tmp[4096];
	char state;
	uint64_t start_time;
	pid_t pid = getpid();
	int fd;

	if (device_count < 1 || device_count > SIMSTATE_MAX_DEVICES) {
		fprintf(stderr, "simcuda: %d devices cannot be published in the state folder (1..%d)\n",
			device_count, SIMSTATE_MAX_DEVICES);
		errno = EINVAL;
		return -1;
	}
	if (published != NULL) {
		errno = EALREADY;
		return -1;
	}
	if (simstate_dir(dir, sizeof(dir)) != 0) {
		fprintf(stderr, "simcuda: state folder path (SIMCUDA_STATE_DIR) is too long\n");
		errno = ENAMETOOLONG;
		return -1;
	}
	if (ensure_dir(dir) != 0)
		return -1;
	/* Remove what crashed processes left, so the folder stays small without an NVML reader. */
	simstate_scan(NULL, NULL);
	if (proc_stat(pid, &state, &start_time) != 0) {
		fprintf(stderr, "simcuda: cannot read /proc/%d/stat\n", (int)pid);
		errno = ENOENT;
		return -1;
	}

	snprintf(published_path, sizeof(published_path), "%s/%d-%" PRIu64, dir, (int)pid, start_time);
	snprintf(tmp, sizeof(tmp), "%s/.%d-%" PRIu64 ".tmp", dir, (int)pid, start_time);
	unlink(tmp);
	fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		goto fail;
	if (ftruncate(fd, SIMSTATE_FILE_BYTES) != 0) {
		close(fd);
		goto fail_unlink;
	}
	struct simstate_file *f =
		mmap(NULL, SIMSTATE_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (f == MAP_FAILED)
		goto fail_unlink;
	f->magic = SIMSTATE_MAGIC;
	f->version = SIMSTATE_VERSION;
	f->file_bytes = SIMSTATE_FILE_BYTES;
	f->device_count = (uint32_t)device_count;
	f->pid = (int32_t)pid;
	f->start_time = start_time;
	/* Readers see the file only once it is complete. */
	if (rename(tmp, published_path) != 0) {
		munmap(f, SIMSTATE_FILE_BYTES);
		goto fail_unlink;
	}
	published_count = device_count;
	published_pid = pid;
	__atomic_store_n(&published, f, __ATOMIC_RELEASE);
	if (!registered) {
		atexit(unpublish);
		pthread_atfork(NULL, NULL, forget_in_child);
		registered = 1;
	}
	return 0;

fail_unlink: {
	int saved = errno;
	unlink(tmp);
	errno = saved;
}
fail:
	fprintf(stderr, "simcuda: cannot publish usage in state folder %s: %s\n", dir, strerror(errno));
	return -1;
}

void simstate_set_device_bytes(int ordinal, uint64_t bytes)
{
	struct simstate_file *f = __atomic_load_n(&published, __ATOMIC_ACQUIRE);

	if (f == NULL || ordinal < 0 || ordinal >= published_count)
		return;
	__atomic_store_n(&f->device_bytes[ordinal], bytes, __ATOMIC_RELAXED);
}

/*
 * Parses "<pid>-<start>" (published) or ".<pid>-<start>.tmp" (being created).
 * Returns 1 for a published name, 2 for a temporary one, 0 for anything else.
 */
static int parse_name(const char *name, pid_t *pid, uint64_t *start_time)
{
	int temporary = name[0] == '.';
	const char *p = name + temporary;
	char *end;

	if (*p < '1' || *p > '9')
		return 0;
	errno = 0;
	long v = strtol(p, &end, 10);
	if (errno != 0 || *end != '-' || v <= 0 || v > INT32_MAX)
		return 0;
	p = end + 1;
	if (*p < '0' || *p > '9')
		return 0;
	unsigned long long s = strtoull(p, &end, 10);
	if (errno != 0)
		return 0;
	if (temporary ? strcmp(end, ".tmp") != 0 : *end != '\0')
		return 0;
	*pid = (pid_t)v;
	*start_time = s;
	return temporary ? 2 : 1;
}

/* Reads one published file; returns 0 and fills proc, or -1 when it is not a valid state file. */
static int read_file(int dirfd, const char *name, pid_t pid, uint64_t start_time,
		     struct simstate_process *proc)
{
	struct stat st;
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    st.st_size != SIMSTATE_FILE_BYTES) {
		close(fd);
		return -1;
	}
	const struct simstate_file *f = mmap(NULL, SIMSTATE_FILE_BYTES, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (f == MAP_FAILED)
		return -1;

	int ok = f->magic == SIMSTATE_MAGIC && f->version == SIMSTATE_VERSION &&
		 f->file_bytes == SIMSTATE_FILE_BYTES && f->pid == (int32_t)pid &&
		 f->start_time == start_time && f->device_count >= 1 &&
		 f->device_count <= SIMSTATE_MAX_DEVICES;
	if (ok) {
		memset(proc, 0, sizeof(*proc));
		proc->pid = (int32_t)pid;
		proc->device_count = f->device_count;
		for (uint32_t i = 0; i < f->device_count; i++)
			proc->device_bytes[i] = __atomic_load_n(&f->device_bytes[i], __ATOMIC_RELAXED);
	}
	munmap((void *)f, SIMSTATE_FILE_BYTES);
	return ok ? 0 : -1;
}

int simstate_scan(void (*fn)(const struct simstate_process *proc, void *arg), void *arg)
{
	char dir[4096];
	struct dirent *ent;
	struct simstate_process proc;

	if (simstate_dir(dir, sizeof(dir)) != 0) {
		errno = ENAMETOOLONG;
		return -1;
	}
	DIR *d = opendir(dir);
	if (d == NULL)
		return errno == ENOENT ? 0 : -1;
	int dirfd_ = dirfd(d);
	while ((ent = readdir(d)) != NULL) {
		pid_t pid;
		uint64_t start_time;
		int kind = parse_name(ent->d_name, &pid, &start_time);

		if (kind == 0)
			continue;
		if (!process_alive(pid, start_time)) {
			/* The name pins one process incarnation, so this never removes a live file. */
			unlinkat(dirfd_, ent->d_name, 0);
			continue;
		}
		if (kind == 1 && fn != NULL && read_file(dirfd_, ent->d_name, pid, start_time, &proc) == 0)
			fn(&proc, arg);
	}
	closedir(d);
	return 0;
}
