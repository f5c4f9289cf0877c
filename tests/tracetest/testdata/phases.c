/* phases: cudaMalloc+cudaFree pairs in phases, for attaching and detaching
 * a tracer between them.
 *
 *   phases PAIRS   for each byte read from fd 3, runs PAIRS pairs of
 *                  cudaMalloc(4096)+cudaFree, then writes one byte to fd 4;
 *                  exits at the end of fd 3. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <spillway/cuda_runtime.h>

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: phases PAIRS\n");
		return 2;
	}
	long pairs = atol(argv[1]);
	char c;
	while (read(3, &c, 1) == 1) {
		for (long i = 0; i < pairs; i++) {
			void *p;
			if (cudaMalloc(&p, 4096) != cudaSuccess || cudaFree(p) != cudaSuccess) {
				fprintf(stderr, "phases: cudaMalloc or cudaFree failed\n");
				return 1;
			}
		}
		if (write(4, &c, 1) != 1)
			return 1;
	}
	return 0;
}
