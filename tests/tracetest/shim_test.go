package tracetest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/bpf"
	"github.com/spillway-gpu/spillway/tests/harness"
)

// The real shim's pool and oversubscription on simcuda, traced through the
// command: what the probes saw is checked against the shim's own
// SPILLWAY_REPORT line and against what the program did.

func oversubWorkload(t *testing.T) string {
	t.Helper()
	return harness.Compile(t, harness.CBuild{
		Sources: []string{"testdata/oversub.c"}, Cudart: true, ProjectHeaders: true,
	})
}

// reportLine parses the shim's SPILLWAY_REPORT line for device 0.
func reportLine(t *testing.T, stderr string) map[string]uint64 {
	t.Helper()
	var found []string
	for _, l := range strings.Split(stderr, "\n") {
		if rest, ok := strings.CutPrefix(l, "spillway: device 0: "); ok {
			found = append(found, rest)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one report line for device 0, got %d in:\n%s", len(found), stderr)
	}
	rep := map[string]uint64{}
	for _, f := range strings.Fields(found[0]) {
		k, v, _ := strings.Cut(f, "=")
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("report field %q in %q", f, found[0])
		}
		rep[k] = n
	}
	for _, k := range []string{"cache_hits", "device_reservations", "pass_through", "syncs", "external_syncs",
		"refused", "spilled_total", "promoted_total"} {
		if _, ok := rep[k]; !ok {
			t.Fatalf("report line %q has no %s", found[0], k)
		}
	}
	return rep
}

// printedCounts parses "key=N ..." printed by the workload.
func printedCounts(t *testing.T, stdout, first string) map[string]uint64 {
	t.Helper()
	for _, l := range strings.Split(stdout, "\n") {
		if !strings.HasPrefix(l, first+"=") {
			continue
		}
		out := map[string]uint64{}
		for _, f := range strings.Fields(l) {
			k, v, _ := strings.Cut(f, "=")
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("workload printed %q", l)
			}
			out[k] = n
		}
		return out
	}
	t.Fatalf("workload printed no %s= line in:\n%s", first, stdout)
	return nil
}

// An oversubscribed program under a 16 MiB quota allocates 8 chunks of
// 4 MiB, writes every page of those spilled to the host from the CPU, frees
// half (the spilled chunks are promoted back), then the rest. Every
// spilled page written faults once (huge pages are off for them), in the
// program and nowhere else; the spill, promotion and pool figures are
// the shim's own. The per-interval JSON lines add up to the totals.
func TestTraceOversubscribedShim(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	workload := oversubWorkload(t)
	const chunks, chunkMiB = 8, 4
	for _, tc := range []struct {
		spill   string
		promote bool
	}{
		{"managed", true},
		{"pinned", false},
	} {
		t.Run(tc.spill, func(t *testing.T) {
			summary := filepath.Join(t.TempDir(), "summary.json")
			cmd := harness.Command(t, spillway, "trace", "--json", "--interval", "20ms", "--summary-json", summary,
				"--", workload, "spill", strconv.Itoa(chunks), strconv.Itoa(chunkMiB))
			harness.SetEnv(cmd, "SPILLWAY_MEMORY_LIMIT=16MiB", "SPILLWAY_OVERSUBSCRIBE=1",
				"SPILLWAY_SPILL="+tc.spill, "SPILLWAY_REPORT=1")
			res := harness.Run(t, cmd)
			if res.ExitCode != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			sum := readSummary(t, summary)
			rep := reportLine(t, res.Stderr)
			did := printedCounts(t, res.Stdout, "spilled_chunks")

			if sum.Drops != 0 {
				t.Fatalf("drops = %d, want 0", sum.Drops)
			}
			if did["spilled_chunks"] == 0 || did["touched_pages"] == 0 {
				t.Fatalf("the shim spilled nothing the program could touch: %v, report %v", did, rep)
			}
			// Faults on spilled memory: exactly the pages the program wrote
			// there, all in the program.
			if sum.PageFaults.Spilled != did["touched_pages"] {
				t.Errorf("faults on spilled memory = %d, want the %d spilled pages written", sum.PageFaults.Spilled, did["touched_pages"])
			}
			if len(sum.Processes) != 1 {
				t.Errorf("records from %d processes, want the program's only: %v", len(sum.Processes), sum.Processes)
			}
			for pid, p := range sum.Processes {
				if p.PageFaults.Spilled != sum.PageFaults.Spilled || !p.Exited {
					t.Errorf("process %s: %+v, want all %d faults on spilled memory and its exit", pid, p, sum.PageFaults.Spilled)
				}
			}

			// The shim's view matches its report.
			if sum.SpillBytes != rep["spilled_total"] || sum.PromoteBytes != rep["promoted_total"] {
				t.Errorf("spill_bytes %d, promote_bytes %d; report spilled_total %d, promoted_total %d",
					sum.SpillBytes, sum.PromoteBytes, rep["spilled_total"], rep["promoted_total"])
			}
			if sum.SpillBytes != did["spilled_chunks"]*chunkMiB<<20 || sum.Pool.Spills != did["spilled_chunks"] {
				t.Errorf("%d spills of %d bytes, want the %d chunks the program found spilled", sum.Pool.Spills, sum.SpillBytes, did["spilled_chunks"])
			}
			if promoted := sum.PromoteBytes > 0; promoted != tc.promote {
				t.Errorf("promote_bytes = %d with %s spilling", sum.PromoteBytes, tc.spill)
			}
			wantPool := bpf.PoolCounts{
				Allocs:             50 + chunks,
				CacheHits:          rep["cache_hits"],
				DeviceReservations: rep["device_reservations"],
				SpilledAllocs:      did["spilled_chunks"],
				PassThrough:        rep["pass_through"],
				Frees:              50 + chunks,
				Syncs:              rep["syncs"] + rep["external_syncs"],
				SyncReusableBytes:  sum.Pool.SyncReusableBytes,
				Spills:             did["spilled_chunks"],
				Promotes:           sum.Pool.Promotes,
				Refusals:           rep["refused"],
			}
			if sum.Pool != wantPool {
				t.Errorf("pool = %+v\nwant   %+v (report %v)", sum.Pool, wantPool, rep)
			}
			if tc.promote && sum.Pool.Promotes != sum.Pool.Spills {
				t.Errorf("%d promotions of %d spilled chunks, want all of them", sum.Pool.Promotes, sum.Pool.Spills)
			}
			wantBytes := map[string]uint64{"h2d": did["h2d"], "d2h": did["d2h"], "d2d": did["d2d"], "default": 0, "h2h": 0}
			if !maps.Equal(sum.MemcpyBytes, wantBytes) || did["h2d"] == 0 {
				t.Errorf("memcpy_bytes = %v, want %v", sum.MemcpyBytes, wantBytes)
			}
			// The application's calls, not the shim's own calls into CUDA
			// (segments, spills, promotions).
			deviceChunks := uint64(chunks) - did["spilled_chunks"]
			wantCalls := map[string]uint64{"cudaMalloc": 50 + chunks, "cudaFree": 50 + chunks, "cudaDeviceSynchronize": 4,
				"cudaMemcpy": 3 * deviceChunks}
			for name, n := range wantCalls {
				if sum.Calls[name] != n {
					t.Errorf("calls = %v, want %v", sum.Calls, wantCalls)
					break
				}
			}
			if len(sum.Calls) != len(wantCalls) || len(sum.Errors) != 0 {
				t.Errorf("calls = %v, errors = %v; want %v and no errors", sum.Calls, sum.Errors, wantCalls)
			}

			// The steps are the program's four synchronizations, the bytes
			// moved the shim's spilled and promoted totals, and the accesses
			// its three copies of each chunk left on the device, none of
			// them on spilled memory.
			if sum.Steps != 4 || sum.MovedBytes != rep["spilled_total"]+rep["promoted_total"] {
				t.Errorf("steps %d, moved_bytes %d; want 4 and %d (report spilled_total + promoted_total)",
					sum.Steps, sum.MovedBytes, rep["spilled_total"]+rep["promoted_total"])
			}
			if want := uint64(50<<20 + chunks*chunkMiB<<20); sum.AllocBytes != want {
				t.Errorf("alloc_bytes = %d, want %d", sum.AllocBytes, want)
			}
			wantAccesses := bpf.AccessCounts{Total: 3 * deviceChunks, Bytes: did["h2d"] + did["d2h"] + did["d2d"]}
			if sum.Accesses != wantAccesses {
				t.Errorf("accesses = %+v, want %+v", sum.Accesses, wantAccesses)
			}

			checkIntervals(t, res.Stdout, sum)
		})
	}
}

// intervalLine is the part of a --json interval line checked here.
type intervalLine struct {
	IntervalS       float64            `json:"interval_s"`
	AllocsPerS      float64            `json:"allocs_per_s"`
	FreesPerS       float64            `json:"frees_per_s"`
	PoolHitRate     *float64           `json:"pool_hit_rate"`
	MemcpyBytesPerS map[string]float64 `json:"memcpy_bytes_per_s"`
	SpillBytes      uint64             `json:"spill_bytes"`
	PromoteBytes    uint64             `json:"promote_bytes"`
	PageFaults      bpf.FaultCounts    `json:"page_faults"`
	Refusals        uint64             `json:"refusals"`
	Drops           uint64             `json:"drops"`
	Calls           map[string]uint64  `json:"calls"`
	Steps           uint64             `json:"steps"`
	MovedBytes      uint64             `json:"moved_bytes"`
	Accesses        bpf.AccessCounts   `json:"accesses"`
}

// checkIntervals adds up the --json interval lines and compares them with
// the totals: every figure of the live view, as rates or counts.
func checkIntervals(t *testing.T, stdout string, sum *bpf.Summary) {
	t.Helper()
	var (
		lines                    int
		allocs, frees            float64
		copied                   = map[string]float64{}
		spill, promote, refusals uint64
		faults                   bpf.FaultCounts
		rated                    bool
		last                     intervalLine
		calls                    = map[string]uint64{}
		steps, moved             uint64
		accesses                 bpf.AccessCounts
	)
	for _, l := range strings.Split(stdout, "\n") {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var iv intervalLine
		if err := json.Unmarshal([]byte(l), &iv); err != nil {
			t.Fatalf("interval line %q: %v", l, err)
		}
		lines++
		allocs += iv.AllocsPerS * iv.IntervalS
		frees += iv.FreesPerS * iv.IntervalS
		for k, v := range iv.MemcpyBytesPerS {
			copied[k] += v * iv.IntervalS
		}
		spill += iv.SpillBytes
		promote += iv.PromoteBytes
		refusals += iv.Refusals
		faults.Total += iv.PageFaults.Total
		faults.Spilled += iv.PageFaults.Spilled
		rated = rated || iv.PoolHitRate != nil
		last = iv
		for k, v := range iv.Calls {
			calls[k] += v
		}
		steps += iv.Steps
		moved += iv.MovedBytes
		accesses.Total += iv.Accesses.Total
		accesses.Spilled += iv.Accesses.Spilled
		accesses.Bytes += iv.Accesses.Bytes
		accesses.SpilledBytes += iv.Accesses.SpilledBytes
	}
	if lines == 0 {
		t.Fatal("no interval lines")
	}
	near := func(got float64, want uint64) bool { return math.Abs(got-float64(want)) < 0.5 }
	if !near(allocs, sum.CallsOf(bpf.OpAlloc)) || !near(frees, sum.CallsOf(bpf.OpFree)) {
		t.Errorf("intervals add up to %.1f allocations and %.1f frees, want %d and %d",
			allocs, frees, sum.CallsOf(bpf.OpAlloc), sum.CallsOf(bpf.OpFree))
	}
	for k, v := range sum.MemcpyBytes {
		if !near(copied[k], v) {
			t.Errorf("intervals add up to %.1f %s bytes, want %d", copied[k], k, v)
		}
	}
	if spill != sum.SpillBytes || promote != sum.PromoteBytes || faults != sum.PageFaults || refusals != sum.Pool.Refusals {
		t.Errorf("intervals add up to spill %d, promote %d, faults %+v, refusals %d; totals %d, %d, %+v, %d",
			spill, promote, faults, refusals, sum.SpillBytes, sum.PromoteBytes, sum.PageFaults, sum.Pool.Refusals)
	}
	maps.DeleteFunc(calls, func(_ string, n uint64) bool { return n == 0 })
	if !maps.Equal(calls, sum.Calls) || steps != sum.Steps || moved != sum.MovedBytes || accesses != sum.Accesses {
		t.Errorf("intervals add up to calls %v, steps %d, moved %d, accesses %+v; totals %v, %d, %d, %+v",
			calls, steps, moved, accesses, sum.Calls, sum.Steps, sum.MovedBytes, sum.Accesses)
	}
	if !rated || last.Drops != sum.Drops {
		t.Errorf("pool hit rate shown: %v; last line's drops %d, total %d", rated, last.Drops, sum.Drops)
	}
}

// A request the quota cannot hold (no oversubscription) is refused, and the
// refusal is counted from the shim's refuse probe point: live, on the
// Prometheus endpoint while the program is still running, and in the
// summary, as the report line counts it.
func TestTraceQuotaRefusalShim(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	workload := oversubWorkload(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "go-on")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	summary := filepath.Join(dir, "summary.json")
	// The program is refused, then its shell waits on the fifo, so that the
	// live figures can be read before the session ends.
	script := fmt.Sprintf("%s refuse 10 && read line < %s", workload, fifo)
	cmd := harness.Command(t, spillway, "trace", "--interval", "50ms", "--metrics-addr", "127.0.0.1:0",
		"--summary-json", summary, "--", "sh", "-c", script)
	harness.SetEnv(cmd, "SPILLWAY_MEMORY_LIMIT=16MiB", "SPILLWAY_REPORT=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stdout strings.Builder
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			cmd.Process.Kill()
		}
	}()
	var log strings.Builder
	addr := make(chan string, 1)
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if a, ok := strings.CutPrefix(sc.Text(), "spillway trace: serving metrics at "); ok {
				addr <- a
			}
		}
		close(addr)
	}()
	url, ok := <-addr
	if !ok {
		cmd.Wait()
		<-logDone
		t.Fatalf("the tracer announced no metrics address:\n%s", log.String())
	}
	// Poll until the program's last call, the cudaFree after the refusal,
	// shows (records are read in the order they were made); a minute is far
	// more than it needs.
	var metrics string
	for deadline := time.Now().Add(time.Minute); ; {
		metrics = scrape(t, url)
		if strings.Contains(metrics, `spillway_trace_calls_total{function="cudaFree"} 1`) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{
		"\nspillway_trace_quota_refusals_total 1\n",
		`spillway_trace_call_errors_total{function="cudaMalloc"} 1` + "\n",
		`spillway_trace_calls_total{function="cudaMalloc"} 2` + "\n",
		`spillway_trace_pool_allocations_total{source="device"} 1` + "\n",
		"\nspillway_trace_dropped_records_total 0\n",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("live metrics lack %q:\n%s", want, metrics)
		}
	}

	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("go on\n")
	f.Close()
	released = true
	werr := cmd.Wait()
	<-logDone
	if werr != nil {
		t.Fatalf("trace: %v\nstdout:\n%s\nstderr:\n%s", werr, stdout.String(), log.String())
	}
	sum := readSummary(t, summary)
	rep := reportLine(t, log.String())
	if sum.Pool.Refusals != 1 || rep["refused"] != 1 || sum.Pool.RefusedBytes != 10<<20 {
		t.Errorf("refusals %d of %d bytes, report refused=%d; want 1 of %d bytes", sum.Pool.Refusals, sum.Pool.RefusedBytes, rep["refused"], 10<<20)
	}
	if sum.Errors["cudaMalloc"] != 1 || sum.Calls["cudaMalloc"] != 2 || sum.Drops != 0 {
		t.Errorf("calls %v, errors %v, drops %d; want 2 cudaMalloc, 1 failed", sum.Calls, sum.Errors, sum.Drops)
	}
	// The plain view shows the refusal in one of its lines.
	if !strings.Contains(stdout.String(), " refusals=1 ") {
		t.Errorf("no interval line shows the refusal:\n%s", stdout.String())
	}
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s, %v", url, resp.Status, err)
	}
	return string(body)
}

// TestTraceVMMOnHost: physical memory a program asks through cuMemCreate
// beyond the quota, placed on the host under oversubscription, is spilled
// memory to a tracing session: each mapping of it is a spill (and its unmap
// a free), and the program's copies over it are spilled accesses. The
// program is the shim tests' scripted driver client: it grows a reserved
// range by 12 granules under an 8-granule quota, copies over all of them
// and back, then releases them.
func TestTraceVMMOnHost(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"../shimtest/testdata/ctxvmm.c"}, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda", "-lnvidia-ml"}})
	summary := filepath.Join(t.TempDir(), "summary.json")
	cmd := harness.Command(t, spillway, "trace", "--summary-json", summary, "--",
		prog, "r", "1G", "g", "12", "w", "s", "12")
	harness.SetEnv(cmd, "SPILLWAY_MEMORY_LIMIT=16MiB", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_VMM=0", "SPILLWAY_REPORT=1")
	res := harness.Run(t, cmd)
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "g 0 12") || !strings.Contains(res.Stdout, "w 0 0") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	sum := readSummary(t, summary)
	rep := harness.ReportFor(t, res.Stderr, 0)
	const granule = 2 << 20
	if sum.Pool.Spills != 4 || sum.SpillBytes != 4*granule || rep.SpilledTotal != 0 {
		t.Errorf("spills %d of %d bytes (report: %d spilled by the pool); want the 4 granules on the host, 8 MiB, and none",
			sum.Pool.Spills, sum.SpillBytes, rep.SpilledTotal)
	}
	if sum.Pool.Frees != 4 {
		t.Errorf("%d frees, want the 4 host granules' unmaps", sum.Pool.Frees)
	}
	// One copy to the range and one back: each ends on a host granule.
	wantAccesses := bpf.AccessCounts{Total: 2, Spilled: 2, Bytes: 2 * 12 * granule, SpilledBytes: 2 * 12 * granule}
	if sum.Accesses != wantAccesses {
		t.Errorf("accesses: %+v, want both copies of the 12 granules spilled, %+v", sum.Accesses, wantAccesses)
	}
}
