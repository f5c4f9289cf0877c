package tracetest

import (
	"encoding/json"
	"fmt"
	"maps"
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

// The figures an operator reads from --summary-json and the Prometheus
// endpoint, each checked against what the program did, the shim's
// SPILLWAY_REPORT line or simcuda: not only that the key is there.

// The pool's classes of allocation are the shim's own: with the pool on,
// cache hits and device reservations as the report counts them; with it off
// (SPILLWAY_POOL=0), pass-throughs as it counts them; either way the
// program's one cudaMallocManaged as managed, and every allocation freed;
// the same in the summary and on the Prometheus endpoint.
func TestTracePoolSourcesMatchReport(t *testing.T) {
	harness.RequireBPF(t)
	prog := harness.Compile(t, harness.CBuild{
		Sources: []string{"testdata/apis.c"}, Cudart: true, ProjectHeaders: true, Flags: []string{"-lcuda"},
	})
	for _, pool := range []string{"1", "0"} {
		t.Run("SPILLWAY_POOL="+pool, func(t *testing.T) {
			// The program's last call is its fourth cudaFree.
			run := scrapeAfterRun(t, []string{"SPILLWAY_POOL=" + pool, "SPILLWAY_REPORT=1"},
				`calls_total{function="cudaFree"}`, 4, prog)
			sum, rep := run.summary, harness.ReportFor(t, run.stderr, 0)
			p := sum.Pool
			if p.CacheHits != rep.CacheHits || p.DeviceReservations != rep.DeviceReservations || p.PassThrough != rep.PassThrough {
				t.Errorf("pool cache_hits %d, device_reservations %d, pass_through %d; report %d, %d, %d",
					p.CacheHits, p.DeviceReservations, p.PassThrough, rep.CacheHits, rep.DeviceReservations, rep.PassThrough)
			}
			if served := rep.CacheHits + rep.DeviceReservations + rep.PassThrough; served == 0 ||
				(pool == "0") != (rep.PassThrough == served) {
				t.Errorf("the report shows %d served, %d passed through, with SPILLWAY_POOL=%s", served, rep.PassThrough, pool)
			}
			if p.ManagedAllocs != 1 || p.SpilledAllocs != 0 {
				t.Errorf("managed_allocs %d, spilled_allocs %d; want the program's one cudaMallocManaged, none spilled",
					p.ManagedAllocs, p.SpilledAllocs)
			}
			if p.Allocs != p.CacheHits+p.DeviceReservations+p.PassThrough+p.ManagedAllocs || p.Frees != p.Allocs {
				t.Errorf("pool %+v: want every allocation in one class, and each freed", p)
			}
			if p.Syncs != rep.Syncs+rep.ExternalSyncs {
				t.Errorf("pool.syncs %d, want the report's syncs + external_syncs, %d", p.Syncs, rep.Syncs+rep.ExternalSyncs)
			}
			served := map[string]uint64{}
			for k, v := range run.metrics {
				if strings.HasPrefix(k, "pool_allocations_total{") || k == "pool_frees_total" {
					served[k] = v
				}
			}
			checkMetrics(t, served, map[string]uint64{
				`pool_allocations_total{source="cache"}`:        rep.CacheHits,
				`pool_allocations_total{source="device"}`:       rep.DeviceReservations,
				`pool_allocations_total{source="spilled"}`:      0,
				`pool_allocations_total{source="pass_through"}`: rep.PassThrough,
				`pool_allocations_total{source="managed"}`:      1,
				"pool_frees_total":                              p.Allocs,
			})
		})
	}
}

// metricValues parses Prometheus text into values by series, without the
// spillway_trace_ prefix: `calls_total{function="cudaMalloc"}`.
func metricValues(t *testing.T, text string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		n, err := strconv.ParseUint(value, 10, 64)
		if !ok || err != nil || !strings.HasPrefix(series, "spillway_trace_") {
			t.Fatalf("metrics line %q", line)
		}
		out[strings.TrimPrefix(series, "spillway_trace_")] = n
	}
	return out
}

// Every counter the Prometheus endpoint serves, read live once an
// oversubscribed program under the shim has made its last call, is what the
// program did and what the shim's report says: with managed spilling the
// spilled chunks are promoted back, with pinned they never are.
func TestTraceMetricsMatchShim(t *testing.T) {
	harness.RequireBPF(t)
	workload := oversubWorkload(t)
	for _, spill := range []string{"managed", "pinned"} {
		t.Run(spill, func(t *testing.T) { testMetricsMatchShim(t, workload, spill) })
	}
}

// scrapedRun is what scrapeAfterRun saw.
type scrapedRun struct {
	metrics map[string]uint64 // the endpoint, once the program had made its last call
	stdout  string            // the program's
	stderr  string            // the tracer's and the program's
	summary *bpf.Summary      // --summary-json
}

// scrapeAfterRun runs argv under `spillway trace --metrics-addr` with the
// "K=V" entries of env, and reads the endpoint once the series last has
// reached n: records are read in the order they were made, so the
// program's last call counted means all its figures are. A shell keeps the
// session open after the program has exited, until the endpoint is read.
func scrapeAfterRun(t *testing.T, env []string, last string, n uint64, argv ...string) scrapedRun {
	t.Helper()
	dir := t.TempDir()
	fifo, printed, summary := filepath.Join(dir, "go-on"), filepath.Join(dir, "printed"), filepath.Join(dir, "summary.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	script := `"$@" > ` + printed + ` && read line < ` + fifo
	tracer, log := startTracerEnv(t, env, append([]string{"--metrics-addr", "127.0.0.1:0", "--summary-json", summary, "--", "sh", "-c", script, "sh"}, argv...)...)
	var url string
	for _, l := range strings.Split(log.String(), "\n") {
		if a, ok := strings.CutPrefix(l, "spillway trace: serving metrics at "); ok {
			url = a
		}
	}
	if url == "" {
		t.Fatalf("the tracer announced no metrics address:\n%s", log.String())
	}
	var run scrapedRun
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		run.metrics = metricValues(t, scrape(t, url))
		if run.metrics[last] == n || time.Now().After(deadline) {
			break
		}
	}
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("go on\n")
	f.Close()
	if err := harness.WaitWithin(t, tracer, time.Minute); err != nil {
		t.Fatalf("spillway trace: %v\n%s", err, log.whole())
	}
	out, err := os.ReadFile(printed)
	if err != nil {
		t.Fatal(err)
	}
	run.stdout, run.stderr = string(out), log.whole()
	run.summary = readSummary(t, summary)
	return run
}

// checkMetrics compares the series served with want, every one of them.
func checkMetrics(t *testing.T, got, want map[string]uint64) {
	t.Helper()
	for k, v := range want {
		if n, ok := got[k]; !ok || n != v {
			t.Errorf("%s = %d (served: %v), want %d", k, n, ok, v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s = %d served, want no such series", k, v)
		}
	}
}

func testMetricsMatchShim(t *testing.T, workload, spill string) {
	const chunks, chunkMiB = 8, 4
	// The program's last call is its fourth cudaDeviceSynchronize.
	run := scrapeAfterRun(t,
		[]string{"SPILLWAY_MEMORY_LIMIT=16MiB", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_SPILL=" + spill, "SPILLWAY_REPORT=1"},
		`calls_total{function="cudaDeviceSynchronize"}`, 4,
		workload, "spill", strconv.Itoa(chunks), strconv.Itoa(chunkMiB))
	got := run.metrics
	did := printedCounts(t, run.stdout, "spilled_chunks")
	rep := reportLine(t, run.stderr)
	if did["spilled_chunks"] == 0 || (rep["promoted_total"] > 0) != (spill == "managed") {
		t.Fatalf("spilled and promoted with %s spilling: program %v, report %v", spill, did, rep)
	}

	deviceChunks := chunks - did["spilled_chunks"]
	want := map[string]uint64{
		`calls_total{function="cudaMalloc"}`:            50 + chunks,
		`calls_total{function="cudaFree"}`:              50 + chunks,
		`calls_total{function="cudaDeviceSynchronize"}`: 4,
		`calls_total{function="cudaMemcpy"}`:            3 * deviceChunks,
		`memcpy_bytes_total{direction="h2d"}`:           did["h2d"],
		`memcpy_bytes_total{direction="d2h"}`:           did["d2h"],
		`memcpy_bytes_total{direction="d2d"}`:           did["d2d"],
		`memcpy_bytes_total{direction="default"}`:       0,
		`memcpy_bytes_total{direction="h2h"}`:           0,
		"alloc_bytes_total":                             50<<20 + chunks*chunkMiB<<20,
		"page_faults_total":                             got["page_faults_total"], // the program's and the shell's
		"spilled_page_faults_total":                     did["touched_pages"],
		"spill_bytes_total":                             rep["spilled_total"],
		"promote_bytes_total":                           rep["promoted_total"],
		`pool_allocations_total{source="cache"}`:        rep["cache_hits"],
		`pool_allocations_total{source="device"}`:       rep["device_reservations"],
		`pool_allocations_total{source="spilled"}`:      did["spilled_chunks"],
		`pool_allocations_total{source="pass_through"}`: rep["pass_through"],
		`pool_allocations_total{source="managed"}`:      0,
		"pool_frees_total":                              50 + chunks,
		"quota_refusals_total":                          rep["refused"],
		"dropped_records_total":                         0,
		"steps_total":                                   4,
		"moved_bytes_total":                             rep["spilled_total"] + rep["promoted_total"],
		"accesses_total":                                3 * deviceChunks,
		"access_bytes_total":                            did["h2d"] + did["d2h"] + did["d2d"],
		"spilled_accesses_total":                        0,
		"spilled_access_bytes_total":                    0,
	}
	checkMetrics(t, got, want)
	if got["page_faults_total"] < did["touched_pages"] {
		t.Errorf("page_faults_total %d, fewer than the %d faults on spilled memory", got["page_faults_total"], did["touched_pages"])
	}
}

// A command that makes no CUDA call and exits at once is traced all the
// same: the session ends with it, with its status, and the summary holds
// every documented key, at zero, null where a ratio has no denominator, and
// the process with its exit.
func TestTraceCommandWithoutCUDA(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	summary := filepath.Join(t.TempDir(), "summary.json")
	res := harness.Run(t, harness.Command(t, spillway, "trace", "--summary-json", summary, "--", "sh", "-c", "exit 3"))
	if res.ExitCode != 3 {
		t.Fatalf("exit %d, want the command's 3\nstderr:\n%s", res.ExitCode, res.Stderr)
	}
	data, err := os.ReadFile(summary)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Calls             map[string]uint64 `json:"calls"`
		Errors            map[string]uint64 `json:"errors"`
		MemcpyBytes       map[string]uint64 `json:"memcpy_bytes"`
		PrefetchBytes     *uint64           `json:"prefetch_bytes"`
		AllocBytes        *uint64           `json:"alloc_bytes"`
		Pool              map[string]uint64 `json:"pool"`
		Steps             *uint64           `json:"steps"`
		MovedBytes        *uint64           `json:"moved_bytes"`
		MovedBytesPerStep *float64          `json:"moved_bytes_per_step"`
		Accesses          map[string]*float64
		Processes         map[string]struct {
			Calls  uint64 `json:"calls"`
			Exited bool   `json:"exited"`
		} `json:"processes"`
		Drops                *uint64 `json:"drops"`
		UVMTraced            *bool   `json:"uvm_traced"`
		UVMUnavailableReason string  `json:"uvm_unavailable_reason"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("summary %s: %v", data, err)
	}
	zeroCopies := map[string]uint64{"h2d": 0, "d2h": 0, "d2d": 0, "default": 0, "h2h": 0}
	if doc.Calls == nil || len(doc.Calls) != 0 || doc.Errors == nil || len(doc.Errors) != 0 || !maps.Equal(doc.MemcpyBytes, zeroCopies) {
		t.Errorf("calls %v, errors %v, memcpy_bytes %v; want none, none and all five directions at 0", doc.Calls, doc.Errors, doc.MemcpyBytes)
	}
	for name, v := range map[string]*uint64{"prefetch_bytes": doc.PrefetchBytes, "alloc_bytes": doc.AllocBytes,
		"steps": doc.Steps, "moved_bytes": doc.MovedBytes, "drops": doc.Drops} {
		if v == nil || *v != 0 {
			t.Errorf("%s = %v, want 0:\n%s", name, v, data)
		}
	}
	for _, key := range []string{"allocs", "cache_hits", "device_reservations", "spilled_allocs", "pass_through",
		"managed_allocs", "frees", "syncs", "sync_reusable_bytes", "spills", "promotes", "refusals", "refused_bytes"} {
		if n, ok := doc.Pool[key]; !ok || n != 0 {
			t.Errorf("pool.%s = %d (present: %v), want 0", key, n, ok)
		}
	}
	if doc.MovedBytesPerStep != nil {
		t.Errorf("moved_bytes_per_step = %v without steps, want null", *doc.MovedBytesPerStep)
	}
	for _, key := range []string{"spilled_fraction", "spilled_bytes_fraction"} {
		if v, ok := doc.Accesses[key]; !ok || v != nil {
			t.Errorf("accesses.%s = %v (present: %v) without accesses, want null", key, v, ok)
		}
	}
	if len(doc.Processes) != 1 {
		t.Errorf("processes %v, want the command's one", doc.Processes)
	}
	for pid, p := range doc.Processes {
		if p.Calls != 0 || !p.Exited || !strings.Contains(res.Stderr, "tracing pid "+pid+" (sh)") {
			t.Errorf("process %s: %+v; want the traced sh, with no call, exited", pid, p)
		}
	}
	// No nvidia-uvm here (no kprobes, no module): said, and why.
	if doc.UVMTraced == nil || *doc.UVMTraced || doc.UVMUnavailableReason == "" ||
		!strings.Contains(res.Stderr, doc.UVMUnavailableReason) {
		t.Errorf("uvm_traced %v, uvm_unavailable_reason %q; want false and the reason said on standard error:\n%s",
			doc.UVMTraced, doc.UVMUnavailableReason, res.Stderr)
	}
}

// waitForContents waits, a minute at most, until the file at path holds
// exactly want: a job's word that it reached a point.
func waitForContents(t *testing.T, path, want string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if data, _ := os.ReadFile(path); string(data) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never held %q", path, want)
		}
	}
}

// SIGINT to `spillway trace -- CMD` (^C where the tracer alone gets it) is
// passed on to CMD, as `spillway run` does: a job that catches it goes on,
// traced to its end, and one that does not ends by it, with the status a
// shell gives (128+2). Either way the summary is written.
func TestTraceCommandInterrupted(t *testing.T) {
	harness.RequireBPF(t)
	workload := simWorkload(t)
	t.Run("caught", func(t *testing.T) {
		dir := t.TempDir()
		summary, said := filepath.Join(dir, "summary.json"), filepath.Join(dir, "said")
		script := fmt.Sprintf(`trap 'echo interrupted > %[1]s' INT; echo ready > %[1]s; sleep 1; %[2]s %[3]d`,
			said, workload, simRounds)
		tracer, log := startTracer(t, "--summary-json", summary, "--", "sh", "-c", script)
		// Interrupted once the trap is set, while the shell waits for sleep.
		waitForContents(t, said, "ready\n")
		if err := tracer.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if err := harness.WaitWithin(t, tracer, time.Minute); err != nil {
			t.Fatalf("spillway trace: %v\n%s", err, log.whole())
		}
		if data, err := os.ReadFile(said); err != nil || string(data) != "interrupted\n" {
			t.Errorf("the job's trap ran: %q, %v; want SIGINT passed on", data, err)
		}
		checkSimSummary(t, readSummary(t, summary))
	})
	t.Run("not caught", func(t *testing.T) {
		dir := t.TempDir()
		summary, said := filepath.Join(dir, "summary.json"), filepath.Join(dir, "said")
		// The job says "copying" once its first round of calls is done.
		tracer, log := startTracer(t, "--summary-json", summary, "--", "sh", "-c",
			fmt.Sprintf("exec %s copies > %s", workload, said))
		waitForContents(t, said, "copying\n")
		if err := tracer.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		err := harness.WaitWithin(t, tracer, time.Minute)
		if code := tracer.ProcessState.ExitCode(); code != 128+int(syscall.SIGINT) {
			t.Fatalf("spillway trace exited %d (%v), want %d\n%s", code, err, 128+int(syscall.SIGINT), log.whole())
		}
		sum := readSummary(t, summary)
		if sum.Calls["cudaMalloc"] == 0 || otherCalls(sum) != 0 {
			t.Errorf("calls %v; want the job's cudaMalloc, cudaMemcpy and cudaFree until it was interrupted", sum.Calls)
		}
		for pid, p := range sum.Processes {
			if !p.Exited {
				t.Errorf("process %s not seen to exit: %+v", pid, p)
			}
		}
	})
}

// Records the ring buffer could not hold are counted, not hidden: a
// program makes its calls while the session, on a one-page buffer, is
// stopped (SIGSTOP) and reads nothing, and the summary and the last --json
// interval say how many records were dropped; what was read and what was
// dropped add up to at least the program's calls.
func TestTraceDropsReported(t *testing.T) {
	harness.RequireBPF(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	target := harness.Command(t, simWorkload(t), "-w", "3", strconv.Itoa(simRounds))
	target.ExtraFiles = []*os.File{r}
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	t.Cleanup(func() {
		if target.ProcessState == nil {
			target.Process.Kill()
			target.Wait()
		}
	})
	dir := t.TempDir()
	summary, view := filepath.Join(dir, "summary.json"), filepath.Join(dir, "view.json")
	tracer, log := startTracer(t, "-p", pidKey(target.Process.Pid), "--ring-buffer", strconv.Itoa(os.Getpagesize()),
		"--json", "--output", view, "--summary-json", summary)
	if err := tracer.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); !stopped(tracer.Process.Pid) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	w.Write([]byte{1})
	if err := target.Wait(); err != nil {
		t.Fatalf("workload: %v", err)
	}
	if err := tracer.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := harness.WaitWithin(t, tracer, time.Minute); err != nil {
		t.Fatalf("spillway trace: %v\n%s", err, log.whole())
	}
	sum := readSummary(t, summary)
	var read uint64
	for _, n := range sum.Calls {
		read += n
	}
	if sum.Drops == 0 || read+sum.Drops < 13*simRounds {
		t.Errorf("read %d calls and dropped %d records, want drops, and at least the program's %d calls", read, sum.Drops, 13*simRounds)
	}
	data, err := os.ReadFile(view)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var last struct {
		Final bool   `json:"final"`
		Drops uint64 `json:"drops"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || !last.Final || last.Drops != sum.Drops {
		t.Errorf("last interval %q (%v): want final, with the summary's %d drops", lines[len(lines)-1], err, sum.Drops)
	}
}

// stopped reports whether the process pid is stopped by a signal.
func stopped(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(data), ") ")
	return ok && strings.HasPrefix(rest, "T")
}
