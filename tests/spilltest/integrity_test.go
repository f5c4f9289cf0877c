package spilltest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// integrityConfig is one way of oversubscribing: virtual memory or fixed
// segments, the spill tier, migration.
type integrityConfig struct {
	name    string
	vmm     bool
	spill   string
	migrate bool
}

var integrityConfigs = []integrityConfig{
	{"vmm-migrate-pinned", true, "pinned", true},
	{"vmm-migrate-managed", true, "managed", true},
	{"vmm", true, "managed", false},
	{"segments-managed", false, "managed", false},
	{"segments-pinned", false, "pinned", false},
}

func (c integrityConfig) env(t *testing.T, quota uint64) ([]string, string) {
	vmm, migrate := "0", "0"
	if c.vmm {
		vmm = "1"
	}
	if c.migrate {
		migrate = "1"
	}
	return vmmEnv(t, quota, "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_SPILL="+c.spill,
		fmt.Sprintf("SPILLWAY_HOST_LIMIT=%d", 4*quota), "SPILLWAY_VMM="+vmm, "SPILLWAY_MIGRATE="+migrate)
}

func integrityProgram(t *testing.T) string {
	t.Helper()
	return harness.Compile(t, harness.CBuild{Sources: []string{"testdata/integrity.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-pthread", "-lcuda"}})
}

// runIntegrity runs a scenario of testdata/integrity.c under c and checks
// what holds in every scenario: every byte of every verification as
// written, no failed call, no backing error, the device never above the
// quota. It returns the output and the report.
func runIntegrity(t *testing.T, prog, scenario string, c integrityConfig) (harness.Output, harness.Report) {
	t.Helper()
	const quota = 64 * miB
	env, statsFile := c.env(t, quota)
	res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, scenario))
	var failed []string
	for _, l := range out {
		if l[0] == "fail" || (l[0] == "check" && l[2] != "0") {
			failed = append(failed, strings.Join(l, " "))
		}
	}
	if len(failed) > 0 {
		t.Errorf("%s under %s: bytes read back other than written, or calls failed:\n%s\nstderr:\n%s",
			scenario, c.name, strings.Join(failed, "\n"), tail(res.Stderr))
	}
	if checks, bad := out.Num(t, "done", 0, 1), out.Num(t, "done", 0, 2); checks == 0 || bad != 0 {
		t.Errorf("%s under %s: %d of %d verifications bad", scenario, c.name, bad, checks)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.BackingErrors != 0 || r.ReleaseErrors != 0 {
		t.Errorf("%s under %s: report %+v: backing or release errors", scenario, c.name, r)
	}
	s := readVMMStats(t, statsFile)
	if s.Devices[0].DeviceBytesPeak > quota {
		t.Errorf("%s under %s: simcuda's device peak %d above the quota %d", scenario, c.name, s.Devices[0].DeviceBytesPeak, quota)
	}
	if r.SpilledTotal == 0 {
		t.Errorf("%s under %s: nothing spilled, the scenario proves less than it should: %+v", scenario, c.name, r)
	}
	t.Logf("%s under %s: %d verifications; report %+v", scenario, c.name, out.Num(t, "done", 0, 1), r)
	return out, r
}

// checkMoved: under migration a scenario must have moved granules both ways.
func checkMoved(t *testing.T, scenario string, c integrityConfig, r harness.Report) {
	t.Helper()
	if c.migrate && (r.DemotedTotal == 0 || r.PromotedTotal == 0) {
		t.Errorf("%s under %s: demoted %d, promoted %d bytes: migration never moved granules both ways, the scenario proves less than it should",
			scenario, c.name, r.DemotedTotal, r.PromotedTotal)
	}
}

// checkStraddles: with virtual memory, the block the scenario names must
// have started on device and host granules at once.
func checkStraddles(t *testing.T, out harness.Output, name string, c integrityConfig) {
	t.Helper()
	for _, l := range out {
		if l[0] == "pieces" && l[1] == name {
			if c.vmm && (l[2] == "0" || l[3] == "0") {
				t.Errorf("%s: the block %s is on %s device and %s host pieces, want both", c.name, name, l[2], l[3])
			}
			return
		}
	}
	t.Errorf("%s: no pieces line for %s", c.name, name)
}

// TestIntegrityStraddle: a block on device and host granules at once is
// written across its granule boundaries with every kind of copy and memset
// (synchronous, on a stream, device to device from and to device blocks,
// within itself), then granules move at each synchronization while the
// writes go on; every byte reads back as written, whole and in pieces
// across the boundaries.
func TestIntegrityStraddle(t *testing.T) {
	prog := integrityProgram(t)
	for _, c := range integrityConfigs {
		t.Run(c.name, func(t *testing.T) {
			out, r := runIntegrity(t, prog, "straddle", c)
			checkStraddles(t, out, "straddle", c)
			checkMoved(t, "straddle", c, r)
		})
	}
}

// TestIntegrityPitch: a pitched block, part spilled, whose rows cross
// granule boundaries, written by rows and partial rows and memset across
// the boundaries, survives migration.
func TestIntegrityPitch(t *testing.T) {
	prog := integrityProgram(t)
	for _, c := range integrityConfigs {
		t.Run(c.name, func(t *testing.T) {
			out, r := runIntegrity(t, prog, "pitch", c)
			checkStraddles(t, out, "pitch", c)
			checkMoved(t, "pitch", c, r)
		})
	}
}

// TestIntegrityFreeQueued: copies queued behind a held stream read a block
// that is then freed with cudaFree, its size allocated again and written
// at once, and the device synchronized (with migration: moves): the queued
// copies read what the freed block held, and the new block holds what was
// written to it.
//
// Only with managed whole-block spill: where the block spills to pinned
// memory or host granules, simcuda takes the held stream's copy out of it
// for a host-to-host copy, which returns only once done, and the program
// would wait for ever behind the held stream (CUDA's rule for copies
// between host memory).
func TestIntegrityFreeQueued(t *testing.T) {
	prog := integrityProgram(t)
	for _, c := range integrityConfigs {
		if c.vmm || c.spill != "managed" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			runIntegrity(t, prog, "freequeued", c)
		})
	}
}

// TestIntegrityAsyncReuse: cudaMallocAsync and cudaFreeAsync of spilled
// blocks on a held stream, and allocations of the same sizes on another
// stream written and read back before the held stream goes on: the held
// stream's late writes never land in the other stream's blocks.
//
// Not with whole blocks spilled to pinned memory, for the reason
// TestIntegrityFreeQueued gives.
func TestIntegrityAsyncReuse(t *testing.T) {
	prog := integrityProgram(t)
	for _, c := range integrityConfigs {
		if !c.vmm && c.spill == "pinned" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			runIntegrity(t, prog, "asyncreuse", c)
		})
	}
}

// TestIntegrityThreads: eight threads, each with its stream, allocate,
// write, verify and keep blocks across rounds while another thread
// synchronizes the device, migration's promise kept (no CUDA call of the
// workers during the synchronization): nothing corrupts.
func TestIntegrityThreads(t *testing.T) {
	prog := integrityProgram(t)
	for _, c := range integrityConfigs {
		t.Run(c.name, func(t *testing.T) {
			out, _ := runIntegrity(t, prog, "threads", c)
			if syncs := out.Num(t, "syncs", 0, 1); syncs < 2 {
				t.Errorf("%d synchronizations while the workers ran", syncs)
			}
		})
	}
}

// TestIntegrityFreeDuringSync: the documented sign of another thread at
// work: a block freed by another thread while cudaDeviceSynchronize waits
// makes that synchronization move nothing; freed before it, the same
// synchronization moves granules. Every byte holds either way.
func TestIntegrityFreeDuringSync(t *testing.T) {
	prog := integrityProgram(t)
	c := integrityConfig{"vmm-migrate-pinned", true, "pinned", true}
	_, before := runIntegrity(t, prog, "freebefore", c)
	if before.DemotedTotal == 0 {
		t.Errorf("a block freed before the synchronization: nothing demoted (%+v), want the oldest granules moved", before)
	}
	_, during := runIntegrity(t, prog, "freeduring", c)
	if during.DemotedTotal != 0 || during.PromotedTotal != 0 {
		t.Errorf("a block freed by another thread during the synchronization: demoted %d, promoted %d; want nothing moved",
			during.DemotedTotal, during.PromotedTotal)
	}
}
