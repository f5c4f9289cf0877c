package shimtest

import (
	"bufio"
	"strings"
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
		if total := plain.Num(t, op, 0, 2); total != 16<<30+harness.NVMLReserved {
			t.Errorf("%s without a quota: total %d, want NVML's: the device's 16 GiB and the driver's reserve", op, total)
		}
		if total, used, free := limited.Num(t, op, 0, 2), limited.Num(t, op, 0, 3), limited.Num(t, op, 0, 4); total != 64<<20 || used != 16<<20 || free != 48<<20 {
			t.Errorf("%s with a 64 MiB quota and 16 MiB allocated: total %d used %d free %d", op, total, used, free)
		}
		if got, want := limited.Line(t, op, 1), plain.Line(t, op, 1); got[2] != want[2] {
			t.Errorf("%s of the device without a quota: %v, want NVML's %v", op, got, want)
		}
	}
	if used := plain.Num(t, "v1", 0, 3); used != harness.NVMLReserved+24<<20 {
		t.Errorf("without a quota, NVML's used is %d, want the driver's reserve, 16 MiB allocated and the 8 MiB context", used)
	}
	for _, op := range []string{"p", "p2", "q"} {
		if own := int64(limited.Num(t, op, 0, 2)); own != 16<<20 {
			t.Errorf("%s: the process's own entry shows %d bytes, want the 16 MiB Spillway counts", op, own)
		}
		if own := int64(plain.Num(t, op, 0, 2)); own != 24<<20 {
			t.Errorf("%s without a quota: the process's own entry shows %d bytes, want NVML's: 16 MiB allocated and the 8 MiB context", op, own)
		}
	}
	// BAR1: no more than the quota, within which NVML's own figures.
	if total, used, free := limited.Num(t, "b", 0, 2), limited.Num(t, "b", 0, 3), limited.Num(t, "b", 0, 4); total != 64<<20 || used != 0 || free != 64<<20 {
		t.Errorf("BAR1 with a 64 MiB quota: total %d used %d free %d, want 64 MiB, 0, 64 MiB", total, used, free)
	}
	if got, want := limited.Line(t, "b", 1), plain.Line(t, "b", 1); got[2] != want[2] || plain.Num(t, "b", 0, 2) != 32<<30 {
		t.Errorf("BAR1 without a quota: %v and %v, want NVML's 32 GiB", got, plain.Line(t, "b", 0))
	}
}

// TestNVMLWithoutQuota: a process that only uses NVML and has no quota
// gets NVML's figures and never loads the core.
func TestNVMLWithoutQuota(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/nvmlonly.c"}, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lnvidia-ml"}})
	_, out := harness.RunOK(t, harness.Shimmed(t, nil, prog))
	if total := out.Num(t, "t", 0, 1); total != 16<<30+harness.NVMLReserved {
		t.Errorf("total %d, want NVML's: the device's 16 GiB and the driver's reserve", total)
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

// TestNVMLFreeWithinDevice: a process with a quota shares its device with
// another that holds most of it. NVML's free, in every memory report, is
// what is left of its quota but never more than the device really has free,
// as cudaMemGetInfo's is; its own entry in each process list is what
// Spillway counts.
func TestNVMLFreeWithinDevice(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/nvmlops.c"}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lnvidia-ml"}})
	shared := []string{"SIMCUDA_STATE_DIR=" + t.TempDir(), "SIMCUDA_DEVICES=256MiB"}
	other := harness.Command(t, prog, "200", "hold")
	harness.SetEnv(other, shared...)
	stdin, err := other.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := other.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); other.Wait() }()
	// It holds its 200 MiB once it has printed its last line.
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "b ") {
	}

	_, limited := harness.RunOK(t, harness.Shimmed(t, append(shared, "SPILLWAY_MEMORY_LIMIT=128MiB", "SPILLWAY_POOL=0"), prog, "16"))
	const deviceFree = (256 - 200 - 16) << 20
	for _, op := range []string{"v1", "v2"} {
		if total, used, free := limited.Num(t, op, 0, 2), limited.Num(t, op, 0, 3), limited.Num(t, op, 0, 4); total != 128<<20 || used != 16<<20 || free != deviceFree {
			t.Errorf("%s with a 128 MiB quota, 16 MiB allocated and %d bytes free on the device: total %d used %d free %d",
				op, deviceFree, total, used, free)
		}
	}
	for _, op := range []string{"p", "p2", "q"} {
		if own := int64(limited.Num(t, op, 0, 2)); own != 16<<20 {
			t.Errorf("%s: the process's own entry shows %d bytes, want the 16 MiB Spillway counts", op, own)
		}
	}
}

// TestNVMLPercentQuota: a percentage quota is a share of the device's
// total as CUDA reports it, NVML's being larger by the memory the driver
// reserves. NVML shows that quota, the one enforced, from its first call
// (before the device is first used) as after, as cuDeviceTotalMem and
// cudaMemGetInfo do; BAR1 is within it from the first call too.
func TestNVMLPercentQuota(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/nvmlfirstuse.c"}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lnvidia-ml", "-lcuda"}})
	_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=1x16GiB", "SPILLWAY_MEMORY_LIMIT=50%", "SPILLWAY_POOL=0"}, prog))
	const quota = 8 << 30 // 50% of CUDA's 16 GiB
	for k, used := range []uint64{0, 16 << 20} {
		when := [...]string{"before the first use", "after it"}[k]
		if total, u, free := out.Num(t, "v1", k, 1), out.Num(t, "v1", k, 2), out.Num(t, "v1", k, 3); total != quota || u != used || free != quota-used {
			t.Errorf("nvmlDeviceGetMemoryInfo %s: total %d used %d free %d, want %d, %d, %d", when, total, u, free, uint64(quota), used, quota-used)
		}
		if total, reserved, u, free := out.Num(t, "v2", k, 1), out.Num(t, "v2", k, 2), out.Num(t, "v2", k, 3), out.Num(t, "v2", k, 4); total != quota || reserved != 0 || u != used || free != quota-used {
			t.Errorf("nvmlDeviceGetMemoryInfo_v2 %s: total %d reserved %d used %d free %d, want %d, 0, %d, %d", when, total, reserved, u, free, uint64(quota), used, quota-used)
		}
		if total := out.Num(t, "b", k, 1); total != quota {
			t.Errorf("BAR1 %s: %d, want the quota %d", when, total, uint64(quota))
		}
		if total := out.Num(t, "d", k, 1); total != quota {
			t.Errorf("cuDeviceTotalMem %s: %d, want %d", when, total, uint64(quota))
		}
		if free, total := out.Num(t, "r", k, 1), out.Num(t, "r", k, 2); total != quota || free != quota-used {
			t.Errorf("cudaMemGetInfo %s: free %d total %d, want %d, %d", when, free, total, quota-used, uint64(quota))
		}
	}
}
