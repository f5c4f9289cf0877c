/*
 * export.h - the private table the simulated driver hands the simulated
 * runtime through cuGetExportTable, as the real libcuda does for libcudart.
 * It carries what only simcuda needs: call counts for the statistics file,
 * fault injection for runtime functions, and the calling thread's current
 * context, which the runtime checks at every call without counting a driver
 * call (as the real runtime's private table lets it). Test programs find it
 * the same way, for hold.
 */
#ifndef SIMCUDA_EXPORT_H
#define SIMCUDA_EXPORT_H

#include <stddef.h>
#include <stdint.h>

/* The table's id, as passed to cuGetExportTable. */
#define SIMCUDA_EXPORT_TABLE_ID                                                               \
	{                                                                                     \
		{                                                                             \
			's', 'i', 'm', 'c', 'u', 'd', 'a', '-', 'r', 'u', 'n', 't', 'i', 'm', \
			'e', '1'                                                              \
		}                                                                             \
	}

struct simcuda_export_table {
	size_t size; /* sizeof(struct simcuda_export_table) */
	/*
	 * Registers a runtime's call counters (names[i] counted in counts[i],
	 * updated with atomic adds); the driver reads them when it writes the
	 * statistics file. The arrays must live as long as the process.
	 */
	void (*register_counters)(const char *const *names, uint64_t *counts, int n);
	/* The CUresult the ordinal-th call (from 1) of name must fail with
	 * (SIMCUDA_FAIL), or 0 (CUDA_SUCCESS). */
	int (*should_fail)(const char *name, uint64_t ordinal);
	/*
	 * The calling thread's current context (NULL: none) and, in *device, its
	 * device, or -1 when there is none or it is destroyed or inactive.
	 */
	struct CUctx_st *(*current_context)(int *device);
	/*
	 * A test hook: the next call of the driver function name, from any
	 * thread, runs hook at its entry, before it takes any lock of the
	 * driver's, and goes on when hook returns. A test holds a thread inside
	 * a CUDA call so (and inside whatever an interposer holds around it)
	 * until it has done what must happen meanwhile, such as a fork. One hook
	 * at a time, armed anew for each use; name must outlive the call.
	 */
	void (*hold)(const char *name, void (*hook)(void));
};

#endif
