package shimtest

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// TestDlsymRTLDNext: the shim's dlsym leaves dlsym(RTLD_NEXT, ...) relative
// to the library that calls it: the answer is the same with and without
// the shim preloaded.
func TestDlsymRTLDNext(t *testing.T) {
	var flags []string
	for _, lib := range []string{"nexta", "nextb"} {
		dir := filepath.Dir(harness.Compile(t, harness.CBuild{Sources: []string{"testdata/" + lib + ".c"}, Shared: true, Flags: []string{"-ldl"}}))
		flags = append(flags, "-L", dir, "-Wl,-rpath,"+dir, "-Wl,--no-as-needed", "-l"+lib)
	}
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/rtldnext.c"}, Flags: flags})
	_, plain := harness.RunOK(t, harness.Command(t, prog))
	_, shimmed := harness.RunOK(t, harness.Shimmed(t, nil, prog))
	want := plain.Line(t, "next", 0)[1]
	if want != "nextb" {
		t.Fatalf("without the shim, RTLD_NEXT from libnexta finds %q, want nextb", want)
	}
	if got := shimmed.Line(t, "next", 0)[1]; got != want {
		t.Errorf("with the shim, RTLD_NEXT from libnexta finds %q, want %q as without it", got, want)
	}
}

// TestDlsymCUDAHandles: functions found with dlsym on a program's own
// handles of the runtime and the driver are the shim's: each path is
// refused at the quota, and simcuda never holds more than the quota.
func TestDlsymCUDAHandles(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/handles.c"}, ProjectHeaders: true, Flags: []string{"-ldl"}})
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SIMCUDA_STATS_FILE=" + stats}
	_, out := harness.RunOK(t, harness.Shimmed(t, env, prog, "r", "40", "r", "40", "m", "40", "g", "40", "m", "16"))
	for _, c := range []struct {
		op      string
		i, want int
	}{{"r", 0, 0}, {"r", 1, harness.ErrMemoryAllocation}, {"m", 0, cuOutOfMemory}, {"g", 0, cuOutOfMemory}, {"m", 1, cuSuccess}} {
		if rc := out.Code(t, c.op, c.i); rc != c.want {
			t.Errorf("%s #%d: %d, want %d\n%v", c.op, c.i, rc, c.want, out)
		}
	}
	if peak := harness.ReadStats(t, stats).Devices[0].DeviceBytesPeak; peak > 64<<20 {
		t.Errorf("simcuda held %d bytes at its peak, above the 64 MiB quota", peak)
	}
}

// TestDlsymDependentHandle: the driver's functions found with dlsym on the
// handle of a library that links libcuda (found among its dependencies)
// are the shim's too: refused at the quota, with the quota reported.
func TestDlsymDependentHandle(t *testing.T) {
	lib := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/cudadep.c"}, Shared: true, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda"}})
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/handles.c"}, ProjectHeaders: true, Flags: []string{"-ldl"}})
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SIMCUDA_STATS_FILE=" + stats}
	_, out := harness.RunOK(t, harness.Shimmed(t, env, prog, "W", lib, "w", "40", "w", "40"))
	if out.Code(t, "w", 0) != cuSuccess || out.Code(t, "w", 1) != cuOutOfMemory {
		t.Errorf("two cuMemAlloc_v2 of 40 MiB under a 64 MiB quota: %v, want %d then %d", out, cuSuccess, cuOutOfMemory)
	}
	if peak := harness.ReadStats(t, stats).Devices[0].DeviceBytesPeak; peak > 64<<20 {
		t.Errorf("simcuda held %d bytes at its peak, above the 64 MiB quota", peak)
	}
}

// TestCtypesRuntimeHandle: cudaMalloc found through Python's ctypes on the
// runtime's handle is refused at the quota.
func TestCtypesRuntimeHandle(t *testing.T) {
	env := []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}
	res, out := harness.RunOK(t, harness.Shimmed(t, env, "python3", "testdata/ctypes_cudart.py", "41943040", "41943040"))
	if out.Code(t, "m", 0) != 0 || out.Code(t, "m", 1) != harness.ErrMemoryAllocation {
		t.Errorf("two cudaMalloc of 40 MiB under a 64 MiB quota: %v, want 0 then %d\n%s", out, harness.ErrMemoryAllocation, res.Stderr)
	}
}

// TestRuntimeReload: a runtime unloaded with dlclose and loaded again at
// other addresses is found again: the shim calls the new one, never the
// old addresses.
func TestRuntimeReload(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/reload.c"}, Flags: []string{"-ldl"}})
	res := harness.Run(t, harness.Shimmed(t, []string{"SPILLWAY_POOL=0"}, prog))
	if res.ExitCode != 0 {
		t.Fatalf("exit %d after reloading the runtime\nstdout: %s\nstderr: %s", res.ExitCode, res.Stdout, res.Stderr)
	}
	out := harness.ParseOutput(res.Stdout)
	if out.Code(t, "moved", 0) != 1 {
		t.Fatalf("the runtime was loaded again at the same place; the test proves nothing: %v", out)
	}
	if out.Code(t, "first", 0) != 0 || out.Code(t, "second", 0) != 0 {
		t.Errorf("allocations before and after the reload: %v", out)
	}
}

// TestDlsymLeavesNoStaleError: a lookup the shim answers on a driver's
// handle leaves dlerror as the real lookup would, empty, even where the
// driver (an old one) lacks other functions the shim interposes: a program
// that checks dlerror after dlsym, as POSIX describes, must not take the
// lookup for a failure.
func TestDlsymLeavesNoStaleError(t *testing.T) {
	driver := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/olddriver.c"}, Shared: true, Out: "libcuda.so.1"})
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/dlerror.c"}, Flags: []string{"-ldl"}})
	for _, c := range []struct{ name, found string }{{"cuMemFree_v2", "1"}, {"cuMemCreate", "0"}} {
		_, plain := harness.RunOK(t, harness.Command(t, prog, driver, c.name))
		_, shimmed := harness.RunOK(t, harness.Shimmed(t, nil, prog, driver, c.name))
		if got := plain.Line(t, "found", 0)[1]; got != c.found {
			t.Fatalf("without the shim, dlsym of %s found %s, want %s", c.name, got, c.found)
		}
		if got := shimmed.Line(t, "found", 0)[1]; got != c.found {
			t.Errorf("with the shim, dlsym of %s found %s, want %s as without it", c.name, got, c.found)
		}
		want := strings.Join(plain.Line(t, "error", 0)[1:], " ")
		if got := strings.Join(shimmed.Line(t, "error", 0)[1:], " "); (got == "none") != (want == "none") {
			t.Errorf("with the shim, dlerror after dlsym of %s says %q; without it, %q", c.name, got, want)
		}
	}
}

// TestReloadWhileLibraryLoads: after a CUDA library was closed, a thread's
// CUDA call finds the real functions anew while another thread is inside
// dlopen of a library whose constructor calls CUDA: neither waits for the
// other (the constructor holds the dynamic loader's lock, which finding
// functions takes), and both get the answers they get without the shim.
func TestReloadWhileLibraryLoads(t *testing.T) {
	hook := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ctorhook.c"}, Shared: true, Flags: []string{"-ldl"}})
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/reloadrace.c"}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-rdynamic", "-ldl"}})
	runtime := filepath.Join(harness.SimcudaDir(t), "libcudart.so.12")
	_, plain := harness.RunOK(t, harness.Command(t, prog, runtime, hook))
	res := harness.Run(t, harness.Shimmed(t, []string{"SPILLWAY_POOL=0"}, prog, runtime, hook))
	if res.ExitCode != 0 {
		t.Fatalf("exit %d (a hang is killed by SIGALRM)\nstdout: %s\nstderr: %s", res.ExitCode, res.Stdout, res.Stderr)
	}
	out := harness.ParseOutput(res.Stdout)
	for _, op := range []string{"first", "a", "ctor"} {
		if got, want := out.Code(t, op, 0), plain.Code(t, op, 0); got != want {
			t.Errorf("%s: cudaMalloc returned %d with the shim, %d without it", op, got, want)
		}
	}
}
