package tracetest

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// Every probed allocation, copy and memset function, called once by a
// program under the shim, is counted once under its own name, with the
// bytes simcuda says it copied: the peer copies as device to device, and
// nothing the shim calls while serving the functions it interposes (pitched
// and pool allocations) as the program's own.
func TestTraceAPIsMatchSimcuda(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	prog := harness.Compile(t, harness.CBuild{
		Sources: []string{"testdata/apis.c"}, Cudart: true, ProjectHeaders: true, Flags: []string{"-lcuda"},
	})
	dir := t.TempDir()
	summary, stats := filepath.Join(dir, "summary.json"), filepath.Join(dir, "simcuda.json")
	cmd := harness.Command(t, spillway, "trace", "--summary-json", summary, "--", prog)
	harness.SetEnv(cmd, "SIMCUDA_STATS_FILE="+stats)
	res := harness.Run(t, cmd)
	if res.ExitCode != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	sum := readSummary(t, summary)
	data, err := os.ReadFile(stats)
	if err != nil {
		t.Fatal(err)
	}
	var truth struct {
		MemcpyBytes map[string]uint64 `json:"memcpy_bytes"`
	}
	if err := json.Unmarshal(data, &truth); err != nil {
		t.Fatalf("simcuda statistics %s: %v", data, err)
	}

	wantCalls := map[string]uint64{
		"cudaMalloc": 2, "cudaMemcpy": 6, "cudaMemcpyAsync": 2, "cudaMemset": 1, "cudaMemsetAsync": 1,
		"cudaMallocHost": 1, "cudaHostAlloc": 1, "cudaMallocManaged": 1, "cudaMemPrefetchAsync": 1,
		"cudaMallocPitch": 1, "cudaMallocAsync": 1, "cudaMallocFromPoolAsync": 1, "cudaFreeAsync": 2,
		"cudaDeviceSynchronize": 1, "cudaFree": 4, "cudaFreeHost": 2,
		"cuMemAlloc_v2": 1, "cuMemAllocPitch_v2": 1, "cuMemAllocFromPoolAsync": 1, "cuMemFreeAsync": 1,
		"cuMemcpyHtoD_v2": 1, "cuMemcpyDtoH_v2": 1, "cuMemcpyDtoD_v2": 1,
		"cuMemcpyHtoDAsync_v2": 1, "cuMemcpyDtoHAsync_v2": 1, "cuMemcpyDtoDAsync_v2": 1,
		"cuMemcpy": 1, "cuMemcpyAsync": 1, "cuMemcpyPeer": 1, "cuMemcpyPeerAsync": 1,
		"cuMemsetD8_v2": 1, "cuMemsetD8Async": 1, "cuCtxSynchronize": 1, "cuMemFree_v2": 2,
	}
	if !maps.Equal(sum.Calls, wantCalls) {
		t.Errorf("calls = %v\nwant    %v", sum.Calls, wantCalls)
	}
	if want := map[string]uint64{"cudaMemcpy": 1}; !maps.Equal(sum.Errors, want) {
		t.Errorf("errors = %v, want %v (the copy of kind 7)", sum.Errors, want)
	}

	// simcuda classifies copies by the memory on each side: the program's
	// cudaMemcpyDefault, cuMemcpy and cuMemcpyAsync copies (87 bytes) are
	// device to device.
	const defaultBytes = 50 + 18 + 19
	wantBytes := map[string]uint64{
		"h2d": truth.MemcpyBytes["h2d"], "d2h": truth.MemcpyBytes["d2h"], "h2h": truth.MemcpyBytes["h2h"],
		"d2d": truth.MemcpyBytes["d2d"] - defaultBytes, "default": defaultBytes,
	}
	if !maps.Equal(sum.MemcpyBytes, wantBytes) || truth.MemcpyBytes["d2d"] != 300+16+17+20+21+defaultBytes {
		t.Errorf("memcpy_bytes = %v, want %v (simcuda copied %v)", sum.MemcpyBytes, wantBytes, truth.MemcpyBytes)
	}
	const allocBytes = 2*65536 + 5000 + 6000 + 1<<20 + 100*10 + 7000 + 8000 + 9000 + 200*20 + 3000
	if sum.AllocBytes != allocBytes || sum.PrefetchBytes != 4096 || sum.Steps != 2 {
		t.Errorf("alloc_bytes %d, prefetch_bytes %d, steps %d; want %d, 4096, 2", sum.AllocBytes, sum.PrefetchBytes, sum.Steps, allocBytes)
	}
	// Every successful copy but the host-to-host one, and the four memsets.
	const memsetBytes = 333 + 444 + 100 + 101
	copied := truth.MemcpyBytes["h2d"] + truth.MemcpyBytes["d2h"] + truth.MemcpyBytes["d2d"]
	if sum.Accesses.Total != 20 || sum.Accesses.Bytes != copied+memsetBytes {
		t.Errorf("accesses %+v, want 20 of %d bytes", sum.Accesses, copied+memsetBytes)
	}
	if sum.Drops != 0 || sum.Unpaired != 0 {
		t.Errorf("drops %d, unpaired %d; want none", sum.Drops, sum.Unpaired)
	}
}
