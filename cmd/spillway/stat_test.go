package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/spillway-gpu/spillway/internal/stat"
)

// fakeNVML lists one GPU per PCI bus, at index order, with the given
// processes' memory.
func fakeNVML(buses []uint32, procs map[int][]nvml.ProcessInfo) nvml.Interface {
	return &mock.Interface{
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(buses), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			return &mock.Device{
				GetNameFunc:       func() (string, nvml.Return) { return "Sim GPU", nvml.SUCCESS },
				GetUUIDFunc:       func() (string, nvml.Return) { return "GPU-" + string(rune('a'+i)), nvml.SUCCESS },
				GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 1 << 30}, nvml.SUCCESS },
				GetMemoryInfo_v2Func: func() (nvml.Memory_v2, nvml.Return) {
					return nvml.Memory_v2{Total: 1 << 30}, nvml.SUCCESS
				},
				GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
					return nvml.PciInfo{Domain: 0, Bus: buses[i], Device: 0}, nvml.SUCCESS
				},
				GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return procs[i], nvml.SUCCESS },
			}, nvml.SUCCESS
		},
	}
}

// publishAs writes a figures file for a live process of its own.
func publishAs(t *testing.T, dir string, devs ...stat.Device) int {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	w, err := stat.Create(dir, cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	w.Publish(devs, time.Now())
	return cmd.Process.Pid
}

// A published device goes under the NVML GPU at its PCI location, whatever
// its ordinal; one without a location under the GPU of its ordinal, said
// so; a location NVML does not list under a GPU of its own.
func TestCollectJoinsByPCILocation(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spillway")
	renumbered := publishAs(t, dir, stat.Device{Ordinal: 0, Quota: 1, PCI: &stat.PCILocation{Bus: 0x19}})
	old := publishAs(t, dir, stat.Device{Ordinal: 1, Quota: 2})
	elsewhere := publishAs(t, dir, stat.Device{Ordinal: 0, Quota: 3, PCI: &stat.PCILocation{Domain: 1, Bus: 0x40, Device: 2}})
	lib := fakeNVML([]uint32{0x18, 0x19}, map[int][]nvml.ProcessInfo{1: {{Pid: uint32(renumbered), UsedGpuMemory: 5}}})

	r, err := collect(lib, new(stat.Reader), []string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.unreadable) > 0 || len(r.Devices) != 3 {
		t.Fatalf("devices %+v, unreadable %v; want 3 devices", r.Devices, r.unreadable)
	}
	want := []struct {
		index int
		bus   string
		pids  []int
		by    []string
	}{
		{0, "00000000:18:00.0", nil, nil},
		{1, "00000000:19:00.0", []int{renumbered, old}, []string{matchedByPCI, matchedByIndex}},
		{-1, "00000001:40:02.0", []int{elsewhere}, []string{matchedByPCI}},
	}
	if renumbered > old { // listed by PID
		want[1].pids, want[1].by = []int{old, renumbered}, []string{matchedByIndex, matchedByPCI}
	}
	for i, w := range want {
		g := r.Devices[i]
		if g.Index != w.index || g.PCIBusID != w.bus || len(g.Processes) != len(w.pids) {
			t.Fatalf("device %d: %+v; want index %d, bus %s, pids %v", i, g, w.index, w.bus, w.pids)
		}
		for j, p := range g.Processes {
			if p.PID != w.pids[j] || p.MatchedBy != w.by[j] || p.Spillway == nil {
				t.Errorf("device %d process %d: %+v; want pid %d matched by %s", i, j, p, w.pids[j], w.by[j])
			}
			if (p.PID == renumbered) != (p.NVMLUsedBytes != nil) {
				t.Errorf("pid %d: NVML's figure %v; NVML lists only %d", p.PID, p.NVMLUsedBytes, renumbered)
			}
		}
	}

	var b strings.Builder
	writeStatTable(&b, r)
	for _, line := range []string{
		"GPU ?  (not listed by NVML)    0B used of 0B\n  at PCI 00000001:40:02.0\n",
		"PID " + strconv.Itoa(old) + " is shown by its device ordinal 1: it published no PCI location",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("table lacks %q:\n%s", line, b.String())
		}
	}
	if strings.Count(b.String(), "published no PCI location") != 1 {
		t.Errorf("the match by ordinal is remarked more than once, or for the wrong process:\n%s", b.String())
	}
}

// A device without processes lists them as [] in JSON, as every list is,
// never null (which the README keeps for fields that are unknown).
func TestCollectEmptyProcessesAreAList(t *testing.T) {
	r, err := collect(fakeNVML([]uint32{0x18}, nil), new(stat.Reader), []string{filepath.Join(t.TempDir(), "spillway")})
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(r.Devices)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"processes":[]`) {
		t.Errorf("a device without processes: %s, want \"processes\":[]", out)
	}
}

// SPILLWAY_RUNTIME_DIR is read as the shim reads it: a relative or empty
// folder, which the shim refuses, is an error naming the variable, not a
// folder that lists no process.
func TestStatDirsChecksRuntimeDir(t *testing.T) {
	for _, bad := range []string{"relative/spillway", ""} {
		t.Setenv("SPILLWAY_RUNTIME_DIR", bad)
		if dirs, err := statDirs(); err == nil || !strings.Contains(err.Error(), "SPILLWAY_RUNTIME_DIR") {
			t.Errorf("SPILLWAY_RUNTIME_DIR=%q: dirs %v, error %v; want an error naming the variable", bad, dirs, err)
		}
	}
	dir := t.TempDir()
	t.Setenv("SPILLWAY_RUNTIME_DIR", dir)
	if dirs, err := statDirs(); err != nil || len(dirs) != 1 || dirs[0] != dir {
		t.Errorf("SPILLWAY_RUNTIME_DIR=%q: dirs %v, error %v", dir, dirs, err)
	}
}

// fixedFigures is a figures reader that returns procs.
type fixedFigures []stat.Process

func (f fixedFigures) ReadDirs(...string) ([]stat.Process, []error) { return f, nil }

// Jobs of containers this /proc cannot show, listed under their PIDs
// there (both 1), are rows of their own, said so: neither the other nor
// the process NVML lists under the same PID here.
func TestCollectKeepsPIDsOfOtherNamespacesApart(t *testing.T) {
	pci := &stat.PCILocation{Bus: 0x18}
	procs := fixedFigures{
		{PID: 1, PIDInItsNamespace: true, PIDNamespace: 4026532001, Command: "python", Devices: []stat.Device{{Quota: 1, PCI: pci}}},
		{PID: 1, PIDInItsNamespace: true, PIDNamespace: 4026532002, Command: "python", Devices: []stat.Device{{Quota: 2, PCI: pci}}},
	}
	lib := fakeNVML([]uint32{0x18}, map[int][]nvml.ProcessInfo{0: {{Pid: 1, UsedGpuMemory: 5}}})
	r, err := collect(lib, procs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Devices) != 1 || len(r.Devices[0].Processes) != 3 {
		t.Fatalf("devices %+v; want one with 3 processes", r.Devices)
	}
	var quotas []uint64
	for _, p := range r.Devices[0].Processes {
		switch {
		case p.PIDInItsNamespace && p.Spillway != nil && p.NVMLUsedBytes == nil:
			quotas = append(quotas, p.Spillway.Quota)
		case !p.PIDInItsNamespace && p.Spillway == nil && p.NVMLUsedBytes != nil:
		default:
			t.Errorf("process %+v: figures joined across namespaces", p)
		}
	}
	if slices.Sort(quotas); !slices.Equal(quotas, []uint64{1, 2}) {
		t.Errorf("quotas of the jobs in containers %v; want [1 2]", quotas)
	}
	out, _ := json.Marshal(r.Devices)
	if strings.Count(string(out), `"pid_in_its_namespace":true`) != 2 || strings.Count(string(out), `"pid_in_its_namespace":false`) != 1 {
		t.Errorf("JSON %s; want pid_in_its_namespace true for the two jobs in containers, false for NVML's", out)
	}
	var b strings.Builder
	writeStatTable(&b, r)
	if line := "PID 1 (python) is its PID in another PID namespace"; strings.Count(b.String(), line) != 2 {
		t.Errorf("table lacks %q twice:\n%s", line, b.String())
	}
	// Two jobs with one PID and one command in two containers are two
	// series, told apart by their namespace; NVML's PID 1 has none.
	b.Reset()
	writeStatMetrics(&b, r)
	for _, series := range []string{
		`spillway_process_quota_bytes{gpu="0",UUID="GPU-a",modelName="Sim GPU",pid="1",pid_namespace="4026532001",command="python"} 1`,
		`spillway_process_quota_bytes{gpu="0",UUID="GPU-a",modelName="Sim GPU",pid="1",pid_namespace="4026532002",command="python"} 2`,
	} {
		if !strings.Contains(b.String(), series) {
			t.Errorf("metrics lack %s:\n%s", series, b.String())
		}
	}
}

// The refusals counter counts, and its help says so, the requests refused
// because the device itself was full below the quota, as well as those
// refused at the quota or the host limit.
func TestStatMetricsRefusalsHelp(t *testing.T) {
	var b strings.Builder
	writeStatMetrics(&b, &statReport{})
	want := "# HELP spillway_process_refusals_total Allocations refused: at the quota, at the host limit, or with the device itself full below the quota.\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("metrics lack %q:\n%s", want, b.String())
	}
}

// A GPU's used bytes leave out the driver's reserve, as NVML's second memory
// query and nvidia-smi give them; a driver without that query gives the
// first one's figures.
func TestGPUMemory(t *testing.T) {
	const total, reserved, allocated = 16 << 30, 456 << 20, 1 << 30
	v1 := func() (nvml.Memory, nvml.Return) {
		return nvml.Memory{Total: total, Used: reserved + allocated, Free: total - reserved - allocated}, nvml.SUCCESS
	}
	for _, c := range []struct {
		name      string
		v2        nvml.Return
		wantTotal uint64
		wantUsed  uint64
	}{
		{"v2", nvml.SUCCESS, total, allocated},
		{"v1 only", nvml.ERROR_FUNCTION_NOT_FOUND, total, reserved + allocated},
		{"v1 only, v2 refused", nvml.ERROR_NOT_SUPPORTED, total, reserved + allocated},
	} {
		dev := &mock.Device{
			GetMemoryInfoFunc: v1,
			GetMemoryInfo_v2Func: func() (nvml.Memory_v2, nvml.Return) {
				if c.v2 != nvml.SUCCESS {
					return nvml.Memory_v2{}, c.v2
				}
				return nvml.Memory_v2{Total: total, Reserved: reserved, Used: allocated, Free: total - reserved - allocated}, nvml.SUCCESS
			},
		}
		if gotTotal, gotUsed := gpuMemory(dev); gotTotal != c.wantTotal || gotUsed != c.wantUsed {
			t.Errorf("%s: total %d, used %d; want %d, %d", c.name, gotTotal, gotUsed, c.wantTotal, c.wantUsed)
		}
	}
}

// TestStatSaysTheVariableIsInTheEnvironment: a SPILLWAY_RUNTIME_DIR the shim
// refuses is said as run and trace say a variable they refuse, as found in
// the environment, with exit status 2, before NVML is looked for.
func TestStatSaysTheVariableIsInTheEnvironment(t *testing.T) {
	t.Setenv("SPILLWAY_RUNTIME_DIR", "relative/spillway")
	status, out, errText := dispatchOutput(t, "stat")
	want := `spillway stat: invalid SPILLWAY_RUNTIME_DIR="relative/spillway": not an absolute path (valid example: SPILLWAY_RUNTIME_DIR=/run/user/1000/spillway) (in the environment) (see 'spillway stat --help')` + "\n"
	if status != 2 || out != "" || errText != want {
		t.Errorf("stat with SPILLWAY_RUNTIME_DIR=relative/spillway: status %d, %q, %q; want status 2 and %q", status, out, errText, want)
	}
}

// promLabelValues checks one exposition line's label values as the
// Prometheus text format reads them (only \\, \" and \n are escapes, the
// text is UTF-8) and returns them unescaped, by name.
func promLabelValues(t *testing.T, line string) map[string]string {
	t.Helper()
	open := strings.IndexByte(line, '{')
	if open < 0 {
		return nil
	}
	labels := map[string]string{}
	s := line[open+1:]
	for len(s) > 0 && s[0] != '}' {
		eq := strings.Index(s, `="`)
		if eq < 0 {
			t.Fatalf("%q: a label without a quoted value", line)
		}
		name := strings.TrimPrefix(s[:eq], ",")
		s = s[eq+2:]
		var v strings.Builder
		for {
			if s == "" {
				t.Fatalf("%q: label %s not closed", line, name)
			}
			c := s[0]
			s = s[1:]
			if c == '"' {
				break
			}
			if c == '\\' {
				if s == "" {
					t.Fatalf("%q: label %s ends in a backslash", line, name)
				}
				switch s[0] {
				case '\\', '"':
					v.WriteByte(s[0])
				case 'n':
					v.WriteByte('\n')
				default:
					t.Fatalf("%q: label %s has the escape \\%c, which Prometheus refuses", line, name, s[0])
				}
				s = s[1:]
				continue
			}
			v.WriteByte(c)
		}
		if !utf8.ValidString(v.String()) {
			t.Fatalf("%q: label %s is not UTF-8", line, name)
		}
		labels[name] = v.String()
		s = strings.TrimPrefix(s, ",")
	}
	return labels
}

// A command or model name holding quotes, backslashes, newlines, tabs,
// other control bytes or bytes that are not UTF-8 (a process may name
// itself anything, prctl(PR_SET_NAME)) is written as the Prometheus text
// format escapes it, one series a line, and reads back as itself (bytes
// that are not UTF-8 as U+FFFD).
func TestStatMetricsEscapeLabels(t *testing.T) {
	const odd = "a\"b\\c\nd\te\x01f\xffg"
	model := "Sim \"GPU\"\t\\x"
	r := &statReport{Devices: []statGPU{{Index: 0, Name: model, UUID: "GPU-a", TotalBytes: 1, Processes: []statProcess{
		{PID: 7, Command: odd, Spillway: &stat.Device{Quota: 3}},
	}}}}
	var b strings.Builder
	writeStatMetrics(&b, r)
	series := 0
	for _, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.HasPrefix(line, "spillway_") {
			t.Fatalf("line %q is neither a comment nor a series:\n%s", line, b.String())
		}
		series++
		labels := promLabelValues(t, line)
		if labels["modelName"] != model {
			t.Errorf("%q: modelName reads back as %q, want %q", line, labels["modelName"], model)
		}
		if c, ok := labels["command"]; ok && c != strings.ToValidUTF8(odd, "\uFFFD") {
			t.Errorf("%q: command reads back as %q, want %q", line, c, strings.ToValidUTF8(odd, "\uFFFD"))
		}
	}
	if series != 2+11 { // the GPU's two, and the eleven of the process's figures
		t.Errorf("%d series, want 13:\n%s", series, b.String())
	}
}

// A command name holding a newline, a tab or another control byte (a
// process may name itself anything) stays on its row of the table, its
// control bytes shown as '?', and the other columns line up.
func TestStatTableCommandWithControlBytes(t *testing.T) {
	r := &statReport{Devices: []statGPU{{Index: 0, Name: "Sim GPU", UUID: "GPU-a", Processes: []statProcess{
		{PID: 7, Command: "evil\n  8  fake", Spillway: &stat.Device{Quota: 3}},
		{PID: 9, Command: "tab\there\x1b[2J", PIDInItsNamespace: true, Spillway: &stat.Device{Quota: 3}},
	}}}}
	var b strings.Builder
	writeStatTable(&b, r)
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	// The heading, the columns' names, two rows, and the remark on PID 9.
	if len(lines) != 5 || !strings.Contains(lines[2], "evil?  8  fake") || !strings.Contains(lines[3], "tab?here?[2J") ||
		strings.ContainsAny(b.String(), "\t\x1b") || !strings.Contains(lines[4], "PID 9 (tab?here?[2J)") {
		t.Errorf("table:\n%s", b.String())
	}
	if strings.Index(lines[2], "none") != strings.Index(lines[3], "none") {
		t.Errorf("columns do not line up:\n%s", b.String())
	}
}
