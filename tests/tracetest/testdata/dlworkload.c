/* dlworkload: loads a CUDA library with dlopen after it has started, as the
 * runtime loads the driver, then makes calls through it.
 *
 *   dlworkload FD LIBRARY N
 *
 * Reads a byte from FD, dlopens LIBRARY, prints "loaded", reads another byte
 * from FD, then makes N cudaMalloc+cudaFree pairs. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void wait_byte(int fd)
{
	char c;
	if (read(fd, &c, 1) != 1) {
		fprintf(stderr, "dlworkload: no go-ahead byte on fd %d\n", fd);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: dlworkload FD LIBRARY N\n");
		return 2;
	}
	int fd = atoi(argv[1]);
	wait_byte(fd);
	void *lib = dlopen(argv[2], RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "dlworkload: %s\n", dlerror());
		return 1;
	}
	int (*malloc_fn)(void **, size_t) = (int (*)(void **, size_t))dlsym(lib, "cudaMalloc");
	int (*free_fn)(void *) = (int (*)(void *))dlsym(lib, "cudaFree");
	if (!malloc_fn || !free_fn) {
		fprintf(stderr, "dlworkload: %s lacks cudaMalloc or cudaFree\n", argv[2]);
		return 1;
	}
	printf("loaded\n");
	fflush(stdout);
	wait_byte(fd);
	for (long i = 0, n = atol(argv[3]); i < n; i++) {
		void *p;
		if (malloc_fn(&p, 512) != 0 || free_fn(p) != 0) {
			fprintf(stderr, "dlworkload: call failed\n");
			return 1;
		}
	}
	return 0;
}
