package tracetest

import (
	"strconv"
	"testing"

	"github.com/spillway-gpu/spillway/bpf"
)

// Faults on a range the shim reported spilled are told apart from others,
// and only the traced process's faults are counted. The workload fires
// spillway_probe_spill itself on a fresh host range, writes each page of it,
// then as many pages of an unspilled range.
func TestSpilledFaultsClassified(t *testing.T) {
	const pages = 64
	sum, pid := traceFakeWorkload(t, "spill", "64")

	if sum.Drops != 0 {
		t.Fatalf("drops = %d, want 0", sum.Drops)
	}
	if sum.SpillBytes != pages*4096 || sum.Pool.Spills != 1 {
		t.Errorf("spill_bytes = %d in %d spills, want %d in 1", sum.SpillBytes, sum.Pool.Spills, pages*4096)
	}
	// One write fault per fresh page (huge pages are off for the range).
	if sum.PageFaults.Spilled != pages {
		t.Errorf("faults on spilled memory = %d, want %d", sum.PageFaults.Spilled, pages)
	}
	if sum.PageFaults.Total < 2*pages {
		t.Errorf("faults = %d, want at least %d (both ranges)", sum.PageFaults.Total, 2*pages)
	}
	for key, p := range sum.Processes {
		if key != pidKey(pid) && (p.PageFaults.Total != 0 || p.Calls != 0) {
			t.Errorf("faults attributed to process %s, not the workload %d: %+v", key, pid, p)
		}
	}
	if got := sum.Processes[pidKey(pid)]; got == nil || got.PageFaults != sum.PageFaults {
		t.Errorf("workload's own faults = %+v, want all of %+v", got, sum.PageFaults)
	}
}

// A spilled range that starts and ends inside pages is matched to the byte:
// the kernel keeps it as aligned power-of-two blocks, and the faults on its
// three pages are spilled while those just outside are not.
func TestSpilledRangeEdges(t *testing.T) {
	sum, _ := traceFakeWorkload(t, "edges", "8")
	if sum.PageFaults.Spilled != 3 {
		t.Errorf("faults on spilled memory = %d, want 3 (pages 1 to 3)", sum.PageFaults.Spilled)
	}
	if sum.PageFaults.Total < 5 {
		t.Errorf("faults = %d, want at least the 5 pages written", sum.PageFaults.Total)
	}
	if sum.SpillBytes != 3*4096+7 || sum.PromoteBytes != 3*4096+7 {
		t.Errorf("spilled %d, promoted %d bytes, want %d each", sum.SpillBytes, sum.PromoteBytes, 3*4096+7)
	}
}

// Copies and memsets are classified by the first and last byte of each range
// they name against the same spilled ranges, counted in bytes with the
// driver's units, host-to-host copies are no access, and a promoted range is
// spilled no more. Synchronizations at either layer are steps, counted once.
func TestSpilledAccessesClassified(t *testing.T) {
	sum, _ := traceFakeWorkload(t, "accesses", "8")

	if sum.Drops != 0 {
		t.Fatalf("drops = %d, want 0", sum.Drops)
	}
	want := bpf.AccessCounts{Total: 8, Spilled: 4, Bytes: 16 + 60 + 50 + 4 + 8 + 10 + 10 + 16, SpilledBytes: 16 + 60 + 4 + 10}
	if sum.Accesses != want {
		t.Errorf("accesses %+v, want %+v", sum.Accesses, want)
	}
	if sum.Steps != 2 || sum.Calls["cudaDeviceSynchronize"] != 1 || sum.Calls["cuCtxSynchronize"] != 1 {
		t.Errorf("steps = %d, calls %v; want 2, one at each layer", sum.Steps, sum.Calls)
	}
	if sum.MovedBytes != 2*(3*4096+7) {
		t.Errorf("moved_bytes = %d, want the spill and the promotion, %d", sum.MovedBytes, 2*(3*4096+7))
	}
}

// A spill past the limit on spilled allocations a session tracks (the size
// of the spilled map in bpf/spillway.bpf.c) leaves no range behind: once
// every spill is freed, faults on its pages, now plain memory, are not
// counted as spilled.
func TestSpillPastLimitLeavesNoRange(t *testing.T) {
	const spilledLimit = 65536
	sum, _ := traceFakeWorkload(t, "overfill", strconv.Itoa(spilledLimit))

	if sum.Drops != 0 {
		t.Fatalf("drops = %d, want 0", sum.Drops)
	}
	if sum.Pool.Spills != spilledLimit+1 {
		t.Errorf("spills = %d, want %d", sum.Pool.Spills, spilledLimit+1)
	}
	const pages = 8 // written after every spill was freed
	if sum.PageFaults.Total < pages {
		t.Errorf("faults = %d, want at least the %d pages written", sum.PageFaults.Total, pages)
	}
	if sum.PageFaults.Spilled != 0 {
		t.Errorf("faults on spilled memory = %d, want 0: every spill was freed before the pages were written", sum.PageFaults.Spilled)
	}
}
