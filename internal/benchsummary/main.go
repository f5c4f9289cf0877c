// Command benchsummary turns the output of `go test -bench` (as `make bench`
// writes it to build/bench.txt) into the table of the README's Performance
// section: one row per benchmark result, with what it measures and its
// figures, marked as measured on this machine.
//
// It only reads and formats what the benchmarks reported: it must never
// compute, adjust or invent a figure, nor hide a result it does not know
// (an unknown benchmark gets a row under its own name).
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// described says what each benchmark measures, as the README words it.
var described = map[string]string{
	"BenchmarkMallocFreePairNullRuntime": "cudaMalloc+cudaFree through the core, do-nothing runtime",
	"BenchmarkMallocFreePair":            "a cudaMalloc+cudaFree pair on simcuda, with and without the shim",
	"BenchmarkFirstCall":                 "the first interposed call, core load included",
	"BenchmarkStartup":                   "a process start with the shim preloaded",
	"BenchmarkPair":                      "the pool alone, alloc+free pair",
	"BenchmarkPairRandomVictim":          "the pool alone, pair freeing a random live block",
	"BenchmarkTrace":                     "replayed trace: ns per pair, peak reserved / peak live",
	"BenchmarkChurnNearQuota":            "requests refused although they fit, churn near the quota",
	"BenchmarkShimAllocFreePair":         "a pooled pair under the shim, untraced vs traced",
	"BenchmarkAllocFreePairUntraced":     "a pair on the stand-in CUDA, untraced",
	"BenchmarkAllocFreePairTraced":       "a pair on the stand-in CUDA, traced",
	"BenchmarkProbeRecordRate":           "records a tracing session sustains (one thread)",
	"BenchmarkFaultRecordRate":           "page-fault records a session sustains",
	"BenchmarkNVMLMemoryInfo":            "simcuda's nvmlDeviceGetMemoryInfo",
	"BenchmarkPublish":                   "one refresh of the figures file spillway stat reads (8 devices)",
	"BenchmarkReadDirsOtherNamespaces":   "one refresh of spillway stat --watch, jobs in containers among N processes: kept vs scanning /proc",
}

// result is one benchmark line.
type result struct {
	pkg, name, sub string
	metrics        []string // "value unit", custom ones first
}

// parse reads `go test -bench` output.
func parse(r io.Reader) ([]result, error) {
	var out []result
	pkg := ""
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = p
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		full := f[0]
		if i := strings.LastIndexByte(full, '-'); i > 0 && isDigits(full[i+1:]) {
			full = full[:i] // the GOMAXPROCS suffix
		}
		name, sub, _ := strings.Cut(full, "/")
		res := result{pkg: pkg, name: name, sub: sub}
		var standard []string
		for i := 2; i+1 < len(f); i += 2 {
			m := f[i] + " " + f[i+1]
			switch f[i+1] {
			case "ns/op", "B/op", "allocs/op", "MB/s":
				standard = append(standard, m)
			default:
				res.metrics = append(res.metrics, m)
			}
		}
		// ns/op leads unless the benchmark reports a time of its own (ns/pair,
		// added-µs, ...), which is then the figure that means something.
		if len(standard) > 0 && !reportsTime(res.metrics) {
			res.metrics = append(standard[:1:1], res.metrics...)
		}
		out = append(out, res)
	}
	return out, sc.Err()
}

// reportsTime says whether one of metrics ("value unit") is a duration.
func reportsTime(metrics []string) bool {
	for _, m := range metrics {
		_, unit, _ := strings.Cut(m, " ")
		for _, u := range []string{"ns", "µs", "us", "ms"} {
			if strings.HasPrefix(unit, u+"/") || strings.HasSuffix(unit, "-"+u) || unit == u {
				return true
			}
		}
	}
	return false
}

func isDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// machine describes where the figures were measured.
func machine() string {
	var u unix.Utsname
	kernel := "?"
	if unix.Uname(&u) == nil {
		kernel = unix.ByteSliceToString(u.Release[:])
	}
	return fmt.Sprintf("this machine: %d CPUs, Linux %s, %s/%s, %s", runtime.NumCPU(), kernel, runtime.GOOS, runtime.GOARCH,
		time.Now().UTC().Format("2006-01-02"))
}

// write prints the table in Markdown, as the README has it.
func write(w io.Writer, results []result, where string) {
	fmt.Fprintf(w, "\nPerformance, measured on %s (figures are this machine's, not a reference):\n\n", where)
	fmt.Fprintln(w, "| what | figures | benchmark |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, r := range results {
		what, ok := described[r.name]
		if !ok {
			what = strings.TrimPrefix(r.name, "Benchmark")
		}
		if r.sub != "" {
			what += " (" + r.sub + ")"
		}
		bench := "`" + r.name + "`"
		if r.pkg != "" {
			bench += " in `" + strings.TrimPrefix(r.pkg, "github.com/spillway-gpu/spillway/") + "`"
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", what, strings.Join(r.metrics, ", "), bench)
	}
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: benchsummary BENCH-OUTPUT-FILE")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchsummary: %v\n", err)
		os.Exit(1)
	}
	defer f.Close()
	results, err := parse(f)
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchsummary: %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	if len(results) == 0 {
		fmt.Fprintf(os.Stderr, "benchsummary: %s holds no benchmark result\n", os.Args[1])
		os.Exit(1)
	}
	write(os.Stdout, results, machine())
}
