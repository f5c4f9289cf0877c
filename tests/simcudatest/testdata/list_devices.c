/* list_devices.c - prints "<count>: <bytes> <bytes>..." from cudaGetDeviceCount and cuDeviceTotalMem. */
#include <stdio.h>

#include <spillway/cuda_runtime.h>

int main(void)
{
	struct cudaDeviceProp prop;
	int n;
	cudaError_t err = cudaGetDeviceCount(&n);

	if (err != cudaSuccess) {
		fprintf(stderr, "cudaGetDeviceCount: %s\n", cudaGetErrorName(err));
		return 1;
	}
	printf("%d:", n);
	for (int i = 0; i < n; i++) {
		if ((err = cudaGetDeviceProperties(&prop, i)) != cudaSuccess) {
			fprintf(stderr, "cudaGetDeviceProperties: %s\n", cudaGetErrorName(err));
			return 1;
		}
		printf(" %zu", prop.totalGlobalMem);
	}
	printf("\n");
	return 0;
}
