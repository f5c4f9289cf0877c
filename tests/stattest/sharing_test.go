package stattest

import (
	"strconv"
	"strings"
	"testing"
)

// processFigures is what spillway stat publishes for pid on GPU gpu.
func processFigures(t *testing.T, s statJSON, gpu, pid int) statProcessJSON {
	t.Helper()
	for _, p := range s.Devices[gpu].Processes {
		if p.PID == pid && p.Spillway != nil {
			return p
		}
	}
	t.Fatalf("GPU %d does not list pid %d with its figures: %+v", gpu, pid, s.Devices[gpu].Processes)
	return statProcessJSON{}
}

// Two processes share a 256 MiB device, each under its own quota (default
// virtual memory). a holds 192 MiB of its 200 MiB quota: its 16 MiB more is
// the quota's refusal. b holds 32 MiB of its 128 MiB quota, and its 64 MiB
// more finds the device full below its quota: CUDA's out-of-memory error, a
// line that says the device is full (not the quota), the refusal counted,
// and none of what b mapped trying kept from a.
func TestDeviceFullBelowQuota(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	a := startHolder(t, e, bin, "200MiB", "0", "0", strconv.Itoa(192*mib), "?"+strconv.Itoa(16*mib))
	b := startHolder(t, e, bin, "128MiB", "0", "0", strconv.Itoa(32*mib), "?"+strconv.Itoa(64*mib))
	s := statAfter(t, e, a, b)
	pa, pb := processFigures(t, s, 0, a.cmd.Process.Pid), processFigures(t, s, 0, b.cmd.Process.Pid)
	if sp := pa.Spillway; sp.Used != 192*mib || sp.Refused != 1 {
		t.Errorf("a published %+v: want 192MiB used and one refusal", sp)
	}
	if sp := pb.Spillway; sp.Used != 32*mib || sp.Cached != 0 || sp.Refused != 1 {
		t.Errorf("b published %+v: want 32MiB used, nothing cached, one refusal", sp)
	}
	if pb.NVMLUsed == nil || *pb.NVMLUsed != 32*mib {
		t.Errorf("NVML does not give b %d bytes: %+v", 32*mib, pb)
	}
	ra, _ := a.finish(t, 0)
	rb, stats := b.finish(t, 0)
	if ra.Refused != 1 || rb.Refused != 1 || rb.Reserved != 32*mib || stats.Devices[0].DeviceBytesPeak > 64*mib {
		t.Errorf("a's report %+v, b's %+v, b's simcuda peak %d", ra, rb, stats.Devices[0].DeviceBytesPeak)
	}
	quotaLine := "cudaMalloc of 16MiB refused on device 0: 192MiB in use of a quota of 200MiB"
	if !strings.Contains(a.stderr.String(), quotaLine) || !strings.Contains(a.stderr.String(), "hold: cudaMalloc of 16777216 refused: 2") {
		t.Errorf("a's stderr lacks the quota's refusal %q:\n%s", quotaLine, a.stderr.String())
	}
	deviceLine := "cudaMalloc of 64MiB refused on device 0: the device is out of memory (32MiB free on it) though the quota is not (32MiB in use of 128MiB)"
	if !strings.Contains(b.stderr.String(), deviceLine) || !strings.Contains(b.stderr.String(), "hold: cudaMalloc of 67108864 refused: 2") {
		t.Errorf("b's stderr lacks the device's refusal %q:\n%s", deviceLine, b.stderr.String())
	}
}

// With oversubscription, what the full device cannot give below the quota
// spills, granule by granule: b's 64 MiB takes the 32 MiB the device has
// left and 32 MiB of host memory, and the device never holds more than it
// has.
func TestDeviceFullBelowQuotaSpills(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	a := startHolder(t, e, bin, "200MiB", "0", "0", strconv.Itoa(192*mib))
	b := startHolderEnv(t, e, bin, []string{"SPILLWAY_MEMORY_LIMIT=128MiB", "SPILLWAY_OVERSUBSCRIBE=1"},
		"0", "0", strconv.Itoa(32*mib), strconv.Itoa(64*mib))
	s := statAfter(t, e, a, b)
	pb := processFigures(t, s, 0, b.cmd.Process.Pid)
	if sp := pb.Spillway; sp.Used != 64*mib || sp.Spilled != 32*mib || sp.Live != 96*mib || sp.Refused != 0 {
		t.Errorf("b published %+v: want 64MiB used, 32MiB spilled, 96MiB live, no refusal", sp)
	}
	a.finish(t, 0)
	rb, stats := b.finish(t, 0)
	if rb.Spilled != 32*mib || rb.Refused != 0 || stats.Devices[0].DeviceBytesPeak != 64*mib {
		t.Errorf("b's report %+v, simcuda peak %d: want 32MiB spilled and the device's 64MiB", rb, stats.Devices[0].DeviceBytesPeak)
	}
	if strings.Contains(b.stderr.String(), "refused on device") || strings.Contains(b.stderr.String(), "hold: cudaMalloc") {
		t.Errorf("b's stderr tells of a refusal:\n%s", b.stderr.String())
	}
}
