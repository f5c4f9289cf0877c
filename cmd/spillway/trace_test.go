package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/bpf"
)

func TestParseTraceFlags(t *testing.T) {
	o, err := parseTraceFlags([]string{"-p", "12", "--p", "34", "--interval", "250ms", "--summary-json", "s.json", "--", "prog", "-x", "--json"}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.pids) != 2 || o.pids[0] != 12 || o.pids[1] != 34 || o.interval != 250*time.Millisecond ||
		o.summaryPath != "s.json" || strings.Join(o.argv, " ") != "prog -x --json" || o.json {
		t.Errorf("options %+v", o)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "nothing to trace"},
		{[]string{"--interval", "0s", "-p", "1"}, `invalid --interval="0s": want a duration above zero`},
		{[]string{"--duration", "-1s", "-p", "1"}, `invalid --duration="-1s": want a duration above zero`},
		{[]string{"--interval", "soon", "-p", "1"}, `invalid --interval="soon": not a duration`},
		{[]string{"--ring-buffer", "0", "-p", "1"}, `invalid --ring-buffer="0": want a power of two from 4KiB to 2GiB`},
		{[]string{"--ring-buffer", "12KiB", "-p", "1"}, "want a power of two"},
		{[]string{"--ring-buffer", "4GiB", "-p", "1"}, "above the kernel's limit; want a power of two from 4KiB to 2GiB"},
		{[]string{"--ring-buffer", "8XB", "-p", "1"}, `invalid --ring-buffer="8XB": unknown unit`},
		{[]string{"-p", "0"}, "want a process id"},
		{[]string{"--nope", "-p", "1"}, "unknown flag --nope"},
	} {
		if _, err := parseTraceFlags(tc.args, nil, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
	// Sizes and durations are written as run's are.
	o, err = parseTraceFlags([]string{"--ring-buffer", "64MiB", "--interval", "2", "--duration", "1m", "-p", "1"}, nil, io.Discard)
	if err != nil || o.ringBuffer != 64<<20 || o.interval != 2*time.Second || o.duration != time.Minute {
		t.Errorf("options %+v, %v", o, err)
	}
}

// Every bad flag value is a usage error (exit status 2, before anything
// starts) in the project's words: the flag, the value as typed and a valid
// example.
func TestTraceFlagErrorsNameFlagValueAndExample(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--interval", "soon", "-p", "1"}, `invalid --interval="soon": not a duration`},
		{[]string{"--interval=0", "-p", "1"}, `invalid --interval="0": want a duration above zero`},
		{[]string{"--interval", "1ns", "-p", "1"}, `invalid --interval="1ns": shorter than 10ms, a refresh without pause; want 10ms or more`},
		{[]string{"--interval", "0.009", "-p", "1"}, `invalid --interval="0.009": shorter than 10ms`},
		{[]string{"--duration", "1x", "-p", "1"}, `invalid --duration="1x": not a duration`},
		{[]string{"-p", "x"}, `invalid -p="x": want a process id`},
		{[]string{"-p", "-4"}, `invalid -p="-4": want a process id`},
		{[]string{"--metrics-addr", "bogus", "-p", "1"}, `invalid --metrics-addr="bogus": want HOST:PORT`},
		{[]string{"--metrics-addr", "127.0.0.1:99999", "-p", "1"}, `invalid --metrics-addr="127.0.0.1:99999": want HOST:PORT`},
		{[]string{"--ring-buffer", "0", "-p", "1"}, `invalid --ring-buffer="0"`},
		{[]string{"--json", "false", "--", "prog"}, `invalid --json false: a switch takes its value after '='`},
	} {
		_, err := parseTraceFlags(tc.args, nil, io.Discard)
		var usage *usageErr
		if !errors.As(err, &usage) {
			t.Errorf("%q: %v, want a usage error (exit status 2)", tc.args, err)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, tc.want) || !strings.Contains(msg, "valid example: ") {
			t.Errorf("%q: %q, want one starting %q with a valid example", tc.args, msg, tc.want)
		}
	}
	// A program named as a switch's value is still a program after "--".
	if o, err := parseTraceFlags([]string{"--json", "--", "true"}, nil, io.Discard); err != nil || !o.json || len(o.argv) != 1 {
		t.Errorf("--json -- true: %+v, %v", o, err)
	}
	for _, addr := range []string{"127.0.0.1:9400", ":0", "localhost:9400", "[::1]:9400"} {
		if o, err := parseTraceFlags([]string{"--metrics-addr", addr, "-p", "1"}, nil, io.Discard); err != nil || o.metricsAddr != addr {
			t.Errorf("--metrics-addr %s: %v", addr, err)
		}
	}
}

// CMD runs under the shim with this environment, as under spillway run: a
// SPILLWAY_* setting the shim would refuse stops the session before it
// starts. A running process (-p) keeps its own environment.
func TestParseTraceFlagsChecksEnvironment(t *testing.T) {
	bad := []string{"SPILLWAY_MEMORY_LIMIT=8gigs"}
	_, err := parseTraceFlags([]string{"--", "prog"}, bad, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `SPILLWAY_MEMORY_LIMIT="8gigs"`) || !strings.Contains(err.Error(), "in the environment") {
		t.Errorf("-- prog with %q: error %v, want one naming the variable and its value", bad, err)
	}
	if _, err := parseTraceFlags([]string{"-p", "1"}, bad, io.Discard); err != nil {
		t.Errorf("-p 1 with %q: %v; the traced process's environment is its own", bad, err)
	}
	if _, err := parseTraceFlags([]string{"--", "prog"}, []string{"SPILLWAY_MEMORY_LIMIT=8GiB"}, io.Discard); err != nil {
		t.Errorf("-- prog with a valid quota: %v", err)
	}
}

func TestIntervalOf(t *testing.T) {
	prev, cur := bpf.NewSummary(), bpf.NewSummary()
	prev.Calls["cudaMalloc"], cur.Calls["cudaMalloc"] = 10, 30
	cur.Calls["cuMemAlloc_v2"] = 10
	prev.Calls["cudaFree"], cur.Calls["cudaFree"] = 5, 15
	cur.MemcpyBytes["h2d"] = 4096
	cur.Pool.CacheHits, cur.Pool.DeviceReservations = 3, 1
	cur.PageFaults = bpf.FaultCounts{Total: 9, Spilled: 4}
	cur.Drops = 2

	iv := intervalOf(prev, cur, 10, 2)
	if iv.AllocsPerS != 15 || iv.FreesPerS != 5 || iv.MemcpyBytesPerS["h2d"] != 2048 {
		t.Errorf("rates: allocs %v frees %v h2d %v", iv.AllocsPerS, iv.FreesPerS, iv.MemcpyBytesPerS["h2d"])
	}
	if iv.PoolHitRate == nil || *iv.PoolHitRate != 0.75 {
		t.Errorf("pool hit rate %v, want 0.75", iv.PoolHitRate)
	}
	if iv.PageFaults.Spilled != 4 || iv.Drops != 2 || iv.Calls["cudaMalloc"] != 20 || iv.Calls["cudaFree"] != 10 {
		t.Errorf("interval %+v", iv)
	}
	// Without pool allocations there is no hit rate, rather than 0%.
	if iv := intervalOf(prev, prev, 1, 1); iv.PoolHitRate != nil || !strings.Contains(formatLine(iv), "pool_hit=-") {
		t.Errorf("idle pool: hit rate %v, line %q", iv.PoolHitRate, formatLine(iv))
	}
}

// An interval's steps, bytes moved and accesses are what changed in it.
func TestIntervalSteps(t *testing.T) {
	prev, cur := bpf.NewSummary(), bpf.NewSummary()
	prev.Steps, cur.Steps = 3, 7
	prev.MovedBytes, cur.MovedBytes = 100, 4100
	prev.Accesses = bpf.AccessCounts{Total: 10, Spilled: 1, Bytes: 1000, SpilledBytes: 100}
	cur.Accesses = bpf.AccessCounts{Total: 30, Spilled: 6, Bytes: 3000, SpilledBytes: 1100}
	iv := intervalOf(prev, cur, 2, 1)
	if iv.Steps != 4 || iv.MovedBytes != 4000 || iv.MovedBytesPerStep == nil || *iv.MovedBytesPerStep != 1000 {
		t.Errorf("steps %d moved %d per step %v", iv.Steps, iv.MovedBytes, iv.MovedBytesPerStep)
	}
	if iv.Accesses != (bpf.AccessCounts{Total: 20, Spilled: 5, Bytes: 2000, SpilledBytes: 1000}) {
		t.Errorf("accesses %+v", iv.Accesses)
	}
	if line := formatLine(iv); !strings.Contains(line, "steps=4 moved/step=1000B spilled_accesses=25.0%") {
		t.Errorf("line %q", line)
	}
	data, err := json.Marshal(iv)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"steps":4`, `"moved_bytes":4000`, `"moved_bytes_per_step":1000`, `"spilled_fraction":0.25`, `"spilled_bytes_fraction":0.5`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("interval JSON lacks %s: %s", want, data)
		}
	}
	// Without steps there is no figure per step.
	if iv := intervalOf(prev, prev, 1, 1); iv.MovedBytesPerStep != nil || !strings.Contains(formatLine(iv), "moved/step=- spilled_accesses=-") {
		t.Errorf("idle: per step %v, line %q", iv.MovedBytesPerStep, formatLine(iv))
	}
}

// The session's last interval is marked final, even one that ran a whole
// interval or more because the session ended as a tick was due; the others
// are not.
func TestLastIntervalFinal(t *testing.T) {
	start := time.Now().Add(-3 * time.Second)
	clock := viewClock{start: start, last: start, prev: bpf.NewSummary(), every: time.Second}
	if iv := clock.next(bpf.NewSummary(), false); iv.Final {
		t.Errorf("an interval drawn at a tick is marked final: %+v", iv)
	}
	clock.last = time.Now().Add(-2 * time.Second)
	iv := clock.next(bpf.NewSummary(), true)
	if !iv.Final || iv.IntervalS < 2 {
		t.Errorf("last interval of 2s: final %v, interval_s %v; want final over the 2s", iv.Final, iv.IntervalS)
	}
	data, err := json.Marshal(iv)
	if err != nil || !strings.Contains(string(data), `"final":true`) {
		t.Errorf("last interval as JSON: %s, %v", data, err)
	}
}

func TestBytesText(t *testing.T) {
	for n, want := range map[float64]string{0: "0B", 1023: "1023B", 1024: "1.0KiB", 1536 << 20: "1.5GiB"} {
		if got := bytesText(n); got != want {
			t.Errorf("bytesText(%v) = %q, want %q", n, got, want)
		}
	}
}

func TestWriteMetrics(t *testing.T) {
	sum := bpf.NewSummary()
	sum.Calls["cudaMalloc"] = 3
	sum.MemcpyBytes["d2h"] = 700
	sum.PageFaults = bpf.FaultCounts{Total: 9, Spilled: 4}
	sum.Pool.CacheHits = 2
	sum.Drops = 1
	sum.Steps, sum.MovedBytes = 5, 8192
	sum.Accesses = bpf.AccessCounts{Total: 9, Spilled: 2, Bytes: 900, SpilledBytes: 200}
	var b strings.Builder
	writeMetrics(&b, sum)
	for _, want := range []string{
		"# TYPE spillway_trace_calls_total counter\n",
		`spillway_trace_calls_total{function="cudaMalloc"} 3` + "\n",
		`spillway_trace_memcpy_bytes_total{direction="d2h"} 700` + "\n",
		`spillway_trace_memcpy_bytes_total{direction="h2d"} 0` + "\n",
		"spillway_trace_spilled_page_faults_total 4\n",
		`spillway_trace_pool_allocations_total{source="cache"} 2` + "\n",
		`spillway_trace_pool_allocations_total{source="pass_through"} 0` + "\n",
		"spillway_trace_dropped_records_total 1\n",
		"# TYPE spillway_trace_steps_total counter\n", "spillway_trace_steps_total 5\n",
		"spillway_trace_moved_bytes_total 8192\n",
		"spillway_trace_accesses_total 9\n", "spillway_trace_spilled_accesses_total 2\n",
		"spillway_trace_access_bytes_total 900\n", "spillway_trace_spilled_access_bytes_total 200\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, b.String())
		}
	}
}

func TestDescribeEvent(t *testing.T) {
	var memcpy bpf.Func
	for _, f := range bpf.Funcs() {
		if f.String() == "cudaMemcpy" {
			memcpy = f
		}
	}
	call := describe(&bpf.Event{Kind: bpf.KindAPI, Func: memcpy, PID: 5, TID: 6, Args: [6]uint64{0xa0, 0xb0, 700, 2}})
	if call.Kind != "call" || call.Func != "cudaMemcpy" || call.Size != 700 || call.Direction != "d2h" || call.Ret == nil || *call.Ret != 0 {
		t.Errorf("memcpy record described as %+v", call)
	}
	alloc := describe(&bpf.Event{Kind: bpf.KindProbe, Probe: bpf.ProbeAlloc, Args: [6]uint64{0xd000, 4096, 1, 0, bpf.SourceCache}})
	if alloc.Probe != "alloc" || alloc.Ptr != "0xd000" || alloc.Size != 4096 || *alloc.Device != 1 || alloc.Source != "cache" {
		t.Errorf("alloc probe described as %+v", alloc)
	}
	// Sources are spelt as the summary's keys and the Prometheus labels are.
	for source, want := range map[uint64]string{bpf.SourceCache: "cache", bpf.SourceDevice: "device", bpf.SourcePassThrough: "pass_through"} {
		e := &bpf.Event{Kind: bpf.KindProbe, Probe: bpf.ProbeAlloc, Args: [6]uint64{0xd000, 4096, 0, 0, source}}
		if got := describe(e).Source; got != want {
			t.Errorf("source %d described as %q, want %q", source, got, want)
		}
		if line := string(newEventPrinter(io.Discard, false, false).format(e)); !strings.Contains(line, " source="+want+" ") {
			t.Errorf("source %d in the text record %q, want source=%s", source, line, want)
		}
	}
	var memset bpf.Func
	for _, f := range bpf.Funcs() {
		if f.String() == "cudaMemsetAsync" {
			memset = f
		}
	}
	set := describe(&bpf.Event{Kind: bpf.KindAPI, Func: memset, Args: [6]uint64{0xd000, 0, 64, 7}, Flags: 1})
	if set.Func != "cudaMemsetAsync" || set.Ptr != "0xd000" || set.Size != 64 || !set.Spilled || set.Direction != "" {
		t.Errorf("memset record described as %+v", set)
	}
	fault := describe(&bpf.Event{Kind: bpf.KindFault, Args: [6]uint64{0x7000}, Flags: 1})
	if fault.Kind != "fault" || fault.Address != "0x7000" || !fault.Spilled {
		t.Errorf("fault described as %+v", fault)
	}
}

// TestMetricsAddrHost: a host that is neither an IP address nor a host name
// is refused before anything starts, as a bad port is, where listening
// failed once the session had attached (exit status 1).
func TestMetricsAddrHost(t *testing.T) {
	for _, tc := range []struct{ addr, host string }{
		{"1.2.3.4.5:9400", "1.2.3.4.5"},
		{"256.1.1.1:9400", "256.1.1.1"},
		{" :9400", " "},
		{"local host:9400", "local host"},
		{"-bad.example:9400", "-bad.example"},
		{"bad-:9400", "bad-"},
		{"[::1%]:9400", "::1%"},
	} {
		want := fmt.Sprintf(`invalid --metrics-addr=%q: the host %q is neither an IP address nor a host name; want HOST:PORT, with a port from 0 to 65535 (valid example: --metrics-addr 127.0.0.1:9400)`,
			tc.addr, tc.host)
		for cmd, err := range map[string]error{
			"trace": func() error {
				_, err := parseTraceFlags([]string{"--metrics-addr", tc.addr, "-p", "1"}, nil, io.Discard)
				return err
			}(),
			"stat": func() error { _, err := parseStatFlags([]string{"--metrics-addr", tc.addr}, io.Discard); return err }(),
		} {
			var usage *usageErr
			if !errors.As(err, &usage) || err.Error() != want {
				t.Errorf("%s --metrics-addr %q: %v, want the usage error %q", cmd, tc.addr, err, want)
			}
		}
	}
	for _, addr := range []string{"localhost:9400", "node-1.cluster.local.:9400", "[fe80::1%eth0]:9400", "0.0.0.0:http", ":0", "[::]:9400"} {
		if err := checkListenAddr("--metrics-addr", addr); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
}

// TestTraceLibNeedsCommand: --lib is the shim CMD is started under; with
// -p alone nothing is started, and a --lib meant for the traced processes
// would be ignored without a word.
func TestTraceLibNeedsCommand(t *testing.T) {
	// The shim as built, where it is built: refused all the same.
	lib, err := filepath.Abs(filepath.Join("..", "..", "build", "lib", "libspillway.so"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = parseTraceFlags([]string{"--lib", lib, "-p", "1"}, nil, io.Discard)
	want := fmt.Sprintf("--lib %s is the shim to start CMD under, but no CMD is given: -p traces a process as it runs (valid example: --lib %s -- CMD ARGS)", lib, lib)
	var usage *usageErr
	if !errors.As(err, &usage) || err.Error() != want {
		t.Errorf("trace --lib %s -p 1: %v, want the usage error %q", lib, err, want)
	}
}

// TestDashIsNoFile: "-", which many tools read as standard output, is
// refused as a file name, where the view or the totals went to a file
// called "-"; a file of that name is ./-.
func TestDashIsNoFile(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--output", "-", "-p", "1"}, `invalid --output="-": want the FILE to write to; standard output is where the view goes without --output, and a file called "-" is ./- (valid example: --output trace.txt)`},
		{[]string{"--summary-json=-", "-p", "1"}, `invalid --summary-json="-": want the FILE to write to; the totals go to a file only, and a file called "-" is ./- (valid example: --summary-json totals.json)`},
	} {
		_, err := parseTraceFlags(tc.args, nil, io.Discard)
		var usage *usageErr
		if !errors.As(err, &usage) || err.Error() != tc.want {
			t.Errorf("trace %q: %v, want the usage error %q", tc.args, err, tc.want)
		}
	}
	if o, err := parseTraceFlags([]string{"--output", "./-", "--summary-json", "./-.json", "-p", "1"}, nil, io.Discard); err != nil || o.output != "./-" {
		t.Errorf("trace --output ./- --summary-json ./-.json: %+v, %v", o, err)
	}
}

// TestSummaryIsNotStandardOutputsFile: without --output the view goes to
// standard output; where that is the file --summary-json names (> out.txt
// with --summary-json out.txt), the totals would replace the view.
func TestSummaryIsNotStandardOutputsFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "out.txt")
	stdout, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	saved := os.Stdout
	os.Stdout = stdout
	_, err = parseTraceFlags([]string{"--summary-json", file, "-p", "1"}, nil, io.Discard)
	_, withOutput := parseTraceFlags([]string{"--summary-json", file, "--output", file + ".view", "-p", "1"}, nil, io.Discard)
	os.Stdout = saved
	want := fmt.Sprintf("--summary-json %s is standard output's file, where the view goes without --output: the totals would replace the view", file)
	var usage *usageErr
	if !errors.As(err, &usage) || err.Error() != want {
		t.Errorf("trace --summary-json %s > %s: %v, want the usage error %q", file, file, err, want)
	}
	if withOutput != nil {
		t.Errorf("trace --summary-json %s --output %s.view > %s: %v", file, file, file, withOutput)
	}
}
