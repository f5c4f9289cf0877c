package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/bpf"
	"github.com/spillway-gpu/spillway/internal/stat"
	"github.com/spillway-gpu/spillway/tests/harness"
)

func TestFlagMessage(t *testing.T) {
	for in, want := range map[string]string{
		`invalid value "8XB" for flag -memory-limit: invalid --memory-limit="8XB": unknown unit`: `invalid --memory-limit="8XB": unknown unit`,
		`flag provided but not defined: -nope`:                                                   `unknown flag --nope`,
		`flag provided but not defined: --nope`:                                                  `unknown flag --nope`,
		`invalid value "soon" for flag -interval: "soon" is not a duration`:                      `invalid value "soon" for flag --interval: "soon" is not a duration`,
		`invalid boolean value "0" for -watch: "0": want a duration above zero`:                  `invalid --watch="0": want a duration above zero`,
		`flag needs an argument: -lib`:                                                           `flag needs an argument: --lib`,
		`invalid value "x" for flag -p: want a process id`:                                       `invalid value "x" for flag -p: want a process id`,
	} {
		if got := flagMessage(in); got != want {
			t.Errorf("flagMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"1s": time.Second, "250ms": 250 * time.Millisecond, "2": 2 * time.Second, "0.5": 500 * time.Millisecond,
		"1.0": time.Second, "2.50": 2500 * time.Millisecond, "10": 10 * time.Second} {
		if got, err := parseDuration("--interval", in); err != nil || got != want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"0", "0s", "-1s", "soon", "1x", "", "0.0", "NaN", "Inf", "1e3", "99999999999"} {
		if _, err := parseDuration("--interval", bad); err == nil {
			t.Errorf("parseDuration(%q) accepted", bad)
		}
	}
	// Past the longest duration, in either form, the value is too long, not
	// something else: 9223372036.854775807 s rounds to 2⁶³ ns.
	for _, long := range []string{"99999999999", "9223372036.854775807", "2562048h", "+9999999999999s", "2562047h48m"} {
		if _, err := parseDuration("--interval", long); err == nil || !strings.Contains(err.Error(), "too long; want at most 2562047h") {
			t.Errorf("parseDuration(%q): %v, want it refused as too long", long, err)
		}
	}
}

func TestStatFlags(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		watch time.Duration
		json  bool
	}{
		{nil, 0, false},
		{[]string{"--watch"}, time.Second, false},
		{[]string{"--watch", "2s", "--json"}, 2 * time.Second, true},
		{[]string{"--watch=500ms"}, 500 * time.Millisecond, false},
		{[]string{"--json", "--watch"}, time.Second, true},
	} {
		o, err := parseStatFlags(tc.args, &bytes.Buffer{})
		if err != nil || o.watch != tc.watch || o.json != tc.json {
			t.Errorf("%q: %+v, %v; want watch %v json %v", tc.args, o, err, tc.watch, tc.json)
		}
	}
	for _, bad := range [][]string{{"--watch", "0"}, {"--watch=soon"}, {"extra"}, {"--json", "--metrics-addr", ":0"}} {
		if _, err := parseStatFlags(bad, &bytes.Buffer{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// A bad value is named with its flag and a valid example, as run's are.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--watch=soon"}, `invalid --watch="soon": not a duration such as 500ms, 1s or 2m (valid example: --watch 500ms)`},
		{[]string{"--watch", "1us"}, `invalid --watch="1us": shorter than 10ms, a refresh without pause; want 10ms or more (valid example: --watch 500ms)`},
		{[]string{"--metrics-addr", "bogus"}, `invalid --metrics-addr="bogus": want HOST:PORT, with a port from 0 to 65535 (valid example: --metrics-addr 127.0.0.1:9400)`},
	} {
		_, err := parseStatFlags(tc.args, &bytes.Buffer{})
		var usage *usageErr
		if !errors.As(err, &usage) || err.Error() != tc.want {
			t.Errorf("%q: %v, want the usage error %q", tc.args, err, tc.want)
		}
	}
	// An interval that is not above zero is refused as one.
	for _, bad := range []string{"0", "-1s"} {
		_, err := parseStatFlags([]string{"--watch", bad}, &bytes.Buffer{})
		if want := fmt.Sprintf("invalid --watch=%q: want a duration above zero", bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--watch %s: %v, want an error containing %q", bad, err, want)
		}
	}
}

// The last, partial interval's rates are its counts over a whole interval,
// not extrapolated from the fraction of one it lasted.
func TestFinalIntervalNotExtrapolated(t *testing.T) {
	var out bytes.Buffer
	v := &jsonView{viewClock: viewClock{start: time.Now(), last: time.Now(), prev: bpf.NewSummary(), every: 10 * time.Second},
		enc: json.NewEncoder(&out)}
	cur := bpf.NewSummary()
	cur.Calls["cudaMalloc"] = 100
	v.final(cur) // a few microseconds after the last draw
	var iv interval
	if err := json.Unmarshal(out.Bytes(), &iv); err != nil {
		t.Fatal(err)
	}
	if iv.AllocsPerS != 10 || iv.IntervalS != 10 || !iv.Final || iv.ElapsedS >= 10 {
		t.Errorf("final interval after %vs: %v allocs/s over %vs (final %v), want 100 over the whole 10s interval = 10",
			iv.ElapsedS, iv.AllocsPerS, iv.IntervalS, iv.Final)
	}
}

// Records bound for a stream the job shares go out whole, in writes a
// pipe does not split.
type writeLog struct{ writes [][]byte }

func (w *writeLog) Write(p []byte) (int, error) {
	w.writes = append(w.writes, append([]byte(nil), p...))
	return len(p), nil
}

func TestEventPrinterWritesWholeRecords(t *testing.T) {
	for _, asJSON := range []bool{true, false} {
		log := &writeLog{}
		p := newEventPrinter(log, asJSON, true)
		for i := range 500 {
			p.print(&bpf.Event{Kind: bpf.KindFault, PID: uint32(i), Args: [6]uint64{0x7000 + uint64(i)}})
		}
		p.flush()
		total := 0
		for _, w := range log.writes {
			if len(w) > pipeAtomic || w[len(w)-1] != '\n' {
				t.Fatalf("json=%v: a write of %d bytes ending %q", asJSON, len(w), w[len(w)-1])
			}
			total += bytes.Count(w, []byte("\n"))
		}
		if total != 500 || len(log.writes) < 2 {
			t.Errorf("json=%v: %d records in %d writes", asJSON, total, len(log.writes))
		}
	}
}

func TestExecutables(t *testing.T) {
	dir := t.TempDir()
	elf, err := os.Executable() // this test binary
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
		return path
	}
	direct := write("direct", "#!"+elf+" -x\nbody\n")
	chained := write("chained", "#!"+direct+"\n")
	t.Setenv("PATH", filepath.Dir(elf)+":"+os.Getenv("PATH"))
	viaEnv := write("via-env", "#!/usr/bin/env -S "+filepath.Base(elf)+" -u\n")
	for path, want := range map[string]string{elf: elf, direct: elf, chained: elf, viaEnv: elf, write("text", "plain text\n"): ""} {
		got := executables(path)
		if (want == "" && len(got) != 0) || (want != "" && (len(got) != 1 || got[0] != want)) {
			t.Errorf("executables(%s) = %v, want %q", filepath.Base(path), got, want)
		}
	}
}

// TestLinkedLibraries: the libraries a program is linked with are found as
// its loader finds them (here through its run path), each path whole when a
// folder's name holds what the loader's list puts around one (" (", " => ").
func TestLinkedLibraries(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	libDir := filepath.Join(dir, "libs (2) => here")
	if err := os.Mkdir(libDir, 0o755); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(libDir, "libodd.so")
	lib := harness.Compile(t, harness.CBuild{Sources: []string{write("odd.c", "int odd(void) { return 0; }\n")}, Shared: true})
	if err := os.Rename(lib, want); err != nil {
		t.Fatal(err)
	}
	prog := harness.Compile(t, harness.CBuild{
		Sources: []string{write("main.c", "int odd(void);\nint main(void) { return odd(); }\n")},
		Flags:   []string{"-L", libDir, "-lodd", "-Wl,-rpath," + libDir},
	})
	t.Setenv("LD_LIBRARY_PATH", "")
	if got := linkedLibraries(prog); !slices.Contains(got, want) {
		t.Errorf("linkedLibraries = %q, want it to hold %q", got, want)
	}
}

func testReport() *statReport {
	nv := uint64(12 << 20)
	upd := time.Unix(1700000000, 0)
	return &statReport{Devices: []statGPU{{
		Index: 0, Name: "Sim GPU", UUID: "GPU-1", TotalBytes: 16 << 30, UsedBytes: 13 << 20,
		Processes: []statProcess{
			{PID: 7, Command: "python3", Updated: &upd, NVMLUsedBytes: &nv,
				Spillway: &stat.Device{Limited: true, Quota: 64 << 20, Used: 12 << 20, Cached: 4 << 20, Spilled: 1536 << 10, Refused: 3,
					HostOutside: 512 << 10}},
			{PID: 9, Command: "other", NVMLUsedBytes: &nv},
		},
	}}}
}

func TestStatTable(t *testing.T) {
	var b strings.Builder
	writeStatTable(&b, testReport())
	for _, want := range []string{
		"GPU 0  Sim GPU  GPU-1  13MiB used of 16GiB\n",
		"PID  COMMAND  QUOTA   USED  CACHED  SPILLED  REFUSED   NVML",
		"7  python3  64MiB  12MiB    4MiB     2MiB        3  12MiB",
		"9    other      -      -       -        -        -  12MiB",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestStatMetricsText(t *testing.T) {
	var b strings.Builder
	writeStatMetrics(&b, testReport())
	for _, want := range []string{
		"# TYPE spillway_gpu_memory_total_bytes gauge\n",
		`spillway_gpu_memory_total_bytes{gpu="0",UUID="GPU-1",modelName="Sim GPU"} 17179869184` + "\n",
		`spillway_process_quota_bytes{gpu="0",UUID="GPU-1",modelName="Sim GPU",pid="7",command="python3"} 67108864` + "\n",
		`spillway_process_nvml_used_bytes{gpu="0",UUID="GPU-1",modelName="Sim GPU",pid="9",command="other"} 12582912` + "\n",
		`spillway_process_host_outside_bytes{gpu="0",UUID="GPU-1",modelName="Sim GPU",pid="7",command="python3"} 524288` + "\n",
		"# TYPE spillway_process_refusals_total counter\n",
		`spillway_process_refusals_total{gpu="0",UUID="GPU-1",modelName="Sim GPU",pid="7",command="python3"} 3` + "\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), `spillway_process_quota_bytes{gpu="0",UUID="GPU-1",modelName="Sim GPU",pid="9"`) {
		t.Error("a process without Spillway's figures has a quota")
	}
}

// TestSwitchBeforeCommandSaysHowToRunIt: "--report true" may mean a program
// called true, which the refusal then says how to run, as well as the
// switch's value.
func TestSwitchBeforeCommandSaysHowToRunIt(t *testing.T) {
	_, runErr := parseRunFlags([]string{"--report", "true"}, nil, io.Discard)
	_, traceErr := parseTraceFlags([]string{"--events", "1"}, nil, io.Discard)
	for _, tc := range []struct {
		err  error
		want string
	}{
		{runErr, `(valid example: --report=true; to run the program "true": --report -- true)`},
		{traceErr, `(valid example: --events=1; to run the program "1": --events -- 1)`},
	} {
		if tc.err == nil || !strings.HasSuffix(tc.err.Error(), tc.want) {
			t.Errorf("%v, want it to end %q", tc.err, tc.want)
		}
	}
}

// TestStatSwitchValueApart: stat refuses a switch's value written apart as
// run and trace do, saying the form it takes, not only that an argument is
// unexpected.
func TestStatSwitchValueApart(t *testing.T) {
	_, err := parseStatFlags([]string{"--json", "true"}, io.Discard)
	if want := `invalid --json true: a switch takes its value after '=' (valid example: --json=true)`; err == nil || err.Error() != want {
		t.Errorf("stat --json true: %v, want %q", err, want)
	}
	for _, args := range [][]string{{"extra"}, {"--watch", "false"}} {
		if _, err := parseStatFlags(args, io.Discard); err == nil || err.Error() != `unexpected argument "`+args[len(args)-1]+`"` {
			t.Errorf("stat %q: %v", args, err)
		}
	}
}

// TestSwitchValueSaysWhatIsValid: a switch's bad value is named with the
// values it takes, in stat and trace as in run.
func TestSwitchValueSaysWhatIsValid(t *testing.T) {
	_, statErr := parseStatFlags([]string{"--json=yes"}, io.Discard)
	_, traceErr := parseTraceFlags([]string{"--events=on", "-p", "1"}, nil, io.Discard)
	_, runErr := parseRunFlags([]string{"--report=yes", "--", "true"}, nil, io.Discard)
	for _, tc := range []struct {
		err  error
		want string
	}{
		{statErr, `invalid --json="yes": want true or false (valid example: --json=false)`},
		{traceErr, `invalid --events="on": want true or false (valid example: --events=false)`},
		{runErr, `invalid --report="yes": want true or false (valid example: --report=false)`},
	} {
		if tc.err == nil || tc.err.Error() != tc.want {
			t.Errorf("%v, want %q", tc.err, tc.want)
		}
	}
}

// TestTraceChecksTheCore: CMD is started under the shim as by spillway run,
// so a SPILLWAY_CORE that names no core is refused before it starts.
func TestTraceChecksTheCore(t *testing.T) {
	_, err := parseTraceFlags([]string{"--", "true"}, []string{"SPILLWAY_CORE=/nonexistent/libspillway-core.so"}, io.Discard)
	var usage *usageErr
	if !errors.As(err, &usage) || !strings.Contains(err.Error(), `invalid SPILLWAY_CORE="/nonexistent/libspillway-core.so"`) {
		t.Errorf("trace with a missing core: %v", err)
	}
	// Without CMD nothing is started under the shim.
	if _, err := parseTraceFlags([]string{"-p", "1"}, []string{"SPILLWAY_CORE=/nonexistent/libspillway-core.so"}, io.Discard); err != nil {
		t.Errorf("trace -p with a missing core: %v", err)
	}
	// A bare name is the loader's to find on the library path, as for dlopen.
	if _, err := parseTraceFlags([]string{"--", "true"}, []string{"SPILLWAY_CORE=libspillway-core.so"}, io.Discard); err != nil {
		t.Errorf("trace with a core named for the library path: %v", err)
	}
}

// TestTraceKnowsTheShimIsOff: CMD inherits SPILLWAY_DISABLE=1, which the
// session says, as spillway run does.
func TestTraceKnowsTheShimIsOff(t *testing.T) {
	for _, tc := range []struct {
		env      []string
		disabled bool
	}{{[]string{"SPILLWAY_DISABLE=1"}, true}, {[]string{"SPILLWAY_DISABLE=0"}, false}, {nil, false}} {
		o, err := parseTraceFlags([]string{"--", "true"}, tc.env, io.Discard)
		if err != nil || o.disabled != tc.disabled {
			t.Errorf("%q: disabled %v, %v; want %v", tc.env, o.disabled, err, tc.disabled)
		}
	}
}

// TestForgottenValueIsRefused: a flag whose value was forgotten does not
// take "--" or the next flag as its value: "--output -- CMD" would write
// the view to a file called "--", "--summary-json --json" to one called
// "--json".
func TestForgottenValueIsRefused(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		args []string
		want string
	}{
		{"trace", []string{"--output", "--", "true"}, `--output needs a value (--output FILE), but "--" follows it`},
		{"trace", []string{"--summary-json", "--json", "-p", "1"}, `--summary-json needs a value (--summary-json FILE), but "--json" follows it`},
		{"run", []string{"--memory-limit", "--", "true"}, `--memory-limit needs a value (--memory-limit SIZE), but "--" follows it`},
		{"stat", []string{"--metrics-addr", "--json"}, `--metrics-addr needs a value (--metrics-addr ADDR), but "--json" follows it`},
		// The help flags are every command's, though no FlagSet defines them.
		{"trace", []string{"--output", "--help", "-p", "1"}, `--output needs a value (--output FILE), but "--help" follows it`},
		{"run", []string{"--memory-limit", "-h", "--", "true"}, `--memory-limit needs a value (--memory-limit SIZE), but "-h" follows it`},
	} {
		var usage *usageErr
		if err := parseCommand[tc.cmd](tc.args, nil); !errors.As(err, &usage) || err.Error() != tc.want {
			t.Errorf("%s %q: %v, want the usage error %q", tc.cmd, tc.args, err, tc.want)
		}
	}
	// A value that only starts with a dash is a value: refused or taken as such.
	if err := parseCommand["run"]([]string{"--memory-limit", "-1GiB", "--", "true"}, nil); err == nil ||
		!strings.Contains(err.Error(), `invalid --memory-limit="-1GiB": negative`) {
		t.Errorf("--memory-limit -1GiB: %v", err)
	}
}

// TestEveryInvalidSettingAtOnce: spillway run and spillway trace -- CMD
// refuse every invalid setting at once, one line each in name order, a
// variable with "(in the environment)", a flag as typed; the lines are
// printed each naming the command, the last with where to find the flags.
func TestEveryInvalidSettingAtOnce(t *testing.T) {
	env := []string{"SPILLWAY_SPILL=disk", "SPILLWAY_POOL=yes", "SPILLWAY_LOG_LEVEL=verbose"}
	want := []string{
		`invalid SPILLWAY_LOG_LEVEL="verbose": expected one of error, warn, info, debug (valid example: SPILLWAY_LOG_LEVEL=info) (in the environment)`,
		`invalid SPILLWAY_POOL="yes": expected 1 (on) or 0 (off) (valid example: SPILLWAY_POOL=1) (in the environment)`,
		`invalid SPILLWAY_SPILL="disk": expected managed or pinned (valid example: SPILLWAY_SPILL=pinned) (in the environment)`,
	}
	for _, cmd := range []string{"run", "trace"} {
		for _, n := range []int{2, 3} {
			// The last n variables, whose errors are the first n in name order.
			err := parseCommand[cmd]([]string{"--", "true"}, env[3-n:])
			var usage *usageErr
			if !errors.As(err, &usage) || err.Error() != strings.Join(want[:n], "\n") {
				t.Errorf("%s with %v: %v, want the usage error of %d lines %q", cmd, env[3-n:], err, n, want[:n])
			}
		}
	}
	// A flag is named as typed, a variable as set, each on its line.
	err := parseCommand["run"]([]string{"--pool=false", "--pool-reserve", "1GiB", "--", "true"}, []string{"SPILLWAY_LOG_LEVEL=verbose"})
	if want := []string{want[0], `invalid --pool-reserve="1GiB": a reserve needs the pool, but --pool=false (valid example: --pool=true --pool-reserve 4GiB)`}; err == nil ||
		err.Error() != strings.Join(want, "\n") {
		t.Errorf("run --pool=false --pool-reserve 1GiB with SPILLWAY_LOG_LEVEL=verbose: %v, want %q", err, want)
	}
	var out bytes.Buffer
	writeFlagError(&out, "run", &usageErr{"first\nsecond"})
	if got := out.String(); got != "spillway run: first\nspillway run: second (see 'spillway run --help')\n" {
		t.Errorf("two lines printed as %q", got)
	}
	out.Reset()
	writeFlagError(&out, "run", &usageErr{"only"})
	if got := out.String(); got != "spillway run: only (see 'spillway run --help')\n" {
		t.Errorf("one line printed as %q", got)
	}
}

// TestFlagGivenTwiceIsRefused: the flag package keeps a flag's last value,
// so that "--memory-limit 8GiB ... --memory-limit 80GiB" would widen the
// quota without a word; a flag that is not repeatable is given once, and a
// repeatable one names each process or device once.
func TestFlagGivenTwiceIsRefused(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		args []string
		want string
	}{
		{"run", []string{"--memory-limit", "8GiB", "--memory-limit=80GiB", "--", "true"},
			`--memory-limit is given twice ("--memory-limit 8GiB", then "--memory-limit=80GiB"): give it once`},
		{"run", []string{"--oversubscribe", "--report", "--oversubscribe=false", "--", "true"},
			`--oversubscribe is given twice ("--oversubscribe", then "--oversubscribe=false"): give it once`},
		{"trace", []string{"--interval", "1s", "-p", "1", "-interval", "2s", "--interval=3s", "-p", "2"},
			`--interval is given 3 times ("--interval 1s", "-interval 2s", then "--interval=3s"): give it once`},
		{"stat", []string{"--json", "--watch", "--json"}, `--json is given twice ("--json", then "--json"): give it once`},
		{"stat", []string{"--watch", "2s", "--watch"}, `--watch is given twice ("--watch=2s", then "--watch"): give it once`},
		{"run", []string{"--memory-limit-device", "0=8GiB", "--memory-limit-device", "1=4GiB", "--memory-limit-device", "0=80GiB", "--", "true"},
			`invalid --memory-limit-device="0=80GiB": device 0 has a quota already (0=8GiB); give each device once (valid example: --memory-limit-device 0=8GiB)`},
		{"trace", []string{"-p", "12", "-p", "34", "--p", "12"}, `invalid -p="12": pid 12 is given already; give each process once (valid example: -p 12)`},
	} {
		var usage *usageErr
		if err := parseCommand[tc.cmd](tc.args, nil); !errors.As(err, &usage) || err.Error() != tc.want {
			t.Errorf("%s %q: %v, want the usage error %q", tc.cmd, tc.args, err, tc.want)
		}
	}
	// Repeatable flags repeat, each naming another process or device.
	if o, err := parseTraceFlags([]string{"-p", "12", "--p", "34"}, nil, io.Discard); err != nil || len(o.pids) != 2 {
		t.Errorf("trace -p 12 --p 34: %+v, %v", o.pids, err)
	}
	if o, err := parseRunFlags([]string{"--memory-limit-device", "0=8GiB", "--memory-limit-device", "1=4GiB", "--", "true"}, nil, io.Discard); err != nil || len(o.launch.DeviceLimits) != 2 {
		t.Errorf("run with two devices' quotas: %+v, %v", o.launch.DeviceLimits, err)
	}
	// What follows the flags is the program's, which may repeat them.
	if o, err := parseRunFlags([]string{"--memory-limit", "8GiB", "--", "prog", "--memory-limit", "4GiB"}, nil, io.Discard); err != nil || len(o.argv) != 3 {
		t.Errorf("run --memory-limit 8GiB -- prog --memory-limit 4GiB: %q, %v", o.argv, err)
	}
}

// TestEmptyValueIsRefused: an empty value, most often a variable that was
// not set (--output "$OUT"), is refused, where it meant the flag's absence:
// the summary not written, the metrics not served, the view on the
// terminal, the default shim.
func TestEmptyValueIsRefused(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		args []string
		want string
	}{
		{"trace", []string{"--output", "", "-p", "1"}, `invalid --output="": empty; want the FILE to write to (valid example: --output trace.txt)`},
		{"trace", []string{"--summary-json=", "-p", "1"}, `invalid --summary-json="": empty; want the FILE to write to (valid example: --summary-json totals.json)`},
		{"trace", []string{"--metrics-addr", "", "-p", "1"}, `invalid --metrics-addr="": empty; want HOST:PORT, with a port from 0 to 65535 (valid example: --metrics-addr 127.0.0.1:9400)`},
		{"trace", []string{"--lib", "", "--", "true"}, `invalid --lib="": empty; want the PATH of libspillway.so, or no --lib for the one beside this binary (valid example: --lib /opt/spillway/lib/libspillway.so)`},
		{"run", []string{"--lib=", "--", "true"}, `invalid --lib="": empty; want the PATH of libspillway.so, or no --lib for the one beside this binary (valid example: --lib /opt/spillway/lib/libspillway.so)`},
		{"stat", []string{"--metrics-addr", ""}, `invalid --metrics-addr="": empty; want HOST:PORT, with a port from 0 to 65535 (valid example: --metrics-addr 127.0.0.1:9400)`},
		// --watch takes the empty value apart, as it takes an interval.
		{"stat", []string{"--watch", ""}, `invalid --watch="": not a duration such as 500ms, 1s or 2m (valid example: --watch 500ms)`},
	} {
		var usage *usageErr
		if err := parseCommand[tc.cmd](tc.args, nil); !errors.As(err, &usage) || err.Error() != tc.want {
			t.Errorf("%s %q: %v, want the usage error %q", tc.cmd, tc.args, err, tc.want)
		}
	}
}

// TestFlagAfterDashDashIsRefused: after "--" comes the program; one of the
// command's own flags there was meant for it, and is refused as a usage
// error saying where it goes, where the program "--memory-limit" was not
// found (exit status 127) or, for trace, started and traced.
func TestFlagAfterDashDashIsRefused(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		args []string
		want string
	}{
		{"run", []string{"--", "--memory-limit", "8GiB", "python", "train.py"},
			`"--memory-limit" follows "--", where the program to run begins: spillway run's flags go before "--" (valid example: spillway run --memory-limit 8GiB -- python train.py)`},
		{"run", []string{"--report", "--", "--oversubscribe", "--spill", "pinned", "prog", "-x"},
			`"--oversubscribe" follows "--", where the program to run begins: spillway run's flags go before "--" (valid example: spillway run --report --oversubscribe --spill pinned -- prog -x)`},
		{"trace", []string{"--", "-p", "4242"},
			`"-p" follows "--", where the program to run begins: spillway trace's flags go before "--" (valid example: spillway trace -p 4242)`},
		{"trace", []string{"--json", "--", "--help"},
			`"--help" follows "--", where the program to run begins: spillway trace's flags go before "--" (valid example: spillway trace --json --help)`},
	} {
		var usage *usageErr
		if err := parseCommand[tc.cmd](tc.args, nil); !errors.As(err, &usage) || err.Error() != tc.want {
			t.Errorf("%s %q: %v, want the usage error %q", tc.cmd, tc.args, err, tc.want)
		}
	}
	// The program's own flags, after its name, are its own.
	if o, err := parseRunFlags([]string{"--", "prog", "--memory-limit", "8GiB"}, nil, io.Discard); err != nil || len(o.argv) != 3 {
		t.Errorf("run -- prog --memory-limit 8GiB: %q, %v", o.argv, err)
	}
}

// TestFlagsThatExcludeEachOther: a flag that the other makes of no effect
// is refused with it, not ignored: stat serves the metrics until
// interrupted, reading them afresh at each scrape, and does not refresh
// at an interval; trace's totals written to its view's file would replace
// the view.
func TestFlagsThatExcludeEachOther(t *testing.T) {
	for _, args := range [][]string{{"--watch", "--metrics-addr", ":0"}, {"--metrics-addr=:0", "--watch", "5s"}} {
		_, err := parseStatFlags(args, io.Discard)
		var usage *usageErr
		if want := "--watch and --metrics-addr cannot be combined"; !errors.As(err, &usage) || err.Error() != want {
			t.Errorf("stat %q: %v, want the usage error %q", args, err, want)
		}
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "trace.txt")
	if err := os.Symlink(file, filepath.Join(dir, "link.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, pair := range [][2]string{{"trace.txt", "trace.txt"}, {"./trace.txt", file}, {"link.txt", "trace.txt"}} {
		args := []string{"--output", pair[0], "--summary-json", pair[1], "-p", "1"}
		_, err := parseTraceFlags(args, nil, io.Discard)
		var usage *usageErr
		want := fmt.Sprintf("--output %s and --summary-json %s are the same file: the totals would replace the view", pair[0], pair[1])
		if !errors.As(err, &usage) || err.Error() != want {
			t.Errorf("trace %q: %v, want the usage error %q", args, err, want)
		}
	}
	if _, err := parseTraceFlags([]string{"--output", "trace.txt", "--summary-json", "totals.json", "-p", "1"}, nil, io.Discard); err != nil {
		t.Errorf("trace with two files: %v", err)
	}
}

// dispatchOutput runs dispatch(args) with standard output and error
// captured.
func dispatchOutput(t *testing.T, args ...string) (status int, stdout, stderr string) {
	t.Helper()
	files := [2]*os.File{}
	for i := range files {
		f, err := os.CreateTemp(t.TempDir(), "out")
		if err != nil {
			t.Fatal(err)
		}
		files[i] = f
	}
	saved := [2]*os.File{os.Stdout, os.Stderr}
	os.Stdout, os.Stderr = files[0], files[1]
	status = dispatch(args)
	os.Stdout, os.Stderr = saved[0], saved[1]
	var text [2]string
	for i, f := range files {
		data, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		text[i] = string(data)
	}
	return status, text[0], text[1]
}

// TestHelpNamesACommand: "spillway help run" shows run's flags, as "spillway
// run --help" does; a command it does not know is refused, where the
// general usage was shown for any word, with status 0.
func TestHelpNamesACommand(t *testing.T) {
	for _, help := range []string{"help", "--help", "-h"} {
		status, out, _ := dispatchOutput(t, help, "run")
		if status != 0 || !strings.HasPrefix(out, "usage: spillway run [flags] -- CMD ARGS...") || !strings.Contains(out, "--memory-limit SIZE") {
			t.Errorf("spillway %s run: status %d, output %q; want run's usage and flags", help, status, out)
		}
		status, out, errText := dispatchOutput(t, help, "runn")
		if want := "spillway: unknown command \"runn\" (see 'spillway --help')\n"; status != 2 || out != "" || errText != want {
			t.Errorf("spillway %s runn: status %d, %q, %q; want status 2 and %q", help, status, out, errText, want)
		}
		status, out, errText = dispatchOutput(t, help, "run", "stat")
		if want := "spillway: help takes one command, not \"run stat\" (see 'spillway --help')\n"; status != 2 || out != "" || errText != want {
			t.Errorf("spillway %s run stat: status %d, %q, %q; want status 2 and %q", help, status, out, errText, want)
		}
	}
	if status, out, _ := dispatchOutput(t, "help", "version"); status != 0 || !strings.HasPrefix(out, "usage: spillway version") {
		t.Errorf("spillway help version: status %d, %q", status, out)
	}
	for _, args := range [][]string{{"help"}, {"help", "--help"}, {"--help", "-h"}} {
		if status, out, _ := dispatchOutput(t, args...); status != 0 || !strings.HasPrefix(out, "usage: spillway <command>") {
			t.Errorf("spillway %q: status %d, %q", args, status, out)
		}
	}
}

// TestQuotaForEveryDeviceIsNotOverriddenUnseen: --memory-limit is the
// quota of every device, but a SPILLWAY_MEMORY_LIMIT_<n> inherited from the
// environment won over it on device n, and could widen it (8GiB asked,
// 80GiB given) without a word: the two are refused together, unless
// --memory-limit-device gives that device its quota.
func TestQuotaForEveryDeviceIsNotOverriddenUnseen(t *testing.T) {
	env := []string{"SPILLWAY_MEMORY_LIMIT_1=40GiB", "SPILLWAY_MEMORY_LIMIT_0=80GiB"}
	_, err := parseRunFlags([]string{"--memory-limit", "8GiB", "--", "true"}, env, io.Discard)
	want := `invalid --memory-limit="8GiB": SPILLWAY_MEMORY_LIMIT_0=80GiB and SPILLWAY_MEMORY_LIMIT_1=40GiB in the environment win over it on devices 0 and 1; ` +
		`give each its quota with --memory-limit-device, or unset the variables (valid example: --memory-limit 8GiB --memory-limit-device 0=8GiB --memory-limit-device 1=8GiB)`
	var usage *usageErr
	if !errors.As(err, &usage) || err.Error() != want {
		t.Errorf("run --memory-limit 8GiB with %q: %v, want the usage error %q", env, err, want)
	}
	_, err = parseRunFlags([]string{"--memory-limit", "8GiB", "--memory-limit-device", "1=4GiB", "--", "true"}, env, io.Discard)
	want = `invalid --memory-limit="8GiB": SPILLWAY_MEMORY_LIMIT_0=80GiB in the environment wins over it on device 0; ` +
		`give it its quota with --memory-limit-device, or unset the variable (valid example: --memory-limit 8GiB --memory-limit-device 0=8GiB)`
	if !errors.As(err, &usage) || err.Error() != want {
		t.Errorf("run --memory-limit 8GiB --memory-limit-device 1=4GiB with %q: %v, want the usage error %q", env, err, want)
	}
	// Each device's quota given by a flag, or no quota for every device
	// asked: nothing is overridden.
	for _, args := range [][]string{
		{"--memory-limit", "8GiB", "--memory-limit-device", "0=4GiB", "--memory-limit-device", "1=4GiB", "--", "true"},
		{"--memory-limit-device", "0=4GiB", "--", "true"},
		{"--", "true"},
	} {
		if _, err := parseRunFlags(args, env, io.Discard); err != nil {
			t.Errorf("run %q with %q: %v", args, env, err)
		}
	}
}

// TestNegativeSecondsAreNotAboveZero: a negative number of seconds is
// refused as a duration not above zero, as -1s is, not as something that is
// no duration at all.
func TestNegativeSecondsAreNotAboveZero(t *testing.T) {
	for _, v := range []string{"-1", "-0.5", "-0", "-1s", "+0"} {
		_, err := parseDuration("--interval", v)
		want := fmt.Sprintf(`invalid --interval=%q: want a duration above zero, such as 500ms, 1s or 2m (valid example: --interval 500ms)`, v)
		if err == nil || err.Error() != want {
			t.Errorf("parseDuration(%q): %v, want %q", v, err, want)
		}
	}
	_, err := parseTraceFlags([]string{"--duration", "-1", "-p", "1"}, nil, io.Discard)
	if want := `invalid --duration="-1": want a duration above zero`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("trace --duration -1: %v, want one starting %q", err, want)
	}
}

// TestFlagBeforeCommand: a flag written before the command is said to
// belong after it, with the command line it was meant as, where it was
// called an unknown command.
func TestFlagBeforeCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--memory-limit", "8GiB", "run", "--", "python", "train.py"},
			`spillway: "--memory-limit" is no command: a command's flags follow it (valid example: spillway run --memory-limit 8GiB -- python train.py)`},
		{[]string{"--json", "stat", "--watch"}, `spillway: "--json" is no command: a command's flags follow it (valid example: spillway stat --json --watch)`},
		{[]string{"-p", "4242"}, `spillway: "-p" is no command: a command's flags follow it (see 'spillway --help')`},
	} {
		status, out, errText := dispatchOutput(t, tc.args...)
		if status != 2 || out != "" || errText != tc.want+"\n" {
			t.Errorf("spillway %q: status %d, %q, %q; want status 2 and %q", tc.args, status, out, errText, tc.want)
		}
	}
	// A command's name after "--" is the program's argument.
	status, _, errText := dispatchOutput(t, "--pool", "--", "run")
	if want := `spillway: "--pool" is no command: a command's flags follow it (see 'spillway --help')` + "\n"; status != 2 || errText != want {
		t.Errorf("spillway --pool -- run: status %d, %q; want %q", status, errText, want)
	}
}

// parseCommand parses a command's flags with the environment env (stat
// reads its own later, not here), for the tests that run one table over
// every command.
var parseCommand = map[string]func(args, env []string) error{
	"run":   func(args, env []string) error { _, err := parseRunFlags(args, env, io.Discard); return err },
	"trace": func(args, env []string) error { _, err := parseTraceFlags(args, env, io.Discard); return err },
	"stat":  func(args, _ []string) error { _, err := parseStatFlags(args, io.Discard); return err },
}

// TestSettingsCheckedInStages: spillway run refuses the first value its
// flag cannot take alone, as the command line is read, before the settings
// are checked together; --memory-limit against an inherited
// SPILLWAY_MEMORY_LIMIT_<n> only once the rest is valid; as the README
// says.
func TestSettingsCheckedInStages(t *testing.T) {
	for _, tc := range []struct {
		args, env []string
		want      string
	}{
		{[]string{"--memory-limit", "8GiBs", "--spill", "disk", "--", "true"}, []string{"SPILLWAY_LOG_LEVEL=verbose"},
			`invalid --memory-limit="8GiBs": unknown unit "GiBs"; expected a size such as 512MiB, 8GiB, 8GB or 8G, or a percentage such as 50% (valid example: --memory-limit=8GiB)`},
		{[]string{"--memory-limit", "8GiB", "--pool=false", "--pool-reserve", "1GiB", "--", "true"}, []string{"SPILLWAY_MEMORY_LIMIT_0=80GiB"},
			`invalid --pool-reserve="1GiB": a reserve needs the pool, but --pool=false (valid example: --pool=true --pool-reserve 4GiB)`},
	} {
		var usage *usageErr
		if err := parseCommand["run"](tc.args, tc.env); !errors.As(err, &usage) || err.Error() != tc.want {
			t.Errorf("run %q with %q: %v, want the usage error %q", tc.args, tc.env, err, tc.want)
		}
	}
}
