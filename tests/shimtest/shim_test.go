// Package shimtest runs C programs (and Python) under the shim, through the
// real dynamic linker, against simcuda, and checks what they observe: the
// quota, cudaMemGetInfo, per-device limits, configuration errors, fork and
// exec, RTLD_LOCAL runtimes, constructors, the spillway command, and the
// shim's exported symbols. The benchmarks measure the interposition cost.
// It holds no code that other packages use.
package shimtest

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// errSymbolNotFound is cudaErrorSymbolNotFound, which the front returns
// when no CUDA runtime is loaded.
const errSymbolNotFound = 500

func cudaops(t testing.TB, flags ...string) string {
	return harness.Compile(t, harness.CBuild{Sources: []string{"testdata/cudaops.c"}, Cudart: true,
		ProjectHeaders: true, Flags: flags})
}

func nonEmptyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

func dynamicSymbols(t *testing.T, lib string) []string {
	t.Helper()
	out, err := exec.Command("nm", "-D", "--defined-only", lib).Output()
	if err != nil {
		t.Fatalf("nm -D %s: %v", lib, err)
	}
	var names []string
	for _, l := range nonEmptyLines(string(out)) {
		f := strings.Fields(l)
		names = append(names, f[len(f)-1])
	}
	sort.Strings(names)
	return names
}

// Every probe point starts with a 5-byte NOP, which the kernel emulates
// under a uprobe instead of single-stepping the instruction out of line.
func TestProbePointsStartWithNOP(t *testing.T) {
	f, err := elf.Open(harness.Front(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	nop := []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}
	found := 0
	for _, s := range syms {
		if !strings.HasPrefix(s.Name, "spillway_probe_") || elf.ST_TYPE(s.Info) != elf.STT_FUNC {
			continue
		}
		found++
		text := f.Section(".text")
		if text == nil || s.Value < text.Addr || s.Value+uint64(len(nop)) > text.Addr+text.Size {
			t.Fatalf("%s at %#x is not in .text", s.Name, s.Value)
		}
		code := make([]byte, len(nop))
		if _, err := text.ReadAt(code, int64(s.Value-text.Addr)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(code, nop) {
			t.Errorf("%s starts with % x, want the 5-byte NOP % x", s.Name, code, nop)
		}
	}
	if found != 6 {
		t.Errorf("found %d probe points, want 6", found)
	}
}

func TestExportSurface(t *testing.T) {
	want := []string{
		"cuArray3DCreate_v2", "cuArrayCreate_v2", "cuArrayDestroy",
		"cuCtxAttach", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4", "cuCtxDestroy_v2", "cuCtxDetach",
		"cuCtxSynchronize", "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", "cuDeviceTotalMem_v2",
		"cuGetProcAddress", "cuGetProcAddress_v2", "cuGraphDestroy", "cuGraphExecDestroy",
		"cuGraphInstantiateWithFlags", "cuIpcGetMemHandle", "cuMemAllocAsync", "cuMemAllocAsync_ptsz",
		"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
		"cuMemAllocManaged", "cuMemAllocPitch_v2", "cuMemAlloc_v2", "cuMemCreate", "cuMemFreeAsync",
		"cuMemFreeAsync_ptsz", "cuMemFree_v2", "cuMemGetAddressRange_v2", "cuMemGetInfo_v2",
		"cuMemImportFromShareableHandle",
		"cuMemMap", "cuMemPoolCreate", "cuMemPoolDestroy", "cuMemPoolGetAttribute",
		"cuMemPoolSetAttribute", "cuMemPoolTrimTo", "cuMemRelease", "cuMemRetainAllocationHandle", "cuMemSetAccess", "cuMemUnmap",
		"cuMipmappedArrayCreate", "cuMipmappedArrayDestroy", "cuPointerGetAttribute", "cuPointerGetAttributes",
		"cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz", "cuStreamDestroy_v2",
		"cuStreamEndCapture", "cuStreamEndCapture_ptsz",
		"cudaDeviceReset", "cudaDeviceSynchronize", "cudaFree", "cudaFreeArray", "cudaFreeAsync",
		"cudaFreeMipmappedArray",
		"cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion", "cudaGraphDestroy",
		"cudaGraphExecDestroy", "cudaGraphInstantiate", "cudaGraphInstantiateWithFlags", "cudaMalloc",
		"cudaMalloc3DArray", "cudaMallocArray", "cudaMallocAsync", "cudaMallocFromPoolAsync", "cudaMallocManaged",
		"cudaMallocMipmappedArray", "cudaMallocPitch", "cudaMemGetInfo",
		"cudaMemPoolCreate", "cudaMemPoolDestroy", "cudaMemPoolGetAttribute", "cudaMemPoolSetAttribute",
		"cudaMemPoolTrimTo",
		"cudaStreamBeginCapture", "cudaStreamDestroy", "cudaStreamEndCapture", "dlclose", "dlsym",
		"nvmlDeviceGetBAR1MemoryInfo", "nvmlDeviceGetComputeRunningProcesses",
		"nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3",
		"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
		"spillway_probe_alloc", "spillway_probe_free", "spillway_probe_promote",
		"spillway_probe_refuse", "spillway_probe_semaphore", "spillway_probe_spill", "spillway_probe_sync",
	}
	if got := dynamicSymbols(t, harness.Front(t)); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("libspillway.so exports %v\nwant exactly %v", got, want)
	}
	core := dynamicSymbols(t, filepath.Join(harness.LibDir(t), "libspillway-core.so"))
	if len(core) == 0 {
		t.Fatal("the core exports nothing")
	}
	for _, name := range core {
		if !strings.HasPrefix(name, "spillway_core_") {
			t.Errorf("the core exports %q; only spillway_core_* may be exported", name)
		}
	}
}

// The core must never take the host's signals: os/signal would.
func TestCoreDoesNotImportSignal(t *testing.T) {
	// go test puts the go command of the toolchain running it first on PATH.
	cmd := exec.Command("go", "list", "-deps", "./shim/core")
	cmd.Dir = harness.Root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/spillway-gpu/spillway/interpose") {
		t.Fatalf("go list -deps returned %d packages without interpose: not the core's dependencies", len(deps))
	}
	if slices.Contains(deps, "os/signal") {
		t.Error("the core depends on os/signal")
	}
}

// TestEventCallsDoNotLoadTheCore: a call interposed only to tell a running
// core of an event (here cudaDeviceSynchronize) passes through without
// loading it; the first allocation does.
func TestEventCallsDoNotLoadTheCore(t *testing.T) {
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, cudaops(t), "s", "L", "m", "4K", "L"))
	if out.Code(t, "s", 0) != 0 || out.Code(t, "L", 0) != 0 {
		t.Errorf("cudaDeviceSynchronize before any allocation loaded the core: %v", out)
	}
	if out.Code(t, "m", 0) != 0 || out.Code(t, "L", 1) != 1 {
		t.Errorf("the first allocation did not load the core: %v", out)
	}
}

func TestProgramWithoutCUDAUnaffected(t *testing.T) {
	// Even an invalid quota must not disturb a program that never calls CUDA.
	bad := "SPILLWAY_MEMORY_LIMIT=lots"
	res := harness.Run(t, harness.Shimmed(t, []string{bad}, "/bin/true"))
	if res.ExitCode != 0 || res.Stderr != "" {
		t.Errorf("/bin/true under the shim: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	res, out := harness.RunOK(t, harness.Shimmed(t, []string{bad}, cudaops(t), "L", "T"))
	if out.Code(t, "L", 0) != 0 {
		t.Error("the Go core was loaded although no CUDA call was made")
	}
	if n := out.Code(t, "T", 0); n != 1 {
		t.Errorf("a program without CUDA calls has %d threads under the shim, want 1", n)
	}
	if res.Stderr != "" {
		t.Errorf("stderr: %q", res.Stderr)
	}
}

func TestTimeoutUnderShim(t *testing.T) {
	// GNU timeout breaks when a preloaded runtime leaves SIGCHLD unblocked in
	// its threads: it then waits the full second and returns 124.
	res := harness.Run(t, harness.Shimmed(t, nil, "timeout", "1", "/bin/true"))
	if res.ExitCode != 0 {
		t.Errorf("timeout 1 /bin/true under the shim returned %d, want 0; stderr %q", res.ExitCode, res.Stderr)
	}
}

func TestQuotaRefusal(t *testing.T) {
	res, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, cudaops(t),
		"m", "512K", "m", "512K", "m", "1", "f", "0", "m", "256K", "m", "512K", "L"))
	for i, want := range []int{0, 0, harness.ErrMemoryAllocation, 0, harness.ErrMemoryAllocation} {
		if got := out.Code(t, "m", i); got != want {
			t.Errorf("allocation %d returned %d, want %d", i, got, want)
		}
	}
	if out.Code(t, "f", 0) != 0 || out.Code(t, "L", 0) != 1 {
		t.Errorf("output %v", out)
	}
	warn := nonEmptyLines(res.Stderr)
	if len(warn) == 0 {
		t.Fatal("no warning for a refused allocation")
	}
	for _, want := range []string{"spillway:", "refused", "requested=1 ", "used=1048576", "quota=1048576", "device=0"} {
		if !strings.Contains(warn[0], want) {
			t.Errorf("warning %q lacks %q", warn[0], want)
		}
	}
}

func TestOtherAllocationKinds(t *testing.T) {
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, cudaops(t),
		"M", "768K", "m", "512K", // managed memory counts against the quota
		"f", "0", "a", "768K", "m", "512K", "F", "1",
		"p", "1000", "300", // padded rows: the pitch decides what is held
		"r", "m", "1M"))
	if out.Code(t, "M", 0) != 0 || out.Code(t, "m", 0) != harness.ErrMemoryAllocation {
		t.Errorf("managed memory not counted: %v", out)
	}
	if out.Code(t, "a", 0) != 0 || out.Code(t, "m", 1) != harness.ErrMemoryAllocation || out.Code(t, "F", 0) != 0 {
		t.Errorf("cudaMallocAsync not counted: %v", out)
	}
	if out.Code(t, "p", 0) != 0 || out.Num(t, "p", 0, 3) < 1000 {
		t.Errorf("cudaMallocPitch: %v", out)
	}
	// cudaDeviceReset destroys every allocation, and the quota follows.
	if out.Code(t, "r", 0) != 0 || out.Code(t, "m", 2) != 0 {
		t.Errorf("after cudaDeviceReset the full quota must be available again: %v", out)
	}
}

// Registered host memory is page-locked host memory, not device memory: with
// a quota, registering more than the quota (and than the device has) is
// neither refused nor counted, and the whole quota stays allocatable.
func TestHostRegisterOutsideQuota(t *testing.T) {
	stats := filepath.Join(t.TempDir(), "stats.json")
	_, out := harness.RunOK(t, harness.Shimmed(t,
		[]string{"SIMCUDA_DEVICES=1GiB", "SPILLWAY_MEMORY_LIMIT=64MiB", "SIMCUDA_STATS_FILE=" + stats},
		cudaops(t), "h", "2G", "i", "m", "64M", "f", "1", "u", "0", "u", "0", "h", "1G"))
	if out.Code(t, "h", 0) != 0 || out.Code(t, "h", 1) != 0 {
		t.Fatalf("cudaHostRegister under a quota refused: %v", out)
	}
	if f, tot := out.Num(t, "i", 0, 2), out.Num(t, "i", 0, 3); f != 64<<20 || tot != 64<<20 {
		t.Errorf("after registering 2 GiB cudaMemGetInfo = free %d total %d, want the whole 64 MiB quota free", f, tot)
	}
	if out.Code(t, "m", 0) != 0 || out.Code(t, "f", 0) != 0 {
		t.Errorf("the quota is not whole beside registered memory: %v", out)
	}
	if out.Code(t, "u", 0) != 0 || out.Code(t, "u", 1) != harness.ErrHostMemoryNotRegistered {
		t.Errorf("cudaHostUnregister, then again: %v, want 0 then %d", out, harness.ErrHostMemoryNotRegistered)
	}
	truth := harness.ReadStats(t, stats).Devices[0]
	if truth.HostRegisteredBytes != 1<<30 || truth.DeviceBytesPeak > 64<<20 {
		t.Errorf("simcuda holds %d registered bytes at exit and held %d device bytes at its peak, "+
			"want 1 GiB and at most the 64 MiB quota", truth.HostRegisteredBytes, truth.DeviceBytesPeak)
	}
}

func TestPitchPaddingCounts(t *testing.T) {
	// Without the shim, learn the pitch simcuda picks for 1000-byte rows.
	_, plain := harness.RunOK(t, harness.Command(t, cudaops(t), "p", "1000", "1"))
	pitch := plain.Num(t, "p", 0, 3)
	if pitch <= 1000 {
		t.Fatalf("simcuda does not pad 1000-byte rows (pitch %d): the test needs a padded pitch", pitch)
	}
	rows := 1000
	quota := pitch*uint64(rows) - 1 // fits the unpadded size, not the padded one
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{fmt.Sprintf("SPILLWAY_MEMORY_LIMIT=%d", quota)}, cudaops(t),
		"p", "1000", strconv.Itoa(rows), "i"))
	if out.Code(t, "p", 0) != harness.ErrMemoryAllocation {
		t.Errorf("a pitched allocation of %d bytes under a quota of %d: %v", pitch*uint64(rows), quota, out)
	}
	if free := out.Num(t, "i", 0, 2); free != quota {
		t.Errorf("a refused pitched allocation left %d of %d free", free, quota)
	}
}

// TestPitchedAllocationsAsCUDA: cudaMallocPitch and cuMemAllocPitch_v2
// under a quota answer as CUDA does without the shim: the pitch it picks
// for a served allocation, and its own errors for rows of no bytes or of
// so many that padding them to a pitch overflows, in the primary context
// and in a created one (whose quota takes the widest pitch CUDA may pick).
func TestPitchedAllocationsAsCUDA(t *testing.T) {
	const widest, nearly = "18446744073709551615", "18446744073709551105" // 2^64-1, 2^64-511
	env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}
	for _, prog := range []struct {
		path string
		ops  []string
	}{
		{cudaops(t), []string{"p", "0", "10", "p", nearly, "1", "p", widest, "3", "p", "1000", "2"}},
		{drvops(t, ""), []string{"P", "0", "10", "4", "P", nearly, "1", "4", "P", widest, "3", "4", "P", "1000", "2", "4"}},
		{ctxvmm(t, true), []string{"C", "p", "0", "10", "p", nearly, "1", "p", "1000", "2", // in a created context
			"W", "0", "10", "W", nearly, "1", "W", widest, "3", "W", "1000", "2"}},
	} {
		_, plain := harness.RunOK(t, harness.Command(t, prog.path, prog.ops...))
		_, shimmed := harness.RunOK(t, harness.Shimmed(t, env, prog.path, prog.ops...))
		if !slices.EqualFunc(plain, shimmed, slices.Equal) {
			t.Errorf("%s %v: %v under the shim, want CUDA's %v", filepath.Base(prog.path), prog.ops, shimmed, plain)
		}
	}
}

// TestMalloc3DCounts: cudaMalloc3D, which the shim does not interpose,
// counts against the quota through the driver allocation the runtime makes
// for it: refused beyond it, given back by cudaFree.
func TestMalloc3DCounts(t *testing.T) {
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, cudaops(t),
		"D", "1M", "20", "2", "D", "1M", "20", "2", "f", "0", "D", "1M", "20", "2", "i"))
	for i, want := range []int{0, harness.ErrMemoryAllocation, 0} {
		if rc := out.Code(t, "D", i); rc != want {
			t.Errorf("cudaMalloc3D #%d of 40 MiB under a 64 MiB quota: %d, want %d\n%v", i, rc, want, out)
		}
	}
	if pitch := out.Num(t, "D", 0, 3); pitch < 1<<20 {
		t.Errorf("pitch %d for rows of 1 MiB", pitch)
	}
	if free := out.Num(t, "i", 0, 2); free > 24<<20 {
		t.Errorf("cudaMemGetInfo reports %d bytes free beside a 40 MiB cudaMalloc3D under a 64 MiB quota", free)
	}
}

// TestFreeNullReachesCUDA: a free of the null pointer gets CUDA's own
// answer, not the shim's. cudaFree(NULL) is how programs initialise CUDA
// and check that it works: it must initialise the runtime (simcuda counts
// the call and the primary context's retain) and, with no device, fail
// with cudaErrorNoDevice as it does without the shim. The driver's frees of
// 0 answer what the driver answers.
func TestFreeNullReachesCUDA(t *testing.T) {
	const errNoDevice = 100
	env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "CUDA_VISIBLE_DEVICES=-1"}
	_, out := harness.RunOK(t, harness.Shimmed(t, env, cudaops(t), "n", "N"))
	checkSteps(t, out, []step{{"n", 0, errNoDevice}, {"N", 0, errNoDevice}})

	stats := filepath.Join(t.TempDir(), "stats.json")
	env = []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SIMCUDA_STATS_FILE=" + stats}
	_, out = harness.RunOK(t, harness.Shimmed(t, env, cudaops(t), "n"))
	checkSteps(t, out, []step{{"n", 0, 0}})
	calls := harness.ReadStats(t, stats).Calls
	if calls["cudaFree"] != 1 || calls["cuDevicePrimaryCtxRetain"] == 0 {
		t.Errorf("cudaFree(NULL) under the shim: simcuda saw %d cudaFree and %d cuDevicePrimaryCtxRetain calls, want 1 and at least 1",
			calls["cudaFree"], calls["cuDevicePrimaryCtxRetain"])
	}

	drv := drvops(t, "")
	_, plain := harness.RunOK(t, harness.Command(t, drv, "z", "Z"))
	_, shimmed := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, drv, "z", "Z"))
	for _, op := range []string{"z", "Z"} {
		if got, want := shimmed.Code(t, op, 0), plain.Code(t, op, 0); got != want {
			t.Errorf("%s: %d under the shim, %d without it", op, got, want)
		}
	}
}

func TestMemGetInfo(t *testing.T) {
	dev := "SIMCUDA_DEVICES=1GiB"
	prog := cudaops(t)
	plainCmd := harness.Command(t, prog, "i")
	harness.SetEnv(plainCmd, dev)
	_, plain := harness.RunOK(t, plainCmd)
	realFree, realTotal := plain.Num(t, "i", 0, 2), plain.Num(t, "i", 0, 3)
	if realTotal != 1<<30 || realFree <= 0 || realFree > realTotal {
		t.Fatalf("simcuda reports free %d of %d", realFree, realTotal)
	}

	_, noQuota := harness.RunOK(t, harness.Shimmed(t, []string{dev}, prog, "i"))
	if noQuota.Num(t, "i", 0, 2) != realFree || noQuota.Num(t, "i", 0, 3) != realTotal {
		t.Errorf("without a quota the real values must pass: %v vs %v", noQuota, plain)
	}

	_, q := harness.RunOK(t, harness.Shimmed(t, []string{dev, "SPILLWAY_MEMORY_LIMIT=256MiB"}, prog, "i", "m", "64M", "i", "f", "0", "i"))
	for i, wantFree := range []uint64{256 << 20, 192 << 20, 256 << 20} {
		if f, tot := q.Num(t, "i", i, 2), q.Num(t, "i", i, 3); f != wantFree || tot != 256<<20 {
			t.Errorf("cudaMemGetInfo #%d = free %d total %d, want %d and %d", i, f, tot, wantFree, 256<<20)
		}
	}

	// A quota above what the device has free reports the real free memory.
	_, big := harness.RunOK(t, harness.Shimmed(t, []string{dev, "SPILLWAY_MEMORY_LIMIT=4GiB"}, prog, "i"))
	if f, tot := big.Num(t, "i", 0, 2), big.Num(t, "i", 0, 3); f != realFree || tot != 4<<30 {
		t.Errorf("quota above the device: free %d total %d, want %d and %d", f, tot, realFree, 4<<30)
	}

	// A percentage is of the device's real total.
	_, pct := harness.RunOK(t, harness.Shimmed(t, []string{dev, "SPILLWAY_MEMORY_LIMIT=25%"}, prog, "i", "m", "200M", "m", "100M"))
	if tot := pct.Num(t, "i", 0, 3); tot != 256<<20 {
		t.Errorf("25%% of 1GiB reported as total %d", tot)
	}
	if pct.Code(t, "m", 0) != 0 || pct.Code(t, "m", 1) != harness.ErrMemoryAllocation {
		t.Errorf("25%% quota: %v", pct)
	}
}

func TestPerDeviceQuotas(t *testing.T) {
	env := []string{"SIMCUDA_DEVICES=2x1GiB", "SPILLWAY_MEMORY_LIMIT=100MiB", "SPILLWAY_MEMORY_LIMIT_1=200MiB"}
	_, out := harness.RunOK(t, harness.Shimmed(t, env, cudaops(t),
		"d", "0", "m", "150M", "m", "60M", "i",
		"d", "1", "m", "150M", "i", "m", "60M",
		"d", "0", "m", "60M"))
	want := []int{harness.ErrMemoryAllocation, 0, 0, harness.ErrMemoryAllocation, harness.ErrMemoryAllocation}
	for i, w := range want {
		if got := out.Code(t, "m", i); got != w {
			t.Errorf("allocation %d returned %d, want %d (%v)", i, got, w, out)
		}
	}
	if tot0, tot1 := out.Num(t, "i", 0, 3), out.Num(t, "i", 1, 3); tot0 != 100<<20 || tot1 != 200<<20 {
		t.Errorf("per-device totals %d and %d, want %d and %d", tot0, tot1, 100<<20, 200<<20)
	}
	if f1 := out.Num(t, "i", 1, 2); f1 != 50<<20 {
		t.Errorf("device 1 free %d, want %d", f1, 50<<20)
	}
}

func TestConstructorCallsCUDA(t *testing.T) {
	lib := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ctorlib.c"}, Shared: true,
		Cudart: true, ProjectHeaders: true})
	prog := cudaops(t, "-Wl,--no-as-needed", lib, "-Wl,-rpath,"+filepath.Dir(lib))
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, prog, "m", "768K", "m", "256K", "L"))
	if out.Code(t, "ctor", 0) != 0 {
		t.Fatalf("cudaMalloc in a constructor: %v", out)
	}
	// The constructor's 512 KiB is held: 768 KiB more does not fit, 256 KiB does.
	if out.Code(t, "m", 0) != harness.ErrMemoryAllocation || out.Code(t, "m", 1) != 0 || out.Code(t, "L", 0) != 1 {
		t.Errorf("the constructor's allocation was not accounted: %v", out)
	}
}

// TestConstructorBlockFreed: the block a constructor allocated (the first
// interposed call, which loads the core) is known by its address, so
// freeing it gives its bytes back and the whole quota fits again.
func TestConstructorBlockFreed(t *testing.T) {
	lib := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ctorlib.c"}, Shared: true,
		Cudart: true, ProjectHeaders: true})
	prog := cudaops(t, "-Wl,--no-as-needed", lib, "-Wl,-rpath,"+filepath.Dir(lib))
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, prog, "c", "m", "1M"))
	if out.Code(t, "ctor", 0) != 0 || out.Code(t, "c", 0) != 0 {
		t.Fatalf("cudaMalloc in a constructor, then cudaFree of its block: %v", out)
	}
	if out.Code(t, "m", 0) != 0 {
		t.Errorf("the constructor's block, freed, still holds quota: %v", out)
	}
}

// TestEarlyBlockAdopted: an allocation made on the thread loading the core
// (a constructor run by the core's load) passes through, is kept in the
// front's early ledger and counted once the core starts; freeing it by its
// address gives its bytes back.
func TestEarlyBlockAdopted(t *testing.T) {
	core := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/eagercore.c"}, Shared: true,
		Cudart: true, ProjectHeaders: true,
		Flags: []string{"-Wl,--no-as-needed", filepath.Join(harness.LibDir(t), "libspillway-core.so"),
			"-Wl,-rpath," + harness.LibDir(t)}})
	env := []string{"SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_CORE=" + core}
	_, out := harness.RunOK(t, harness.Shimmed(t, env, cudaops(t), "m", "768K", "e", "m", "1M"))
	if out.Code(t, "eager", 0) != 0 || out.Code(t, "e", 0) != 0 {
		t.Fatalf("cudaMalloc while the core loads, then cudaFree of its block: %v", out)
	}
	// 512 KiB held by the early block: 768 KiB more does not fit; freed, 1 MiB does.
	if out.Code(t, "m", 0) != harness.ErrMemoryAllocation || out.Code(t, "m", 1) != 0 {
		t.Errorf("the early block was not counted, or not given back when freed: %v", out)
	}
}

func userLib(t testing.TB) string {
	return harness.Compile(t, harness.CBuild{Sources: []string{"testdata/user.c"}, Shared: true,
		Cudart: true, ProjectHeaders: true})
}

func TestRuntimeInLocalScope(t *testing.T) {
	lib := userLib(t)
	app := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/dlapp.c"}, Flags: []string{"-ldl"}})
	for name, cmd := range map[string]*exec.Cmd{
		"C":      harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, app, lib, "524288", "786432", "524288"),
		"ctypes": harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, "python3", "testdata/ctypes_local.py", lib, "524288", "786432", "524288"),
	} {
		t.Run(name, func(t *testing.T) {
			res, out := harness.RunOK(t, cmd)
			if out.Code(t, "global", 0) != 0 {
				t.Fatal("the runtime is in the global scope: this does not test RTLD_LOCAL")
			}
			for i, want := range []int{0, harness.ErrMemoryAllocation, 0} {
				if got := out.Code(t, "m", i); got != want {
					t.Errorf("allocation %d returned %d, want %d\nstderr: %s", i, got, want, res.Stderr)
				}
			}
		})
	}
}

func TestNoRuntimeLoaded(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/noruntime.c"}, Flags: []string{"-ldl"}})
	res, out := harness.RunOK(t, harness.Shimmed(t, nil, prog))
	if out.Code(t, "m", 0) != errSymbolNotFound {
		t.Errorf("cudaMalloc without a runtime returned %v, want %d", out, errSymbolNotFound)
	}
	if lines := nonEmptyLines(res.Stderr); len(lines) != 1 || !strings.Contains(lines[0], "no CUDA runtime") {
		t.Errorf("want one line saying no runtime is loaded, got %q", res.Stderr)
	}
}

// TestExitWithoutSignalStack: a program whose main thread had an alternate
// signal stack at its first CUDA call and removed it before exiting, as
// Python's faulthandler does at shutdown (numba's test suite enables it),
// exits cleanly under signals: the shim's work at exit runs Go on that
// thread, and Go's runtime aborts on a signal that lands there with no
// signal stack. The signals are timed by chance, so the program runs
// several times; each run crashed more often than not before the shim gave
// the thread a stack back.
func TestExitWithoutSignalStack(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/altstack.c"}, Cudart: true,
		ProjectHeaders: true})
	for run := 0; run < 10; run++ {
		_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, prog))
		if out.Code(t, "malloc", 0) != 0 || out.Code(t, "free", 0) != 0 {
			t.Fatalf("run %d: cudaMalloc and cudaFree of 1 MiB: %v, want both to succeed", run, out)
		}
	}
}

func TestManyThreads(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/threads.c"}, Cudart: true, ProjectHeaders: true})
	stats := filepath.Join(t.TempDir(), "stats.json")
	cmd := harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=4MiB", "SIMCUDA_STATS_FILE=" + stats, "SPILLWAY_REPORT=1"}, prog, "8", "3000")
	res, out := harness.RunOK(t, cmd)
	if out.Num(t, "refused", 0, 3) != 0 {
		t.Errorf("calls failed for reasons other than the quota: %v", out)
	}
	if out.Num(t, "refused", 0, 1) == 0 {
		t.Errorf("8 threads holding up to 8 blocks of up to 1 MiB never hit a 4 MiB quota: %v", out)
	}
	if f, tot := out.Num(t, "info", 0, 2), out.Num(t, "info", 0, 3); f != 4<<20 || tot != 4<<20 {
		t.Errorf("after every block was freed: free %d total %d, want the whole 4 MiB", f, tot)
	}
	// The pool keeps freed memory cached: at exit nothing is live, and what
	// simcuda still holds is exactly what the pool reserved.
	rep := reportOf(t, res.Stderr, 0)
	if rep["live"] != 0 || rep["peak_live"] == 0 {
		t.Errorf("the pool's report after every block was freed: %v", rep)
	}
	s := harness.ReadStats(t, stats)
	if len(s.Devices) == 0 || s.Devices[0].DeviceBytesPeak > 4<<20 || s.Devices[0].DeviceBytes != rep["reserved"] {
		t.Errorf("simcuda saw %+v, the pool reported %v: the quota was exceeded or blocks leaked", s.Devices, rep)
	}
}

func TestForkAfterCUDA(t *testing.T) {
	forker := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/forker.c"}, Cudart: true, ProjectHeaders: true})
	_, plain := harness.RunOK(t, harness.Command(t, forker, "call"))
	// The parent holds 1 MiB of a 1.5 MiB quota: a child that went through
	// the core (inheriting its accounting) would be refused; one that goes
	// straight to CUDA gets CUDA's own answer, as without the shim.
	res, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1536K", "SPILLWAY_LOG_LEVEL=debug"}, forker, "call"))
	if out.Code(t, "parent", 0) != 0 {
		t.Fatalf("parent: %v", out)
	}
	// A hang would show as SIGALRM from the child's watchdog.
	if l := out.Line(t, "child", 1); strings.Join(l, " ") != "child exit 0" {
		t.Fatalf("the forked child ended with %v", l)
	}
	for field, call := range map[int]string{1: "cudaMalloc", 2: "cudaFreeAsync"} {
		if got, want := out.Num(t, "child", 0, field), plain.Num(t, "child", 0, field); got != want {
			t.Errorf("the forked child's %s returned %d under the shim, %d without", call, got, want)
		}
	}
	// The core logs every call at debug level; only the child calls cudaFreeAsync.
	if strings.Contains(res.Stderr, "cudaFreeAsync") {
		t.Errorf("the forked child entered the core:\n%s", res.Stderr)
	}
	if out.Num(t, "parent", 1, 3) != 0 {
		t.Errorf("the parent's free after fork: %v", out)
	}

	// A child that execs starts afresh: the shim loads again and enforces the quota.
	_, ex := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=2MiB"}, forker, "exec", cudaops(t), "m", "3M", "L"))
	if ex.Code(t, "m", 0) != harness.ErrMemoryAllocation || ex.Code(t, "L", 0) != 1 {
		t.Errorf("exec'd child: %v", ex)
	}
	if l := ex.Line(t, "child", 0); strings.Join(l, " ") != "child exit 0" {
		t.Errorf("the exec'd child ended with %v", l)
	}
}

// TestForkDuringVirtualMemoryCall: a multi-threaded program forks while
// another thread is inside cuMemMap, which the front guards with a lock of
// its own in every mode. The forked child's cuMemMap and cuMemRelease must
// get CUDA's own answer, as without the shim, and never wait for that lock:
// with SPILLWAY_DISABLE=1 (pure pass-through), before anything loaded the
// core, and with the core running.
func TestForkDuringVirtualMemoryCall(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/forkheld.c"}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-I", filepath.Join(harness.Root(t), "tests", "simcuda"), "-lcuda"}})
	for _, run := range []struct {
		name string
		env  []string
		args []string
	}{
		{"disabled", []string{"SPILLWAY_DISABLE=1"}, []string{"create"}},
		{"core not loaded", nil, nil},
		{"core running", []string{"SPILLWAY_MEMORY_LIMIT=1GiB"}, []string{"create"}},
	} {
		t.Run(run.name, func(t *testing.T) {
			_, plain := harness.RunOK(t, harness.Command(t, prog, run.args...))
			_, out := harness.RunOK(t, harness.Shimmed(t, run.env, prog, run.args...))
			// A child waiting for the lock shows as SIGALRM from its watchdog.
			if l := out.Line(t, "child", 0); strings.Join(l, " ") != "child exit 0" {
				t.Fatalf("the child forked during cuMemMap ended with %v", l)
			}
			if got, want := strings.Join(out.Line(t, "forked", 0), " "), strings.Join(plain.Line(t, "forked", 0), " "); got != want {
				t.Errorf("the forked child printed %q under the shim, %q without", got, want)
			}
			if got, want := out.Num(t, "parent", 0, 2), plain.Num(t, "parent", 0, 2); got != want {
				t.Errorf("the parent's held cuMemMap returned %d under the shim, %d without", got, want)
			}
		})
	}
}

// TestFrontLocksTakenThroughFrontLock: the front takes each of its locks
// with front_lock (front_read_lock, front_write_lock for reset_lock), which
// registers the fork handler first, so that no lock
// can be held at a fork before a child would start it afresh. Most of the
// places that lock (a table of contexts or pools changing) hold no real
// call a test could keep a thread inside, so this reads the sources.
func TestFrontLocksTakenThroughFrontLock(t *testing.T) {
	sources, err := filepath.Glob(filepath.Join(harness.Root(t), "shim", "front", "*.c"))
	if err != nil || len(sources) == 0 {
		t.Fatalf("the front's sources: %v (found %d)", err, len(sources))
	}
	locking := regexp.MustCompile(`pthread_(mutex_(lock|trylock|timedlock)|rwlock_(rd|wr|tryrd|trywr|timedrd|timedwr|clockrd|clockwr)lock|spin_lock)\(`)
	// front_lock's, front_read_lock's and front_write_lock's own calls, after
	// they registered the handler.
	wrappers := map[string]bool{"pthread_mutex_lock(lock);": true, "pthread_rwlock_rdlock(lock);": true, "pthread_rwlock_wrlock(lock);": true}
	for _, path := range sources {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("reading the front's source: %v", err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			if wrappers[strings.TrimSpace(line)] && filepath.Base(path) == "front.c" {
				continue
			}
			if locking.MatchString(line) {
				t.Errorf("%s:%d takes a lock without front_lock: %s", filepath.Base(path), i+1, strings.TrimSpace(line))
			}
		}
	}
}

func TestBadConfiguration(t *testing.T) {
	prog := cudaops(t)
	for _, env := range []string{
		"SPILLWAY_MEMORY_LIMIT=8GiBs", "SPILLWAY_MEMORY_LIMIT=8gigs", "SPILLWAY_MEMORY_LIMIT=-1GiB",
		"SPILLWAY_MEMORY_LIMIT=0", "SPILLWAY_MEMORY_LIMIT=", "SPILLWAY_MEMORY_LIMIT=150%",
		"SPILLWAY_MEMORY_LIMIT=0%", "SPILLWAY_MEMORY_LIMIT=99999999999999999999",
		"SPILLWAY_MEMORY_LIMIT=1e9", "SPILLWAY_MEMORY_LIMIT_1=lots", "SPILLWAY_MEMORY_LIMIT_x=1GiB",
		"SPILLWAY_LOG_LEVEL=verbose", "SPILLWAY_LOG_FORMAT=xml", "SPILLWAY_DISABLE=yes",
		"SPILLWAY_LOG_FILE=/nonexistent-dir/spillway.log",
		"SPILLWAY_POOL=2", "SPILLWAY_POOL_RELEASE_THRESHOLD=101%", "SPILLWAY_POOL_RESERVE=0",
		"SPILLWAY_FREE_SYNC=yes", "SPILLWAY_REPORT=on", "SPILLWAY_OVERSUBSCRIBE=true", "SPILLWAY_SPILL=disk",
		"SPILLWAY_HOST_LIMIT=lots",
		// Percentages that are no byte of the device: refused, and said so.
		"SPILLWAY_MEMORY_LIMIT=0.0000000001%", "SPILLWAY_MEMORY_LIMIT_0=0.0000000001%",
	} {
		t.Run(env, func(t *testing.T) {
			res, out := harness.RunOK(t, harness.Shimmed(t, []string{env}, prog, "m", "4K", "M", "4K", "m", "4K", "n"))
			for i := 0; i < 2; i++ {
				if got := out.Code(t, "m", i); got != harness.ErrInitialization {
					t.Errorf("allocation %d returned %d, want %d (cudaErrorInitializationError)", i, got, harness.ErrInitialization)
				}
			}
			if out.Code(t, "M", 0) != harness.ErrInitialization {
				t.Errorf("managed allocation: %v", out)
			}
			name, value, _ := strings.Cut(env, "=")
			lines := nonEmptyLines(res.Stderr)
			if len(lines) != 1 {
				t.Fatalf("want exactly one error line, got %q", res.Stderr)
			}
			for _, want := range []string{name, value, "valid example"} {
				if !strings.Contains(lines[0], want) {
					t.Errorf("error line %q does not mention %q", lines[0], want)
				}
			}
		})
	}
}

// With an invalid configuration, or a quota and a core that cannot be
// loaded, every allocation is refused, so no memory is the process's:
// cudaMemGetInfo and cuMemGetInfo report free 0 with the device's real
// total, cuDeviceTotalMem the real total, and NVML (once the core has been
// started) the real total, all of it used. A program that sizes its work
// from them is not told of memory it cannot get.
func TestBadConfigurationReportsNoFreeMemory(t *testing.T) {
	const total = 16 << 30
	device := "SIMCUDA_DEVICES=1x16GiB"
	noCore := "SPILLWAY_CORE=" + filepath.Join(t.TempDir(), "libspillway-core.so")
	for name, bad := range map[string][]string{
		"invalid quota": {"SPILLWAY_MEMORY_LIMIT=8gigs"}, "invalid switch": {"SPILLWAY_POOL=2"},
		"no core": {noCore, "SPILLWAY_MEMORY_LIMIT=8GiB"},
		// Settings found invalid only once the device's total is known.
		"percentage of no byte":            {"SPILLWAY_MEMORY_LIMIT=0.0000000001%"},
		"reserve above a percentage quota": {"SPILLWAY_MEMORY_LIMIT=10%", "SPILLWAY_POOL_RESERVE=2GiB"},
	} {
		t.Run(name, func(t *testing.T) {
			bad := append([]string{device}, bad...)
			res, rt := harness.RunOK(t, harness.Shimmed(t, bad, cudaops(t), "i", "m", "4K", "i"))
			if rt.Code(t, "m", 0) != harness.ErrInitialization {
				t.Fatalf("allocation: %v, want it refused", rt)
			}
			if strings.Contains(name, "reserve") && !strings.Contains(res.Stderr, `SPILLWAY_POOL_RESERVE=\"2GiB\": larger than the quota of device 0 (1.6GiB)`) {
				t.Errorf("error %q does not give the reserve and the quota for people", res.Stderr)
			}
			// A core that is not where SPILLWAY_CORE says is named with the variable to fix.
			if name == "no core" && !strings.Contains(res.Stderr, "cannot load the core "+strings.TrimPrefix(noCore, "SPILLWAY_CORE=")+" (SPILLWAY_CORE)") {
				t.Errorf("error %q does not name SPILLWAY_CORE", res.Stderr)
			}
			for i := range 2 {
				if l := rt.Line(t, "i", i); rt.Code(t, "i", i) != 0 || rt.Num(t, "i", i, 2) != 0 || rt.Num(t, "i", i, 3) != total {
					t.Errorf("cudaMemGetInfo %d: %v, want success, free 0, the real total %d", i, l, uint64(total))
				}
			}
			_, drv := harness.RunOK(t, harness.Shimmed(t, bad, drvops(t, "dynamic"), "i", "t", "I", "m", "4K"))
			if drv.Code(t, "m", 0) == 0 {
				t.Fatalf("cuMemAlloc: %v, want it refused", drv)
			}
			if l := drv.Line(t, "i", 0); drv.Code(t, "i", 0) != 0 || drv.Num(t, "i", 0, 2) != 0 || drv.Num(t, "i", 0, 3) != total {
				t.Errorf("cuMemGetInfo: %v, want success, free 0, the real total", l)
			}
			if l := drv.Line(t, "t", 0); drv.Code(t, "t", 0) != 0 || drv.Num(t, "t", 0, 2) != total {
				t.Errorf("cuDeviceTotalMem: %v, want the real total", l)
			}
			if l := drv.Line(t, "I", 0); drv.Code(t, "I", 0) != 0 || drv.Num(t, "I", 0, 2) != 0 || drv.Num(t, "I", 0, 3) != total {
				t.Errorf("cudaMemGetInfo after the driver's calls: %v, want success, free 0, the real total", l)
			}
		})
	}
	// NVML alone starts the core when a quota is configured.
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/nvmlonly.c"}, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lnvidia-ml"}})
	for _, bad := range [][]string{{"SPILLWAY_MEMORY_LIMIT=8gigs"}, {"SPILLWAY_MEMORY_LIMIT=0.0000000001%"},
		{"SPILLWAY_MEMORY_LIMIT=10%", "SPILLWAY_POOL_RESERVE=2GiB"}} {
		_, nv := harness.RunOK(t, harness.Shimmed(t, append([]string{device}, bad...), prog))
		const nvmlTotal = total + harness.NVMLReserved // NVML's real total counts the driver's reserve
		if l := nv.Line(t, "t", 0); nv.Num(t, "t", 0, 1) != nvmlTotal || nv.Num(t, "t", 0, 2) != nvmlTotal || nv.Num(t, "t", 0, 3) != 0 {
			t.Errorf("%v: nvmlDeviceGetMemoryInfo: %v, want NVML's real total, all of it used, none free", bad, l)
		}
	}
}

// A setting invalid only for a device's size is said, once, as soon as a
// memory query reports none of the device free for it: a program that sizes
// its work from the query, and so never allocates, is told why.
func TestDeviceSettingErrorSaidAtFirstQuery(t *testing.T) {
	nvml := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/nvmlonly.c"}, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lnvidia-ml"}})
	for _, bad := range []struct{ env, says string }{
		{"SPILLWAY_MEMORY_LIMIT=0.0000000001%", `SPILLWAY_MEMORY_LIMIT=\"0.0000000001%\": that is 0 bytes of device 0's 16GiB`},
		{"SPILLWAY_POOL_RESERVE=2GiB", `SPILLWAY_POOL_RESERVE=\"2GiB\": larger than the quota of device 0 (1.6GiB)`},
	} {
		env := []string{"SIMCUDA_DEVICES=1x16GiB", "SPILLWAY_MEMORY_LIMIT=10%", bad.env}
		for name, cmd := range map[string]*exec.Cmd{
			"cudaMemGetInfo":            harness.Shimmed(t, env, cudaops(t), "i", "i"),
			"cuDeviceTotalMem":          harness.Shimmed(t, env, drvops(t, "dynamic"), "t"),
			"nvmlDeviceGetMemoryInfo":   harness.Shimmed(t, env, nvml),
			"cudaMemGetInfo and malloc": harness.Shimmed(t, env, cudaops(t), "i", "m", "4K", "i"),
		} {
			res, _ := harness.RunOK(t, cmd)
			if n := strings.Count(res.Stderr, bad.says); n != 1 {
				t.Errorf("%s with %s: said %d times, want once; stderr:\n%s", name, bad.env, n, res.Stderr)
			}
		}
	}
}

func TestLogSettings(t *testing.T) {
	prog := cudaops(t)
	res, _ := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_LOG_FORMAT=json"}, prog, "m", "2M"))
	var entry map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.Stderr)), &entry); err != nil {
		t.Fatalf("json log line %q: %v", res.Stderr, err)
	}
	if entry["requested"] != float64(2<<20) || entry["quota"] != float64(1<<20) || entry["level"] != "warning" {
		t.Errorf("json warning: %v", entry)
	}

	file := filepath.Join(t.TempDir(), "spillway.log")
	res, _ = harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_LOG_FILE=" + file}, prog, "m", "2M"))
	logged, err := os.ReadFile(file)
	if err != nil || !strings.Contains(string(logged), "refused") || res.Stderr != "" {
		t.Errorf("log file: %q (%v); stderr %q", logged, err, res.Stderr)
	}

	res, _ = harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_LOG_LEVEL=error"}, prog, "m", "2M"))
	if res.Stderr != "" {
		t.Errorf("warning printed at level error: %q", res.Stderr)
	}

	// A burst of refusals is reported, not repeated a thousand times.
	res, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, prog, "R", "1000", "2M"))
	if out.Num(t, "R", 0, 2) != 1000 {
		t.Fatalf("refusals: %v", out)
	}
	if n := len(nonEmptyLines(res.Stderr)); n < 1 || n > 10 {
		t.Errorf("%d warning lines for 1000 refusals in a burst", n)
	}
}

func TestDisable(t *testing.T) {
	// The configuration reads switches with surrounding blanks as 1, so the
	// front must too: otherwise the core would load and enforce everything.
	for _, value := range []string{"1", " 1", "1 "} {
		setting := "SPILLWAY_DISABLE=" + value
		_, out := harness.RunOK(t, harness.Shimmed(t, []string{setting, "SPILLWAY_MEMORY_LIMIT=1MiB"}, cudaops(t),
			"m", "2M", "i", "L", "T"))
		if out.Code(t, "m", 0) != 0 || out.Code(t, "L", 0) != 0 {
			t.Errorf("%q must pass through without loading the core: %v", setting, out)
		}
		if out.Num(t, "i", 0, 3) == 1<<20 {
			t.Errorf("%q still reports the quota: %v", setting, out)
		}
	}
	// spillway run asked for a quota under SPILLWAY_DISABLE=1 runs the job
	// as it was told, but says that nothing of Spillway applies to it.
	cmd := harness.Command(t, harness.Bin(t, "spillway"), "run", "--memory-limit", "1MiB", "--", "sh", "-c", "echo ran")
	harness.SetEnv(cmd, "SPILLWAY_DISABLE=1")
	if res := harness.Run(t, cmd); res.ExitCode != 0 || res.Stdout != "ran\n" ||
		!strings.Contains(res.Stderr, "SPILLWAY_DISABLE=1 in the environment turns Spillway off: the program runs with no quota") {
		t.Errorf("spillway run under SPILLWAY_DISABLE=1: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	// A value the front does not read as 1 (a trailing no-break space) is
	// no 1 to the core either: it is refused as invalid, not read as off
	// by one side and on by the other.
	setting := "SPILLWAY_DISABLE=1\u00a0"
	res, out := harness.RunOK(t, harness.Shimmed(t, []string{setting, "SPILLWAY_MEMORY_LIMIT=1MiB"}, cudaops(t), "m", "4K"))
	if got := out.Code(t, "m", 0); got != harness.ErrInitialization {
		t.Errorf("%q: allocation returned %d, want %d (cudaErrorInitializationError)", setting, got, harness.ErrInitialization)
	}
	if lines := nonEmptyLines(res.Stderr); len(lines) != 1 || !strings.Contains(lines[0], "invalid SPILLWAY_DISABLE=") ||
		!strings.Contains(lines[0], `1\\u00a0`) || !strings.Contains(lines[0], "expected 1 (on) or 0 (off)") {
		t.Errorf("%q: stderr %q, want one line naming the variable, its value and the valid ones", setting, res.Stderr)
	}
}

func TestCoreLoadFailure(t *testing.T) {
	missing := "SPILLWAY_CORE=" + filepath.Join(t.TempDir(), "libspillway-core.so")
	prog := cudaops(t)
	res, out := harness.RunOK(t, harness.Shimmed(t, []string{missing, "SPILLWAY_MEMORY_LIMIT=1GiB"}, prog, "m", "4K", "m", "4K"))
	if out.Code(t, "m", 0) != harness.ErrInitialization || out.Code(t, "m", 1) != harness.ErrInitialization {
		t.Errorf("with a quota and no core, allocations must fail: %v", out)
	}
	lines := nonEmptyLines(res.Stderr)
	if len(lines) != 1 || !strings.Contains(lines[0], "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=") {
		t.Errorf("want one line with the fix, got %q", res.Stderr)
	}
	_, out = harness.RunOK(t, harness.Shimmed(t, []string{missing}, prog, "m", "4K"))
	if out.Code(t, "m", 0) != 0 {
		t.Errorf("without a quota and no core, calls pass through: %v", out)
	}
}

// TestCoreLoadFailureQuotaKept: with a quota and no core, allocations keep
// failing after the program removes SPILLWAY_MEMORY_LIMIT from its
// environment (as one does to keep a variable from its children): the
// quota is the one configured when CUDA was first called, as the log line
// says, never dropped by a later change of the environment.
func TestCoreLoadFailureQuotaKept(t *testing.T) {
	missing := "SPILLWAY_CORE=" + filepath.Join(t.TempDir(), "libspillway-core.so")
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{missing, "SPILLWAY_MEMORY_LIMIT=1GiB"}, cudaops(t),
		"m", "4K", "U", "SPILLWAY_MEMORY_LIMIT", "m", "4K", "i"))
	if out.Code(t, "U", 0) != 0 {
		t.Fatalf("unsetenv failed: %v", out)
	}
	if out.Code(t, "m", 0) != harness.ErrInitialization || out.Code(t, "m", 1) != harness.ErrInitialization {
		t.Errorf("with a quota and no core, allocations must fail, before and after SPILLWAY_MEMORY_LIMIT "+
			"leaves the environment: %v", out)
	}
	if free := out.Num(t, "i", 0, 2); free != 0 {
		t.Errorf("with a quota and no core, cudaMemGetInfo reports %d bytes free after SPILLWAY_MEMORY_LIMIT "+
			"left the environment, want 0: %v", free, out)
	}
}

// frontABI reads SPILLWAY_CORE_ABI, the front's and the core's ABI version, from abi.h.
func frontABI(t *testing.T) int {
	t.Helper()
	header, err := os.ReadFile(filepath.Join(harness.Root(t), "shim", "core", "abi.h"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#define SPILLWAY_CORE_ABI (\d+)$`).FindSubmatch(header)
	if m == nil {
		t.Fatal("abi.h defines no SPILLWAY_CORE_ABI")
	}
	v, err := strconv.Atoi(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A core from another build is refused as a core that cannot be loaded is:
// one line naming both versions and both objects, then pass-through, or
// failed allocations under a quota. Its entry points abort if called.
func TestCoreFromAnotherBuild(t *testing.T) {
	version := frontABI(t)
	prog := cudaops(t)
	for _, tc := range []struct {
		name     string
		flags    []string
		coreSays string
	}{
		{"other version", []string{fmt.Sprintf("-DOTHER_ABI=%d", version+1)}, fmt.Sprintf("has ABI version %d", version+1)},
		{"no version", []string{"-DNO_ABI"}, "has no ABI version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/othercore.c"}, Shared: true, Flags: tc.flags})
			want := []string{core + " " + tc.coreSays, fmt.Sprintf("the front %s has ABI version %d", harness.Front(t), version), "same build"}

			res, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_CORE=" + core, "SPILLWAY_MEMORY_LIMIT=1GiB"}, prog, "m", "4K", "m", "4K"))
			if out.Code(t, "m", 0) != harness.ErrInitialization || out.Code(t, "m", 1) != harness.ErrInitialization {
				t.Errorf("with a quota and a core from another build, allocations must fail: %v", out)
			}
			lines := nonEmptyLines(res.Stderr)
			if len(lines) != 1 {
				t.Fatalf("want one line, got %q", res.Stderr)
			}
			for _, w := range append(want, "interposed allocations fail") {
				if !strings.Contains(lines[0], w) {
					t.Errorf("%q does not say %q", lines[0], w)
				}
			}

			res, out = harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_CORE=" + core}, prog, "m", "4K", "i"))
			if out.Code(t, "m", 0) != 0 || out.Code(t, "i", 0) != 0 {
				t.Errorf("without a quota and a core from another build, calls pass through: %v", out)
			}
			lines = nonEmptyLines(res.Stderr)
			if len(lines) != 1 || !strings.Contains(lines[0], "pass through to CUDA unaccounted") {
				t.Errorf("want one line saying calls pass through, got %q", res.Stderr)
			}
		})
	}
}

func TestStaticTLSExhausted(t *testing.T) {
	hog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/tlshog.c"}, Shared: true})
	data, err := os.ReadFile(hog)
	if err != nil {
		t.Fatal(err)
	}
	// Distinct files, so that each copy is a distinct object with its own TLS.
	const hogs = 600 // 4800 bytes: more than glibc's default surplus, far less than the tunable's
	dir := t.TempDir()
	for i := range hogs {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("hog%d.so", i)), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/tlsfill.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-ldl"}})

	res, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1GiB"}, prog, dir, strconv.Itoa(hogs)))
	if out.Code(t, "hogs", 0) == hogs {
		t.Fatalf("%d bytes of TLS did not exhaust the static TLS surplus: the test proves nothing", 8*hogs)
	}
	if out.Code(t, "m", 0) != harness.ErrInitialization {
		t.Errorf("with a quota and no core, the allocation must fail: %v", out)
	}
	lines := nonEmptyLines(res.Stderr)
	if len(lines) != 1 || !strings.Contains(lines[0], "static TLS") || !strings.Contains(lines[0], "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=") {
		t.Errorf("want one line naming the problem and the fix, got %q", res.Stderr)
	}

	// spillway run sets the tunable: the same program loads every hog and the core.
	res, out = harness.RunOK(t, harness.Command(t, harness.Bin(t, "spillway"), "run", "--memory-limit", "1GiB", "--", prog, dir, strconv.Itoa(hogs)))
	if out.Code(t, "hogs", 0) != hogs || out.Code(t, "m", 0) != 0 {
		t.Errorf("under spillway run: %v\nstderr: %s", out, res.Stderr)
	}
}

func TestFreeEdgeCases(t *testing.T) {
	prog := cudaops(t)
	// G: cudaFreeAsync on cudaStreamPerThread of memory outside the pool
	// (managed), which reaches the runtime with the stream it was given.
	args := []string{"n", "m", "4K", "f", "0", "x", "0", "M", "4K", "G", "1"}
	_, plain := harness.RunOK(t, harness.Command(t, prog, args...))
	_, shim := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, prog, append(args, "i")...))
	for _, op := range []string{"n", "f", "x", "G"} {
		if plain.Code(t, op, 0) != shim.Code(t, op, 0) {
			t.Errorf("%s: %d under the shim, %d without", op, shim.Code(t, op, 0), plain.Code(t, op, 0))
		}
	}
	if shim.Code(t, "x", 0) == 0 {
		t.Error("a double free succeeded")
	}
	// The managed block is still held if its cudaFreeAsync failed.
	held := uint64(0)
	if shim.Code(t, "G", 0) != 0 {
		held = 4 << 10
	}
	if f := shim.Num(t, "i", 0, 2); f != 1<<20-held {
		t.Errorf("a double free changed the accounting: free %d, want %d", f, 1<<20-held)
	}
}

func TestSpillwayRun(t *testing.T) {
	spillway := harness.Bin(t, "spillway")
	prog := cudaops(t)
	_, out := harness.RunOK(t, harness.Command(t, spillway, "run", "--memory-limit", "1MiB", "--", prog, "m", "768K", "m", "512K", "L"))
	if out.Code(t, "m", 0) != 0 || out.Code(t, "m", 1) != harness.ErrMemoryAllocation || out.Code(t, "L", 0) != 1 {
		t.Errorf("spillway run --memory-limit 1MiB: %v", out)
	}

	cmd := harness.Command(t, spillway, "run", "--memory-limit", "1GiB", "--memory-limit-device", "1=1MiB",
		"--log-level", "error", "--", prog, "d", "1", "m", "2M", "d", "0", "m", "2M")
	harness.SetEnv(cmd, "SIMCUDA_DEVICES=2x1GiB")
	res, out := harness.RunOK(t, cmd)
	if out.Code(t, "m", 0) != harness.ErrMemoryAllocation || out.Code(t, "m", 1) != 0 || res.Stderr != "" {
		t.Errorf("per-device flag: %v, stderr %q", out, res.Stderr)
	}

	for _, tc := range []struct {
		args []string
		exit int
	}{
		{[]string{"--", "sh", "-c", "exit 7"}, 7},
		{[]string{"--", "sh", "-c", "kill -TERM $$"}, 128 + 15},
		{[]string{"--memory-limit", "8GiBs", "--", "/bin/true"}, 2},
		{[]string{"--memory-limit-device", "x=1GiB", "--", "/bin/true"}, 2},
		{[]string{"--", "/nonexistent/program"}, 127},
		{[]string{"--", "/etc/passwd"}, 126}, // found, not executable
		{[]string{"--", "/tmp"}, 126},        // a directory
		{[]string{}, 2},
	} {
		res := harness.Run(t, harness.Command(t, spillway, append([]string{"run"}, tc.args...)...))
		if res.ExitCode != tc.exit {
			t.Errorf("spillway run %v exited %d, want %d (stderr %q)", tc.args, res.ExitCode, tc.exit, res.Stderr)
		}
	}

	// A launcher that cannot find the shim fails itself (1), not as a
	// program that was not found (127) or cannot be executed (126).
	alone := filepath.Join(t.TempDir(), "bin", "spillway")
	data, err := os.ReadFile(spillway)
	if err == nil {
		err = os.MkdirAll(filepath.Dir(alone), 0o755)
	}
	if err == nil {
		err = os.WriteFile(alone, data, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	res = harness.Run(t, harness.Command(t, alone, "run", "--", "/bin/true"))
	if res.ExitCode != 1 || !strings.Contains(res.Stderr, "the shim library") || !strings.Contains(res.Stderr, "--lib") {
		t.Errorf("spillway run without its shim: exit %d, stderr %q; want 1 and a word of --lib", res.ExitCode, res.Stderr)
	}

	res = harness.Run(t, harness.Command(t, spillway, "run", "--memory-limit", "8GiBs", "--", "/bin/true"))
	if !strings.Contains(res.Stderr, "8GiBs") || !strings.Contains(res.Stderr, "valid example") {
		t.Errorf("bad flag message: %q", res.Stderr)
	}

	// The variables reach the child, and the shim is first in LD_PRELOAD.
	cmd = harness.Command(t, spillway, "run", "--memory-limit", "50%", "--", "sh", "-c",
		`echo "$LD_PRELOAD|$SPILLWAY_MEMORY_LIMIT|$GLIBC_TUNABLES"`)
	harness.SetEnv(cmd, "LD_PRELOAD=/lib/other.so")
	res, _ = harness.RunOK(t, cmd)
	want := harness.Front(t) + ":/lib/other.so|50%|glibc.rtld.optional_static_tls="
	if !strings.HasPrefix(strings.TrimSpace(res.Stdout), want) {
		t.Errorf("child environment %q, want prefix %q", res.Stdout, want)
	}

	if res := harness.Run(t, harness.Command(t, spillway, "version")); res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "spillway ") {
		t.Errorf("spillway version: %+v", res)
	}
}

// SPILLWAY_LOG_FILE naming a FIFO that nobody reads: neither the front (a
// core that cannot load) nor the core (logging) waits for a reader.
func TestLogFileFIFOWithoutReader(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "log.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	prog := cudaops(t)
	env := []string{"SPILLWAY_LOG_FILE=" + fifo, "SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_LOG_LEVEL=debug"}
	res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, "m", "768K", "m", "512K", "L"))
	if out.Code(t, "m", 0) != 0 || out.Code(t, "m", 1) != harness.ErrMemoryAllocation || out.Code(t, "L", 0) != 1 {
		t.Errorf("the quota under a FIFO log: %v", out)
	}
	if !strings.Contains(res.Stderr, "nobody reads") {
		t.Errorf("no word of the FIFO on stderr: %q", res.Stderr)
	}
	_, out = harness.RunOK(t, harness.Shimmed(t, append(env, "SPILLWAY_CORE=/nonexistent/libspillway-core.so"), prog, "m", "4K"))
	if out.Code(t, "m", 0) != harness.ErrInitialization {
		t.Errorf("without a core, under a quota: %v", out)
	}
}

// Threads that allocate on cudaStreamPerThread and exit leave nothing in
// the pool: each thread's identity is retired at its exit.
func TestPerThreadIdentitiesRetiredAtExit(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/perthread.c"}, Cudart: true, ProjectHeaders: true})
	rss := func(threads int) int {
		_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, prog, strconv.Itoa(threads)))
		if out.Code(t, "m", 0) != 0 {
			t.Fatalf("%d threads: %v", threads, out)
		}
		return int(out.Num(t, "rss", 0, 1))
	}
	few, many := rss(100), rss(4000)
	t.Logf("resident: %d KiB after 100 threads, %d KiB after 4000", few, many)
	// Kept, each identity held about 31 KB of pool state: 120 MB here.
	if grown := many - few; grown > 16<<10 {
		t.Errorf("resident memory grew by %d KiB from 100 to 4000 threads", grown)
	}
}

// cudaMemGetInfo with NULL pointers answers as CUDA does.
func TestMemGetInfoNull(t *testing.T) {
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, cudaops(t), "m", "4K", "I"))
	if out.Code(t, "I", 0) != harness.ErrInvalidValue {
		t.Errorf("cudaMemGetInfo(NULL, NULL): %v", out)
	}
}

// While the core is starting, another thread does not escape the quota: it
// waits, and fails closed if the start takes too long (here it never ends:
// the core is a FIFO that nobody writes).
func TestNoEscapeWhileTheCoreStarts(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "core.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/slowstart.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-pthread"}})
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_CORE=" + fifo}, prog))
	if out.Code(t, "m", 0) != harness.ErrInitialization {
		t.Errorf("an allocation while the core starts, over the quota: %v", out)
	}
}

// The README's list of the calls the shim interposes (its "Running a
// program under Spillway" paragraph) names every CUDA and NVML function the
// front exports, so that a reader looking for a call finds it there. A name
// may be written with its variants in brackets (cuMemAllocAsync[_ptsz],
// nvmlDeviceGetComputeRunningProcesses[_v2|_v3]) or as a suffix after the
// full name (`cuCtxCreate_v2`, `_v3` and `_v4`).
func TestREADMEListsInterposedFunctions(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(harness.Root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "## Running a program under Spillway\n")
	if !ok {
		t.Fatal("README.md has no section \"Running a program under Spillway\"")
	}
	paragraph, _, _ := strings.Cut(strings.TrimLeft(section, "\n"), "\n\n")
	listed := map[string]bool{}
	last := "" // the last full name, whose base a bare suffix extends
	for _, m := range regexp.MustCompile("`([A-Za-z0-9_]*)(?:\\[([A-Za-z0-9_|]+)\\])?`").FindAllStringSubmatch(paragraph, -1) {
		name, variants := m[1], m[2]
		if strings.HasPrefix(name, "_") && last != "" {
			name = regexp.MustCompile(`_[A-Za-z0-9]+$`).ReplaceAllString(last, "") + name
		}
		listed[name], last = true, name
		for _, v := range strings.Split(variants, "|") {
			listed[name+v] = true
		}
	}
	for _, name := range dynamicSymbols(t, harness.Front(t)) {
		if strings.HasPrefix(name, "cu") || strings.HasPrefix(name, "nvml") {
			if !listed[name] {
				t.Errorf("README's list of interposed calls does not name %s", name)
			}
		}
	}
}

// TestOlderDriverLacksFunction: a driver older than a function the shim
// interposes (one without cuMemCreate or cuCtxCreate_v4): the program that
// calls it gets CUDA_ERROR_NOT_FOUND, and a line for each such function says
// that the loaded driver, named by its path, lacks it, not that no driver is
// loaded.
func TestOlderDriverLacksFunction(t *testing.T) {
	driver := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/olddriver.c"}, Shared: true, Out: "libcuda.so.1"})
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/olddrivercall.c"}, Flags: []string{"-ldl"}})
	names := []string{"cuMemCreate", "cuCtxCreate_v4"}
	res, out := harness.RunOK(t, harness.Shimmed(t, nil, prog, append([]string{driver}, names...)...))
	lines := nonEmptyLines(res.Stderr)
	for _, name := range names {
		if rc := out.Code(t, name, 0); rc != errSymbolNotFound {
			t.Errorf("%s on a driver without it returned %d, want %d: %v", name, rc, errSymbolNotFound, out)
		}
		var said string
		for _, l := range lines {
			if strings.Contains(l, "the real "+name+":") {
				said = l
			}
		}
		if said == "" || !strings.Contains(said, driver) || strings.Contains(said, "no CUDA driver") {
			t.Errorf("want a line saying the driver %s lacks %s, got %q", driver, name, res.Stderr)
		}
	}
}
