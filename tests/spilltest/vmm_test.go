package spilltest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// vmmStats is the part of simcuda's stats file about virtual memory
// management, beside harness.Stats.
type vmmStats struct {
	Devices []struct {
		DeviceBytes      uint64 `json:"device_bytes"`
		DeviceBytesPeak  uint64 `json:"device_bytes_peak"`
		VMMPhysicalBytes uint64 `json:"vmm_physical_bytes"`
		LiveAllocations  uint64 `json:"live_allocations"`
	} `json:"devices"`
	Calls map[string]uint64 `json:"calls"`
	VMM   struct {
		HostPhysicalBytes uint64 `json:"host_physical_bytes"`
		Handles           uint64 `json:"handles"`
		ReservedBytes     uint64 `json:"reserved_bytes"`
		MappedBytes       uint64 `json:"mapped_bytes"`
	} `json:"vmm"`
}

func readVMMStats(t *testing.T, path string) vmmStats {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read simcuda stats: %v", err)
	}
	var s vmmStats
	if err := json.Unmarshal(data, &s); err != nil || len(s.Devices) == 0 {
		t.Fatalf("parse simcuda stats %s: %v\n%s", path, err, data)
	}
	return s
}

// vmmEnv is the environment of a run under quota with the report and
// simcuda's stats file (whose path it returns); extra comes last and wins.
func vmmEnv(t *testing.T, quota uint64, extra ...string) ([]string, string) {
	stats := filepath.Join(t.TempDir(), "stats.json")
	env := []string{
		"SIMCUDA_DEVICES=1GiB",
		"SIMCUDA_CONTEXT_BYTES=0",
		"SIMCUDA_STATS_FILE=" + stats,
		fmt.Sprintf("SPILLWAY_MEMORY_LIMIT=%d", quota),
		"SPILLWAY_REPORT=1",
	}
	return append(env, extra...), stats
}

// churn is an ops script of random allocations (512 KiB to 17 MiB) and
// frees, with a synchronization every ten calls, whose live bytes never
// exceed maxLive; it returns the script and the most bytes live at once.
func churn(seed uint64, steps int, maxLive uint64) ([]string, uint64) {
	sizes := []uint64{miB / 2, 1 * miB, 3 * miB, 5 * miB, 9 * miB, 17 * miB}
	rng := rand.New(rand.NewPCG(seed, seed))
	var script []string
	type block struct {
		slot int
		size uint64
	}
	var live []block
	var liveBytes, peak uint64
	slot := 0
	for i := range steps {
		size := sizes[rng.IntN(len(sizes))]
		if len(live) > 0 && (rng.IntN(2) == 0 || liveBytes+size > maxLive) {
			j := rng.IntN(len(live))
			script = append(script, "f", fmt.Sprint(live[j].slot))
			liveBytes -= live[j].size
			live = append(live[:j], live[j+1:]...)
		} else {
			script = append(script, "m", fmt.Sprint(size))
			live = append(live, block{slot, size})
			liveBytes += size
			peak = max(peak, liveBytes)
			slot++
		}
		if i%10 == 9 {
			script = append(script, "s")
		}
	}
	return script, peak
}

// TestVMMChurnUnderQuota runs the same churn with virtual memory and with
// fixed segments. With virtual memory the device never holds more than
// the quota (simcuda's ground truth), every byte it holds is physical
// memory from cuMemCreate, freed granules are reused rather than created
// again, and the memory reserved stays near the working set.
func TestVMMChurnUnderQuota(t *testing.T) {
	const quota = 96 * miB
	prog := harness.Ops(t)
	script, peakLive := churn(7, 600, 48*miB)
	allocs := uint64(0)
	for _, op := range script {
		if op == "m" {
			allocs++
		}
	}
	var reserved [3]uint64
	for i, vmm := range []string{"1", "0", "keep"} {
		env, statsFile := vmmEnv(t, quota, "SPILLWAY_VMM="+vmm)
		if vmm == "keep" {
			// Nothing released: every granule is created once, then reused.
			env, statsFile = vmmEnv(t, quota, "SPILLWAY_VMM=1", "SPILLWAY_POOL_RELEASE_THRESHOLD=100%")
		}
		res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, script...))
		for k := range out.Count("m") {
			if out.Code(t, "m", k) != 0 {
				t.Fatalf("SPILLWAY_VMM=%s: allocation %d refused under a quota of twice the working set: %v\nstderr: %s", vmm, k, out.Line(t, "m", k), res.Stderr)
			}
		}
		r := harness.ReportFor(t, res.Stderr, 0)
		s := readVMMStats(t, statsFile)
		d := s.Devices[0]
		t.Logf("SPILLWAY_VMM=%s: peak live %d MiB, peak reserved %d MiB (%.3f), simcuda peak %d MiB; cuMemCreate %d, cuMemMap %d, cudaMalloc %d for %d allocations",
			vmm, r.PeakLive/miB, r.PeakReserved/miB, float64(r.PeakReserved)/float64(r.PeakLive), d.DeviceBytesPeak/miB,
			s.Calls["cuMemCreate"], s.Calls["cuMemMap"], s.Calls["cudaMalloc"], allocs)
		if r.PeakLive != peakLive {
			t.Errorf("SPILLWAY_VMM=%s: report's peak live %d, the script's %d", vmm, r.PeakLive, peakLive)
		}
		if d.DeviceBytesPeak > quota || r.PeakReserved > quota {
			t.Errorf("SPILLWAY_VMM=%s: simcuda's device_bytes_peak %d, the report's peak_reserved %d, quota %d", vmm, d.DeviceBytesPeak, r.PeakReserved, quota)
		}
		if d.DeviceBytes != r.Reserved {
			t.Errorf("SPILLWAY_VMM=%s: simcuda holds %d bytes at exit, the pool %d", vmm, d.DeviceBytes, r.Reserved)
		}
		reserved[i] = r.PeakReserved
		if vmm == "0" {
			if s.Calls["cuMemCreate"] != 0 || d.VMMPhysicalBytes != 0 {
				t.Errorf("SPILLWAY_VMM=0: %d cuMemCreate calls, %d physical bytes", s.Calls["cuMemCreate"], d.VMMPhysicalBytes)
			}
			continue
		}
		if d.VMMPhysicalBytes != d.DeviceBytes || s.Calls["cudaMalloc"] != 0 || s.Calls["cuMemAlloc_v2"] != 0 {
			t.Errorf("with virtual memory: %d of simcuda's %d device bytes from cuMemCreate, %d cudaMalloc, %d cuMemAlloc_v2",
				d.VMMPhysicalBytes, d.DeviceBytes, s.Calls["cudaMalloc"], s.Calls["cuMemAlloc_v2"])
		}
		// Granules are reused: with nothing released, each is created
		// once; otherwise, those released above the threshold are made
		// again, and each goes back with cuMemRelease.
		creates := s.Calls["cuMemCreate"]
		if vmm == "keep" && creates != r.PeakReserved/(2*miB) {
			t.Errorf("%d cuMemCreate calls for a peak of %d MiB in 2 MiB granules: freed granules are not reused", creates, r.PeakReserved/miB)
		}
		if held := creates - s.Calls["cuMemRelease"]; held*2*miB != d.VMMPhysicalBytes || s.VMM.Handles != held {
			t.Errorf("%d granules created, %d released; simcuda holds %d bytes in %d handles", creates, s.Calls["cuMemRelease"], d.VMMPhysicalBytes, s.VMM.Handles)
		}
		// The working set, plus the partly used granule at either end of a
		// free range and the cache the release threshold keeps (1/8 of the
		// quota): nothing like a segment per size.
		if limit := peakLive + quota/8 + 8*miB; r.PeakReserved > limit {
			t.Errorf("peak reserved %d MiB for a peak live of %d MiB, want at most %d MiB", r.PeakReserved/miB, peakLive/miB, limit/miB)
		}
		if s.VMM.HostPhysicalBytes != 0 || r.Spilled != 0 {
			t.Errorf("host memory without oversubscription: simcuda %d, report %d", s.VMM.HostPhysicalBytes, r.Spilled)
		}
	}
	if reserved[0] > reserved[1] || reserved[2] > reserved[1] {
		t.Errorf("peak reserved %d MiB with virtual memory, %d MiB with segments", reserved[0]/miB, reserved[1]/miB)
	}
}

// TestVMMFallback: without VMM on the device (SIMCUDA_NO_VMM=1), with
// SPILLWAY_VMM=0, or with spillway run --vmm=false, the pool uses fixed
// segments (cudaMalloc), and the quota holds.
func TestVMMFallback(t *testing.T) {
	const quota = 64 * miB
	prog := harness.Ops(t)
	script := []string{"m", "8M", "m", "3M", "f", "0", "s", "m", "5M", "V"}
	run := func(name string, env []string, statsFile string, args ...string) {
		cmd := harness.Shimmed(t, env, prog, script...)
		if args != nil {
			cmd = harness.Command(t, harness.Bin(t, "spillway"), append(args, append([]string{"--", prog}, script...)...)...)
			harness.SetEnv(cmd, env...)
		}
		res, out := harness.RunOK(t, cmd)
		s := readVMMStats(t, statsFile)
		if out.Count("m") != 3 || out.Code(t, "m", 0) != 0 || out.Code(t, "m", 1) != 0 || out.Code(t, "m", 2) != 0 {
			t.Fatalf("%s: %v\nstderr: %s", name, out, res.Stderr)
		}
		if s.Calls["cuMemCreate"] != 0 || s.Calls["cuMemAddressReserve"] != 0 || s.Devices[0].VMMPhysicalBytes != 0 || s.Calls["cudaMalloc"] == 0 {
			t.Errorf("%s: cuMemCreate %d, cuMemAddressReserve %d, physical %d, cudaMalloc %d: want fixed segments",
				name, s.Calls["cuMemCreate"], s.Calls["cuMemAddressReserve"], s.Devices[0].VMMPhysicalBytes, s.Calls["cudaMalloc"])
		}
		if s.Devices[0].DeviceBytesPeak > quota {
			t.Errorf("%s: simcuda's peak %d above the quota", name, s.Devices[0].DeviceBytesPeak)
		}
	}
	env, stats := vmmEnv(t, quota, "SIMCUDA_NO_VMM=1")
	run("SIMCUDA_NO_VMM=1", env, stats)
	env, stats = vmmEnv(t, quota, "SPILLWAY_VMM=0")
	run("SPILLWAY_VMM=0", env, stats)
	env, stats = vmmEnv(t, quota)
	run("spillway run --vmm=false", env, stats, "run", "--vmm=false")

	// The default uses it, through spillway run too.
	env, stats = vmmEnv(t, quota)
	cmd := harness.Command(t, harness.Bin(t, "spillway"), append([]string{"run", "--", prog}, script...)...)
	harness.SetEnv(cmd, env...)
	harness.RunOK(t, cmd)
	if s := readVMMStats(t, stats); s.Calls["cuMemCreate"] == 0 || s.Calls["cudaMalloc"] != 0 {
		t.Errorf("by default: cuMemCreate %d, cudaMalloc %d: want virtual memory", s.Calls["cuMemCreate"], s.Calls["cudaMalloc"])
	}
}

// TestVMMOversubscribed: twice the quota in patterned chunks with virtual
// memory: every chunk reads back intact, the device never holds more than
// the quota, what does not fit is host-located physical memory mapped
// behind the chunks' addresses (simcuda's vmm.host_physical_bytes, the
// report's spilled bytes), nothing is managed or pinned, and freeing the
// chunks returns every host granule.
func TestVMMOversubscribed(t *testing.T) {
	const quota, n = 64 * miB, 32
	prog := harness.Ops(t)
	fill := []string{"N", fmt.Sprint(n), "4M", "V", "i"}
	for _, freeAll := range []bool{false, true} {
		env, statsFile := vmmEnv(t, quota, "SPILLWAY_OVERSUBSCRIBE=1", fmt.Sprintf("SPILLWAY_HOST_LIMIT=%d", 2*quota))
		args := fill
		if freeAll {
			args = script(fill, each("f", 0, n), []string{"s", "V"})
		}
		res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, args...))
		if ok, failed := out.Num(t, "N", 0, 1), out.Num(t, "N", 0, 2); ok != n || failed != 0 {
			t.Fatalf("%d of %d chunks allocated and filled, %d failed\nstderr: %s", ok, n, failed, res.Stderr)
		}
		if checked, bad := out.Num(t, "V", 0, 1), out.Num(t, "V", 0, 2); checked != n || bad != 0 {
			t.Errorf("%d of %d chunks read back corrupt\nstderr: %s", bad, checked, res.Stderr)
		}
		if free, total := out.Num(t, "i", 0, 2), out.Num(t, "i", 0, 3); free != 0 || total != quota {
			t.Errorf("cudaMemGetInfo while spilled: free %d total %d, want 0 and %d", free, total, quota)
		}
		r := harness.ReportFor(t, res.Stderr, 0)
		s := readVMMStats(t, statsFile)
		d := s.Devices[0]
		t.Logf("freed: %v; report %+v; simcuda device peak %d, physical %d, host physical %d, handles %d",
			freeAll, r, d.DeviceBytesPeak, d.VMMPhysicalBytes, s.VMM.HostPhysicalBytes, s.VMM.Handles)
		if d.DeviceBytesPeak > quota || r.PeakReserved > quota {
			t.Errorf("simcuda's device_bytes_peak %d, the report's peak_reserved %d, above the quota %d", d.DeviceBytesPeak, r.PeakReserved, quota)
		}
		if s.Calls["cudaMallocManaged"] != 0 || s.Calls["cudaHostAlloc"] != 0 || s.Calls["cuMemAllocManaged"] != 0 {
			t.Errorf("whole blocks spilled (managed or pinned) where host granules serve: %v", s.Calls)
		}
		if r.SpilledTotal != n*4*miB-quota {
			t.Errorf("report %+v: want spilled_total %d, the chunks past the quota", r, n*4*miB-quota)
		}
		if !freeAll {
			if r.Spilled != r.SpilledTotal || s.VMM.HostPhysicalBytes != r.Spilled || d.VMMPhysicalBytes != quota || d.DeviceBytes != quota {
				t.Errorf("live: report spilled %d of %d; simcuda host physical %d, device physical %d of %d, want the quota on the device and the rest on the host",
					r.Spilled, r.SpilledTotal, s.VMM.HostPhysicalBytes, d.VMMPhysicalBytes, d.DeviceBytes)
			}
			continue
		}
		if r.Spilled != 0 || s.VMM.HostPhysicalBytes != 0 || r.Live != 0 {
			t.Errorf("after every free: report spilled %d live %d, simcuda host physical %d: want 0", r.Spilled, r.Live, s.VMM.HostPhysicalBytes)
		}
		if d.DeviceBytes != r.Reserved || d.VMMPhysicalBytes != r.Reserved {
			t.Errorf("after every free: simcuda holds %d (%d physical), the pool %d", d.DeviceBytes, d.VMMPhysicalBytes, r.Reserved)
		}
	}
}

// TestVMMMemGetInfoPartlySpilled: with the quota full, a block that puts
// half a host granule to use leaves the other half cached by the pool, and
// its free leaves the granule cached until the free completes: host
// memory, so cudaMemGetInfo reports no free memory all along, and the
// report's cached counts none of it.
func TestVMMMemGetInfoPartlySpilled(t *testing.T) {
	const quota = 64 * miB
	env, _ := vmmEnv(t, quota, "SPILLWAY_OVERSUBSCRIBE=1", fmt.Sprintf("SPILLWAY_HOST_LIMIT=%d", quota))
	res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t), "N", "16", "4M", "m", "1M", "i", "f", "16", "i"))
	if ok := out.Num(t, "N", 0, 1); ok != 16 || out.Code(t, "m", 0) != 0 {
		t.Fatalf("filling the quota and spilling 1 MiB: %v\nstderr: %s", out, res.Stderr)
	}
	for i, when := range []string{"with half a host granule unused", "with the spilled block freed"} {
		if free, total := out.Num(t, "i", i, 2), out.Num(t, "i", i, 3); free != 0 || total != quota {
			t.Errorf("cudaMemGetInfo %s: free %d total %d, want 0 and %d", when, free, total, quota)
		}
	}
	if r := harness.ReportFor(t, res.Stderr, 0); r.Cached != 0 {
		t.Errorf("report %+v: want nothing cached, the quota being full of live blocks", r)
	}
}

// TestVMMRuntimeOnly: a program linked with the runtime alone, whose driver
// the runtime opens at its first call (after the shim's core has started),
// still gets the pool in virtual memory.
func TestVMMRuntimeOnly(t *testing.T) {
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/runtime_only.c"}, Cudart: true, ProjectHeaders: true})
	env, statsFile := vmmEnv(t, 96*miB)
	harness.RunOK(t, harness.Shimmed(t, env, prog))
	s := readVMMStats(t, statsFile)
	if s.Calls["cuMemCreate"] == 0 || s.Calls["cudaMalloc"] != 0 {
		t.Errorf("a runtime-only program: %d cuMemCreate and %d real cudaMalloc calls; want granules, not segments",
			s.Calls["cuMemCreate"], s.Calls["cudaMalloc"])
	}
}

// TestVMMMigrate: with SPILLWAY_MIGRATE=1, a short-lived block that spilled
// in one step gets device memory in the next ones, the oldest blocks'
// granules having moved to the host at the synchronization between; once no
// step needs the room, they move back. Every byte of every block reads back
// as written, and the device never holds more than the quota.
func TestVMMMigrate(t *testing.T) {
	const quota, steps = 64 * miB, 4
	prog := harness.Ops(t)
	// Seven blocks of 8 MiB (28 of the quota's 32 granules), then steps
	// that each allocate, fill, check and free 16 MiB (8 granules).
	args := []string{"N", "7", "8M", "s"}
	for i := range steps {
		slot := fmt.Sprint(7 + i)
		args = append(args, "m", "16M", "w", slot, "99", "v", slot, "99", "f", slot, "s")
	}
	args = append(args, "s", "s", "V")
	for _, migrate := range []bool{false, true} {
		t.Run(fmt.Sprintf("migrate=%v", migrate), func(t *testing.T) {
			env, statsFile := vmmEnv(t, quota, "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_SPILL=pinned",
				fmt.Sprintf("SPILLWAY_HOST_LIMIT=%d", 2*quota), fmt.Sprintf("SPILLWAY_MIGRATE=%d", map[bool]int{false: 0, true: 1}[migrate]))
			res, out := harness.RunOK(t, harness.Shimmed(t, env, prog, args...))
			if ok := out.Num(t, "N", 0, 1); ok != 7 {
				t.Fatalf("%d of 7 blocks allocated\nstderr: %s", ok, res.Stderr)
			}
			for i := range steps {
				if intact := out.Num(t, "v", i, 2); intact != 1 {
					t.Errorf("step %d: the short-lived block read back corrupt", i)
				}
			}
			if checked, bad := out.Num(t, "V", 0, 1), out.Num(t, "V", 0, 2); checked != 7 || bad != 0 {
				t.Errorf("%d of %d blocks read back corrupt after the moves\nstderr: %s", bad, checked, res.Stderr)
			}
			r := harness.ReportFor(t, res.Stderr, 0)
			s := readVMMStats(t, statsFile)
			t.Logf("report %+v; simcuda device peak %d", r, s.Devices[0].DeviceBytesPeak)
			if s.Devices[0].DeviceBytesPeak > quota || r.PeakReserved > quota {
				t.Errorf("simcuda's device peak %d, the report's %d, above the quota %d", s.Devices[0].DeviceBytesPeak, r.PeakReserved, quota)
			}
			if r.Spilled != 0 || s.VMM.HostPhysicalBytes != 0 {
				t.Errorf("host memory left at the end: report %d, simcuda %d", r.Spilled, s.VMM.HostPhysicalBytes)
			}
			// Each step's block spills its last 4 granules without
			// migration; with it, only the first step does, and 4 granules
			// of the oldest block move to the host and back.
			want := struct{ spilled, demoted, promoted uint64 }{steps * 8 * miB, 0, 0}
			if migrate {
				want.spilled, want.demoted, want.promoted = 8*miB+8*miB, 8*miB, 8*miB
			}
			if r.SpilledTotal != want.spilled || r.DemotedTotal != want.demoted || r.PromotedTotal != want.promoted {
				t.Errorf("spilled_total %d demoted_total %d promoted_total %d; want %d, %d, %d",
					r.SpilledTotal, r.DemotedTotal, r.PromotedTotal, want.spilled, want.demoted, want.promoted)
			}
		})
	}
}

// cpuFallbackLine is the start of what the core logs once when the driver
// will not map host granules for the CPU.
const cpuFallbackLine = "the CPU cannot reach host granules at their addresses"

// TestVMMHostGranulesReachableByCPU: a block spilled to host granules is
// host memory to cudaPointerGetAttributes, so a CUDA-aware library (MPI)
// reads and writes it with the CPU at its address, as it does pinned
// memory: the core grants the CPU access to every host granule it maps,
// and the device sees what the CPU wrote.
func TestVMMHostGranulesReachableByCPU(t *testing.T) {
	const quota = 64 * miB
	env, statsFile := vmmEnv(t, quota, "SPILLWAY_OVERSUBSCRIBE=1", fmt.Sprintf("SPILLWAY_HOST_LIMIT=%d", quota))
	// The quota filled with 16 blocks of 4 MiB, then one of 4 MiB on two
	// host granules: written with the CPU, read back with cudaMemcpy, and
	// written with cudaMemcpy, read back with the CPU.
	res := harness.Run(t, harness.Shimmed(t, env, harness.Ops(t), "N", "16", "4M", "m", "4M", "t", "16",
		"C", "16", "77", "v", "16", "77", "w", "16", "78", "c", "16", "78"))
	if res.ExitCode != 0 {
		t.Fatalf("the program died (exit %d, -1 for a signal such as SIGSEGV) touching with the CPU a block cudaPointerGetAttributes calls host memory\nstdout:\n%s\nstderr:\n%s",
			res.ExitCode, res.Stdout, res.Stderr)
	}
	out := harness.ParseOutput(res.Stdout)
	if ok := out.Num(t, "N", 0, 1); ok != 16 || out.Code(t, "m", 0) != 0 {
		t.Fatalf("filling the quota and spilling 4 MiB: %v\nstderr: %s", out, res.Stderr)
	}
	if typ := out.Num(t, "t", 0, 2); typ != 1 {
		t.Fatalf("cudaPointerGetAttributes of the spilled block: type %d, want 1 (cudaMemoryTypeHost)", typ)
	}
	if rc, host := out.Code(t, "C", 0), out.Num(t, "C", 0, 2); rc != 0 || host != 2 {
		t.Errorf("writing with the CPU: rc %d, %d pieces called host memory, want 0 and 2", rc, host)
	}
	if rc, ok := out.Code(t, "v", 0), out.Num(t, "v", 0, 2); rc != 0 || ok != 1 {
		t.Errorf("cudaMemcpy of what the CPU wrote: rc %d, intact %d; want it read back as written", rc, ok)
	}
	if host, intact := out.Num(t, "c", 0, 2), out.Num(t, "c", 0, 3); host != 2 || intact != 2 {
		t.Errorf("the CPU read %d of %d host pieces as cudaMemcpy wrote them, want 2 of 2", intact, host)
	}
	if strings.Contains(res.Stderr, cpuFallbackLine) {
		t.Errorf("the core says the CPU cannot reach host granules, where the driver grants it:\n%s", res.Stderr)
	}
	checkOnHostGranules(t, statsFile, 4*miB, "the block")
}

// TestVMMHostGranulesWithoutCPUAccess: a driver that refuses to grant the
// CPU host-located memory (SIMCUDA_NO_HOST_ACCESS=1) still gets blocks
// spilled to host granules, mapped for the device alone, and the core says
// once what that means.
func TestVMMHostGranulesWithoutCPUAccess(t *testing.T) {
	const quota = 64 * miB
	env, statsFile := vmmEnv(t, quota, "SPILLWAY_OVERSUBSCRIBE=1", fmt.Sprintf("SPILLWAY_HOST_LIMIT=%d", quota),
		"SIMCUDA_NO_HOST_ACCESS=1")
	res, out := harness.RunOK(t, harness.Shimmed(t, env, harness.Ops(t), "N", "16", "4M", "m", "4M", "m", "4M",
		"t", "16", "w", "16", "5", "w", "17", "6", "v", "16", "5", "v", "17", "6"))
	if ok := out.Num(t, "N", 0, 1); ok != 16 || out.Code(t, "m", 0) != 0 || out.Code(t, "m", 1) != 0 {
		t.Fatalf("filling the quota and spilling 8 MiB: %v\nstderr: %s", out, res.Stderr)
	}
	if typ := out.Num(t, "t", 0, 2); typ != 1 {
		t.Errorf("cudaPointerGetAttributes of the spilled block: type %d, want 1 (cudaMemoryTypeHost)", typ)
	}
	for i := range 2 {
		if rc, ok := out.Code(t, "v", i), out.Num(t, "v", i, 2); rc != 0 || ok != 1 {
			t.Errorf("spilled block %d: read back rc %d, intact %d; want it as written", i, rc, ok)
		}
	}
	if n := strings.Count(res.Stderr, cpuFallbackLine); n != 1 {
		t.Errorf("the core said %d times that the CPU cannot reach host granules, want once:\n%s", n, res.Stderr)
	}
	if !strings.Contains(res.Stderr, "SPILLWAY_VMM=0") || !strings.Contains(res.Stderr, "SPILLWAY_SPILL=pinned") {
		t.Errorf("the warning does not name SPILLWAY_VMM=0 with SPILLWAY_SPILL=pinned as the way out:\n%s", res.Stderr)
	}
	checkOnHostGranules(t, statsFile, 8*miB, "both blocks")
}

// checkOnHostGranules: simcuda's stats show the spilled blocks on host
// granules, bytes in all, and nothing spilled whole to pinned or managed memory.
func checkOnHostGranules(t *testing.T, statsFile string, bytes uint64, blocks string) {
	t.Helper()
	s := readVMMStats(t, statsFile)
	if s.VMM.HostPhysicalBytes != bytes || s.Calls["cudaHostAlloc"] != 0 || s.Calls["cudaMallocManaged"] != 0 {
		t.Errorf("simcuda: %d bytes of host granules, calls %v; want %s on %d MiB of host granules, not spilled whole",
			s.VMM.HostPhysicalBytes, s.Calls, blocks, bytes/miB)
	}
}

// TestVMMMigrateCPUAccess: with SPILLWAY_MIGRATE=1, granules demoted to the
// host are host memory the CPU reaches at their address, as spilled ones
// are; promoted back to the device they are device memory again, mapped
// for the device alone (the driver refuses the CPU device memory), and
// every byte stays as written.
func TestVMMMigrateCPUAccess(t *testing.T) {
	const quota = 64 * miB
	env, _ := vmmEnv(t, quota, "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_SPILL=pinned",
		fmt.Sprintf("SPILLWAY_HOST_LIMIT=%d", 2*quota), "SPILLWAY_MIGRATE=1")
	// Seven blocks of 8 MiB; a block of 16 MiB spills its last 4 granules
	// and is freed: the synchronization after moves 4 granules of the
	// oldest block (slot 0, filled with seed 1) to the host, and those
	// after, with the room unused, move them back.
	res := harness.Run(t, harness.Shimmed(t, env, harness.Ops(t), "N", "7", "8M", "s",
		"m", "16M", "f", "7", "s", "c", "0", "1", "C", "0", "2", "v", "0", "2",
		"s", "s", "c", "0", "2", "v", "0", "2", "V"))
	if res.ExitCode != 0 {
		t.Fatalf("the program died (exit %d, -1 for a signal such as SIGSEGV) touching with the CPU granules cudaPointerGetAttributes calls host memory\nstdout:\n%s\nstderr:\n%s",
			res.ExitCode, res.Stdout, res.Stderr)
	}
	out := harness.ParseOutput(res.Stdout)
	if ok := out.Num(t, "N", 0, 1); ok != 7 || out.Code(t, "m", 0) != 0 {
		t.Fatalf("allocating: %v\nstderr: %s", out, res.Stderr)
	}
	r := harness.ReportFor(t, res.Stderr, 0)
	if r.DemotedTotal != 8*miB || r.PromotedTotal != 8*miB {
		t.Fatalf("report %+v: want 8 MiB demoted and promoted back", r)
	}
	if host, intact := out.Num(t, "c", 0, 2), out.Num(t, "c", 0, 3); host != 4 || intact != 4 {
		t.Errorf("demoted: the CPU read %d of %d host pieces of the oldest block intact, want 4 of 4", intact, host)
	}
	if rc, host := out.Code(t, "C", 0), out.Num(t, "C", 0, 2); rc != 0 || host != 4 {
		t.Errorf("demoted: writing with the CPU: rc %d, %d host pieces, want 0 and 4", rc, host)
	}
	for i, when := range []string{"demoted", "promoted"} {
		if rc, ok := out.Code(t, "v", i), out.Num(t, "v", i, 2); rc != 0 || ok != 1 {
			t.Errorf("%s: cudaMemcpy read the oldest block back rc %d, intact %d; want it as the CPU wrote it", when, rc, ok)
		}
	}
	if host := out.Num(t, "c", 1, 2); host != 0 {
		t.Errorf("promoted: %d pieces of the oldest block still host memory, want 0", host)
	}
	if checked, bad := out.Num(t, "V", 0, 1), out.Num(t, "V", 0, 2); checked != 7 || bad != 0 {
		t.Errorf("%d of %d blocks read back corrupt after the moves\nstderr: %s", bad, checked, res.Stderr)
	}
	if strings.Contains(res.Stderr, cpuFallbackLine) || r.BackingErrors != 0 {
		t.Errorf("moving granules: backing errors %d, or the CPU grant refused:\n%s", r.BackingErrors, res.Stderr)
	}
}
