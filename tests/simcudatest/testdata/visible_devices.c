/*
 * visible_devices.c - prints the devices the runtime shows, one
 * "<capacity>@<pci bus>=<uuid>" per device after their count:
 * "2: 3221225472@1a=GPU-... 1073741824@18=GPU-...", or "error <code>" when
 * cudaGetDeviceCount fails.
 */
#include <stdio.h>

#include <spillway/cuda_runtime.h>

int main(void)
{
	struct cudaDeviceProp prop;
	int n;
	cudaError_t err = cudaGetDeviceCount(&n);

	if (err != cudaSuccess) {
		printf("error %d\n", (int)err);
		return 0;
	}
	printf("%d:", n);
	for (int i = 0; i < n; i++) {
		if ((err = cudaGetDeviceProperties(&prop, i)) != cudaSuccess) {
			fprintf(stderr, "cudaGetDeviceProperties(%d): %s\n", i, cudaGetErrorName(err));
			return 1;
		}
		const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
		printf(" %zu@%02x=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		       prop.totalGlobalMem, prop.pciBusID, u[0], u[1], u[2], u[3], u[4], u[5], u[6],
		       u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
	}
	printf("\n");
	return 0;
}
