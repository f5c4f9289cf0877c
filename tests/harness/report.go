// Parsing of the shim's SPILLWAY_REPORT lines and the other lines of its
// standard error.

package harness

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// Report is one device's SPILLWAY_REPORT line, in the format of
// pool.Stats.String prefixed by "device N: ".
type Report struct {
	Device                int
	Live                  uint64
	PeakLive              uint64
	Reserved              uint64
	PeakReserved          uint64
	Quota                 uint64
	Cached                uint64
	LargestFree           uint64
	CacheHits             uint64
	DeviceReservations    uint64
	PassThrough           uint64
	Syncs                 uint64
	ExternalSyncs         uint64
	SegmentsReleased      uint64
	Refused               uint64
	Spilled               uint64
	SpilledTotal          uint64
	Promoted              uint64
	PromotedTotal         uint64
	DemotedTotal          uint64
	HostOutside           uint64
	BackingErrors         uint64
	ReleaseErrors         uint64
	CaptureSkips          uint64
	DeferredReleaseErrors uint64
}

func (r *Report) fields() map[string]*uint64 {
	return map[string]*uint64{
		"live": &r.Live, "peak_live": &r.PeakLive, "reserved": &r.Reserved, "peak_reserved": &r.PeakReserved,
		"quota": &r.Quota, "cached": &r.Cached, "largest_free": &r.LargestFree, "cache_hits": &r.CacheHits,
		"device_reservations": &r.DeviceReservations, "pass_through": &r.PassThrough, "syncs": &r.Syncs,
		"external_syncs": &r.ExternalSyncs, "segments_released": &r.SegmentsReleased, "refused": &r.Refused,
		"spilled": &r.Spilled, "spilled_total": &r.SpilledTotal, "promoted": &r.Promoted,
		"promoted_total": &r.PromotedTotal, "demoted_total": &r.DemotedTotal, "host_outside": &r.HostOutside, "backing_errors": &r.BackingErrors, "release_errors": &r.ReleaseErrors,
		"capture_skips": &r.CaptureSkips, "deferred_release_errors": &r.DeferredReleaseErrors,
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
