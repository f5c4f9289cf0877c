/*
 * check.h: the checks the simcuda test programs share. Each program sets
 * current_case to the case it runs; a failed check names the case, the
 * place and the call, and exits 1.
 */
#ifndef SIMCUDATEST_CHECK_H
#define SIMCUDATEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
