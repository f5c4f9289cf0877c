/*
 * ipc_runtime.c - the two sides of a CUDA IPC handle through the runtime
 * (cudaIpcGetMemHandle, cudaIpcOpenMemHandle, cudaIpcCloseMemHandle), linked
 * against libcudart only.
 *   ipc_runtime export        allocates 8 MiB with cudaMalloc, fills its
 *                             first MiB, checks the refusals (NULL, freed
 *                             and stream-ordered memory, its own handle) and
 *                             the last error they leave, prints "handle
 *                             <hex>" (the handle of a pointer 1 MiB + 4 KiB
 *                             into it), then at the line "check" verifies
 *                             the MiB at 4 MiB that an importer wrote and
 *                             prints "checked"; it frees and exits at the
 *                             end of its input.
 *   ipc_runtime import <hex>  checks the refused opens, opens the handle,
 *                             checks the first MiB (the opened pointer is
 *                             the allocation's base), writes the MiB at
 *                             4 MiB, closes it and prints "PASS import".
 *   ipc_runtime gone <hex>    checks that a handle whose memory is gone is
 *                             refused, and prints "PASS gone".
 * Any failed check names itself on stderr and exits 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda_runtime.h>

#include "ipc.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) == IPC_HANDLE_BYTES, "parse_handle and print_handle cover the whole handle");

/* A failed call leaves its error as the thread's last error, which reading clears. */
static void expect_last_error(cudaError_t want)
{
	EXPECT(cudaPeekAtLastError(), want);
	EXPECT(cudaGetLastError(), want);
	EXPECT(cudaGetLastError(), cudaSuccess);
}

static void export(unsigned char *buf)
{
	char *p, *freed, *ordered;
	void *opened = NULL;
	cudaIpcMemHandle_t h, again, inner;
	char line[64];

	CHECK(sizeof(cudaIpcMemHandle_t) == 64);
	OK(cudaMalloc((void **)&p, 8 * MiB));
	for (size_t i = 0; i < MiB; i++)
		buf[i] = pattern(i, 0);
	OK(cudaMemcpy(p, buf, MiB, cudaMemcpyHostToDevice));
	/* A pointer inside the allocation names the whole allocation, as the base does. */
	OK(cudaIpcGetMemHandle(&inner, p + MiB + 4096));
	OK(cudaIpcGetMemHandle(&h, p));
	OK(cudaIpcGetMemHandle(&again, p));
	CHECK(memcmp(&h, &again, sizeof(h)) == 0);
	CHECK(memcmp(&h, &inner, sizeof(h)) == 0);
	expect_last_error(cudaSuccess);

	EXPECT(cudaIpcGetMemHandle(NULL, p), cudaErrorInvalidValue);
	expect_last_error(cudaErrorInvalidValue);
	EXPECT(cudaIpcGetMemHandle(&again, NULL), cudaErrorInvalidValue);
	expect_last_error(cudaErrorInvalidValue);
	EXPECT(cudaIpcGetMemHandle(&again, p + 8 * MiB), cudaErrorInvalidValue); /* past its end */
	expect_last_error(cudaErrorInvalidValue);
	OK(cudaMalloc((void **)&freed, MiB));
	OK(cudaFree(freed));
	EXPECT(cudaIpcGetMemHandle(&again, freed), cudaErrorInvalidValue);
	expect_last_error(cudaErrorInvalidValue);
	/* Stream-ordered memory is shared through its pool, never by a legacy handle. */
	OK(cudaMallocAsync((void **)&ordered, MiB, 0));
	OK(cudaStreamSynchronize(0));
	EXPECT(cudaIpcGetMemHandle(&again, ordered), cudaErrorInvalidValue);
	expect_last_error(cudaErrorInvalidValue);
	OK(cudaFreeAsync(ordered, 0));
	OK(cudaStreamSynchronize(0));

	/* The bytes survive the export, and a process cannot open its own handle. */
	memset(buf, 0, MiB);
	OK(cudaMemcpy(buf, p, MiB, cudaMemcpyDeviceToHost));
	check_pattern(buf, 0);
	EXPECT(cudaIpcOpenMemHandle(&opened, h, cudaIpcMemLazyEnablePeerAccess),
	       cudaErrorDeviceUninitialized);
	expect_last_error(cudaErrorDeviceUninitialized);
	CHECK(opened == NULL);

	/* The importer gets the interior pointer's handle and must open at the base. */
	print_handle(inner.reserved);

	CHECK(fgets(line, sizeof(line), stdin) != NULL && strcmp(line, "check\n") == 0);
	OK(cudaMemcpy(buf, p + 4 * MiB, MiB, cudaMemcpyDeviceToHost));
	check_pattern(buf, 1);
	printf("checked\n");
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin) != NULL)
		;
	OK(cudaFree(p));
}

static void import(const char *hex, unsigned char *buf)
{
	cudaIpcMemHandle_t h, wrong;
	char *q;
	size_t free_bytes, total;

	parse_handle(hex, h.reserved);
	EXPECT(cudaIpcOpenMemHandle((void **)&q, h, 0), cudaErrorInvalidValue); /* the flag is required */
	expect_last_error(cudaErrorInvalidValue);
	EXPECT(cudaIpcOpenMemHandle(NULL, h, cudaIpcMemLazyEnablePeerAccess), cudaErrorInvalidValue);
	expect_last_error(cudaErrorInvalidValue);
	wrong = h;
	wrong.reserved[16] ^= 1; /* another allocation id */
	EXPECT(cudaIpcOpenMemHandle((void **)&q, wrong, cudaIpcMemLazyEnablePeerAccess),
	       cudaErrorInvalidResourceHandle);
	expect_last_error(cudaErrorInvalidResourceHandle);
	OK(cudaIpcOpenMemHandle((void **)&q, h, cudaIpcMemLazyEnablePeerAccess));

	OK(cudaMemcpy(buf, q, MiB, cudaMemcpyDeviceToHost));
	check_pattern(buf, 0);
	for (size_t i = 0; i < MiB; i++)
		buf[i] = pattern(i, 1);
	OK(cudaMemcpy(q + 4 * MiB, buf, MiB, cudaMemcpyHostToDevice));

	/* The importer is charged nothing and cannot free what it opened. */
	OK(cudaMemGetInfo(&free_bytes, &total));
	CHECK(free_bytes == total - 8 * MiB); /* the exporter's 8 MiB, seen through the device */
	EXPECT(cudaFree(q), cudaErrorInvalidValue);
	expect_last_error(cudaErrorInvalidValue);
	EXPECT(cudaIpcCloseMemHandle(q + 4096), cudaErrorInvalidValue); /* not the opened pointer */
	OK(cudaIpcCloseMemHandle(q));
	EXPECT(cudaIpcCloseMemHandle(q), cudaErrorInvalidValue);
	expect_last_error(cudaErrorInvalidValue);
	printf("PASS import\n");
}

static void gone(const char *hex)
{
	cudaIpcMemHandle_t h;
	void *q = NULL;

	parse_handle(hex, h.reserved);
	EXPECT(cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess),
	       cudaErrorInvalidResourceHandle);
	expect_last_error(cudaErrorInvalidResourceHandle);
	printf("PASS gone\n");
}
