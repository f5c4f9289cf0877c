/* forker: a launcher that leaves the work to a child and exits.
 *
 *   forker ROUNDS
 *
 * Waits for a byte on fd 3 (so that a tracer can attach), forks and exits.
 * The child waits for a byte on fd 4, then makes ROUNDS cudaMalloc/cudaFree
 * pairs of 4096 bytes and exits 0 (1 if a call fails). The parent makes no
 * CUDA call: CUDA is not used across a fork. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <spillway/cuda_runtime.h>

int main(int argc, char **argv)
{
	char c;
	if (argc != 2) {
		fprintf(stderr, "usage: forker ROUNDS\n");
		return 2;
	}
	if (read(3, &c, 1) != 1) {
		fprintf(stderr, "forker: no go-ahead byte on fd 3\n");
		return 1;
	}
	pid_t child = fork();
	if (child < 0) {
		perror("forker: fork");
		return 1;
	}
	if (child > 0)
		return 0;
	if (read(4, &c, 1) != 1) {
		fprintf(stderr, "forker: no go-ahead byte on fd 4\n");
		return 1;
	}
	long rounds = atol(argv[1]);
	for (long i = 0; i < rounds; i++) {
		void *p;
		if (cudaMalloc(&p, 4096) != cudaSuccess || cudaFree(p) != cudaSuccess) {
			fprintf(stderr, "forker: round %ld failed\n", i);
			return 1;
		}
	}
	return 0;
}
