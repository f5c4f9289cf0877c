package shimtest

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// Benchmarks run whole programs, so each reports its own figures (medians
// over b.N runs) with b.ReportMetric; ns/op is the cost of a round of runs.

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// figure runs cmd and returns the number printed after key.
func figure(b *testing.B, cmd *exec.Cmd, key string) float64 {
	b.Helper()
	res := harness.Run(b, cmd)
	if res.ExitCode != 0 {
		b.Fatalf("%v: exit %d: %s", cmd.Args, res.ExitCode, res.Stderr)
	}
	for _, l := range strings.Split(res.Stdout, "\n") {
		if v, ok := strings.CutPrefix(l, key+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			return f
		}
	}
	b.Fatalf("%v printed no %q: %q", cmd.Args, key, res.Stdout)
	return 0
}

// configs are the ways of running the same program, interleaved in every
// round so that drift in the machine's load hits all of them alike: without
// the shim, through the core with the pool (the default), through the core
// with the pool off (SPILLWAY_POOL=0: every call reaches the runtime, with
// the quota's accounting), and through the front alone (SPILLWAY_DISABLE=1).
var configs = []struct {
	name string
	env  []string
	shim bool
}{
	{"none", nil, false},
	{"pool", nil, true},
	{"passthrough", []string{"SPILLWAY_POOL=0"}, true},
	{"disabled", []string{"SPILLWAY_DISABLE=1"}, true},
}

// reportPairs reports the medians of each configuration and what the shim
// adds per call against no shim (half a pair).
func reportPairs(b *testing.B, got map[string][]float64) {
	none := median(got["none"])
	for _, c := range configs {
		b.ReportMetric(median(got[c.name]), c.name+"-ns/pair")
		if c.shim {
			b.ReportMetric((median(got[c.name])-none)/2, c.name+"-added-ns/call")
		}
	}
}

func prepared(b *testing.B, shim bool, env []string, prog string, args ...string) *exec.Cmd {
	if shim {
		return harness.Shimmed(b, env, prog, args...)
	}
	cmd := harness.Command(b, prog, args...)
	harness.SetEnv(cmd, env...)
	return cmd
}

// BenchmarkMallocFreePair: cudaMalloc+cudaFree of 4 KiB on simcuda in each
// configuration. simcuda's own pair (an mmap and munmap, a few
// microseconds) is not a GPU's (tens of microseconds, and a device
// synchronization in cudaFree): the pool's gain here understates a GPU's.
func BenchmarkMallocFreePair(b *testing.B) {
	prog := harness.Compile(b, harness.CBuild{Sources: []string{"testdata/bench.c"}, Cudart: true, ProjectHeaders: true})
	for _, threads := range []int{1, 4} {
		b.Run("threads="+strconv.Itoa(threads), func(b *testing.B) {
			pairs := strconv.Itoa(100000 / threads)
			got := map[string][]float64{}
			for range b.N {
				for _, c := range configs {
					cmd := prepared(b, c.shim, c.env, prog, "pairs", strconv.Itoa(threads), pairs, "4096")
					got[c.name] = append(got[c.name], figure(b, cmd, "pair_ns"))
				}
			}
			reportPairs(b, got)
		})
	}
}

// BenchmarkMallocFreePairNullRuntime: the same pairs over a runtime that
// does nothing (testdata/nullrt.c), so that what remains is the shim's
// own cost per call.
func BenchmarkMallocFreePairNullRuntime(b *testing.B) {
	rt := harness.Compile(b, harness.CBuild{Sources: []string{"testdata/nullrt.c"}, Shared: true,
		ProjectHeaders: true, Out: "libcudart.so.12", Flags: []string{"-Wl,-soname,libcudart.so.12"}})
	prog := harness.Compile(b, harness.CBuild{Sources: []string{"testdata/bench.c"}, ProjectHeaders: true,
		Flags: []string{rt}})
	for _, threads := range []int{1, 4} {
		b.Run("threads="+strconv.Itoa(threads), func(b *testing.B) {
			pairs := strconv.Itoa(2000000 / threads)
			got := map[string][]float64{}
			for range b.N {
				for _, c := range configs {
					cmd := prepared(b, c.shim, c.env, prog, "pairs", strconv.Itoa(threads), pairs, "4096")
					harness.SetEnv(cmd, "LD_LIBRARY_PATH="+filepath.Dir(rt))
					got[c.name] = append(got[c.name], figure(b, cmd, "pair_ns"))
				}
			}
			reportPairs(b, got)
		})
	}
}

// BenchmarkFirstCall: the first interposed call, loading the core included,
// against the same first call without the shim.
func BenchmarkFirstCall(b *testing.B) {
	prog := harness.Compile(b, harness.CBuild{Sources: []string{"testdata/bench.c"}, Cudart: true, ProjectHeaders: true})
	var with, without []float64
	for range b.N {
		without = append(without, figure(b, prepared(b, false, nil, prog, "first", "4096"), "first_ns"))
		with = append(with, figure(b, prepared(b, true, nil, prog, "first", "4096"), "first_ns"))
	}
	b.ReportMetric(median(without)/1e3, "plain-first-µs")
	b.ReportMetric(median(with)/1e3, "shim-first-µs")
	b.ReportMetric((median(with)-median(without))/1e3, "added-µs")
}

// BenchmarkStartup: a process that never calls CUDA, started with and
// without the shim preloaded (wall time of fork, exec, run and wait).
func BenchmarkStartup(b *testing.B) {
	for _, target := range []struct {
		name string
		argv []string
	}{
		{"true", []string{"/bin/true"}},
		{"python", []string{pythonInterpreter(b), "-c", "pass"}},
	} {
		b.Run(target.name, func(b *testing.B) {
			var with, without []float64
			for range b.N {
				for _, shim := range []bool{false, true} {
					cmd := prepared(b, shim, nil, target.argv[0], target.argv[1:]...)
					start := time.Now()
					if res := harness.Run(b, cmd); res.ExitCode != 0 {
						b.Fatalf("%v: %+v", target.argv, res)
					}
					d := float64(time.Since(start).Microseconds())
					if shim {
						with = append(with, d)
					} else {
						without = append(without, d)
					}
				}
			}
			b.ReportMetric(median(without), "plain-µs")
			b.ReportMetric(median(with), "shim-µs")
			b.ReportMetric(median(with)-median(without), "added-µs")
		})
	}
}

// pythonInterpreter returns the interpreter python3 runs. The python3 on PATH
// may be a wrapper script (pyenv's) that starts several processes, each of
// which would pay the preload: timing it would measure the wrapper.
func pythonInterpreter(b *testing.B) string {
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		b.Fatalf("python3: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// BenchmarkDriverPair: the driver's cuMemAlloc_v2+cuMemFree_v2 pair and
// the static runtime's cudaMalloc+cudaFree pair (which reaches the shim
// through the driver), of 4 KiB on one thread, against the dynamic
// runtime's pair, each without the shim and through the pool (the
// default); ratio: the pair through the pool against the runtime's.
func BenchmarkDriverPair(b *testing.B) {
	header := []string{"-L", harness.SimcudaDir(b), "-lcuda"}
	progs := map[string]string{
		"runtime": harness.Compile(b, harness.CBuild{Sources: []string{"testdata/bench.c"}, Cudart: true, ProjectHeaders: true}),
		"driver": harness.Compile(b, harness.CBuild{Sources: []string{"testdata/bench.c"}, Cudart: true, ProjectHeaders: true,
			Flags: append([]string{"-DBENCH_DRIVER"}, header...)}),
		"static": harness.Compile(b, harness.CBuild{Sources: []string{"testdata/bench.c"}, StaticCudart: true, ProjectHeaders: true}),
	}
	got := map[string][]float64{}
	for range b.N {
		for name, prog := range progs {
			for _, shim := range []bool{false, true} {
				key := name + map[bool]string{false: "-none", true: "-pool"}[shim]
				got[key] = append(got[key], figure(b, prepared(b, shim, nil, prog, "pairs", "1", "20000", "4096"), "pair_ns"))
			}
		}
	}
	for _, name := range []string{"runtime", "driver", "static"} {
		b.ReportMetric(median(got[name+"-none"]), name+"-none-ns/pair")
		b.ReportMetric(median(got[name+"-pool"]), name+"-pool-ns/pair")
	}
	for _, name := range []string{"driver", "static"} {
		b.ReportMetric(median(got[name+"-pool"])/median(got["runtime-pool"]), name+"/runtime-pool-ratio")
	}
}

// BenchmarkDriverLookup: cuGetProcAddress of driver functions (the runtime
// makes hundreds as it starts, and frameworks more), each exchanged for the
// shim's function where it interposes it, against the same lookups without
// the shim.
func BenchmarkDriverLookup(b *testing.B) {
	prog := harness.Compile(b, harness.CBuild{Sources: []string{"testdata/bench.c"}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-DBENCH_DRIVER", "-L", harness.SimcudaDir(b), "-lcuda"}})
	var with, without []float64
	for range b.N {
		without = append(without, figure(b, prepared(b, false, nil, prog, "lookups", "20000"), "lookup_ns"))
		with = append(with, figure(b, prepared(b, true, nil, prog, "lookups", "20000"), "lookup_ns"))
	}
	b.ReportMetric(median(without), "plain-ns/lookup")
	b.ReportMetric(median(with), "shim-ns/lookup")
}
