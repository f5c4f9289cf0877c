package simcudatest

// Tests of simcuda's CUDA arrays (cuArrayCreate_v2, cuArray3DCreate_v2,
// cuArrayDestroy, their descriptors, cuArrayGetMemoryRequirements, and the
// runtime's cudaMallocArray, cudaMalloc3DArray, cudaFreeArray,
// cudaArrayGetInfo, cudaArrayGetMemoryRequirements) and mipmapped arrays
// (cuMipmappedArrayCreate, cuMipmappedArrayDestroy, cuMipmappedArrayGetLevel
// and the runtime's cudaMallocMipmappedArray, cudaFreeMipmappedArray,
// cudaGetMipmappedArrayLevel): testdata/arrays.c
// checks one behaviour per run against cuMemGetInfo, and the statistics
// file confirms the totals at exit.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

func TestArrays(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/arrays.c"},
		ProjectHeaders: true,
		Cudart:         true,
		Flags:          []string{"-L", harness.SimcudaDir(t), "-lcuda"},
	})
	cases := []struct {
		name string
		env  []string
		why  string
		// ground truth at exit on device 0: array bytes, live and peak device bytes
		arrays, live, peak uint64
	}{
		{name: "driver_charge", why: "each shape takes its elements times their size in 512-byte granules, until destroyed",
			peak: 1024*768*16 + 512 + 64*64*64*4},
		{name: "driver_errors", why: "CUDA's argument rules and codes; refusals take nothing", peak: 131072 * 4},
		{name: "requirements", why: "only a deferred-mapping array has requirements, and it takes no memory", peak: 16 * mebibyte},
		{name: "capacity", why: "an array past the device's capacity is refused with CUDA_ERROR_OUT_OF_MEMORY",
			env: []string{"SIMCUDA_DEVICES=64MiB"}, arrays: 2048 * 1025 * 16, live: 2048 * 1025 * 16, peak: 2048 * 1025 * 16},
		{name: "contexts", why: "destroying a created context or resetting the primary one destroys its arrays", peak: 2 * mebibyte},
		{name: "runtime", why: "the runtime's forms make the driver's arrays; channel descriptors follow CUDA's rules",
			peak: mebibyte + 64*64*8*2},
		{name: "mipmap_charge", why: "a mipmapped array takes the sum of its levels, halving each extent, until destroyed",
			peak: 176640 + 1196032 + 45056 + 4096},
		{name: "mipmap_errors", why: "CUDA's argument rules and codes for mipmapped arrays; refusals take nothing",
			peak: 16 * 16 * 4 * 2},
		{name: "mipmap_capacity", why: "a mipmapped array whose levels together pass the device's capacity is refused",
			env: []string{"SIMCUDA_DEVICES=64MiB"}, arrays: 44741120, live: 44741120, peak: 44741120},
		{name: "mipmap_contexts", why: "destroying a created context or resetting the primary one destroys its mipmapped arrays",
			peak: 2 * mebibyte},
		{name: "mipmap_runtime", why: "the runtime's forms make the driver's mipmapped arrays, reachable through cuGetProcAddress",
			peak: mebibyte + mebibyte/4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "stats.json")
			cmd := harness.Command(t, bin, c.name)
			harness.SetEnv(cmd, append([]string{"SIMCUDA_STATS_FILE=" + path}, c.env...)...)
			res := harness.Run(t, cmd)
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, "PASS "+c.name) {
				t.Fatalf("%s (%s): exit %d\nstdout:\n%s\nstderr:\n%s", c.name, c.why, res.ExitCode, res.Stdout, res.Stderr)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read simcuda stats: %v", err)
			}
			var s struct {
				Devices []struct {
					ArrayBytes      uint64 `json:"array_bytes"`
					DeviceBytes     uint64 `json:"device_bytes"`
					DeviceBytesPeak uint64 `json:"device_bytes_peak"`
				} `json:"devices"`
			}
			if err := json.Unmarshal(data, &s); err != nil || len(s.Devices) == 0 {
				t.Fatalf("parse simcuda stats: %v\n%s", err, data)
			}
			d := s.Devices[0]
			if d.ArrayBytes != c.arrays || d.DeviceBytes != c.live || d.DeviceBytesPeak != c.peak {
				t.Errorf("%s: at exit array_bytes %d, device_bytes %d, peak %d; want %d, %d, %d",
					c.why, d.ArrayBytes, d.DeviceBytes, d.DeviceBytesPeak, c.arrays, c.live, c.peak)
			}
		})
	}
}
