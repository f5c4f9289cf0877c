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

// TestAsyncFreeOnOtherDevice: CUDA lets memory of device 0 be freed in
// stream order on a stream of device 1, and frees it when that stream
// reaches the free. With a memset of the block queued on a held stream of
// device 1 before the free, device 0's synchronization does not make the
// block reusable: the next cudaMalloc on device 0 gets other memory, and
// what the program writes there stays as written once the stream runs.
// For cudaFreeAsync, cuMemFreeAsync and cuMemFreeAsync_ptsz, with virtual
// memory and fixed segments, with the stream destroyed right after the
// free (its work still runs), and without pooling (SPILLWAY_POOL=0), where
// the free must not wait on the host for the held stream. Once the stream has reached the free, the
// block is reused: 40 MiB more fit under the 64 MiB quota only with the
// 40 MiB freed.
func TestAsyncFreeOnOtherDevice(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/crossfree.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda"}})
	runHeldFrees(t, prog, "device 1's stream", []heldFree{
		{"rt", "rt", "1", "1", "1"}, {"drv", "drv", "1", "1", "1"}, {"drvpt", "drvpt", "1", "1", "1"},
		{"rt-segments", "rt", "0", "1", "1"}, {"rtdestroy", "rtdestroy", "1", "1", "1"},
		{"rt-reuse", "rt", "1", "1", "40"}, {"rtdestroy-reuse", "rtdestroy", "1", "1", "40"},
		{"rt-passthrough", "rt", "1", "0", "40"},
	})
}

// heldFree is a case of a program built on testdata/heldfree.h: its KIND
// argument, SPILLWAY_VMM and SPILLWAY_POOL, and its SIZE in MiB.
type heldFree struct{ name, kind, vmm, pooled, mib string }

// runHeldFrees runs prog for each case under a 64 MiB quota on two peer
// devices: every step succeeds, the block freed on the held stream (of
// device 1, named by held) is not handed out again before that stream
// reaches its free, and what the program wrote in the new block survives
// the memset queued before the free.
func runHeldFrees(t *testing.T, prog, held string, cases []heldFree) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=2x1GiB", "SIMCUDA_PEER=1",
				"SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_VMM=" + c.vmm, "SPILLWAY_POOL=" + c.pooled}, prog, c.kind, c.mib))
			checkSteps(t, out, []step{
				{"A", 0, 0}, {"F", 0, 0}, {"Y", 0, 0}, {"B", 0, 0}, {"P", 0, 0}, {"H", 0, 0},
				{"V", 0, 0}, {"C", 0, 0},
			})
			if same := out.Num(t, "B", 0, 3); same != 0 {
				t.Errorf("cudaMalloc handed out %#x again while %s had not reached its free\n%v",
					out.Num(t, "B", 0, 2), held, out)
			}
			if wrong := out.Num(t, "V", 0, 2); wrong != 0 {
				t.Errorf("%d of 4096 bytes overwritten by a memset queued on %s before the free\n%v", wrong, held, out)
			}
		})
	}
}

// TestAsyncFreeOnOtherDeviceStreamDestroyed: two blocks of device 0 freed
// in stream order on a held stream of device 1, which is destroyed at once
// (its work still runs), with cudaStreamDestroy or the driver's
// cuStreamDestroy, or destroyed by device 1's reset once let go; or freed
// on the default stream while device 1 is current, then device 1 reset, or
// while a context created on device 1 is current, then that context
// destroyed: once the stream has run its work, both blocks are reused, so
// 60 MiB fit under the 64 MiB quota.
func TestAsyncFreeOnOtherDeviceStreamDestroyed(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/crossdestroy.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda"}})
	for _, kind := range []string{"rt", "drv", "reset", "default", "created"} {
		t.Run(kind, func(t *testing.T) {
			_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=2x1GiB", "SIMCUDA_PEER=1",
				"SPILLWAY_MEMORY_LIMIT=64MiB"}, prog, kind))
			checkSteps(t, out, []step{{"A", 0, 0}, {"F", 0, 0}, {"H", 0, 0}, {"C", 0, 0}})
		})
	}
}

// TestAsyncFreeOnOtherDeviceDefaultStream: CUDA orders a stream-ordered
// free on a default stream (0, cudaStreamLegacy, cudaStreamPerThread, the
// driver's stream 0 and its _ptsz form) on the current context's stream of
// that name, whatever device the memory is on. Memory of device 0 freed so
// while device 1 is current, after a memset queued on device 1's held
// default stream, is not made reusable by device 0's synchronization: the
// next cudaMalloc on device 0 gets other memory, and what the program
// writes there stays as written once the stream runs. With pooling and
// without it (SPILLWAY_POOL=0); once the stream has reached the free, 40 MiB
// more fit under the 64 MiB quota only with the 40 MiB freed.
func TestAsyncFreeOnOtherDeviceDefaultStream(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/defaultfree.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda"}})
	runHeldFrees(t, prog, "device 1's default stream", []heldFree{
		{"rt", "rt", "1", "1", "1"}, {"legacy", "legacy", "1", "1", "1"},
		{"perthread", "perthread", "1", "1", "1"}, {"drv", "drv", "1", "1", "1"},
		{"drvpt", "drvpt", "1", "1", "1"}, {"rt-segments", "rt", "0", "1", "1"},
		{"rt-reuse", "rt", "1", "1", "40"}, {"perthread-reuse", "perthread", "1", "1", "40"},
		{"rt-passthrough", "rt", "1", "0", "40"},
	})
}

// TestAsyncFreeOnDestroyedContextStream: a block of device 0 freed in
// stream order on a held stream of a context created on device 1, or of
// device 1's primary context, which is then destroyed (cuCtxDestroy) or
// reset (cudaDeviceReset) once the stream is let go: the driver destroys
// the stream and the events made in that context, the core's among them,
// and hands their handles out again to the program's new events. The core
// must neither query nor destroy its events again: the block comes back
// (40 MiB more fit under the 64 MiB quota) and every event of the
// program's stays valid. With pooling and without it (SPILLWAY_POOL=0).
func TestAsyncFreeOnDestroyedContextStream(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/ctxevents.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda"}})
	for _, kind := range []string{"created", "reset"} {
		for _, pooling := range []string{"1", "0"} {
			t.Run(kind+"-pool"+pooling, func(t *testing.T) {
				_, out := harness.RunOK(t, harness.Shimmed(t, []string{"SIMCUDA_DEVICES=2x1GiB", "SIMCUDA_PEER=1",
					"SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_POOL=" + pooling}, prog, kind))
				checkSteps(t, out, []step{{"A", 0, 0}, {"F", 0, 0}, {"D", 0, 0}, {"C", 0, 0}, {"E", 0, 0}})
			})
		}
	}
}
