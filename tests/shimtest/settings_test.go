package shimtest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// At info level the core says which quota applies to each device when it
// starts; settings without effect are warned about once; no message shows
// Go's formatting of maps or slices.
func TestStartMessages(t *testing.T) {
	prog := cudaops(t)
	res, _ := harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=3x1GiB", "SPILLWAY_LOG_LEVEL=info",
		"SPILLWAY_MEMORY_LIMIT=0.1GiB", "SPILLWAY_MEMORY_LIMIT_1=50%", "SPILLWAY_MEMORY_LIMIT_5=2GiB",
		"SPILLWAY_HOST_LIMIT=1GiB", "SPILLWAY_SPIL=pinned", "SPILLWAY_MEMORY_LIMT=1GiB"}, prog, "m", "1M"))
	for _, want := range []string{
		// 0.1GiB, rounded up to the 512-byte allocation unit.
		`device 0: quota 102.4MiB (SPILLWAY_MEMORY_LIMIT)" device=0 quota_bytes=107374592`,
		`device 1: quota 50% of the device's memory (SPILLWAY_MEMORY_LIMIT_1)`,
		`device 2: quota 102.4MiB (SPILLWAY_MEMORY_LIMIT)" device=2 quota_bytes=107374592`,
		`SPILLWAY_MEMORY_LIMIT_5=2GiB has no effect: this process sees 3 devices (ordinals 0 to 2)`,
		`SPILLWAY_HOST_LIMIT has no effect without SPILLWAY_OVERSUBSCRIBE=1`,
		`ignoring unknown variables SPILLWAY_MEMORY_LIMT, SPILLWAY_SPIL (misspelled?)`,
	} {
		if n := strings.Count(res.Stderr, want); n != 1 {
			t.Errorf("%q said %d times, want once; stderr:\n%s", want, n, res.Stderr)
		}
	}
	for _, bad := range []string{"map[", "[SPILLWAY", "%!"} {
		if strings.Contains(res.Stderr, bad) {
			t.Errorf("stderr shows Go formatting %q:\n%s", bad, res.Stderr)
		}
	}

	// A percentage is said in bytes once the device's total is known, at its
	// first use.
	res, _ = harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=1x1GiB", "SPILLWAY_LOG_LEVEL=info",
		"SPILLWAY_MEMORY_LIMIT=50%"}, prog, "m", "1M"))
	if want := `device 0: quota 50% of its 1GiB is 512MiB" device=0 quota_bytes=536870912`; strings.Count(res.Stderr, want) != 1 {
		t.Errorf("%q not said once; stderr:\n%s", want, res.Stderr)
	}

	// At the default level: the warnings, not the quotas.
	res, _ = harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=1x1GiB", "SPILLWAY_MEMORY_LIMIT_3=1GiB"}, prog, "m", "1M"))
	if !strings.Contains(res.Stderr, "SPILLWAY_MEMORY_LIMIT_3=1GiB has no effect: this process sees 1 device (ordinal 0)") ||
		strings.Contains(res.Stderr, "quota") {
		t.Errorf("default level: stderr %q", res.Stderr)
	}
	// A device quota without effect is quoted as written, a percentage too.
	res, _ = harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=1x1GiB", "SPILLWAY_MEMORY_LIMIT_3=2048MiB",
		"SPILLWAY_MEMORY_LIMIT_4=50%"}, prog, "m", "1M"))
	for _, want := range []string{"SPILLWAY_MEMORY_LIMIT_3=2048MiB has no effect: this process sees 1 device (ordinal 0)",
		"SPILLWAY_MEMORY_LIMIT_4=50% has no effect: this process sees 1 device (ordinal 0)"} {
		if strings.Count(res.Stderr, want) != 1 {
			t.Errorf("%q not said once; stderr:\n%s", want, res.Stderr)
		}
	}
	res, _ = harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=1x1GiB", "SPILLWAY_MEMORY_LIMIT=1GiB"}, prog, "m", "1M"))
	if res.Stderr != "" {
		t.Errorf("nothing to say: stderr %q", res.Stderr)
	}
}

// Refusals are worded with human sizes (exact bytes in the fields); one at
// the host limit names the host limit, not the quota.
func TestRefusalMessages(t *testing.T) {
	prog := cudaops(t)
	res, _ := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, prog, "m", "1536K"))
	if !strings.Contains(res.Stderr, "cudaMalloc of 1.5MiB refused on device 0: 0B in use of a quota of 1MiB") ||
		!strings.Contains(res.Stderr, "requested=1572864") {
		t.Errorf("quota refusal: %q", res.Stderr)
	}

	res = harness.Run(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=16MiB", "SPILLWAY_OVERSUBSCRIBE=1",
		"SPILLWAY_HOST_LIMIT=8MiB"}, spilldemo(t), "8", "4"))
	want := "refused on device 0: the quota is full and spilling it would pass the host limit (SPILLWAY_HOST_LIMIT=8MiB; 8MiB spilled)"
	if res.ExitCode != 1 || !strings.Contains(res.Stderr, want) || strings.Contains(res.Stderr, "of a quota of") ||
		!strings.Contains(res.Stderr, "host_limit=8388608") {
		t.Errorf("host limit refusal: exit %d, stderr %q; want %q", res.ExitCode, res.Stderr, want)
	}
}

// With SPILLWAY_LOG_FORMAT=json the report line is one object with each
// figure as a field of its own (and the line as msg).
func TestReportJSONFields(t *testing.T) {
	res, _ := harness.RunOK(t, harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=8MiB", "SPILLWAY_REPORT=1",
		"SPILLWAY_LOG_FORMAT=json"}, cudaops(t), "m", "1M"))
	var entry map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.Stderr)), &entry); err != nil {
		t.Fatalf("report line %q: %v", res.Stderr, err)
	}
	msg, _ := entry["msg"].(string)
	if entry["device"] != float64(0) || entry["quota"] != float64(8<<20) || entry["live"] != float64(1<<20) ||
		entry["refused"] != float64(0) || !strings.HasPrefix(msg, "device 0: live=1048576 ") {
		t.Errorf("report entry %v", entry)
	}
	for _, f := range strings.Fields(strings.TrimPrefix(msg, "device 0: ")) {
		k, _, _ := strings.Cut(f, "=")
		if _, ok := entry[k]; !ok {
			t.Errorf("field %q of the line is not a field of the object: %v", k, entry)
		}
	}
}
