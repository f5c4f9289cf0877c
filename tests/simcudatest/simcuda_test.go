package simcudatest

// Tests of simcuda's driver and runtime: every behaviour that later suites
// rely on, checked from C programs that run through the real dynamic linker
// against build/simcuda, and simcuda's statistics file as ground truth.

import (
	"bufio"
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

const (
	mebibyte = 1 << 20
	gibibyte = 1 << 30
)

// buildBehaviour compiles testdata/behaviour.c, which checks one behaviour per run.
func buildBehaviour(t *testing.T) string {
	t.Helper()
	return harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/behaviour.c"},
		Cudart:         true,
		ProjectHeaders: true,
		Flags:          []string{"-lcuda", "-ldl"},
	})
}

// runCase runs one behaviour case with env and returns its result and statistics.
func runCase(t *testing.T, bin, name string, env ...string) (harness.Result, harness.Stats) {
	t.Helper()
	stats := filepath.Join(t.TempDir(), "stats.json")
	cmd := harness.Command(t, bin, name)
	harness.SetEnv(cmd, append([]string{"SIMCUDA_STATS_FILE=" + stats}, env...)...)
	res := harness.Run(t, cmd)
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "PASS "+name) {
		t.Fatalf("behaviour %s: exit %d\nstdout:\n%s\nstderr:\n%s", name, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res, harness.ReadStats(t, stats)
}

// TestBehaviour runs each documented CUDA behaviour that simcuda reproduces;
// testdata/behaviour.c holds the checks, one function per case.
func TestBehaviour(t *testing.T) {
	bin := buildBehaviour(t)
	cases := []struct {
		name string
		env  []string
		why  string
	}{
		{"capacity", []string{"SIMCUDA_DEVICES=2x1GiB"}, "allocations beyond capacity fail with the out-of-memory codes, per device"},
		{"alignment", nil, "device pointers are 256-byte aligned, disjoint from host memory and unreachable by the CPU"},
		{"bad_free", nil, "freeing unknown or freed pointers fails with cudaErrorInvalidValue and changes nothing"},
		{"stream_order", nil, "a stream runs memsets, copies and host functions in order; pageable sources are staged"},
		{"default_stream", nil, "the legacy default stream synchronizes with blocking streams, not non-blocking ones"},
		{"free_waits", nil, "cudaFree waits for pending work; cudaFreeAsync and cudaMallocAsync are stream-ordered"},
		{"events", nil, "event completion, cross-stream waits, timing errors, no CUDA calls from host functions"},
		{"managed", []string{"SIMCUDA_DEVICES=1GiB"}, "managed residency under prefetch and each kind of advice; eviction under pressure"},
		{"no_managed", []string{"SIMCUDA_NO_MANAGED=1"}, "the device can report no managed memory"},
		{"last_error", nil, "cudaGetLastError returns and clears, cudaPeekAtLastError does not"},
		{"fork", nil, "a child forked after initialisation gets initialization errors and never blocks"},
		{"fault", []string{"SIMCUDA_FAIL=cudaMalloc:2,cuMemAlloc_v2:4,cudaMalloc:7=700,cuMemAlloc_v2:6=719"}, "fault injection fails exactly the named calls, at either layer, with the code named"},
		{"proc_address", nil, "cuGetProcAddress returns the versioned ABI and per-thread variants asked for"},
		{"pointers", nil, "pointer attributes, pinned host memory and its device pointer, bounds checks"},
		{"context_bytes", []string{"SIMCUDA_DEVICES=2x1GiB", "SIMCUDA_CONTEXT_BYTES=256MiB"}, "each context takes its bytes on first use; cudaDeviceReset frees a context's memory"},
		{"properties", []string{"SIMCUDA_DEVICES=80GiB,24GiB"}, "device properties, attributes and versions"},
		{"managed_preferred", []string{"SIMCUDA_DEVICES=2x1GiB"}, "data away from its preferred location migrates to the device that accesses it"},
		{"free_async_pointer", nil, "cudaFree of cudaMallocAsync memory does not wait; freeing it under pending work is refused"},
		{"async_host_copy", nil, "an async host-to-host copy returns only when done"},
		{"primary_reset", nil, "a primary context reset keeps the retain count; the runtime retains again"},
		{"event_device", []string{"SIMCUDA_DEVICES=2x1GiB"}, "an event records only on streams of its own device"},
		{"free_async_race", nil, "a stream-ordered free that races work on another stream aborts with a message"},
		{"zero_size", nil, "zero-byte runtime allocations succeed with NULL and NULL frees succeed"},
		{"malloc3d", nil, "cudaMalloc3D allocates pitched rows of the extent, freed by cudaFree"},
		{"pool_reuse", []string{"SIMCUDA_DEVICES=1GiB"}, "cudaMallocAsync reuses memory whose cudaFreeAsync is queued, waiting for it across streams"},
		{"runtime_context", []string{"SIMCUDA_DEVICES=2x1GiB"}, "runtime calls use the current context, or the current device's primary one when none is; cudaGetDevice answers the current context's device"},
		{"host_register", []string{"SIMCUDA_DEVICES=1GiB"}, "cudaHostRegister page-locks host memory that counts on no device; registered memory is pinned host memory until unregistered or its context is destroyed"},
		{"no_host_register", []string{"SIMCUDA_NO_HOST_REGISTER=1"}, "the device can report no host registration"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Logf("expect: %s", c.why)
			runCase(t, bin, c.name, c.env...)
		})
	}
}

// TestManagedResidencyStats checks the statistics the managed case leaves:
// 512 MiB + 512 MiB of plain memory on the device, its 768 MiB of managed
// memory all evicted to the host.
func TestManagedResidencyStats(t *testing.T) {
	_, stats := runCase(t, buildBehaviour(t), "managed", "SIMCUDA_DEVICES=1GiB")
	dev := stats.Devices[0]
	if dev.DeviceBytes != gibibyte || dev.DeviceBytesPeak != gibibyte || dev.ManagedDeviceBytes != 0 ||
		dev.ManagedHostBytes != 768*mebibyte || dev.LiveAllocations != 3 {
		t.Fatalf("device stats %+v, want 1 GiB resident (peak 1 GiB), 0 managed on device, "+
			"768 MiB managed on host, 3 live allocations", dev)
	}
}

// TestHostRegisterStats: the host_register case leaves 2 GiB registered on
// a 1 GiB device; the statistics file counts it as registered host memory,
// not as device memory, pinned allocations or live allocations.
func TestHostRegisterStats(t *testing.T) {
	_, stats := runCase(t, buildBehaviour(t), "host_register", "SIMCUDA_DEVICES=1GiB")
	dev := stats.Devices[0]
	if dev.HostRegisteredBytes != 2*gibibyte || dev.DeviceBytes != 0 || dev.DeviceBytesPeak != 512 ||
		dev.HostPinnedBytes != 0 || dev.LiveAllocations != 0 {
		t.Fatalf("device stats %+v, want 2 GiB registered, no device bytes (peak 512, the 16-byte "+
			"cudaMalloc's granule), no pinned or live allocations", dev)
	}
}

// TestBadConfiguration: a malformed variable fails initialisation with a
// message naming it; nothing is silently defaulted.
func TestBadConfiguration(t *testing.T) {
	bin := buildBehaviour(t)
	for _, env := range []string{
		"SIMCUDA_DEVICES=16GB",
		"SIMCUDA_DEVICES=0x16GiB",
		"SIMCUDA_DEVICES=16GiB,,8GiB",
		"SIMCUDA_DEVICES=17x1GiB",
		"SIMCUDA_CONTEXT_BYTES=lots",
		"SIMCUDA_NO_MANAGED=yes",
		"SIMCUDA_NO_HOST_REGISTER=on",
		"SIMCUDA_FAIL=cuMemAlloc_v2",
		"SIMCUDA_FAIL=cuMemAlloc_v2:0",
		"SIMCUDA_FAIL=cuMemAlloc_v2:1=",
		"SIMCUDA_FAIL=cuMemAlloc_v2:1=0",
		"SIMCUDA_FAIL=cuMemAlloc_v2:1=1000",
		"SIMCUDA_FAIL=cuMemAlloc_v2:1=illegal",
		"SIMCUDA_FAIL=cuMemAlloc_v2=700",
	} {
		t.Run(env, func(t *testing.T) {
			res, _ := runCase(t, bin, "bad_config", env)
			name, _, _ := strings.Cut(env, "=")
			if !strings.Contains(res.Stderr, name+"=") {
				t.Fatalf("stderr does not name %s:\n%s", name, res.Stderr)
			}
		})
	}
}

// TestDeviceList checks the SIMCUDA_DEVICES syntax through cuDeviceTotalMem.
func TestDeviceList(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/list_devices.c"},
		Cudart:         true,
		ProjectHeaders: true,
	})
	for _, c := range []struct{ spec, want string }{
		{"", "1: 17179869184"},
		{"16GiB", "1: 17179869184"},
		{"2x16GiB", "2: 17179869184 17179869184"},
		{"80GiB,24GiB", "2: 85899345920 25769803776"},
		{"512MiB,2x1TiB", "3: 536870912 1099511627776 1099511627776"},
		{"1048576", "1: 1048576"},
	} {
		t.Run(c.spec, func(t *testing.T) {
			cmd := harness.Command(t, bin)
			harness.SetEnv(cmd, "SIMCUDA_DEVICES="+c.spec)
			res := harness.Run(t, cmd)
			if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != c.want {
				t.Fatalf("SIMCUDA_DEVICES=%q: exit %d, got %q, want %q\n%s",
					c.spec, res.ExitCode, res.Stdout, c.want, res.Stderr)
			}
		})
	}
}

// checkDoneWhen runs testdata/done_when.c's binary on a 1 GiB device and
// checks its output and the statistics it leaves.
func checkDoneWhen(t *testing.T, bin string) harness.Stats {
	t.Helper()
	stats := filepath.Join(t.TempDir(), "stats.json")
	cmd := harness.Command(t, bin)
	harness.SetEnv(cmd, "SIMCUDA_DEVICES=1GiB", "SIMCUDA_STATS_FILE="+stats)
	res := harness.Run(t, cmd)
	if res.ExitCode != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	for _, line := range []string{
		"allocated 4 chunks of 256 MiB, then error 2 (cudaErrorMemoryAllocation)",
		"cudaFree waited for the pending stream work",
		"64 bytes round-tripped",
	} {
		if !strings.Contains(res.Stdout, line) {
			t.Errorf("output lacks %q:\n%s", line, res.Stdout)
		}
	}
	info, err := os.Stat(stats)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("stats file mode %v, want 0600", info.Mode().Perm())
	}
	s := harness.ReadStats(t, stats)
	want := harness.DeviceStats{
		Ordinal: 0, CapacityBytes: gibibyte, DeviceBytes: 256 * mebibyte, DeviceBytesPeak: gibibyte,
		HostPinnedBytes: mebibyte, LiveAllocations: 2,
	}
	if len(s.Devices) != 1 || s.Devices[0] != want {
		t.Errorf("devices %+v, want [%+v]", s.Devices, want)
	}
	for name, n := range map[string]uint64{
		"cudaMalloc": 5, "cuMemAlloc_v2": 5, "cudaFree": 3, "cuMemFree_v2": 3,
		"cudaMemcpy": 3, "cudaMallocHost": 1, "cuMemAllocHost_v2": 1, "cudaLaunchHostFunc": 1,
	} {
		if s.Calls[name] != n {
			t.Errorf("calls[%s] = %d, want %d", name, s.Calls[name], n)
		}
	}
	for dir, n := range map[string]uint64{"h2d": 64, "d2h": 64, "d2d": 64, "h2h": 0} {
		if s.MemcpyBytes[dir] != n {
			t.Errorf("memcpy_bytes[%s] = %d, want %d", dir, s.MemcpyBytes[dir], n)
		}
	}
	return s
}

// TestDoneWhen: a program written only against the public runtime API, with
// its own prototypes, built with -lcudart.
func TestDoneWhen(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/done_when.c"}, Cudart: true})
	checkDoneWhen(t, bin)
}

// TestStaticallyLinkedRuntime: the same program with libcudart_static.a, as
// nvcc links by default; it still reaches the driver through libcuda.so.1.
func TestStaticallyLinkedRuntime(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{
		Sources: []string{"testdata/done_when.c"}, Out: "done_when_static", StaticCudart: true,
	})
	libs := importedLibraries(t, bin)
	for _, lib := range libs {
		if strings.HasPrefix(lib, "libcudart") || strings.HasPrefix(lib, "libcuda") {
			t.Fatalf("statically linked program needs %s (all: %v)", lib, libs)
		}
	}
	checkDoneWhen(t, bin)
}

func importedLibraries(t *testing.T, path string) []string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	return libs
}

// TestRuntimeReachesDriverOnlyThroughGetProcAddress: the runtime neither
// links the driver nor binds any driver symbol by name. A preloaded library
// that defines driver functions must see none of the runtime's calls, while
// the driver counts them, reached through cuGetProcAddress_v2.
func TestRuntimeReachesDriverOnlyThroughGetProcAddress(t *testing.T) {
	runtimeLib := filepath.Join(harness.SimcudaDir(t), "libcudart.so.12")
	for _, lib := range importedLibraries(t, runtimeLib) {
		if strings.HasPrefix(lib, "libcuda.") {
			t.Fatalf("libcudart.so.12 links %s", lib)
		}
	}
	f, err := elf.Open(runtimeLib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "cu") {
			t.Fatalf("libcudart.so.12 imports driver symbol %s", s.Name)
		}
	}

	trap := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/intercept.c"}, Shared: true})
	for _, static := range []bool{false, true} {
		name := map[bool]string{false: "dynamic", true: "static"}[static]
		t.Run(name, func(t *testing.T) {
			bin := harness.Compile(t, harness.CBuild{
				Sources: []string{"testdata/done_when.c"}, Out: "done_when_" + name,
				Cudart: !static, StaticCudart: static,
			})
			stats := filepath.Join(t.TempDir(), "stats.json")
			cmd := harness.Command(t, bin)
			harness.SetEnv(cmd, "SIMCUDA_DEVICES=1GiB", "SIMCUDA_STATS_FILE="+stats, "LD_PRELOAD="+trap)
			res := harness.Run(t, cmd)
			if res.ExitCode != 0 || strings.Contains(res.Stderr, "INTERCEPTED") {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			s := harness.ReadStats(t, stats)
			if s.Calls["cuGetProcAddress_v2"] == 0 || s.Calls["cuMemAlloc_v2"] != s.Calls["cudaMalloc"] ||
				s.Calls["cuInit"] != 1 {
				t.Fatalf("calls %v: want cuGetProcAddress_v2 > 0, cuInit 1 and one cuMemAlloc_v2 per cudaMalloc", s.Calls)
			}
		})
	}
}

// TestStatsFileTruncates: an existing, longer file is replaced, not overwritten in place.
func TestStatsFileTruncates(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/done_when.c"}, Cudart: true})
	stats := filepath.Join(t.TempDir(), "stats.json")
	if err := os.WriteFile(stats, []byte(strings.Repeat(" garbage ", 4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := harness.Command(t, bin)
	harness.SetEnv(cmd, "SIMCUDA_DEVICES=1GiB", "SIMCUDA_STATS_FILE="+stats)
	if res := harness.Run(t, cmd); res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
	}
	if s := harness.ReadStats(t, stats); len(s.Devices) != 1 {
		t.Fatalf("devices %+v", s.Devices)
	}
}

// TestCapacitySharedBetweenProcesses: processes on the same device share its
// memory, as on a GPU: what one holds, another cannot allocate, and
// cudaMemGetInfo reports the device's free memory, not the process's.
func TestCapacitySharedBetweenProcesses(t *testing.T) {
	bin := buildBehaviour(t)
	state := t.TempDir()
	holder := harness.Command(t, bin, "hold")
	harness.SetEnv(holder, "SIMCUDA_DEVICES=1GiB", "SIMCUDA_STATE_DIR="+state)
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	holder.Stderr = &stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		if err := holder.Wait(); err != nil {
			t.Errorf("holder: %v\n%s", err, stderr.String())
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		stdin.Close()
		t.Fatalf("holder did not get ready: %q, %v\n%s", line, err, stderr.String())
	}
	runCase(t, bin, "shared_capacity", "SIMCUDA_DEVICES=1GiB", "SIMCUDA_STATE_DIR="+state)
}
