package simcudatest

// Tests of simcuda's explicit memory pools: testdata/mempools.c checks the
// driver's cuMemPool* API, cuMemAllocFromPoolAsync and the runtime's pool
// calls, and the statistics file confirms the device's totals at exit.

import (
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

func TestMemoryPools(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/mempools.c"},
		ProjectHeaders: true,
		Flags:          []string{"-L", harness.SimcudaDir(t), "-lcuda", "-lcudart"},
	})
	s := runVMMCase(t, bin, "mempools", "SIMCUDA_DEVICES=64MiB")
	dev := s.Devices[0]
	// 16 + 40 MiB from one pool is the most the program holds at once.
	if dev.DeviceBytes != 0 || dev.DeviceBytesPeak != 56*mebibyte {
		t.Errorf("device_bytes %d, device_bytes_peak %d; want 0 and %d",
			dev.DeviceBytes, dev.DeviceBytesPeak, 56*mebibyte)
	}
}
