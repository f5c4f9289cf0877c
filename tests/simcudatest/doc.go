// Package simcudatest tests simcuda, the project's simulated CUDA driver,
// runtime and NVML, as applications see them: C programs built against
// build/simcuda and run through the real dynamic linker, and go-nvml loading
// its libnvidia-ml.so.1. It holds no code that other packages use.
package simcudatest
