package tracetest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/bpf"
	"github.com/spillway-gpu/spillway/tests/harness"
	"github.com/spillway-gpu/spillway/tests/traces"
)

// The Qwen2.5-32B inference trace replayed under the shim with
// oversubscription at 60% of its peak, traced: steps, bytes moved per step
// and the share of accesses that touch spilled memory, as `spillway trace`
// reports them, checked against the replayer's own counts, the shim's
// report and simcuda's ground truth.

const (
	// replayScale divides every size of the trace, so that the job fits
	// simcuda on a small machine: Qwen2.5-32B's 65.5 GB of weights become
	// 1.0 GB.
	replayScale = 64
	// replayQuotaPercent is the quota, as a share of the scaled trace's peak
	// live bytes.
	replayQuotaPercent = 60
	// replayTouchBytes is how much of a block each access sets.
	replayTouchBytes = 4096
)

// scaledQwenTrace writes the Qwen2.5-32B inference trace with every size
// divided by replayScale (rounded up) where the replayer reads it, and
// returns its path and figures.
func scaledQwenTrace(t *testing.T) (string, traces.Stats) {
	t.Helper()
	ops, err := traces.Load(filepath.Join(harness.Root(t), "tests", "traces", "qwen2.5-32b-inference.trace.gz"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range ops {
		ops[i].Size = (ops[i].Size + replayScale - 1) / replayScale
	}
	st, err := traces.Summarize(ops)
	if err != nil {
		t.Fatalf("scaled trace: %v", err)
	}
	path := filepath.Join(t.TempDir(), "qwen.trace")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	model := fmt.Sprintf("Qwen2.5-32B inference, sizes / %d", replayScale)
	if err := traces.Write(f, model, ops); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path, st
}

// Under SPILLWAY_SPILL=pinned a spilled block is never promoted, so the
// replayer knows from each block's pointer attributes which of its touches
// hit spilled memory; the kernel's classification of every cudaMemsetAsync
// must agree exactly. The bytes moved are the shim's spilled and promoted
// totals, the steps the trace's synchronizations, and the device never holds
// more than the quota. With SPILLWAY_SPILL=managed (the default) spilled
// blocks are promoted when room appears, so the replayer's count is an upper
// bound. Both run on fixed segments (SPILLWAY_VMM=0), where whole blocks
// spill. With virtual memory (the default) spilling is per granule and never
// promoted: the replayer's count, by either end of each touch, is exact again.
// With SPILLWAY_MIGRATE=1 granules move, but only while the replayer waits in
// cudaDeviceSynchronize, and it asks where each touch lies: exact too.
func TestTraceReplayQwenOversubscribed(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	replay := harness.Compile(t, harness.CBuild{
		Sources: []string{"testdata/replay.c"}, Cudart: true, ProjectHeaders: true,
	})
	trace, st := scaledQwenTrace(t)
	quota := st.PeakLive * replayQuotaPercent / 100
	t.Logf("Qwen2.5-32B inference trace / %d: peak live %d bytes, %d steps; quota %d bytes (%d%%)",
		replayScale, st.PeakLive, st.Syncs, quota, replayQuotaPercent)

	for _, c := range []struct {
		name, spill, vmm string
		migrate          bool
	}{
		{"pinned", "pinned", "SPILLWAY_VMM=0", false}, {"managed", "managed", "SPILLWAY_VMM=0", false},
		{"granules", "pinned", "SPILLWAY_VMM=1", false}, {"migrate", "pinned", "SPILLWAY_VMM=1", true},
	} {
		spill := c.spill
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			summaryPath := filepath.Join(dir, "summary.json")
			statsPath := filepath.Join(dir, "stats.json")
			cmd := harness.Command(t, spillway, "trace", "--interval", "1h", "--summary-json", summaryPath,
				"--output", filepath.Join(dir, "view.txt"),
				"--", replay, trace, strconv.Itoa(replayTouchBytes))
			harness.SetEnv(cmd,
				"SIMCUDA_DEVICES=2GiB", "SIMCUDA_CONTEXT_BYTES=0", "SIMCUDA_STATS_FILE="+statsPath,
				fmt.Sprintf("SPILLWAY_MEMORY_LIMIT=%d", quota), "SPILLWAY_OVERSUBSCRIBE=1",
				fmt.Sprintf("SPILLWAY_HOST_LIMIT=%d", st.PeakLive), "SPILLWAY_SPILL="+spill,
				"SPILLWAY_REPORT=1")
			harness.SetEnv(cmd, c.vmm)
			if c.migrate {
				harness.SetEnv(cmd, "SPILLWAY_MIGRATE=1")
			}
			// The fixed-segment replays took about 90 s each on a busy
			// 2-core machine: 5 minutes leaves room for a busier one.
			res := harness.RunWithin(t, cmd, 5*time.Minute)
			if res.ExitCode != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			sum := readSummary(t, summaryPath)
			rep := harness.ReportFor(t, res.Stderr, 0)
			did := printedCounts(t, res.Stdout, "steps")
			stats := harness.ReadStats(t, statsPath)

			if sum.Drops != 0 {
				t.Fatalf("drops = %d, want 0 (the figures would be short)", sum.Drops)
			}
			if rep.Refused != 0 || sum.Pool.Refusals != 0 {
				t.Errorf("refusals: report %d, trace %d; want none", rep.Refused, sum.Pool.Refusals)
			}
			if peak := stats.Devices[0].DeviceBytesPeak; peak > quota {
				t.Errorf("simcuda's device_bytes_peak = %d, over the quota %d", peak, quota)
			}
			if sum.Steps != uint64(st.Syncs) || did["steps"] != uint64(st.Syncs) {
				t.Errorf("steps: traced %d, replayed %d; the trace has %d synchronizations", sum.Steps, did["steps"], st.Syncs)
			}
			if sum.SpillBytes != rep.SpilledTotal || sum.PromoteBytes != rep.PromotedTotal ||
				sum.MovedBytes != rep.SpilledTotal+rep.PromotedTotal {
				t.Errorf("moved %d bytes (spilled %d, promoted %d); the report says spilled_total=%d promoted_total=%d",
					sum.MovedBytes, sum.SpillBytes, sum.PromoteBytes, rep.SpilledTotal, rep.PromotedTotal)
			}
			if sum.Accesses.Total != did["accesses"] || sum.Accesses.Bytes != did["access_bytes"] {
				t.Errorf("accesses: traced %d of %d bytes, replayed %d of %d bytes",
					sum.Accesses.Total, sum.Accesses.Bytes, did["accesses"], did["access_bytes"])
			}
			if did["spilled_blocks"] == 0 || rep.SpilledTotal == 0 {
				t.Fatalf("nothing spilled (replayer: %d blocks, report: %d bytes): the quota does not bite",
					did["spilled_blocks"], rep.SpilledTotal)
			}
			// Migration promotes the demoted granules and also those that
			// spilled when allocated, so it may promote more than it demoted.
			if c.migrate && (rep.DemotedTotal == 0 || rep.PromotedTotal == 0) {
				t.Errorf("migration: demoted_total %d, promoted_total %d; want some demoted, and some promoted back",
					rep.DemotedTotal, rep.PromotedTotal)
			}
			if spill == "pinned" {
				if rep.PromotedTotal != 0 && !c.migrate {
					t.Errorf("pinned memory promoted: %d bytes", rep.PromotedTotal)
				}
				if sum.Accesses.Spilled != did["spilled_accesses"] || sum.Accesses.SpilledBytes != did["spilled_access_bytes"] {
					t.Errorf("spilled accesses: traced %d of %d bytes, replayer's %d of %d bytes",
						sum.Accesses.Spilled, sum.Accesses.SpilledBytes, did["spilled_accesses"], did["spilled_access_bytes"])
				}
			} else if sum.Accesses.Spilled == 0 || sum.Accesses.Spilled > did["spilled_accesses"] ||
				sum.Accesses.SpilledBytes > did["spilled_access_bytes"] {
				t.Errorf("spilled accesses: traced %d of %d bytes; want some, and at most the replayer's %d of %d bytes to blocks spilled when allocated",
					sum.Accesses.Spilled, sum.Accesses.SpilledBytes, did["spilled_accesses"], did["spilled_access_bytes"])
			}
			checkSummaryFigures(t, summaryPath, sum)

			perStep, _ := bpf.PerStep(sum.MovedBytes, sum.Steps)
			byCount, byBytes, _ := sum.Accesses.Fractions()
			t.Logf("%s: %d steps, %d bytes moved (spilled %d, of which demoted %d; promoted %d): %.0f bytes per step (x%d at full scale: %.0f); "+
				"spilled accesses %d of %d (%.1f%%), %d of %d bytes (%.1f%%); device peak %d of quota %d",
				c.name, sum.Steps, sum.MovedBytes, sum.SpillBytes, rep.DemotedTotal, sum.PromoteBytes, perStep, replayScale, perStep*replayScale,
				sum.Accesses.Spilled, sum.Accesses.Total, byCount*100, sum.Accesses.SpilledBytes, sum.Accesses.Bytes, byBytes*100,
				stats.Devices[0].DeviceBytesPeak, quota)
		})
	}
}

// checkSummaryFigures checks the derived keys of the summary file against its
// counts.
func checkSummaryFigures(t *testing.T, path string, sum *bpf.Summary) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		MovedBytesPerStep *float64 `json:"moved_bytes_per_step"`
		Accesses          struct {
			SpilledFraction      *float64 `json:"spilled_fraction"`
			SpilledBytesFraction *float64 `json:"spilled_bytes_fraction"`
		} `json:"accesses"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("summary %s: %v", data, err)
	}
	wantPerStep, _ := bpf.PerStep(sum.MovedBytes, sum.Steps)
	wantCount, wantBytes, _ := sum.Accesses.Fractions()
	if doc.MovedBytesPerStep == nil || *doc.MovedBytesPerStep != wantPerStep {
		t.Errorf("moved_bytes_per_step = %v, want %v", doc.MovedBytesPerStep, wantPerStep)
	}
	f := doc.Accesses
	if f.SpilledFraction == nil || *f.SpilledFraction != wantCount || f.SpilledBytesFraction == nil || *f.SpilledBytesFraction != wantBytes {
		t.Errorf("accesses.spilled_fraction = %v, spilled_bytes_fraction = %v; want %v and %v",
			f.SpilledFraction, f.SpilledBytesFraction, wantCount, wantBytes)
	}
}
