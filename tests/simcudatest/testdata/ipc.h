/*
 * ipc.h: what the two sides of a CUDA IPC handle share, through the driver
 * (ipc.c) and through the runtime (ipc_runtime.c): the bytes each side
 * writes, the handle's text form and the dispatch of the three roles, which
 * each program defines. A failed check names its role (check.h).
 */
#ifndef SIMCUDATEST_IPC_H
#define SIMCUDATEST_IPC_H

#include "check.h"

#define MiB (1ULL << 20)

/* The bytes of a CUDA IPC handle, driver's or runtime's. */
#define IPC_HANDLE_BYTES 64

static void export(unsigned char *buf);
static void import(const char *hex, unsigned char *buf);
static void gone(const char *hex);

static unsigned char pattern(size_t i, int which)
{
	return (unsigned char)(which ? i * 13 + 5 : i * 7 + 1);
}

static void check_pattern(const unsigned char *buf, int which)
{
	for (size_t i = 0; i < MiB; i++)
		CHECK(buf[i] == pattern(i, which));
}

static void parse_handle(const char *hex, char reserved[IPC_HANDLE_BYTES])
{
	CHECK(strlen(hex) == 2 * IPC_HANDLE_BYTES);
	for (size_t i = 0; i < IPC_HANDLE_BYTES; i++) {
		unsigned int byte;
		CHECK(sscanf(hex + 2 * i, "%2x", &byte) == 1);
		reserved[i] = (char)byte;
	}
}

/* print_handle prints the line "handle <hex>" the importer is given. */
static void print_handle(const char reserved[IPC_HANDLE_BYTES])
{
	printf("handle ");
	for (size_t i = 0; i < IPC_HANDLE_BYTES; i++)
		printf("%02x", (unsigned char)reserved[i]);
	printf("\n");
	fflush(stdout);
}

int main(int argc, char **argv)
{
	int exporting = argc == 2 && strcmp(argv[1], "export") == 0;
	int importing = argc == 3 && strcmp(argv[1], "import") == 0;
	int late = argc == 3 && strcmp(argv[1], "gone") == 0;
	unsigned char *buf;

	if (!exporting && !importing && !late) {
		fprintf(stderr, "usage: %s export | import <hex> | gone <hex>\n", argv[0]);
		return 2;
	}
	current_case = argv[1];
	buf = malloc(MiB);
	CHECK(buf != NULL);
	if (exporting)
		export(buf);
	else if (importing)
		import(argv[2], buf);
	else
		gone(argv[2]);
	free(buf);
	return 0;
}

#endif
