package shimtest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// CUDA arrays under a quota: testdata/arrays.c scripts them with the
// driver's and the runtime's calls. Its arrays are of float4 elements, so
// 1024 x 1024 takes 16 MiB.

const arrayMiB = 1 << 20

// arrayTruth is simcuda's ground truth for device 0 at exit.
type arrayTruth struct {
	DeviceBytes     uint64 `json:"device_bytes"`
	DeviceBytesPeak uint64 `json:"device_bytes_peak"`
	ArrayBytes      uint64 `json:"array_bytes"`
}

// runArrays runs the array script under quota with vars set, and returns
// its output, its stderr and simcuda's ground truth, checking that the
// device never held more than the quota.
func runArrays(t *testing.T, quota uint64, vars []string, ops ...string) (harness.Output, string, arrayTruth) {
	t.Helper()
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/arrays.c"}, ProjectHeaders: true,
		Cudart: true, Flags: []string{"-L", harness.SimcudaDir(t), "-lcuda"}})
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := append([]string{"SPILLWAY_MEMORY_LIMIT=" + sizeArg(quota), "SIMCUDA_STATS_FILE=" + stats}, vars...)
	res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, ops...))
	data, err := os.ReadFile(stats)
	if err != nil {
		t.Fatalf("read simcuda stats: %v", err)
	}
	var s struct{ Devices []arrayTruth }
	if err := json.Unmarshal(data, &s); err != nil || len(s.Devices) == 0 {
		t.Fatalf("parse simcuda stats %s: %v\n%s", stats, err, data)
	}
	truth := s.Devices[0]
	if truth.DeviceBytesPeak > quota {
		t.Errorf("simcuda held %d bytes at its peak, above the quota of %d\n%v", truth.DeviceBytesPeak, quota, out)
	}
	return out, res.Stderr, truth
}

// checkInfo checks the free bytes the i-th line of op (i or I) reports.
func checkInfo(t *testing.T, out harness.Output, op string, i int, want uint64) {
	t.Helper()
	if rc := out.Code(t, op, i); rc != 0 {
		t.Fatalf("%s #%d: %d\n%v", op, i, rc, out)
	}
	if free := out.Num(t, op, i, 2); free != want {
		t.Errorf("%s #%d reports %d MiB free, want %d MiB", op, i, free/arrayMiB, want/arrayMiB)
	}
}

// TestArrayQuotaDriver: the driver's arrays (2D, 1D-form and 3D) fill the
// quota and the next is refused with CUDA's out-of-memory code and the
// shim's warning; a destroyed one gives its room back; cuMemGetInfo counts
// them; and what the shim counts is what simcuda holds.
func TestArrayQuotaDriver(t *testing.T) {
	out, stderr, truth := runArrays(t, 64*arrayMiB, nil,
		"a", "1024", "1024", "0", "k", "1024", "1024", "a", "1024", "512", "2", "a", "1024", "1024", "0",
		"i", "a", "1", "1", "1", "d", "1", "i", "a", "1024", "1024", "0", "i")
	checkSteps(t, out, []step{{"a", 0, cuSuccess}, {"k", 0, cuSuccess}, {"a", 1, cuSuccess}, {"a", 2, cuSuccess},
		{"a", 3, cuOutOfMemory}, {"d", 0, cuSuccess}, {"a", 4, cuSuccess}})
	checkInfo(t, out, "i", 0, 0)
	checkInfo(t, out, "i", 1, 16*arrayMiB)
	checkInfo(t, out, "i", 2, 0)
	if !strings.Contains(stderr, "a CUDA array of 16B refused on device 0: 64MiB in use of a quota of 64MiB") {
		t.Errorf("no warning names the refused array:\n%s", stderr)
	}
	if truth.ArrayBytes != 64*arrayMiB || truth.DeviceBytes != 64*arrayMiB {
		t.Errorf("simcuda holds %d MiB of arrays (%d MiB in all) at exit, want the 64 MiB the shim counts",
			truth.ArrayBytes/arrayMiB, truth.DeviceBytes/arrayMiB)
	}
}

// TestArrayQuotaThroughProcAddress: cuArray3DCreate_v2 obtained with
// cuGetProcAddress is counted like the one the program links.
func TestArrayQuotaThroughProcAddress(t *testing.T) {
	out, _, _ := runArrays(t, 32*arrayMiB, nil,
		"g", "1024", "1024", "0", "g", "1024", "1024", "0", "g", "1024", "1024", "0", "i")
	checkSteps(t, out, []step{{"g", 0, cuSuccess}, {"g", 1, cuSuccess}, {"g", 2, cuOutOfMemory}})
	checkInfo(t, out, "i", 0, 0)
}

// TestArrayQuotaRuntime: cudaMallocArray and cudaMalloc3DArray are counted
// once each (the runtime makes them with the driver's calls, which the shim
// also interposes: counted twice, only two would fit), refused with
// cudaErrorMemoryAllocation as the thread's last error, and
// cudaFreeArray gives the room back.
func TestArrayQuotaRuntime(t *testing.T) {
	out, stderr, truth := runArrays(t, 64*arrayMiB, nil,
		"A", "1024", "1024", "A", "1024", "1024", "A", "1024", "1024", "T", "1024", "512", "2",
		"I", "A", "1", "1", "e", "F", "0", "I", "T", "1024", "1024", "1", "I", "i")
	checkSteps(t, out, []step{{"A", 0, cuSuccess}, {"A", 1, cuSuccess}, {"A", 2, cuSuccess}, {"T", 0, cuSuccess},
		{"A", 3, harness.ErrMemoryAllocation}, {"e", 0, harness.ErrMemoryAllocation}, {"F", 0, cuSuccess},
		{"T", 1, cuSuccess}})
	checkInfo(t, out, "I", 0, 0)
	checkInfo(t, out, "I", 1, 16*arrayMiB)
	checkInfo(t, out, "I", 2, 0)
	checkInfo(t, out, "i", 0, 0)
	if !strings.Contains(stderr, "a CUDA array of 16B refused on device 0") {
		t.Errorf("no warning names the refused array:\n%s", stderr)
	}
	if truth.ArrayBytes != 64*arrayMiB || truth.DeviceBytes != 64*arrayMiB {
		t.Errorf("simcuda holds %d MiB of arrays (%d MiB in all) at exit, want the 64 MiB the shim counts",
			truth.ArrayBytes/arrayMiB, truth.DeviceBytes/arrayMiB)
	}
}

// TestArraysGivenBackWithContext: destroying the context an array was made
// in, resetting the primary context (cuDevicePrimaryCtxReset_v2,
// cudaDeviceReset) gives its room back, as CUDA destroys the array; the
// quota then holds exactly as many again.
func TestArraysGivenBackWithContext(t *testing.T) {
	out, _, truth := runArrays(t, 64*arrayMiB, nil,
		"C", "a", "1024", "1024", "0", "i", "X", "0", "i",
		"a", "1024", "1024", "0", "D", "i",
		"A", "1024", "1024", "T", "1024", "1024", "1", "R", "I",
		"a", "1024", "1024", "0", "a", "1024", "1024", "0", "a", "1024", "1024", "0", "a", "1024", "1024", "0",
		"a", "1", "1", "1")
	checkSteps(t, out, []step{{"C", 0, cuSuccess}, {"a", 0, cuSuccess}, {"X", 0, cuSuccess}, {"a", 1, cuSuccess},
		{"D", 0, cuSuccess}, {"A", 0, cuSuccess}, {"T", 0, cuSuccess}, {"R", 0, cuSuccess},
		{"a", 2, cuSuccess}, {"a", 5, cuSuccess}, {"a", 6, cuOutOfMemory}})
	checkInfo(t, out, "i", 0, 48*arrayMiB)
	checkInfo(t, out, "i", 1, 64*arrayMiB)
	checkInfo(t, out, "i", 2, 64*arrayMiB)
	checkInfo(t, out, "I", 0, 64*arrayMiB)
	if truth.ArrayBytes != 64*arrayMiB {
		t.Errorf("simcuda holds %d MiB of arrays at exit, want 64", truth.ArrayBytes/arrayMiB)
	}
}

// TestArraysOversubscribed: an array cannot live on the host, so with
// oversubscription one past the quota is still refused.
func TestArraysOversubscribed(t *testing.T) {
	out, _, _ := runArrays(t, 32*arrayMiB, []string{"SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=64MiB"},
		"a", "1024", "1024", "0", "a", "1024", "1024", "0", "a", "1024", "1024", "0", "A", "1024", "1024", "i")
	checkSteps(t, out, []step{{"a", 0, cuSuccess}, {"a", 1, cuSuccess}, {"a", 2, cuOutOfMemory},
		{"A", 0, harness.ErrMemoryAllocation}})
	checkInfo(t, out, "i", 0, 0)
}

// TestArrayAfterFreeInPrimaryContext: memory the pool holds freed but
// awaiting a device synchronization is free to the program (cudaMemGetInfo
// counts it, and CUDA's cudaFree has synchronized), so an array made in the
// primary context, the pool's own, after a cudaFree fits: the pool
// synchronizes and gives the memory back first, as it does for
// cudaMallocManaged. Both the runtime's and the driver's arrays.
func TestArrayAfterFreeInPrimaryContext(t *testing.T) {
	out, _, _ := runArrays(t, 64*arrayMiB, nil,
		"u", "48", "U", "0", "I", "T", "1024", "1024", "2", "F", "1",
		"u", "48", "U", "2", "i", "a", "1024", "1024", "2", "i")
	checkSteps(t, out, []step{{"u", 0, cuSuccess}, {"U", 0, cuSuccess}, {"T", 0, cuSuccess}, {"F", 0, cuSuccess},
		{"u", 1, cuSuccess}, {"U", 1, cuSuccess}, {"a", 0, cuSuccess}})
	checkInfo(t, out, "I", 0, 64*arrayMiB)
	checkInfo(t, out, "i", 0, 64*arrayMiB)
	checkInfo(t, out, "i", 1, 32*arrayMiB)
}

// TestArrayDeferredMappingNotCounted: an array made with
// CUDA_ARRAY3D_DEFERRED_MAPPING has no memory of its own (it is mapped
// onto cuMemCreate memory, counted there): it takes nothing from the quota.
func TestArrayDeferredMappingNotCounted(t *testing.T) {
	out, _, _ := runArrays(t, 16*arrayMiB, nil, "f", "4096", "4096", "0", "i", "d", "0", "i")
	checkSteps(t, out, []step{{"f", 0, cuSuccess}, {"d", 0, cuSuccess}})
	checkInfo(t, out, "i", 0, 16*arrayMiB)
	checkInfo(t, out, "i", 1, 16*arrayMiB)
}

// TestArrayBlockCompressedRuntime: the runtime describes a block-compressed
// array by a decoded texel's components (BC1: 8 bits x 4), but it holds
// 4x4 texels in a block, of 8 bytes for BC1 and 16 for BC2 to BC7, which is
// what the quota is charged: under a full quota the refusal of a 1024 x
// 1024 array names its packed size.
func TestArrayBlockCompressedRuntime(t *testing.T) {
	for _, c := range []struct{ name, op, charge string }{{"bc1", "B", "512KiB"}, {"bc7", "E", "1MiB"}} {
		t.Run(c.name, func(t *testing.T) {
			out, stderr, _ := runArrays(t, 64*arrayMiB, nil,
				"A", "1024", "1024", "A", "1024", "1024", "A", "1024", "1024", "A", "1024", "1024",
				c.op, "1024", "1024")
			checkSteps(t, out, []step{{"A", 3, cuSuccess}, {c.op, 0, harness.ErrMemoryAllocation}})
			if !strings.Contains(stderr, "a CUDA array of "+c.charge+" refused on device 0") {
				t.Errorf("the refused 1024 x 1024 array is not charged its %s of blocks:\n%s", c.charge, stderr)
			}
		})
	}
}

// TestArrayInvalidChannelsNotCharged: a descriptor CUDA refuses (three
// channels, float3) gets CUDA's own error for it, also when the quota is
// full, rather than an out-of-memory refusal and a warning that blame the
// quota.
func TestArrayInvalidChannelsNotCharged(t *testing.T) {
	const errInvalidChannelDescriptor = 20 // cudaErrorInvalidChannelDescriptor
	out, stderr, _ := runArrays(t, 64*arrayMiB, nil,
		"a", "1024", "1024", "0", "a", "1024", "1024", "0", "a", "1024", "1024", "0", "a", "1024", "1024", "0",
		"n", "1024", "1024", "0", "3", "V", "1024", "1024")
	checkSteps(t, out, []step{{"a", 3, cuSuccess}, {"n", 0, harness.ErrInvalidValue},
		{"V", 0, errInvalidChannelDescriptor}})
	if strings.Contains(stderr, "refused") {
		t.Errorf("an array CUDA refuses for its channels was refused for the quota:\n%s", stderr)
	}
}

// TestArrayRefusedByCUDAGivesBack: an array the quota admits but CUDA
// refuses (1D, wider than the limit of 131072; by cuArray3DCreate_v2,
// cuArrayCreate_v2, cudaMallocArray and cudaMalloc3DArray) gets CUDA's
// invalid-value error and gives its 2 MiB charge back: the quota then
// takes four whole 16 MiB arrays.
func TestArrayRefusedByCUDAGivesBack(t *testing.T) {
	out, _, truth := runArrays(t, 64*arrayMiB, nil,
		"a", "131073", "0", "0", "k", "131073", "0", "A", "131073", "0", "T", "131073", "0", "0", "i",
		"a", "1024", "1024", "0", "a", "1024", "1024", "0", "A", "1024", "1024", "T", "1024", "1024", "0")
	checkSteps(t, out, []step{{"a", 0, harness.ErrInvalidValue}, {"k", 0, harness.ErrInvalidValue},
		{"A", 0, harness.ErrInvalidValue}, {"T", 0, harness.ErrInvalidValue},
		{"a", 1, cuSuccess}, {"a", 2, cuSuccess}, {"A", 1, cuSuccess}, {"T", 1, cuSuccess}})
	checkInfo(t, out, "i", 0, 64*arrayMiB)
	if truth.ArrayBytes != 64*arrayMiB {
		t.Errorf("simcuda holds %d MiB of arrays at exit, want 64", truth.ArrayBytes/arrayMiB)
	}
}

// TestArrayChargedByChannels: an array of one or two channels is charged
// for those channels, not for four: 1024 x 1024 floats take 4 MiB, float2s
// 8 MiB, by the driver's call and the runtime's.
func TestArrayChargedByChannels(t *testing.T) {
	out, _, truth := runArrays(t, 64*arrayMiB, nil,
		"n", "1024", "1024", "0", "1", "i", "n", "1024", "1024", "0", "2", "i",
		"v", "1024", "1024", "1", "I", "v", "1024", "1024", "2", "I")
	checkSteps(t, out, []step{{"n", 0, cuSuccess}, {"n", 1, cuSuccess}, {"v", 0, cuSuccess}, {"v", 1, cuSuccess}})
	checkInfo(t, out, "i", 0, 60*arrayMiB)
	checkInfo(t, out, "i", 1, 52*arrayMiB)
	checkInfo(t, out, "I", 0, 48*arrayMiB)
	checkInfo(t, out, "I", 1, 40*arrayMiB)
	if truth.ArrayBytes != 24*arrayMiB {
		t.Errorf("simcuda holds %d MiB of arrays at exit, want the 24 MiB the shim counts", truth.ArrayBytes/arrayMiB)
	}
}

// TestArraysGivenBackWithTheirDevice: resetting one device's primary
// context gives back the arrays of that device only: another device's
// stay charged, and its full quota still refuses the next.
func TestArraysGivenBackWithTheirDevice(t *testing.T) {
	out, _, _ := runArrays(t, 32*arrayMiB, []string{"SIMCUDA_DEVICES=2x16GiB"},
		"a", "1024", "1024", "0", "S", "1", "a", "1024", "1024", "0", "a", "1024", "1024", "0",
		"S", "0", "D", "S", "1", "i", "a", "1", "1", "1")
	checkSteps(t, out, []step{{"a", 0, cuSuccess}, {"S", 0, cuSuccess}, {"a", 1, cuSuccess}, {"a", 2, cuSuccess},
		{"S", 1, cuSuccess}, {"D", 0, cuSuccess}, {"S", 2, cuSuccess}, {"a", 3, cuOutOfMemory}})
	checkInfo(t, out, "i", 0, 0)
}

// A mipmapped array of 1024 x 1024 float4 elements in 2 levels takes 16 MiB
// and 4 MiB: 20 MiB.
const mipmapMiB = 20 * arrayMiB

// TestMipmappedArrayQuotaDriver: cuMipmappedArrayCreate is charged the sum
// of its levels (the first alone would fit the 16 MiB left, the whole does
// not) and refused with CUDA's out-of-memory code and a warning naming it;
// a layered one's levels keep their layers; a level cannot be destroyed on
// its own and takes nothing back; cuMipmappedArrayDestroy gives the room
// back; a deferred-mapping one takes nothing; and what the shim counts is
// what simcuda holds.
func TestMipmappedArrayQuotaDriver(t *testing.T) {
	const cuInvalidHandle = 400 // CUDA_ERROR_INVALID_HANDLE
	out, stderr, truth := runArrays(t, 64*arrayMiB, nil,
		"a", "1024", "1024", "0", "a", "1024", "1024", "0", "a", "1024", "1024", "0",
		"m", "1024", "1024", "0", "2", "0", "i", "d", "0",
		"m", "1024", "1024", "0", "2", "0", "i", "l", "3", "1", "i", "M", "3", "i",
		"m", "512", "512", "4", "2", "1", "i", "m", "4096", "4096", "0", "20", "128", "i")
	checkSteps(t, out, []step{{"a", 2, cuSuccess}, {"m", 0, cuOutOfMemory}, {"d", 0, cuSuccess},
		{"m", 1, cuSuccess}, {"l", 0, cuInvalidHandle}, {"M", 0, cuSuccess}, {"m", 2, cuSuccess}, {"m", 3, cuSuccess}})
	checkInfo(t, out, "i", 0, 16*arrayMiB)
	checkInfo(t, out, "i", 1, 32*arrayMiB-mipmapMiB)
	checkInfo(t, out, "i", 2, 32*arrayMiB-mipmapMiB)
	checkInfo(t, out, "i", 3, 32*arrayMiB)
	checkInfo(t, out, "i", 4, 32*arrayMiB-mipmapMiB) // 512 x 512 x 4 layers, then 256 x 256 x 4
	checkInfo(t, out, "i", 5, 32*arrayMiB-mipmapMiB)
	if !strings.Contains(stderr, "a CUDA mipmapped array of 20MiB refused on device 0: 48MiB in use of a quota of 64MiB") {
		t.Errorf("no warning names the refused mipmapped array and its 20 MiB of levels:\n%s", stderr)
	}
	if truth.ArrayBytes != 52*arrayMiB || truth.DeviceBytes != 52*arrayMiB {
		t.Errorf("simcuda holds %d MiB of arrays (%d MiB in all) at exit, want the 52 MiB the shim counts",
			truth.ArrayBytes/arrayMiB, truth.DeviceBytes/arrayMiB)
	}
}

// TestMipmappedArrayQuotaThroughProcAddress: cuMipmappedArrayCreate
// obtained with cuGetProcAddress is counted like the one the program links.
func TestMipmappedArrayQuotaThroughProcAddress(t *testing.T) {
	out, _, _ := runArrays(t, 64*arrayMiB, nil, "G", "1024", "1024", "0", "2", "G", "1024", "1024", "0", "2",
		"G", "1024", "1024", "0", "2", "G", "1024", "1024", "0", "2", "i")
	checkSteps(t, out, []step{{"G", 0, cuSuccess}, {"G", 2, cuSuccess}, {"G", 3, cuOutOfMemory}})
	checkInfo(t, out, "i", 0, 64*arrayMiB-3*mipmapMiB)
}

// TestMipmappedArrayQuotaRuntime: cudaMallocMipmappedArray is counted once
// (the runtime makes it with cuMipmappedArrayCreate, which the shim also
// interposes: counted twice, only one would fit), refused with
// cudaErrorMemoryAllocation as the thread's last error, and
// cudaFreeMipmappedArray gives the room back.
func TestMipmappedArrayQuotaRuntime(t *testing.T) {
	out, stderr, truth := runArrays(t, 64*arrayMiB, nil,
		"P", "1024", "1024", "0", "2", "P", "1024", "1024", "0", "2", "P", "1024", "1024", "0", "2",
		"P", "1024", "1024", "0", "2", "e", "I", "Q", "0", "I", "P", "1024", "1024", "0", "2", "I")
	checkSteps(t, out, []step{{"P", 0, cuSuccess}, {"P", 1, cuSuccess}, {"P", 2, cuSuccess},
		{"P", 3, harness.ErrMemoryAllocation}, {"e", 0, harness.ErrMemoryAllocation}, {"Q", 0, cuSuccess},
		{"P", 4, cuSuccess}})
	checkInfo(t, out, "I", 0, 64*arrayMiB-3*mipmapMiB)
	checkInfo(t, out, "I", 1, 64*arrayMiB-2*mipmapMiB)
	checkInfo(t, out, "I", 2, 64*arrayMiB-3*mipmapMiB)
	if !strings.Contains(stderr, "a CUDA mipmapped array of 20MiB refused on device 0") {
		t.Errorf("no warning names the refused mipmapped array:\n%s", stderr)
	}
	if truth.ArrayBytes != 3*mipmapMiB {
		t.Errorf("simcuda holds %d MiB of arrays at exit, want the 60 MiB the shim counts", truth.ArrayBytes/arrayMiB)
	}
}

// TestMipmappedArraysGivenBackWithContext: destroying the context a
// mipmapped array was made in, or resetting the primary context
// (cuDevicePrimaryCtxReset_v2, cudaDeviceReset), gives its room back, as
// CUDA destroys it; the quota then holds exactly as many again.
func TestMipmappedArraysGivenBackWithContext(t *testing.T) {
	out, _, truth := runArrays(t, 64*arrayMiB, nil,
		"C", "m", "1024", "1024", "0", "2", "0", "i", "X", "0", "i",
		"m", "1024", "1024", "0", "2", "0", "D", "i",
		"P", "1024", "1024", "0", "2", "R", "I",
		"m", "1024", "1024", "0", "2", "0", "m", "1024", "1024", "0", "2", "0", "m", "1024", "1024", "0", "2", "0",
		"m", "1024", "1024", "0", "2", "0")
	checkSteps(t, out, []step{{"C", 0, cuSuccess}, {"m", 0, cuSuccess}, {"X", 0, cuSuccess}, {"m", 1, cuSuccess},
		{"D", 0, cuSuccess}, {"P", 0, cuSuccess}, {"R", 0, cuSuccess},
		{"m", 2, cuSuccess}, {"m", 4, cuSuccess}, {"m", 5, cuOutOfMemory}})
	checkInfo(t, out, "i", 0, 64*arrayMiB-mipmapMiB)
	checkInfo(t, out, "i", 1, 64*arrayMiB)
	checkInfo(t, out, "i", 2, 64*arrayMiB)
	checkInfo(t, out, "I", 0, 64*arrayMiB)
	if truth.ArrayBytes != 3*mipmapMiB {
		t.Errorf("simcuda holds %d MiB of arrays at exit, want 60", truth.ArrayBytes/arrayMiB)
	}
}

// TestMipmappedArrayLevelsChargedAsArrays: each level of a mipmapped array
// is an array of its own, charged in whole 512-byte granules, so the sum
// counts the small levels' granules one by one: 256 x 128 float4 elements
// take 512 KiB, 128 KiB, 32 KiB, 8 KiB, 2 KiB and 512 bytes in their first
// six levels and a granule in each of the last three (4 x 2, 2 x 1, 1 x 1),
// 700416 bytes for the 9 levels 20 is clamped to. What the shim counts, by
// the driver's call and the runtime's, is what simcuda holds.
func TestMipmappedArrayLevelsChargedAsArrays(t *testing.T) {
	const levelsBytes = 524288 + 131072 + 32768 + 8192 + 2048 + 512 + 3*512
	out, _, truth := runArrays(t, 64*arrayMiB, nil,
		"m", "256", "128", "0", "20", "0", "i", "P", "256", "128", "0", "20", "i")
	checkSteps(t, out, []step{{"m", 0, cuSuccess}, {"P", 0, cuSuccess}})
	for i := 0; i < 2; i++ {
		if free := out.Num(t, "i", i, 2); free != 64*arrayMiB-uint64(i+1)*levelsBytes {
			t.Errorf("i #%d reports %d bytes in use, want %d", i, 64*arrayMiB-free, (i+1)*levelsBytes)
		}
	}
	if truth.ArrayBytes != 2*levelsBytes {
		t.Errorf("simcuda holds %d bytes of arrays at exit, want the %d the shim counts", truth.ArrayBytes, 2*levelsBytes)
	}
}

// TestMipmappedArrayShapesCharged: a 3D mipmapped array halves its depth
// with its width and height (64^3 float4 elements in the 7 levels 20 is
// clamped to: 4 MiB, 512 KiB, 64 KiB, 8 KiB, 1 KiB and two granules), and a
// layered one keeps its layers, which do not count towards the level count
// (4 elements of 64 layers in 3 levels: 4 KiB, 2 KiB, 1 KiB). The shim
// counts what simcuda holds.
func TestMipmappedArrayShapesCharged(t *testing.T) {
	const cube, layered = 4194304 + 524288 + 65536 + 8192 + 1024 + 2*512, 4096 + 2048 + 1024
	out, _, truth := runArrays(t, 64*arrayMiB, nil,
		"m", "64", "64", "64", "20", "0", "i", "m", "4", "0", "64", "20", "1", "i")
	checkSteps(t, out, []step{{"m", 0, cuSuccess}, {"m", 1, cuSuccess}})
	checkInfo(t, out, "i", 0, 64*arrayMiB-cube)
	checkInfo(t, out, "i", 1, 64*arrayMiB-cube-layered)
	if truth.ArrayBytes != cube+layered {
		t.Errorf("simcuda holds %d bytes of arrays at exit, want the %d the shim counts", truth.ArrayBytes, cube+layered)
	}
}

// TestMipmappedArrayRefusedByCUDAGivesBack: a mipmapped array the quota
// admits but CUDA refuses (wider than the mipmapped 1D limit of 32768, a
// cubemap that is not square; by the driver's call and the runtime's) gets
// CUDA's invalid-value error and gives its charge back: the quota then
// takes three whole 20 MiB mipmapped arrays.
func TestMipmappedArrayRefusedByCUDAGivesBack(t *testing.T) {
	const cubemap = "4" // CUDA_ARRAY3D_CUBEMAP
	out, _, truth := runArrays(t, 64*arrayMiB, nil,
		"m", "32769", "0", "0", "1", "0", "m", "16", "8", "6", "2", cubemap, "P", "32769", "0", "0", "1", "i",
		"m", "1024", "1024", "0", "2", "0", "m", "1024", "1024", "0", "2", "0", "m", "1024", "1024", "0", "2", "0")
	checkSteps(t, out, []step{{"m", 0, harness.ErrInvalidValue}, {"m", 1, harness.ErrInvalidValue},
		{"P", 0, harness.ErrInvalidValue}, {"m", 2, cuSuccess}, {"m", 3, cuSuccess}, {"m", 4, cuSuccess}})
	checkInfo(t, out, "i", 0, 64*arrayMiB)
	if truth.ArrayBytes != 3*mipmapMiB {
		t.Errorf("simcuda holds %d MiB of arrays at exit, want 60", truth.ArrayBytes/arrayMiB)
	}
}
