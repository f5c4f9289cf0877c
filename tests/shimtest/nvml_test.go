package shimtest

import (
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// TestNVMLQuota: NVML shows a process with a quota on a device that quota
// as the device's total and what Spillway counts as used, in every memory
// report and in its own process entry; a device without a quota, or a
// process without one, sees NVML's own figures.
func TestNVMLQuota(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/nvmlops.c"}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lnvidia-ml"}})
	// Contexts of 8 MiB make NVML's used differ from what Spillway counts.
	devices := []string{"SIMCUDA_DEVICES=2x16GiB", "SIMCUDA_CONTEXT_BYTES=8MiB"}
	_, plain := harness.RunOK(t, harness.Shimmed(t, devices, prog, "16"))
	_, limited := harness.RunOK(t, harness.Shimmed(t, append(devices, "SPILLWAY_MEMORY_LIMIT_0=64MiB", "SPILLWAY_POOL=0"), prog, "16"))
	for _, op := range []string{"v1", "v2"} {
		if total := plain.Num(t, op, 0, 2); total != 16<<30 {
			t.Errorf("%s without a quota: total %d, want the device's 16 GiB", op, total)
		}
		if total, used, free := limited.Num(t, op, 0, 2), limited.Num(t, op, 0, 3), limited.Num(t, op, 0, 4); total != 64<<20 || used != 16<<20 || free != 48<<20 {
			t.Errorf("%s with a 64 MiB quota and 16 MiB allocated: total %d used %d free %d", op, total, used, free)
		}
		if got, want := limited.Line(t, op, 1), plain.Line(t, op, 1); got[2] != want[2] {
			t.Errorf("%s of the device without a quota: %v, want NVML's %v", op, got, want)
		}
	}
	if used := plain.Num(t, "v1", 0, 3); used != 24<<20 {
		t.Errorf("without a quota, NVML's used is %d, want 16 MiB allocated + the 8 MiB context", used)
	}
	for _, op := range []string{"p", "q"} {
		if own := int64(limited.Num(t, op, 0, 2)); own != 16<<20 {
			t.Errorf("%s: the process's own entry shows %d bytes, want the 16 MiB Spillway counts", op, own)
		}
	}
	// BAR1: no more than the quota, within which NVML's own figures.
	if total, used, free := limited.Num(t, "b", 0, 2), limited.Num(t, "b", 0, 3), limited.Num(t, "b", 0, 4); total != 64<<20 || used != 0 || free != 64<<20 {
		t.Errorf("BAR1 with a 64 MiB quota: total %d used %d free %d, want 64 MiB, 0, 64 MiB", total, used, free)
	}
	if got, want := limited.Line(t, "b", 1), plain.Line(t, "b", 1); got[2] != want[2] || plain.Num(t, "b", 0, 2) != 16<<30 {
		t.Errorf("BAR1 without a quota: %v and %v, want NVML's 16 GiB", got, plain.Line(t, "b", 0))
	}
}

// TestNVMLWithoutQuota: a process that only uses NVML and has no quota
// gets NVML's figures and never loads the core.
func TestNVMLWithoutQuota(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/nvmlonly.c"}, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lnvidia-ml"}})
	_, out := harness.RunOK(t, harness.Shimmed(t, nil, prog))
	if total := out.Num(t, "t", 0, 1); total != 16<<30 {
		t.Errorf("total %d, want the device's 16 GiB", total)
	}
	if out.Num(t, "L", 0, 1) != 0 {
		t.Errorf("an NVML call without a quota loaded the core")
	}
}

// TestNVMLOnlyWithQuota: a process that has used only NVML (a monitoring
// tool started under a quota) sees the quota as the device's total: the
// core starts on the driver the front loads to match NVML's devices to
// CUDA's, without a word on standard error.
func TestNVMLOnlyWithQuota(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/nvmlonly.c"}, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lnvidia-ml"}})
	res, out := harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=1x16GiB", "SPILLWAY_MEMORY_LIMIT=8GiB"}, prog))
	if l := out.Line(t, "t", 0); out.Num(t, "t", 0, 1) != 8<<30 || out.Num(t, "t", 0, 3) != 8<<30 {
		t.Errorf("nvmlDeviceGetMemoryInfo under an 8 GiB quota: %v, want total and free 8 GiB", l)
	}
	if res.Stderr != "" {
		t.Errorf("stderr: %q", res.Stderr)
	}
}
