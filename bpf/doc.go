// Package bpf holds the eBPF probes of a tracing session and their loader.
//
// The probes (spillway.bpf.c, compiled into the committed
// spillway_x86_bpfel.o by `make generate`) watch four things in the
// processes being traced:
//
//   - the CUDA memory and transfer API, by uprobes and uretprobes on the
//     runtime (cudaMalloc, cudaMemcpy, ...) and driver (cuMemAlloc_v2,
//     cuMemcpyHtoD_v2, ...) functions in every file that defines them: the
//     shim's front, libcudart, libcuda, or an executable linked with the static
//     runtime. Each call is counted once, at the outermost probed layer: the
//     layer the application called. Calls one layer makes into another while
//     serving it (the shim into the runtime, the runtime into the driver) are
//     nested and not reported. cudaDeviceSynchronize, cudaStreamDestroy,
//     cudaMemGetInfo and cudaDeviceReset are probed (and counted) for that
//     reason too: the shim releases segments and promotes spilled memory
//     inside them; the synchronizations (with cuCtxSynchronize) also count
//     the application's steps. When a copy or memset returns, the kernel
//     flags it if a range it names touches spilled memory (see below);
//   - the shim's probe points (spillway_probe_alloc, _free, _sync, _spill,
//     _promote, _refuse in libspillway.so), the pool's own view. Their
//     uprobes take the shim's spillway_probe_semaphore as reference counter:
//     the kernel keeps it non-zero while they are attached, and the shim
//     fires them only then;
//   - CPU page faults, from the exceptions:page_fault_user tracepoint,
//     classified in the kernel by whether the address lies in memory the shim
//     has spilled to the host (the spill, promote and free probe points keep
//     those ranges in a BPF map, which classifies copies and memsets too);
//   - optionally, GPU faults and migrations from nvidia-uvm, where the module is
//     loaded and the kernel has kprobes.
//
// Processes are filtered in the kernel: a traced map holds the thread group
// ids asked for, and their children join it when they fork. Files are found
// through /proc/PID/maps and attached once each, however many processes map
// them, so a running job can be traced without restarting it. Every record
// goes through one ring buffer; records that do not fit are counted in the
// kernel and reported by Drops.
//
// This package must never change what a traced process does: probes only read.
// It knows the CUDA signatures it decodes, but nothing of the shim's pool.
package bpf
