package shimtest

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// The driver's CUresult codes the tests expect (cuda.h).
const (
	cuSuccess             = 0
	cuOutOfMemory         = 2
	cuErrorNotInitialized = 3
	cuErrorIllegalAddress = 700
	cuErrorLaunchFailed   = 719
	cuInvalidDevice       = 101
)

// drvops builds testdata/drvops.c against the driver and, with runtime set,
// the dynamic ("dynamic") or static ("static") simcuda runtime.
func drvops(t testing.TB, runtime string) string {
	b := harness.CBuild{Sources: []string{"testdata/drvops.c"}, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda", "-ldl"}}
	switch runtime {
	case "dynamic":
		b.Cudart = true
		b.Flags = append(b.Flags, "-DWITH_RUNTIME")
	case "static":
		b.StaticCudart = true
		b.Flags = append(b.Flags, "-DWITH_RUNTIME")
	}
	return harness.Compile(t, b)
}

// TestDriverQuota: cuMemAlloc_v2 is refused at the quota with
// CUDA_ERROR_OUT_OF_MEMORY, leaves the runtime's last error alone, and
// cuMemGetInfo_v2 reports the quota as the total; simcuda never holds more
// than the quota. The runtime's own driver calls, made for an interposed
// runtime call, are not counted a second time: runtime and driver
// allocations share one quota, each counted once. The log names the driver
// functions the program called, never the runtime's.
func TestDriverQuota(t *testing.T) {
	for _, runtime := range []string{"dynamic", "static"} {
		t.Run(runtime, func(t *testing.T) {
			prog := drvops(t, runtime)
			stats := filepath.Join(t.TempDir(), "stats.json")
			env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SIMCUDA_STATS_FILE=" + stats, "SPILLWAY_LOG_LEVEL=debug"}
			res, out := harness.RunOK(t, harness.Shimmed(t, env, prog,
				"r", "24M", "m", "24M", "m", "24M", "e", "i", "I", "m", "8M", "f", "1", "m", "24M"))
			if res.ExitCode != 0 {
				t.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
			}
			if rc := out.Code(t, "r", 0); rc != 0 {
				t.Errorf("cudaMalloc of 24 MiB under a 64 MiB quota: %d", rc)
			}
			for i, want := range []int{cuSuccess, cuOutOfMemory, cuSuccess, cuSuccess} {
				if rc := out.Code(t, "m", i); rc != want {
					t.Errorf("cuMemAlloc_v2 #%d: %d, want %d\n%v", i, rc, want, out)
				}
			}
			if rc := out.Code(t, "e", 0); rc != 0 {
				t.Errorf("a refused cuMemAlloc_v2 left the runtime's last error %d", rc)
			}
			for _, want := range []string{"cuMemAlloc_v2 of 24MiB refused on device 0: 48MiB in use of a quota of 64MiB",
				"cuMemAlloc_v2 of 25165824 bytes on device 0", "cuMemFree_v2 of 0x"} {
				if !strings.Contains(res.Stderr, want) {
					t.Errorf("the log does not say %q: %s", want, res.Stderr)
				}
			}
			for _, op := range []string{"i", "I"} {
				if rc, total := out.Code(t, op, 0), out.Num(t, op, 0, 3); rc != 0 || total != 64<<20 {
					t.Errorf("%s: rc %d total %d, want 0 and the 64 MiB quota", op, rc, total)
				}
			}
			if peak := harness.ReadStats(t, stats).Devices[0].DeviceBytesPeak; peak > 64<<20 {
				t.Errorf("simcuda held %d bytes at its peak, above the 64 MiB quota", peak)
			}
		})
	}
}

// TestProcAddressQuota: cuMemAlloc as cuGetProcAddress and
// cuGetProcAddress_v2 hand it out (default and per-thread default stream)
// is the shim's, refused at the quota like the linked one.
func TestProcAddressQuota(t *testing.T) {
	prog := drvops(t, "dynamic")
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SIMCUDA_STATS_FILE=" + stats}
	_, out := harness.RunOK(t, harness.Shimmed(t, env, prog, "g", "40M", "g", "40M", "G", "40M", "h", "40M", "f", "0", "G", "40M", "e"))
	for _, c := range []struct {
		op   string
		i    int
		want int
	}{{"g", 0, cuSuccess}, {"g", 1, cuOutOfMemory}, {"G", 0, cuOutOfMemory}, {"h", 0, cuOutOfMemory}, {"G", 1, cuSuccess}} {
		if rc := out.Code(t, c.op, c.i); rc != c.want {
			t.Errorf("%s #%d: %d, want %d\n%v", c.op, c.i, rc, c.want, out)
		}
	}
	if rc := out.Code(t, "e", 0); rc != 0 {
		t.Errorf("a refused driver allocation left the runtime's last error %d", rc)
	}
	// The version asked for the per-thread default stream is the one wrapped.
	if name := out.Line(t, "h", 0)[3]; name != "cuMemAllocAsync_ptsz@libspillway.so" {
		t.Errorf("cuGetProcAddress_v2 handed out %s for cuMemAllocAsync on the per-thread stream, want the shim's cuMemAllocAsync_ptsz", name)
	}
	if peak := harness.ReadStats(t, stats).Devices[0].DeviceBytesPeak; peak > 64<<20 {
		t.Errorf("simcuda held %d bytes at its peak, above the 64 MiB quota", peak)
	}
}

// TestDriverMemoryAPI: the driver's other allocation functions, its
// stream-ordered free, cuCtxSynchronize, cuDeviceTotalMem_v2 and
// cuDevicePrimaryCtxReset_v2 go through the shim against one quota.
func TestDriverMemoryAPI(t *testing.T) {
	prog := drvops(t, "dynamic")
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SIMCUDA_STATS_FILE=" + stats}
	_, out := harness.RunOK(t, harness.Shimmed(t, env, prog,
		"M", "24M", "p", "1M", "48", "p", "1M", "16", "a", "16M", "A", "12M", "F", "2", "s", "A", "12M",
		"t", "x", "m", "60M", "e"))
	for _, c := range []struct {
		op   string
		i    int
		want int
	}{
		{"M", 0, cuSuccess}, {"p", 0, cuOutOfMemory}, {"p", 1, cuSuccess}, {"a", 0, cuSuccess},
		{"A", 0, cuOutOfMemory}, {"F", 0, cuSuccess}, {"s", 0, cuSuccess}, {"A", 1, cuSuccess},
		{"t", 0, cuSuccess}, {"x", 0, cuSuccess}, {"m", 0, cuSuccess}, {"e", 0, 0},
	} {
		if rc := out.Code(t, c.op, c.i); rc != c.want {
			t.Errorf("%s #%d: %d, want %d\n%v", c.op, c.i, rc, c.want, out)
		}
	}
	if pitch := out.Num(t, "p", 1, 3); pitch < 1<<20 {
		t.Errorf("pitch %d for rows of 1 MiB", pitch)
	}
	if total := out.Num(t, "t", 0, 2); total != 64<<20 {
		t.Errorf("cuDeviceTotalMem_v2 reports %d, want the 64 MiB quota", total)
	}
	if peak := harness.ReadStats(t, stats).Devices[0].DeviceBytesPeak; peak > 64<<20 {
		t.Errorf("simcuda held %d bytes at its peak, above the 64 MiB quota", peak)
	}
}

// TestCtxSynchronizePromotes: cuCtxSynchronize is a device synchronization
// for oversubscription as cudaDeviceSynchronize is: after a free made room
// under the quota, it brings the spilled block back to the device, where
// the free alone did not.
func TestCtxSynchronizePromotes(t *testing.T) {
	env := []string{"SPILLWAY_VMM=0", "SPILLWAY_MEMORY_LIMIT=16MiB", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_REPORT=1"}
	res, out := harness.RunOK(t, harness.Shimmed(t, env, drvops(t, ""), "m", "8M", "m", "8M", "m", "8M", "f", "0", "s"))
	for i := range 3 {
		if rc := out.Code(t, "m", i); rc != cuSuccess {
			t.Fatalf("cuMemAlloc_v2 %d: %d, want the third spilled\n%v\nstderr: %s", i, rc, out, res.Stderr)
		}
	}
	if out.Code(t, "f", 0) != cuSuccess || out.Code(t, "s", 0) != cuSuccess {
		t.Fatalf("%v", out)
	}
	if r := harness.ReportFor(t, res.Stderr, 0); r.PromotedTotal != 8<<20 || r.Spilled != 0 {
		t.Errorf("report %+v: want the spilled 8 MiB promoted at cuCtxSynchronize", r)
	}
}

// A quota above the device's memory is the total cuDeviceTotalMem and NVML
// report, as cudaMemGetInfo does, before the device is first used as after.
func TestQuotaAboveTheDeviceIsTheTotalFromTheStart(t *testing.T) {
	env := []string{"SIMCUDA_DEVICES=1x4GiB", "SPILLWAY_MEMORY_LIMIT=8GiB"}
	_, out := harness.RunOK(t, harness.Shimmed(t, env, drvops(t, "dynamic"), "t", "i", "m", "1M", "t", "i"))
	for i := range 2 {
		if total, info := out.Num(t, "t", i, 2), out.Num(t, "i", i, 3); total != 8<<30 || info != 8<<30 {
			t.Errorf("#%d: cuDeviceTotalMem %d, cuMemGetInfo's total %d, want the 8 GiB quota\n%v", i, total, info, out)
		}
	}
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/nvmlonly.c"}, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lnvidia-ml"}})
	_, nv := harness.RunOK(t, harness.Shimmed(t, env, prog))
	if total := nv.Num(t, "t", 0, 1); total != 8<<30 {
		t.Errorf("nvmlDeviceGetMemoryInfo's total %d before any allocation, want the 8 GiB quota", total)
	}
}

// TestPrimaryCtxResetUnversioned: cuDevicePrimaryCtxReset, the entry point
// programs built with CUDA 7 to 10 call (and cuGetProcAddress answers below
// CUDA 11.0), destroys the device's memory as cuDevicePrimaryCtxReset_v2
// does: the pool goes with it, and the quota is free again, in a process
// with the runtime and in one with the driver alone.
func TestPrimaryCtxResetUnversioned(t *testing.T) {
	for _, runtime := range []string{"dynamic", ""} {
		t.Run("runtime="+runtime, func(t *testing.T) {
			stats := filepath.Join(t.TempDir(), "stats.json")
			env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SIMCUDA_STATS_FILE=" + stats}
			_, out := harness.RunOK(t, harness.Shimmed(t, env, drvops(t, runtime),
				"m", "24M", "m", "24M", "X", "m", "60M", "i"))
			checkSteps(t, out, []step{{"m", 0, cuSuccess}, {"m", 1, cuSuccess}, {"X", 0, cuSuccess},
				{"m", 2, cuSuccess}, {"i", 0, cuSuccess}})
			if free := out.Num(t, "i", 0, 2); free != 4<<20 {
				t.Errorf("cuMemGetInfo_v2 with 60 MiB allocated after the reset: %d bytes free, want 4 MiB", free)
			}
			if peak := harness.ReadStats(t, stats).Devices[0].DeviceBytesPeak; peak > 64<<20 {
				t.Errorf("simcuda held %d bytes at its peak, above the 64 MiB quota", peak)
			}
		})
	}
}

// TestDriverWithoutRuntime: a process with no CUDA runtime at all (only
// libcuda) gets the quota and the pool, which serve it with the driver.
func TestDriverWithoutRuntime(t *testing.T) {
	prog := drvops(t, "")
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_REPORT=1", "SIMCUDA_STATS_FILE=" + stats}
	ops := []string{"m", "40M", "m", "40M", "f", "0", "m", "40M", "m", "4K", "f", "2", "m", "4K", "M", "8M", "i", "s"}
	res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, ops...))
	for _, c := range []struct {
		op      string
		i, want int
	}{{"m", 0, cuSuccess}, {"m", 1, cuOutOfMemory}, {"f", 0, cuSuccess}, {"m", 2, cuSuccess}, {"M", 0, cuSuccess}, {"i", 0, cuSuccess}, {"s", 0, cuSuccess}} {
		if rc := out.Code(t, c.op, c.i); rc != c.want {
			t.Errorf("%s #%d: %d, want %d\n%v\n%s", c.op, c.i, rc, c.want, out, res.Stderr)
		}
	}
	if total := out.Num(t, "i", 0, 3); total != 64<<20 {
		t.Errorf("cuMemGetInfo_v2 total %d, want the 64 MiB quota", total)
	}
	// The pool works as it does over the runtime.
	withRuntime, _ := harness.RunOK(t, harness.Shimmed(t, env[:2], drvops(t, "dynamic"), ops...))
	got, want := reportOf(t, res.Stderr, 0), reportOf(t, withRuntime.Stderr, 0)
	if got["cache_hits"] == 0 || !maps.Equal(got, want) {
		t.Errorf("the pool without a runtime: %v\nwant as over the runtime: %v", got, want)
	}
	if peak := harness.ReadStats(t, stats).Devices[0].DeviceBytesPeak; peak > 64<<20 {
		t.Errorf("simcuda held %d bytes at its peak, above the 64 MiB quota", peak)
	}
}

// TestBothRuntimes: a program with the static runtime that also loads the
// dynamic one: the static runtime's, the dynamic runtime's and the
// driver's allocations share the quota, each counted once.
func TestBothRuntimes(t *testing.T) {
	prog := drvops(t, "static")
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SIMCUDA_STATS_FILE=" + stats}
	_, out := harness.RunOK(t, harness.Shimmed(t, env, prog, "r", "20M", "d", "20M", "m", "20M", "d", "8M", "r", "2M", "m", "2M"))
	for _, c := range []struct {
		op      string
		i, want int
	}{{"r", 0, 0}, {"d", 0, 0}, {"m", 0, cuSuccess}, {"d", 1, harness.ErrMemoryAllocation}, {"r", 1, 0}, {"m", 1, cuSuccess}} {
		if rc := out.Code(t, c.op, c.i); rc != c.want {
			t.Errorf("%s #%d: %d, want %d\n%v", c.op, c.i, rc, c.want, out)
		}
	}
	if peak := harness.ReadStats(t, stats).Devices[0].DeviceBytesPeak; peak > 64<<20 {
		t.Errorf("simcuda held %d bytes at its peak, above the 64 MiB quota", peak)
	}
}

// TestDriverEntryPointQuota: cuMemAlloc as the runtime's
// cudaGetDriverEntryPoint and cudaGetDriverEntryPointByVersion hand it out
// is the shim's, refused at the quota like the linked one.
func TestDriverEntryPointQuota(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/entrypoint.c"}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-ldl"}})
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SIMCUDA_STATS_FILE=" + stats}
	_, out := harness.RunOK(t, harness.Shimmed(t, env, prog, "24", "d", "v", "d", "v"))
	for _, c := range []struct {
		op      string
		i, want int
	}{{"d", 0, cuSuccess}, {"v", 0, cuSuccess}, {"d", 1, cuOutOfMemory}, {"v", 1, cuOutOfMemory}} {
		if rc := out.Code(t, c.op, c.i); rc != c.want {
			t.Errorf("%s #%d: %d, want %d\n%v", c.op, c.i, rc, c.want, out)
		}
		if name := out.Line(t, c.op, c.i)[2]; name != "cuMemAlloc_v2@libspillway.so" {
			t.Errorf("%s #%d handed out %s, want the shim's cuMemAlloc_v2", c.op, c.i, name)
		}
	}
	if peak := harness.ReadStats(t, stats).Devices[0].DeviceBytesPeak; peak > 64<<20 {
		t.Errorf("simcuda held %d bytes at its peak, above the 64 MiB quota", peak)
	}
}

// TestManagedFlagsOverQuota: a managed allocation with flags CUDA refuses
// (neither CU_MEM_ATTACH_GLOBAL nor CU_MEM_ATTACH_HOST) gets CUDA's
// CUDA_ERROR_INVALID_VALUE / cudaErrorInvalidValue, also when the quota is
// full: an out-of-memory error would send the program looking for memory
// to free instead of at its flags. Valid flags are still refused at the
// quota.
func TestManagedFlagsOverQuota(t *testing.T) {
	const cuInvalidValue = 1 // CUDA_ERROR_INVALID_VALUE and cudaErrorInvalidValue
	out, _ := runScriptWith(t, drvops(t, "dynamic"), 64<<20, nil,
		"m", "64M", "n", "4K", "0", "n", "4K", "4", "N", "4K", "0", "e", "N", "4K", "7", "e",
		"n", "4K", "1", "N", "4K", "2", "e")
	checkSteps(t, out, []step{
		{"m", 0, cuSuccess},
		{"n", 0, cuInvalidValue}, {"n", 1, cuInvalidValue},
		{"N", 0, cuInvalidValue}, {"e", 0, cuInvalidValue}, {"N", 1, cuInvalidValue}, {"e", 1, cuInvalidValue},
		{"n", 2, cuOutOfMemory}, {"N", 2, harness.ErrMemoryAllocation}, {"e", 2, harness.ErrMemoryAllocation},
	})
}

// TestManagedUnsupportedOverQuota: on a device without managed memory CUDA
// refuses every managed allocation with CUDA_ERROR_NOT_SUPPORTED /
// cudaErrorNotSupported, whatever its size; so does the shim, also when
// the quota is full, where it answered out of memory and warned of a
// refusal, sending the program to free memory that would not help.
func TestManagedUnsupportedOverQuota(t *testing.T) {
	const notSupported = 801 // CUDA_ERROR_NOT_SUPPORTED and cudaErrorNotSupported
	out, _ := runScriptWith(t, drvops(t, "dynamic"), 64<<20, []string{"SIMCUDA_NO_MANAGED=1"},
		"n", "4K", "1", "N", "4K", "1", "e", "m", "64M", "n", "4K", "1", "N", "4K", "1", "e")
	checkSteps(t, out, []step{
		{"n", 0, notSupported}, {"N", 0, notSupported}, {"e", 0, notSupported},
		{"m", 0, cuSuccess},
		{"n", 1, notSupported}, {"N", 1, notSupported}, {"e", 1, notSupported},
	})
}

// TestDriverStreamErrors: a driver call the core answers with an error
// CUDA has a CUresult for returns that CUresult, not CUDA_ERROR_UNKNOWN:
// CUDA_ERROR_INVALID_HANDLE for a stream-ordered allocation or free on a
// destroyed stream, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED for a managed
// allocation during a global-mode capture (which CUDA invalidates).
func TestDriverStreamErrors(t *testing.T) {
	const (
		cuInvalidHandle            = 400 // CUDA_ERROR_INVALID_HANDLE
		cuStreamCaptureUnsupported = 900 // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
		cuStreamCaptureInvalidated = 901 // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
	)
	// Without a runtime, the core serves the driver's calls through the driver.
	for _, runtime := range []string{"dynamic", ""} {
		out, _ := runScriptWith(t, drvops(t, runtime), 64<<20, nil,
			"a", "1M", "S", "b", "1M", "B", "0", "F", "0", "c", "M", "4K", "C")
		t.Logf("runtime %q", runtime)
		checkSteps(t, out, []step{
			{"a", 0, cuSuccess}, {"S", 0, cuSuccess},
			{"b", 0, cuInvalidHandle}, {"B", 0, cuInvalidHandle}, {"F", 0, cuSuccess},
			{"c", 0, cuSuccess}, {"M", 0, cuStreamCaptureUnsupported}, {"C", 0, cuStreamCaptureInvalidated},
		})
	}
}

// TestDriverMemGetInfoNull: cuMemGetInfo_v2 with null outputs gets CUDA's
// CUDA_ERROR_INVALID_VALUE under a quota, as cudaMemGetInfo does, rather
// than a success that wrote nothing.
func TestDriverMemGetInfoNull(t *testing.T) {
	const cuInvalidValue = 1
	for _, runtime := range []string{"dynamic", ""} {
		out, _ := runScriptWith(t, drvops(t, runtime), 64<<20, nil, "m", "1M", "j", "i")
		t.Logf("runtime %q", runtime)
		checkSteps(t, out, []step{{"m", 0, cuSuccess}, {"j", 0, cuInvalidValue}, {"i", 0, cuSuccess}})
	}
}

// TestDriverInvalidAllocationsGetCUDAsAnswer: a driver allocation CUDA
// refuses for its arguments gets CUDA_ERROR_INVALID_VALUE under a quota, as
// without Spillway, rather than a success from the pool: cuMemAlloc_v2 of
// zero bytes, and cuMemAllocPitch_v2 with an element size other than 4, 8
// or 16 bytes. A valid element size is still served.
func TestDriverInvalidAllocationsGetCUDAsAnswer(t *testing.T) {
	const cuInvalidValue = 1
	for _, runtime := range []string{"dynamic", ""} {
		out, _ := runScriptWith(t, drvops(t, runtime), 64<<20, nil,
			"m", "0", "P", "1K", "16", "3", "P", "1K", "16", "0", "P", "1K", "16", "32", "P", "1K", "16", "8")
		t.Logf("runtime %q", runtime)
		checkSteps(t, out, []step{
			{"m", 0, cuInvalidValue},
			{"P", 0, cuInvalidValue}, {"P", 1, cuInvalidValue}, {"P", 2, cuInvalidValue},
			{"P", 3, cuSuccess},
		})
	}
}

// TestPooledAddressRange: the address range of a pointer into a block the
// pool served (cuMemGetAddressRange_v2, and CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
// and RANGE_SIZE of cuPointerGetAttribute and cuPointerGetAttributes) is the
// block's, as CUDA reports a cuMemAlloc's, not the pool's segment or granule
// the block was cut from: start at the pointer the allocation returned, size
// the request rounded up to 512 bytes. A pointer into pool memory that no
// live block holds is answered as CUDA answers freed memory. Outputs CUDA
// lets a program leave NULL (the base or the size of
// cuMemGetAddressRange_v2, an entry of cuPointerGetAttributes' data) are
// left alone, and cuPointerGetAttribute into NULL is CUDA's error. Neither
// a block nor freed pool memory can be shared (cuIpcGetMemHandle,
// IS_LEGACY_CUDA_IPC_CAPABLE) or has a handle of its own
// (cuMemRetainAllocationHandle). A pointer outside the pool, asked before
// the first allocation as after, gets CUDA's answer. Checked with fixed
// segments, with virtual memory, for a block partly spilled to host
// granules and for one spilled whole (managed memory of its own).
func TestPooledAddressRange(t *testing.T) {
	const cuNotFound, cuInvalidValue = 500, 1
	prog := drvops(t, "")
	type query struct {
		slot, offset string
		size         int64 // 0: no live block
	}
	for _, tc := range []struct {
		name    string
		env     []string
		ops     []string
		queries []query
	}{
		{"segments", []string{"SPILLWAY_MEMORY_LIMIT=256MiB", "SPILLWAY_VMM=0"},
			[]string{"m", "1000", "m", "5000", "m", "48M", "m", "4K", "f", "3"},
			[]query{{"0", "0", 1024}, {"0", "999", 1024}, {"1", "100", 5120}, {"2", "40M", 48 << 20},
				{"3", "0", 0}}},
		{"virtual", []string{"SPILLWAY_MEMORY_LIMIT=256MiB"},
			[]string{"m", "1000", "m", "5000", "m", "48M", "m", "4K", "f", "3"},
			[]query{{"0", "0", 1024}, {"0", "999", 1024}, {"1", "100", 5120}, {"2", "40M", 48 << 20},
				{"3", "0", 0}}},
		{"spilled", []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_OVERSUBSCRIBE=1"},
			[]string{"m", "60M", "m", "16M"},
			[]query{{"0", "1M", 60 << 20}, {"1", "15M", 16 << 20}}},
		{"spilled whole", []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_VMM=0"},
			[]string{"m", "60M", "m", "16M"},
			[]query{{"0", "1M", 60 << 20}, {"1", "15M", 16 << 20}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"w"}, tc.ops...)
			for _, q := range tc.queries {
				args = append(args, "q", q.slot, q.offset, "u", q.slot, q.offset, "o", q.slot, q.offset, "k", q.slot, q.offset)
			}
			res, out := harness.RunOK(t, harness.Shimmed(t, tc.env, prog, append(args, "w")...))
			if strings.Contains(res.Stderr, "internal error") {
				t.Errorf("the range queries logged an internal error:\n%s", res.Stderr)
			}
			for i := range 2 {
				if w, want := out.Line(t, "w", i), []string{"w", "500", "1", "1"}; !slices.Equal(w, want) {
					t.Errorf("cuMemGetAddressRange_v2, RANGE_SIZE and IS_LEGACY_CUDA_IPC_CAPABLE of a stack address "+
						"(%s): %v, want %v, CUDA's answers for memory it does not know", []string{"before any allocation", "at the end"}[i], w, want)
				}
			}
			for i := 0; i < out.Count("m"); i++ {
				if rc := out.Code(t, "m", i); rc != cuSuccess {
					t.Fatalf("cuMemAlloc_v2 #%d: %d\n%v", i, rc, out)
				}
			}
			for i, q := range tc.queries {
				where := "slot " + q.slot + " + " + q.offset
				rc, base, size := out.Code(t, "q", i), int64(out.Num(t, "q", i, 2)), int64(out.Num(t, "q", i, 3))
				u := out.Line(t, "u", i)
				if k, want := out.Line(t, "k", i), []string{"k", "1", "0", "0", "0", "0", "1"}; !slices.Equal(k, want) {
					t.Errorf("cuIpcGetMemHandle, IS_LEGACY_CUDA_IPC_CAPABLE (cuPointerGetAttribute, then "+
						"cuPointerGetAttributes) and cuMemRetainAllocationHandle of %s: %v, want %v", where, k, want)
				}
				o := out.Line(t, "o", i)
				if q.size == 0 {
					if got, want := []string{o[1], o[3], o[5], o[6], o[7], o[8]}, []string{"500", "500", "1", "1", "0", "0"}; !slices.Equal(got, want) {
						t.Errorf("range queries of freed %s with NULL outputs: %v, want rc %v", where, o, want)
					}
					if rc != cuNotFound {
						t.Errorf("cuMemGetAddressRange_v2 of freed %s: %d, want CUDA_ERROR_NOT_FOUND", where, rc)
					}
					if rc := out.Code(t, "u", i); rc != cuInvalidValue {
						t.Errorf("cuPointerGetAttribute of freed %s: %d, want CUDA_ERROR_INVALID_VALUE", where, rc)
					}
					if rcs, sizes := out.Num(t, "u", i, 4), out.Num(t, "u", i, 6); rcs != 0 || sizes != 0 {
						t.Errorf("cuPointerGetAttributes of freed %s: rc %d size %d, want 0 and 0 (unknown memory)", where, rcs, sizes)
					}
					continue
				}
				if rc != cuSuccess || base != 0 || size != q.size {
					t.Errorf("cuMemGetAddressRange_v2 of %s: rc %d base %+d size %d (base from the slot's address), want 0 +0 %d", where, rc, base, size, q.size)
				}
				want := []string{"u", "0", "0", fmt.Sprint(q.size), "0", "0", fmt.Sprint(q.size)}
				if !slices.Equal(u, want) {
					t.Errorf("range attributes of %s: %v, want %v (cuPointerGetAttribute, then cuPointerGetAttributes)", where, u, want)
				}
				want = []string{"o", "0", fmt.Sprint(q.size), "0", "0", "1", "1", "0", fmt.Sprint(q.size)}
				if !slices.Equal(o, want) {
					t.Errorf("range queries of %s with NULL outputs: %v, want %v (cuMemGetAddressRange_v2 without "+
						"the base, then without the size; cuPointerGetAttribute into NULL of RANGE_START_ADDR and "+
						"IS_LEGACY_CUDA_IPC_CAPABLE; cuPointerGetAttributes with only RANGE_SIZE's data)", where, o, want)
				}
			}
		})
	}
}

// TestEveryInvalidSettingLogged: the core logs every invalid setting at
// once, a line each in name order, each with what allocations answer, and
// refuses every allocation as for one.
func TestEveryInvalidSettingLogged(t *testing.T) {
	res, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_SPILL=disk", "SPILLWAY_POOL=yes", "SPILLWAY_MEMORY_LIMIT=8gigs"},
		drvops(t, ""), "m", "1M"))
	if rc := out.Code(t, "m", 0); rc != cuErrorNotInitialized {
		t.Errorf("cuMemAlloc_v2 answered %d, want CUDA_ERROR_NOT_INITIALIZED (%d)", rc, cuErrorNotInitialized)
	}
	names := []string{"SPILLWAY_MEMORY_LIMIT", "SPILLWAY_POOL", "SPILLWAY_SPILL"}
	lines := nonEmptyLines(res.Stderr)
	if len(lines) != len(names) {
		t.Fatalf("stderr %q: want %d lines, one for each invalid setting", res.Stderr, len(names))
	}
	for i, l := range lines {
		if !strings.Contains(l, `invalid `+names[i]+`=\"`) || !strings.Contains(l, "will fail with CUDA_ERROR_NOT_INITIALIZED until it is fixed") {
			t.Errorf("line %d %q: want the error of %s and what allocations answer", i, l, names[i])
		}
	}
}

// TestInvalidSettingNamesTheDriversError: an invalid setting's line says
// what the program's allocations will answer in the API it uses:
// CUDA_ERROR_NOT_INITIALIZED in a process with the driver alone, where
// cudaErrorInitializationError would name an error it never sees; both, in
// a process with the runtime, whose driver calls answer the driver's.
func TestInvalidSettingNamesTheDriversError(t *testing.T) {
	for _, tc := range []struct{ runtime, says, never string }{
		{"", "will fail with CUDA_ERROR_NOT_INITIALIZED until", "cudaError"},
		{"dynamic", "will fail with cudaErrorInitializationError (CUDA_ERROR_NOT_INITIALIZED from the driver's functions) until", ""},
	} {
		for name, env := range map[string][]string{
			"process":  {"SPILLWAY_MEMORY_LIMIT=8gigs"},
			"device 0": {"SIMCUDA_DEVICES=1x16GiB", "SPILLWAY_MEMORY_LIMIT=0.0000000001%"},
		} {
			res, out := harness.RunOK(t, harness.Shimmed(t, env, drvops(t, tc.runtime), "m", "1M"))
			if rc := out.Code(t, "m", 0); rc != cuErrorNotInitialized {
				t.Errorf("runtime=%q, %s: cuMemAlloc_v2 answered %d, want CUDA_ERROR_NOT_INITIALIZED (%d)", tc.runtime, name, rc, cuErrorNotInitialized)
			}
			if !strings.Contains(res.Stderr, tc.says) || tc.never != "" && strings.Contains(res.Stderr, tc.never) {
				t.Errorf("runtime=%q, %s: stderr %q: want %q and no %q", tc.runtime, name, res.Stderr, tc.says, tc.never)
			}
		}
	}
}

// TestDeviceErrorReachesDriverCaller: an error of the device's that the
// pool meets in a call it makes for the application (here its reservation,
// failing as every call does after a kernel's illegal address) reaches a
// driver-API caller as the driver gave it, not as CUDA_ERROR_UNKNOWN: with
// no runtime, with the runtime serving the pool, and with virtual memory.
func TestDeviceErrorReachesDriverCaller(t *testing.T) {
	for _, tc := range []struct {
		name, runtime, fail string
		vmm                 bool
		want                int
		says                string
	}{
		{"driver", "", "cuMemAlloc_v2:1=700", false, cuErrorIllegalAddress, "cudaErrorIllegalAddress (700)"},
		{"runtime", "dynamic", "cudaMalloc:1=700", false, cuErrorIllegalAddress, "cudaErrorIllegalAddress (700)"},
		{"virtual memory", "", "cuMemCreate:1=719", true, cuErrorLaunchFailed, "cudaErrorLaunchFailure (719)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := []string{"SIMCUDA_FAIL=" + tc.fail, "SPILLWAY_LOG_LEVEL=debug"}
			if !tc.vmm {
				env = append(env, "SPILLWAY_VMM=0")
			}
			res, out := harness.RunOK(t, harness.Shimmed(t, env, drvops(t, tc.runtime), "m", "1M", "m", "1M"))
			if rc := out.Code(t, "m", 0); rc != tc.want {
				t.Errorf("cuMemAlloc_v2 answered %d, want %d\nstderr:\n%s", rc, tc.want, res.Stderr)
			}
			if rc := out.Code(t, "m", 1); rc != 0 {
				t.Errorf("the next cuMemAlloc_v2 answered %d, want CUDA_SUCCESS (the fault was one call's)", rc)
			}
			if !strings.Contains(res.Stderr, tc.says) {
				t.Errorf("stderr does not name the error as %q:\n%s", tc.says, res.Stderr)
			}
		})
	}
}
