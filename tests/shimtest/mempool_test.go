package shimtest

import (
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

const miB = 1 << 20

// poolFigures are the four usage attributes of a line of mempool's output.
type poolFigures struct{ reserved, reservedHigh, used, usedHigh uint64 }

func figures(t *testing.T, out harness.Output, step string) poolFigures {
	t.Helper()
	if rc := out.Code(t, step, 0); rc != 0 {
		t.Fatalf("%s: reading the attributes failed with %d\n%v", step, rc, out)
	}
	return poolFigures{out.Num(t, step, 0, 2), out.Num(t, step, 0, 3), out.Num(t, step, 0, 4), out.Num(t, step, 0, 5)}
}

// runMempool runs testdata/mempool.c in mode arg on device 0 under a 256
// MiB quota with env and returns its output and simcuda's device bytes for
// the process at exit.
func runMempool(t *testing.T, env []string, arg string) (harness.Output, uint64) {
	t.Helper()
	return runMempoolOn(t, env, arg, 0)
}

// runMempoolOn is runMempool on device.
func runMempoolOn(t *testing.T, env []string, arg string, device int) (harness.Output, uint64) {
	t.Helper()
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/mempool.c"}, Cudart: true,
		ProjectHeaders: true, Flags: []string{"-lcuda"}})
	stats := filepath.Join(t.TempDir(), "stats.json")
	env = append([]string{"SPILLWAY_MEMORY_LIMIT=256MiB", "SIMCUDA_STATS_FILE=" + stats}, env...)
	_, out := harness.RunOK(t, harness.Shimmed(t, env, prog, arg, fmt.Sprint(device)))
	return out, harness.ReadStats(t, stats).Devices[device].DeviceBytes
}

// TestDefaultMemPoolAttributes: the default memory pool's usage attributes,
// read through the runtime and through the driver as PyTorch's
// cudaMallocAsync backend reads them, are Spillway's pool's (cudaMalloc's
// memory included, since the pool serves both), agree with simcuda's
// device bytes, and reset their high-water marks to the current figures
// when set to 0 (any other value is CUDA's cudaErrorInvalidValue, and
// resets nothing). The
// release threshold reads back what was set, and a pool the program created
// keeps CUDA's figures. cudaDeviceSynchronize and cudaMemPoolTrimTo(pool, 0)
// give the cache back to the device: simcuda then holds only the live
// block. With fixed segments and with virtual memory.
func TestDefaultMemPoolAttributes(t *testing.T) {
	for _, vmm := range []string{"SPILLWAY_VMM=0", "SPILLWAY_VMM=1"} {
		t.Run(vmm, func(t *testing.T) {
			out, held := runMempool(t, []string{vmm}, "keep")
			if out.Code(t, "pools", 0) != 0 || out.Num(t, "pools", 0, 2) != 1 {
				t.Fatalf("the default pool and the current pool: %v, want one pool", out.Line(t, "pools", 0))
			}
			if l := out.Line(t, "explicit", 0); out.Code(t, "explicit", 0) != 0 || out.Num(t, "explicit", 0, 2) != 4*miB ||
				out.Num(t, "explicit", 0, 3) != 4*miB || out.Num(t, "explicit", 0, 4) != 12345 {
				t.Errorf("a pool the program made, holding 4 MiB: %v, want CUDA's figures 4 MiB reserved, 4 MiB used, threshold 12345", l)
			}
			if rc := out.Code(t, "alloc", 0); rc != 0 {
				t.Fatalf("alloc: %d", rc)
			}
			full := figures(t, out, "full")
			if full.used != 36*miB || full.usedHigh != 36*miB || full.reserved < full.used || full.reservedHigh != full.reserved {
				t.Errorf("with 36 MiB live: %+v, want 36 MiB used and used high, reserved at least that and its high equal", full)
			}
			if drv := figures(t, out, "full-drv"); drv != full {
				t.Errorf("through the driver's cuMemPoolGetAttribute (cuGetProcAddress): %+v, the runtime's %+v", drv, full)
			}
			if freed := figures(t, out, "freed"); freed.used != 8*miB || freed.usedHigh != 36*miB || freed.reserved != full.reserved {
				t.Errorf("after freeing 28 MiB: %+v, want 8 MiB used, 36 MiB used high, reserved unchanged %d", freed, full.reserved)
			}
			if rc := out.Code(t, "badhigh", 0); rc != harness.ErrInvalidValue {
				t.Errorf("setting UsedMemHigh to 5: %d, want cudaErrorInvalidValue", rc)
			}
			if bad, freed := figures(t, out, "after-badhigh"), figures(t, out, "freed"); bad != freed {
				t.Errorf("after UsedMemHigh set to 5, which CUDA refuses: %+v, want the figures unchanged %+v", bad, freed)
			}
			if rc := out.Code(t, "reset", 0); rc != 0 {
				t.Errorf("setting both Highs to 0: %d", rc)
			}
			if reset := figures(t, out, "after-reset"); reset.usedHigh != 8*miB || reset.reservedHigh != reset.reserved {
				t.Errorf("after the reset: %+v, want the Highs at the current figures", reset)
			}
			drv := figures(t, out, "after-drvreset")
			if out.Code(t, "drvreset", 0) != 0 || drv.usedHigh != 8*miB || drv.reservedHigh < drv.reserved {
				t.Errorf("16 MiB allocated and freed, then UsedMemHigh reset through the driver: %+v, want 8 MiB used high", drv)
			}
			if l := out.Line(t, "threshold", 0); out.Code(t, "threshold", 0) != 0 || len(l) < 3 || l[2] != fmt.Sprint(uint64(math.MaxUint64)) {
				t.Errorf("release threshold set to UINT64_MAX: %v", out.Line(t, "threshold", 0))
			}
			if held != drv.reserved {
				t.Errorf("simcuda holds %d bytes for the process, the default pool reports %d reserved", held, drv.reserved)
			}

			out, held = runMempool(t, []string{vmm}, "trim")
			before := figures(t, out, "after-drvreset")
			trimmed := figures(t, out, "trimmed")
			if rc := out.Code(t, "trim", 0); rc != 0 {
				t.Fatalf("cudaDeviceSynchronize, cudaMemPoolTrimTo(pool, 0): %d", rc)
			}
			// Under a 256 MiB quota a shared segment is at most 8 MiB, so
			// the 8 MiB block left has a segment of its own; with virtual
			// memory it lies on four whole granules: nothing else is held.
			if trimmed.used != 8*miB || trimmed.reserved != 8*miB || held != 8*miB {
				t.Errorf("trimmed to 0 with 8 MiB live: %+v, simcuda holds %d bytes (%d reserved before); want 8 MiB reserved and held", trimmed, held, before.reserved)
			}
			if trimmed.reservedHigh != before.reservedHigh {
				t.Errorf("reserved high after the trim %d, want %d, the mark before it", trimmed.reservedHigh, before.reservedHigh)
			}
		})
	}
}

// TestDefaultMemPoolTrimKeeps: cudaMemPoolTrimTo of the default pool keeps
// up to the bytes it is asked to keep: trimmed to 256 MiB, more than the
// pool holds, it releases nothing, and neither does trimming a pool the
// program made to 0; trimmed to 0 afterwards, only the live 8 MiB block
// stays.
func TestDefaultMemPoolTrimKeeps(t *testing.T) {
	out, held := runMempool(t, nil, "trimkeep")
	before := figures(t, out, "after-drvreset")
	if rc := out.Code(t, "trimkeep", 0); rc != 0 {
		t.Fatalf("cudaMemPoolTrimTo(pool, 256 MiB), then of a pool the program made: %d", rc)
	}
	if kept := figures(t, out, "kept"); kept.reserved != before.reserved || kept.reserved <= 8*miB {
		t.Errorf("trimmed to 256 MiB, and another pool to 0: %d bytes reserved, want the %d held before (more than the 8 MiB live)", kept.reserved, before.reserved)
	}
	if trimmed := figures(t, out, "trimmed"); trimmed.reserved != 8*miB || held != 8*miB {
		t.Errorf("then trimmed to 0: %d bytes reserved, simcuda holds %d; want the live 8 MiB", trimmed.reserved, held)
	}
}

// TestDefaultMemPoolWithoutPooling: with SPILLWAY_POOL=0 cudaMallocAsync
// reaches CUDA's own default pool, whose figures then stand: the 32 MiB of
// cudaMallocAsync, not cudaMalloc's 4 MiB.
func TestDefaultMemPoolWithoutPooling(t *testing.T) {
	out, _ := runMempool(t, []string{"SPILLWAY_POOL=0"}, "trim")
	if full := figures(t, out, "full"); full.used != 32*miB || full.reserved != 32*miB {
		t.Errorf("pool off, 32 MiB of cudaMallocAsync and 4 MiB of cudaMalloc live: %+v, want CUDA's own 32 MiB", full)
	}
	if rc := out.Code(t, "trim", 0); rc != 0 {
		t.Errorf("cudaMemPoolTrimTo with the pool off: %d", rc)
	}
}

// TestDefaultMemPoolOfSecondDevice: each device's default pool answers from
// that device's pool, found by its handle whatever device is current.
func TestDefaultMemPoolOfSecondDevice(t *testing.T) {
	out, held := runMempoolOn(t, []string{"SIMCUDA_DEVICES=2x1GiB"}, "trim", 1)
	if full := figures(t, out, "full"); full.used != 36*miB {
		t.Errorf("device 1 with 36 MiB live: %+v, want 36 MiB used", full)
	}
	if trimmed := figures(t, out, "trimmed"); trimmed.reserved != held || held != 8*miB {
		t.Errorf("device 1 trimmed to 0 with 8 MiB live: %+v, simcuda holds %d bytes there; want 8 MiB", trimmed, held)
	}
}
