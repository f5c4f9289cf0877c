package simcudatest

// Tests of simcuda's virtual memory management API (cuMemAddressReserve,
// cuMemCreate, cuMemMap, cuMemSetAccess, ...): testdata/vmm.c checks one
// behaviour per run, reading the device's usage with cuMemGetInfo after
// every step, and the statistics file confirms the totals at exit.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// vmmStats is the part of simcuda's statistics file that concerns VMM.
type vmmStats struct {
	Devices []struct {
		DeviceBytes      uint64 `json:"device_bytes"`
		DeviceBytesPeak  uint64 `json:"device_bytes_peak"`
		VMMPhysicalBytes uint64 `json:"vmm_physical_bytes"`
	} `json:"devices"`
	VMM struct {
		HostPhysicalBytes uint64 `json:"host_physical_bytes"`
		Handles           uint64 `json:"handles"`
		ReservedBytes     uint64 `json:"reserved_bytes"`
		MappedBytes       uint64 `json:"mapped_bytes"`
	} `json:"vmm"`
}

func buildVMM(t *testing.T) string {
	t.Helper()
	return harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/vmm.c"},
		ProjectHeaders: true,
		Flags:          []string{"-L", harness.SimcudaDir(t), "-lcuda"},
	})
}

// runVMMCase runs one case of testdata/vmm.c with env and returns its statistics.
func runVMMCase(t *testing.T, bin, name string, env ...string) vmmStats {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stats.json")
	cmd := harness.Command(t, bin, name)
	harness.SetEnv(cmd, append([]string{"SIMCUDA_STATS_FILE=" + path}, env...)...)
	res := harness.Run(t, cmd)
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "PASS "+name) {
		t.Fatalf("vmm case %s: exit %d\nstdout:\n%s\nstderr:\n%s", name, res.ExitCode, res.Stdout, res.Stderr)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read simcuda stats: %v", err)
	}
	var s vmmStats
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("parse simcuda stats: %v\n%s", err, data)
	}
	if len(s.Devices) == 0 {
		t.Fatalf("simcuda stats list no device:\n%s", data)
	}
	return s
}

func TestVMM(t *testing.T) {
	bin := buildVMM(t)
	cases := []struct {
		name string
		env  []string
		why  string
		// ground truth at exit: live and peak device bytes, VMM physical bytes
		// on device 0 and on the host, live handles, reserved and mapped bytes
		live, peak, physical, host, handles, reserved, mapped uint64
	}{
		{name: "granularity", why: "2 MiB granularity; CUDA 12.4's location rules; the attributes say VMM with POSIX file descriptor handles"},
		{name: "round_trip", why: "reserve, create, map, grant access, copy, memset, query, unmap, release, free",
			peak: 4*mebibyte + 4096},
		{name: "shared", why: "every mapping of one handle shows the same bytes; copies span adjacent mappings",
			peak: 6 * mebibyte},
		{name: "adjacent", why: "a run of mappings across adjacent reservations takes access and is unmapped in one call each",
			peak: 4 * mebibyte},
		{name: "release_before_unmap", why: "released memory lives until its last mapping goes; retained handles keep it",
			peak: 4 * mebibyte},
		{name: "count_once", why: "physical memory counts once however often it is mapped",
			live: 2 * mebibyte, peak: 2 * mebibyte, physical: 2 * mebibyte, handles: 1,
			reserved: 8 * mebibyte, mapped: 6 * mebibyte},
		{name: "errors", env: []string{"SIMCUDA_DEVICES=32MiB"},
			why:  "misaligned sizes and offsets, double maps, access before cuMemSetAccess, bad handles and ranges",
			peak: 4*mebibyte + 4096},
		{name: "capacity", env: []string{"SIMCUDA_DEVICES=32MiB"},
			why:  "cuMemCreate and cuMemAlloc share the device's capacity",
			live: 26*mebibyte + 512, peak: 32 * mebibyte},
		{name: "unmap_waits", why: "cuMemUnmap waits for queued copies into the range",
			peak: 2 * mebibyte},
		{name: "peer_access", env: []string{"SIMCUDA_DEVICES=2x1GiB", "SIMCUDA_PEER=1"},
			why:  "each device reaches a mapping only with the access granted to it",
			live: 2 * mebibyte, peak: 2 * mebibyte, physical: 2 * mebibyte, handles: 1,
			reserved: 2 * mebibyte, mapped: 2 * mebibyte},
		{name: "graph_access", env: []string{"SIMCUDA_DEVICES=2x1GiB", "SIMCUDA_PEER=1"},
			why:  "a graph launch is held to the access its stream's device has at launch, as a direct call is",
			peak: 2 * mebibyte},
		{name: "no_peer", env: []string{"SIMCUDA_DEVICES=2x1GiB"},
			why:  "without peers, another device cannot be granted a device's memory",
			peak: 2 * mebibyte},
		{name: "host_numa", why: "host-located memory takes no device memory and is CPU-accessible when granted",
			live: 2 * mebibyte, peak: 2 * mebibyte, physical: 2 * mebibyte, host: 4 * mebibyte, handles: 2,
			reserved: 4 * mebibyte, mapped: 4 * mebibyte},
		{name: "expandable", env: []string{"SIMCUDA_DEVICES=1GiB"},
			why:  "an expandable segment grows granule by granule and shrinks again, counted exactly",
			peak: 48 * 2 * mebibyte},
		{name: "sleep", env: []string{"SIMCUDA_DEVICES=1GiB"},
			why:  "unmap and release everything, recreate and remap at the same addresses, contents restored",
			peak: 32 * mebibyte},
		{name: "share", why: "POSIX file descriptors share an allocation with another process, charged to its creator",
			peak: 4 * mebibyte},
		{name: "share_visible", env: []string{"SIMCUDA_DEVICES=2x1GiB"},
			why: "an importer that numbers the devices otherwise (CUDA_VISIBLE_DEVICES) finds the memory where it lives"},
		{name: "no_vmm", env: []string{"SIMCUDA_NO_VMM=1"}, why: "SIMCUDA_NO_VMM=1 turns the API off"},
		{name: "no_host_access", env: []string{"SIMCUDA_NO_HOST_ACCESS=1"},
			why: "SIMCUDA_NO_HOST_ACCESS=1 refuses to grant the CPU host-located memory; the device's grant still works"},
		{name: "proc_address", why: "cuGetProcAddress finds every VMM entry point"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Logf("expect: %s", c.why)
			s := runVMMCase(t, bin, c.name, c.env...)
			dev := s.Devices[0]
			got := [7]uint64{dev.DeviceBytes, dev.DeviceBytesPeak, dev.VMMPhysicalBytes,
				s.VMM.HostPhysicalBytes, s.VMM.Handles, s.VMM.ReservedBytes, s.VMM.MappedBytes}
			want := [7]uint64{c.live, c.peak, c.physical, c.host, c.handles, c.reserved, c.mapped}
			if got != want {
				t.Fatalf("at exit (device_bytes, device_bytes_peak, vmm_physical_bytes, "+
					"vmm.host_physical_bytes, vmm.handles, vmm.reserved_bytes, vmm.mapped_bytes) = %v, want %v",
					got, want)
			}
		})
	}
}

// TestVMMBadConfiguration: SIMCUDA_NO_VMM takes 1 or 0 and nothing else.
func TestVMMBadConfiguration(t *testing.T) {
	bin := buildVMM(t)
	cmd := harness.Command(t, bin, "granularity")
	harness.SetEnv(cmd, "SIMCUDA_NO_VMM=yes")
	res := harness.Run(t, cmd)
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "SIMCUDA_NO_VMM=\"yes\"") {
		t.Fatalf("SIMCUDA_NO_VMM=yes: exit %d, stderr:\n%s\nwant a failure naming the variable",
			res.ExitCode, res.Stderr)
	}
}
