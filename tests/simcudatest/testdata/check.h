/*
 * check.h: the checks and the case dispatch the simcuda test programs share.
 * A program lists its cases and calls run_case from main; current_case is
 * the case running, and a failed check names the case, the place and the
 * call, and exits 1.
 */
#ifndef SIMCUDATEST_CHECK_H
#define SIMCUDATEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *current_case;

#define CHECK(cond)                                                                    \
	do {                                                                           \
		if (!(cond)) {                                                         \
			fprintf(stderr, "%s: %s:%d: check failed: %s\n", current_case, \
				__FILE__, __LINE__, #cond);                            \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

#define EXPECT(call, want)                                                                    \
	do {                                                                                  \
		int got_ = (int)(call);                                                       \
		if (got_ != (int)(want)) {                                                    \
			fprintf(stderr, "%s: %s:%d: %s returned %d, want %d\n", current_case, \
				__FILE__, __LINE__, #call, got_, (int)(want));                \
			exit(1);                                                              \
		}                                                                             \
	} while (0)

/* A CUDA call that must succeed (CUDA_SUCCESS and cudaSuccess are 0). */
#define OK(call) EXPECT(call, 0)

struct test_case {
	const char *name;
	void (*run)(void);
};

/* run_case runs the case named by the only argument and prints "PASS
 * <case>"; it returns main's exit status: 0, or 2 on a bad command line.
 * It is inline so that a program dispatching its own way (ipc.h) may use
 * the checks alone. */
static inline int run_case(const struct test_case *cases, size_t n, int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s <case>\n", argv[0]);
		return 2;
	}
	for (size_t i = 0; i < n; i++) {
		if (strcmp(cases[i].name, argv[1]) == 0) {
			current_case = argv[1];
			cases[i].run();
			printf("PASS %s\n", argv[1]);
			return 0;
		}
	}
	fprintf(stderr, "unknown case %s\n", argv[1]);
	return 2;
}

#endif
