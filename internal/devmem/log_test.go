package devmem

import (
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/shim/config"
)

// TestEveryInvalidSettingLogged: each invalid setting is logged on a line of
// its own, in name order, each saying what every allocation answers until it
// is fixed, so that fixing one never reveals the next.
func TestEveryInvalidSettingLogged(t *testing.T) {
	_, err := config.Parse([]string{"SPILLWAY_SPILL=disk", "SPILLWAY_POOL=yes", "SPILLWAY_MEMORY_LIMIT=8gigs"})
	if err == nil {
		t.Fatal("three invalid settings accepted")
	}
	var logged strings.Builder
	logInvalidSettings(newLogger(&logged, config.FormatText, config.LevelWarn), err, DriverAPI)
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	names := []string{config.EnvMemoryLimit, config.EnvPool, config.EnvSpill}
	if len(lines) != len(names) {
		t.Fatalf("logged %q, want %d lines", logged.String(), len(names))
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, "spillway: ") || !strings.Contains(l, "level=error") || !strings.Contains(l, `invalid `+names[i]+`=\"`) ||
			!strings.Contains(l, "every CUDA allocation in this process will fail with CUDA_ERROR_NOT_INITIALIZED until it is fixed") {
			t.Errorf("line %d %q, want the error of %s and what allocations answer", i, l, names[i])
		}
	}
}
