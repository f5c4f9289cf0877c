package shimtest

import (
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// TestAsyncAllocOnStreamDevice: CUDA serves a stream-ordered allocation
// from the memory pool of the stream's device, whatever device is current,
// and an explicit pool's allocation from that pool's device, whatever the
// stream's. With 64 MiB quotas on two devices and 48 MiB taken on device 0
// (current), 48 MiB on a stream of device 1, or from a pool of device 1 on
// device 0's default stream, land on device 1 (simcuda's ground truth) and
// count there: device 0's quota does not refuse them, device 1's refuses
// 48 MiB more, cudaMemGetInfo shows each device's use, the current device
// stays 0, and a stream-ordered free gives the bytes back to device 1. For
// the runtime's and the driver's calls, and the driver's _ptsz forms.
func TestAsyncAllocOnStreamDevice(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/streamdev.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda"}})
	for _, kind := range []string{"rt", "drv", "drvpt", "poolrt", "pooldrv", "pooldrvpt"} {
		t.Run(kind, func(t *testing.T) {
			_, out := harness.RunOK(t, harness.Shimmed(t,
				[]string{"SIMCUDA_DEVICES=2x1GiB", "SPILLWAY_MEMORY_LIMIT=64MiB"}, prog, kind))
			checkSteps(t, out, []step{
				{"base", 0, 0}, {"A", 0, 0}, {"B", 0, harness.ErrMemoryAllocation}, {"G", 0, 0},
				{"I0", 0, 0}, {"I1", 0, 0}, {"F", 0, 0}, {"C", 0, 0},
			})
			if dev := out.Num(t, "A", 0, 2); dev != 1 {
				t.Errorf("48 MiB for device 1: on device %d, want 1", dev)
			}
			if dev := out.Num(t, "G", 0, 2); dev != 0 {
				t.Errorf("the current device after the allocations: %d, want 0", dev)
			}
			for _, info := range []string{"I0", "I1"} {
				if free := out.Num(t, info, 0, 2); free != 16*miB {
					t.Errorf("%s: %d bytes free, want 16 MiB (48 MiB of the 64 MiB quota in use)", info, free)
				}
			}
		})
	}
}
