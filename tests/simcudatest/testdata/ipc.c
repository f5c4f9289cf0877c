/*
 * ipc.c - the two sides of a CUDA IPC handle on simcuda, linked against
 * libcuda only.
 *   ipc export         allocates 8 MiB, fills its first MiB, prints
 *                      "handle <hex>" (the handle of a pointer 1 MiB + 4 KiB
 *                      into it), then at the line "check" verifies the
 *                      MiB at 4 MiB that an importer wrote and prints
 *                      "checked"; it frees and exits at the end of its input.
 *   ipc import <hex>   opens the handle, checks the first MiB (the opened
 *                      pointer is the allocation's base), writes the MiB
 *                      at 4 MiB, closes it and prints "PASS import".
 *   ipc gone <hex>     checks that a handle whose memory is gone is refused.
 * Any failed check names itself on stderr and exits 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spillway/cuda.h>

#include "ipc.h"

_Static_assert(sizeof(CUipcMemHandle) == IPC_HANDLE_BYTES, "parse_handle and print_handle cover the whole handle");

static void context(void)
{
	CUcontext ctx;

	EXPECT(cuInit(0), CUDA_SUCCESS);
	EXPECT(cuCtxCreate_v2(&ctx, 0, 0), CUDA_SUCCESS);
}

static void export(unsigned char *buf)
{
	CUdeviceptr p, opened;
	CUipcMemHandle h, again, inner;
	char line[64];

	context();
	EXPECT(cuMemAlloc_v2(&p, 8 * MiB), CUDA_SUCCESS);
	for (size_t i = 0; i < MiB; i++)
		buf[i] = pattern(i, 0);
	EXPECT(cuMemcpyHtoD_v2(p, buf, MiB), CUDA_SUCCESS);
	/* A pointer inside the allocation names the whole allocation, as the base does. */
	EXPECT(cuIpcGetMemHandle(&inner, p + MiB + 4096), CUDA_SUCCESS);
	EXPECT(cuIpcGetMemHandle(&h, p), CUDA_SUCCESS);
	EXPECT(cuIpcGetMemHandle(&again, p), CUDA_SUCCESS);
	CHECK(memcmp(&h, &again, sizeof(h)) == 0);
	CHECK(memcmp(&h, &inner, sizeof(h)) == 0);
	EXPECT(cuIpcGetMemHandle(&again, p + 8 * MiB), CUDA_ERROR_INVALID_VALUE); /* past its end */
	/* The bytes survive the export, and the exporter cannot open its own handle. */
	memset(buf, 0, MiB);
	EXPECT(cuMemcpyDtoH_v2(buf, p, MiB), CUDA_SUCCESS);
	check_pattern(buf, 0);
	EXPECT(cuIpcOpenMemHandle_v2(&opened, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
	       CUDA_ERROR_INVALID_CONTEXT);

	/* The importer gets the interior pointer's handle and must open at the base. */
	print_handle(inner.reserved);

	CHECK(fgets(line, sizeof(line), stdin) != NULL && strcmp(line, "check\n") == 0);
	EXPECT(cuMemcpyDtoH_v2(buf, p + 4 * MiB, MiB), CUDA_SUCCESS);
	check_pattern(buf, 1);
	printf("checked\n");
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin) != NULL)
		;
	EXPECT(cuMemFree_v2(p), CUDA_SUCCESS);
}

static void import(const char *hex, unsigned char *buf)
{
	CUipcMemHandle h;
	CUdeviceptr q;
	size_t free_bytes, total;

	context();
	parse_handle(hex, h.reserved);
	EXPECT(cuIpcOpenMemHandle_v2(&q, h, 0), CUDA_ERROR_INVALID_VALUE); /* the flag is required */
	CUipcMemHandle wrong = h;
	wrong.reserved[16] ^= 1; /* another allocation id */
	EXPECT(cuIpcOpenMemHandle_v2(&q, wrong, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
	       CUDA_ERROR_INVALID_HANDLE);
	EXPECT(cuIpcOpenMemHandle_v2(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);

	EXPECT(cuMemcpyDtoH_v2(buf, q, MiB), CUDA_SUCCESS);
	check_pattern(buf, 0);
	for (size_t i = 0; i < MiB; i++)
		buf[i] = pattern(i, 1);
	EXPECT(cuMemcpyHtoD_v2(q + 4 * MiB, buf, MiB), CUDA_SUCCESS);
	EXPECT(cuMemcpyHtoD_v2(q + 8 * MiB - 1, buf, 2), CUDA_ERROR_INVALID_VALUE); /* its bounds */

	/* The importer is charged nothing and cannot free what it opened. */
	EXPECT(cuMemGetInfo_v2(&free_bytes, &total), CUDA_SUCCESS);
	CHECK(free_bytes == total - 8 * MiB); /* the exporter's 8 MiB, seen through the device */
	EXPECT(cuMemFree_v2(q), CUDA_ERROR_INVALID_VALUE);
	EXPECT(cuIpcCloseMemHandle(q), CUDA_SUCCESS);
	EXPECT(cuIpcCloseMemHandle(q), CUDA_ERROR_INVALID_VALUE);
	printf("PASS import\n");
}

static void gone(const char *hex)
{
	CUipcMemHandle h;
	CUdeviceptr q;

	context();
	parse_handle(hex, h.reserved);
	EXPECT(cuIpcOpenMemHandle_v2(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
	       CUDA_ERROR_INVALID_HANDLE);
	printf("PASS gone\n");
}
