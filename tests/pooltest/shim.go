// Package pooltest checks Spillway's pooled allocator end to end: C programs
// run under the preloaded shim against simcuda, and their observations, the
// shim's SPILLWAY_REPORT line and simcuda's ground truth are compared.
//
// Besides its tests it exports the helpers that the shim's and the host
// tier's tests (tests/shimtest, tests/spilltest) share: running a program
// under the shim, reading its output, and parsing the report line. It must
// never be imported outside tests.
package pooltest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// CUDA runtime error codes the tests expect.
const (
	ErrInvalidValue     = 1
	ErrMemoryAllocation = 2
	ErrInitialization   = 3
)

// Front returns the preloaded library, failing the test when the shim is not built.
func Front(t testing.TB) string {
	t.Helper()
	lib := filepath.Join(harness.LibDir(t), "libspillway.so")
	for _, p := range []string{lib, filepath.Join(harness.LibDir(t), "libspillway-core.so")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s is missing (run `make` first): %v", p, err)
		}
	}
	return lib
}

// Ops builds testdata/ops.c, the scriptable CUDA program both suites use.
func Ops(t testing.TB) string {
	t.Helper()
	src := filepath.Join(harness.Root(t), "tests", "pooltest", "testdata", "ops.c")
	return harness.Compile(t, harness.CBuild{Sources: []string{src}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-lcuda"}})
}

// Shimmed prepares prog under the shim, with env added to the clean
// environment harness.Command gives.
func Shimmed(t testing.TB, env []string, prog string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := harness.Command(t, prog, args...)
	harness.SetEnv(cmd, "LD_PRELOAD="+Front(t))
	harness.SetEnv(cmd, env...)
	return cmd
}

// Output is a program's stdout as lines of fields.
type Output [][]string

// ParseOutput splits s into lines of fields, dropping empty lines.
func ParseOutput(s string) Output {
	var out Output
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// Line returns the i-th line (from 0) whose first field is op.
func (o Output) Line(t testing.TB, op string, i int) []string {
	t.Helper()
	for _, l := range o {
		if l[0] == op {
			if i == 0 {
				return l
			}
			i--
		}
	}
	t.Fatalf("no line %q #%d in output %v", op, i, o)
	return nil
}

// Count returns how many lines start with op.
func (o Output) Count(op string) int {
	n := 0
	for _, l := range o {
		if l[0] == op {
			n++
		}
	}
	return n
}

// Num returns field of the i-th line for op as a number.
func (o Output) Num(t testing.TB, op string, i, field int) uint64 {
	t.Helper()
	l := o.Line(t, op, i)
	if field >= len(l) {
		t.Fatalf("line %v has no field %d", l, field)
	}
	n, err := strconv.ParseInt(l[field], 10, 64)
	if err != nil {
		t.Fatalf("line %v field %d: %v", l, field, err)
	}
	return uint64(n)
}

// Code returns the return code (field 1) of the i-th line for op.
func (o Output) Code(t testing.TB, op string, i int) int {
	t.Helper()
	return int(int64(o.Num(t, op, i, 1)))
}

// Run runs cmd and fails the test unless it exits 0.
func Run(t testing.TB, cmd *exec.Cmd) (harness.Result, Output) {
	t.Helper()
	res := harness.Run(t, cmd)
	if res.ExitCode != 0 {
		t.Fatalf("%v exited %d\nstdout:\n%s\nstderr:\n%s", cmd.Args, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res, ParseOutput(res.Stdout)
}

// Report is one device's SPILLWAY_REPORT line, in the format of
// pool.Stats.String prefixed by "device N: ".
type Report struct {
	Device             int
	Live               uint64
	PeakLive           uint64
	Reserved           uint64
	PeakReserved       uint64
	Quota              uint64
	Cached             uint64
	LargestFree        uint64
	CacheHits          uint64
	DeviceReservations uint64
	PassThrough        uint64
	Syncs              uint64
	ExternalSyncs      uint64
	SegmentsReleased   uint64
	Refused            uint64
	Spilled            uint64
	SpilledTotal       uint64
	Promoted           uint64
	PromotedTotal      uint64
}

func (r *Report) fields() map[string]*uint64 {
	return map[string]*uint64{
		"live": &r.Live, "peak_live": &r.PeakLive, "reserved": &r.Reserved, "peak_reserved": &r.PeakReserved,
		"quota": &r.Quota, "cached": &r.Cached, "largest_free": &r.LargestFree, "cache_hits": &r.CacheHits,
		"device_reservations": &r.DeviceReservations, "pass_through": &r.PassThrough, "syncs": &r.Syncs,
		"external_syncs": &r.ExternalSyncs, "segments_released": &r.SegmentsReleased, "refused": &r.Refused,
		"spilled": &r.Spilled, "spilled_total": &r.SpilledTotal, "promoted": &r.Promoted,
		"promoted_total": &r.PromotedTotal,
	}
}

// reportMarker introduces a report line: "spillway: device N: live=...".
const reportMarker = "spillway: device "

// ParseReports returns the report lines found in a process's standard
// error, by device. Other lines are ignored; a report line that lacks a
// field, repeats one, has an unknown one or a value that is not a number is
// an error, as is a second line for the same device.
func ParseReports(stderr string) (map[int]Report, error) {
	reports := map[int]Report{}
	for _, line := range strings.Split(stderr, "\n") {
		at := strings.Index(line, reportMarker)
		if at < 0 {
			continue
		}
		rest := line[at+len(reportMarker):]
		ordinal, body, ok := strings.Cut(rest, ": ")
		if !ok || !strings.HasPrefix(body, "live=") {
			continue // another message that names a device
		}
		dev, err := strconv.Atoi(ordinal)
		if err != nil {
			return nil, fmt.Errorf("report line %q: device %q is not a number", line, ordinal)
		}
		r := Report{Device: dev}
		fields := r.fields()
		seen := map[string]bool{}
		for _, kv := range strings.Fields(body) {
			k, v, ok := strings.Cut(kv, "=")
			dst, known := fields[k]
			if !ok || !known || seen[k] {
				return nil, fmt.Errorf("report line %q: unexpected or repeated field %q", line, kv)
			}
			if *dst, err = strconv.ParseUint(v, 10, 64); err != nil {
				return nil, fmt.Errorf("report line %q: field %s: %v", line, k, err)
			}
			seen[k] = true
		}
		if len(seen) != len(fields) {
			return nil, fmt.Errorf("report line %q has %d of the %d fields", line, len(seen), len(fields))
		}
		if _, dup := reports[dev]; dup {
			return nil, fmt.Errorf("two report lines for device %d", dev)
		}
		reports[dev] = r
	}
	return reports, nil
}

// ReportFor returns device dev's report line from stderr, failing the test
// when there is none or it is malformed.
func ReportFor(t testing.TB, stderr string, dev int) Report {
	t.Helper()
	reports, err := ParseReports(stderr)
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	r, ok := reports[dev]
	if !ok {
		t.Fatalf("no SPILLWAY_REPORT line for device %d in stderr:\n%s", dev, stderr)
	}
	return r
}

// CheckConfigError fails the test unless stderr holds exactly one line
// besides the report lines, and that line names the variable of env
// ("NAME=VALUE"), its value and a valid example.
func CheckConfigError(t testing.TB, stderr, env string) {
	t.Helper()
	lines := NonReportLines(stderr)
	if len(lines) != 1 {
		t.Fatalf("want exactly one error line, got %q", stderr)
	}
	name, value, _ := strings.Cut(env, "=")
	for _, want := range []string{name, value, "valid example"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("error line %q does not mention %q", lines[0], want)
		}
	}
}

// NonReportLines returns stderr's non-empty lines other than report lines.
func NonReportLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if at := strings.Index(l, reportMarker); at >= 0 && strings.Contains(l[at:], ": live=") {
			continue
		}
		out = append(out, l)
	}
	return out
}
