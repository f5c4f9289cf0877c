package shimtest

import (
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

	// At the default level: the warnings, not the quotas.
	res, _ = harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=1x1GiB", "SPILLWAY_MEMORY_LIMIT_3=1GiB"}, prog, "m", "1M"))
	if !strings.Contains(res.Stderr, "SPILLWAY_MEMORY_LIMIT_3=1GiB has no effect: this process sees 1 device (ordinal 0)") ||
		strings.Contains(res.Stderr, "quota") {
		t.Errorf("default level: stderr %q", res.Stderr)
	}
	res, _ = harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=1x1GiB", "SPILLWAY_MEMORY_LIMIT=1GiB"}, prog, "m", "1M"))
	if res.Stderr != "" {
		t.Errorf("nothing to say: stderr %q", res.Stderr)
	}
}
