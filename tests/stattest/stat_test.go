package stattest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-gpu/spillway/internal/stat"
	"github.com/spillway-gpu/spillway/tests/harness"
)

// watchdog bounds waits for a child; a hang, not a speed goal.
const watchdog = 2 * time.Minute

const mib = 1 << 20

// holder is a running testdata/hold.c under the shim.
type holder struct {
	pid    int // hold's, as this process sees it
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr strings.Builder
	stats  string // its SIMCUDA_STATS_FILE
	ready  time.Time
}

// env is what every process of a test shares: simcuda's state (so that NVML
// sees every holder) and the figures' folder.
type env struct {
	state, runtime string
}

func newEnv(t *testing.T) env {
	return env{state: t.TempDir(), runtime: filepath.Join(t.TempDir(), "spillway")}
}

func (e env) apply(cmd *exec.Cmd) {
	harness.SetEnv(cmd, "SIMCUDA_STATE_DIR="+e.state, "SIMCUDA_DEVICES=2x256MiB", "SPILLWAY_RUNTIME_DIR="+e.runtime)
}

// startHolder runs hold under the shim with a quota and waits until it
// holds its memory.
func startHolder(t *testing.T, e env, bin, limit string, args ...string) *holder {
	t.Helper()
	return startHolderEnv(t, e, bin, []string{"SPILLWAY_MEMORY_LIMIT=" + limit}, args...)
}

// startHolderEnv is startHolder with more of the holder's environment.
func startHolderEnv(t *testing.T, e env, bin string, extra []string, args ...string) *holder {
	t.Helper()
	h := startWrapped(t, e, extra, bin, args...)
	h.pid = h.cmd.Process.Pid
	return h
}

// startWrapped runs prog with args under the shim (prog may be a wrapper
// that runs hold), with extra in its environment, and waits until hold
// holds its memory; h.pid is left to the caller.
func startWrapped(t *testing.T, e env, extra []string, prog string, args ...string) *holder {
	t.Helper()
	h := &holder{stats: filepath.Join(t.TempDir(), "stats.json")}
	h.cmd = harness.Shimmed(t, []string{"SPILLWAY_REPORT=1", "SIMCUDA_STATS_FILE=" + h.stats}, prog, args...)
	e.apply(h.cmd)
	harness.SetEnv(h.cmd, extra...)
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	h.cmd.Stderr = &h.stderr
	var err error
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.cmd.Process.Kill(); h.cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "ready" {
			t.Fatalf("hold printed %q; stderr:\n%s", s, h.stderr.String())
		}
	case <-time.After(watchdog):
		t.Fatalf("hold not ready within %v", watchdog)
	}
	h.ready = time.Now()
	return h
}

// finish lets the holder exit and returns its report for device dev and
// simcuda's stats.
func (h *holder) finish(t *testing.T, dev int) (harness.Report, harness.Stats) {
	t.Helper()
	h.stdin.Close()
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("hold: %v; stderr:\n%s", err, h.stderr.String())
	}
	return harness.ReportFor(t, h.stderr.String(), dev), harness.ReadStats(t, h.stats)
}

// statJSON is what the test reads of `spillway stat --json`.
type statJSON struct {
	Devices []statDevice `json:"devices"`
}

type statDevice struct {
	Index      int               `json:"index"`
	Name       string            `json:"name"`
	UUID       string            `json:"uuid"`
	PCIBusID   string            `json:"pci_bus_id"`
	TotalBytes uint64            `json:"total_bytes"`
	UsedBytes  uint64            `json:"used_bytes"`
	Processes  []statProcessJSON `json:"processes"`
}

// statProcessJSON is one process under a device.
type statProcessJSON struct {
	PID               int       `json:"pid"`
	PIDInItsNamespace bool      `json:"pid_in_its_namespace"`
	PIDNamespace      *uint64   `json:"pid_namespace"`
	Command           string    `json:"command"`
	Updated           time.Time `json:"updated"`
	Spillway          *struct {
		Ordinal       int     `json:"ordinal"`
		Limited       bool    `json:"limited"`
		Quota         uint64  `json:"quota_bytes"`
		Used          uint64  `json:"used_bytes"`
		Reserved      uint64  `json:"reserved_bytes"`
		Cached        uint64  `json:"cached_bytes"`
		Live          uint64  `json:"live_bytes"`
		Spilled       uint64  `json:"spilled_bytes"`
		SpilledTotal  uint64  `json:"spilled_total_bytes"`
		PromotedTotal uint64  `json:"promoted_total_bytes"`
		HostOutside   uint64  `json:"host_outside_bytes"`
		HostLimit     uint64  `json:"host_limit_bytes"`
		Refused       uint64  `json:"refusals"`
		BackingErrors uint64  `json:"backing_errors"`
		PeakReserved  uint64  `json:"peak_reserved_bytes"`
		PCIBusID      *string `json:"pci_bus_id"`
	} `json:"spillway"`
	NVMLUsed  *uint64 `json:"nvml_used_bytes"`
	MatchedBy string  `json:"matched_by"`
}

func runStat(t *testing.T, e env, args ...string) harness.Result {
	t.Helper()
	cmd := harness.Command(t, harness.Bin(t, "spillway"), append([]string{"stat"}, args...)...)
	e.apply(cmd)
	return harness.Run(t, cmd)
}

// statAfter runs `spillway stat --json` until every holder's figures were
// published after it became ready.
func statAfter(t *testing.T, e env, hs ...*holder) statJSON {
	t.Helper()
	deadline := time.Now().Add(watchdog)
	for {
		res := runStat(t, e, "--json")
		if res.ExitCode != 0 {
			t.Fatalf("spillway stat --json: exit %d\n%s", res.ExitCode, res.Stderr)
		}
		var s statJSON
		if err := json.Unmarshal([]byte(res.Stdout), &s); err != nil {
			t.Fatalf("spillway stat --json printed %q: %v", res.Stdout, err)
		}
		fresh := 0
		for _, h := range hs {
			for _, d := range s.Devices {
				for _, p := range d.Processes {
					if p.PID == h.pid && p.Spillway != nil && p.Updated.After(h.ready) {
						fresh++
					}
				}
			}
		}
		if fresh == len(hs) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("figures of %d holders not published after they were ready, within %v: %s", len(hs), watchdog, res.Stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// compileHold builds testdata/hold.c.
func compileHold(t *testing.T) string {
	return harness.Compile(t, harness.CBuild{Sources: []string{"testdata/hold.c"}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-lcuda"}})
}

// A process whose own cuMemCreate went to the host (oversubscription, the
// quota full): the JSON gives those bytes as host_outside_bytes, as its
// report does, and the table counts them as spilled.
func TestStatHostOutside(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	const granule = 2 * mib
	h := startHolderEnv(t, e, bin, []string{"SPILLWAY_MEMORY_LIMIT=8MiB", "SPILLWAY_OVERSUBSCRIBE=1"},
		"0", "0", fmt.Sprintf("v%d", 2*granule), fmt.Sprintf("v%d", 2*granule), fmt.Sprintf("v%d", granule))
	s := statAfter(t, e, h)
	table := runStat(t, e)
	report, _ := h.finish(t, 0)
	if report.HostOutside != granule || report.Spilled != 0 {
		t.Fatalf("report: %d bytes outside the pool on the host, %d spilled; want %d and 0", report.HostOutside, report.Spilled, granule)
	}
	if len(s.Devices) == 0 || len(s.Devices[0].Processes) != 1 || s.Devices[0].Processes[0].Spillway == nil {
		t.Fatalf("stat: %+v, want the holder on GPU 0", s.Devices)
	}
	if sp := s.Devices[0].Processes[0].Spillway; sp.HostOutside != report.HostOutside || sp.Used != 8*mib || sp.Spilled != 0 {
		t.Errorf("published %+v; want host_outside_bytes %d and the quota used", sp, report.HostOutside)
	}
	row := regexp.MustCompile(fmt.Sprintf(`(?m)^\s*%d\s+hold\s+8MiB\s+8MiB\s+\S+\s+2MiB\s`, h.cmd.Process.Pid))
	if !row.MatchString(tableSection(table.Stdout, 0)) {
		t.Errorf("table: want 2MiB spilled for pid %d in:\n%s", h.cmd.Process.Pid, table.Stdout)
	}
}

// Two processes under different quotas on two devices: the table and the
// JSON give each process's own figures, as its exit report states them,
// and NVML's, as simcuda counts them.
func TestStatTwoProcesses(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	// a: 64MiB quota on device 0, holds 8MiB + 2MiB after freeing 4MiB (cached).
	a := startHolder(t, e, bin, "64MiB", "0", "1", strconv.Itoa(4*mib), strconv.Itoa(8*mib), strconv.Itoa(2*mib))
	// b: 32MiB quota on device 1, holds 16MiB.
	b := startHolder(t, e, bin, "32MiB", "1", "0", strconv.Itoa(16*mib))

	s := statAfter(t, e, a, b)
	table := runStat(t, e)
	if table.ExitCode != 0 {
		t.Fatalf("spillway stat: exit %d\n%s", table.ExitCode, table.Stderr)
	}
	if len(s.Devices) != 2 {
		t.Fatalf("devices %+v, want 2", s.Devices)
	}
	checkShown(t, s, table.Stdout, 0, a, 0)
	checkShown(t, s, table.Stdout, 1, b, 1)
	if a.cmd.ProcessState == nil || b.cmd.ProcessState == nil {
		t.Fatal("holders not finished")
	}
	// Their files are gone with them.
	if left, _ := filepath.Glob(filepath.Join(e.runtime, "*.stat")); len(left) != 0 {
		t.Errorf("files left after exit: %v", left)
	}
	after := runStat(t, e, "--json")
	if strings.Contains(after.Stdout, `"spillway":{`) {
		t.Errorf("figures listed after exit: %s", after.Stdout)
	}
}

// checkShown checks that GPU gpu of s (and of the table) lists holder h
// alone, which uses it as its device ordinal, with the figures h reports at
// exit (it is made to exit) and the memory simcuda counts for it. The
// device is matched by its PCI location, which the table does not remark.
func checkShown(t *testing.T, s statJSON, table string, gpu int, h *holder, ordinal int) {
	t.Helper()
	pid := h.cmd.Process.Pid
	dev := s.Devices[gpu]
	wantBus := fmt.Sprintf("00000000:%02x:00.0", 0x18+gpu) // simcuda's bus: 0x18 + NVML's index
	if dev.Index != gpu || dev.TotalBytes != 256*mib+harness.NVMLReserved || !strings.HasPrefix(dev.UUID, "GPU-") || dev.Name == "" ||
		dev.PCIBusID != wantBus {
		t.Errorf("device %d: %+v; want bus %s", gpu, dev, wantBus)
	}
	if len(dev.Processes) != 1 || dev.Processes[0].PID != pid {
		t.Fatalf("device %d lists %+v, want only pid %d", gpu, dev.Processes, pid)
	}
	p := dev.Processes[0]
	report, stats := h.finish(t, ordinal)
	sp := p.Spillway
	if sp == nil || sp.Ordinal != ordinal || !sp.Limited || sp.Quota != report.Quota || sp.Used != report.Reserved ||
		sp.Reserved != report.Reserved || sp.Cached != report.Cached || sp.Live != report.Live ||
		sp.Spilled != report.Spilled || sp.Refused != report.Refused || sp.SpilledTotal != report.SpilledTotal ||
		sp.PromotedTotal != report.PromotedTotal || sp.BackingErrors != report.BackingErrors || sp.PeakReserved != report.PeakReserved {
		t.Fatalf("pid %d published %+v; its report says %+v", pid, sp, report)
	}
	if sp.HostLimit != 0 { // no oversubscription
		t.Errorf("pid %d: host_limit_bytes %d without oversubscription, want 0", pid, sp.HostLimit)
	}
	if sp.PCIBusID == nil || *sp.PCIBusID != wantBus || p.MatchedBy != "pci_bus_id" {
		t.Errorf("pid %d: published bus %v, matched by %q; want %s, pci_bus_id", pid, sp.PCIBusID, p.MatchedBy, wantBus)
	}
	held := stats.Devices[ordinal].DeviceBytes
	if p.NVMLUsed == nil || *p.NVMLUsed != held || held != report.Reserved {
		t.Errorf("pid %d: NVML's figure %v, simcuda's device_bytes %d, reserved %d: want all equal",
			pid, p.NVMLUsed, held, report.Reserved)
	}
	if dev.UsedBytes != held { // the driver's reserve apart, as nvidia-smi shows it
		t.Errorf("device %d: used_bytes %d, want the %d bytes its only process holds (NVML's reserve: %d)",
			gpu, dev.UsedBytes, held, harness.NVMLReserved)
	}
	if p.Command != "hold" {
		t.Errorf("pid %d: command %q, want hold", pid, p.Command)
	}
	// The table's row for the process, under its GPU's heading: PID,
	// command, quota, used, cached, spilled, refusals and NVML's figure,
	// in human sizes.
	section := tableSection(table, gpu)
	row := regexp.MustCompile(fmt.Sprintf(`(?m)^\s*%d\s+hold\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$`, pid))
	m := row.FindStringSubmatch(section)
	want := []string{human(report.Quota), human(report.Reserved), human(report.Cached), human(report.Spilled),
		strconv.FormatUint(report.Refused, 10), human(held)}
	if m == nil || strings.Join(m[1:], " ") != strings.Join(want, " ") {
		t.Errorf("table row for pid %d under GPU %d: %q, want %q in:\n%s", pid, gpu, m, want, table)
	}
	if strings.Contains(section, "published no PCI location") {
		t.Errorf("GPU %d remarks a match by ordinal:\n%s", gpu, table)
	}
}

// tableSection is GPU gpu's part of the table, from its heading to the next.
func tableSection(table string, gpu int) string {
	start := strings.Index(table, fmt.Sprintf("GPU %d ", gpu))
	if start < 0 {
		return ""
	}
	section := table[start:]
	if end := strings.Index(section, "\nGPU "); end >= 0 {
		section = section[:end]
	}
	return section
}

// A process whose CUDA_VISIBLE_DEVICES renumbers its devices is shown under
// the GPU it really uses: b sees physical device 1 as its device 0, and
// a uses device 0 unrenumbered; each is listed alone under its own GPU.
func TestStatVisibleDevices(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	a := startHolder(t, e, bin, "64MiB", "0", "1", strconv.Itoa(4*mib), strconv.Itoa(8*mib), strconv.Itoa(2*mib))
	b := startHolderEnv(t, e, bin, []string{"SPILLWAY_MEMORY_LIMIT=32MiB", "CUDA_VISIBLE_DEVICES=1"},
		"0", "0", strconv.Itoa(16*mib))

	s := statAfter(t, e, a, b)
	table := runStat(t, e)
	if table.ExitCode != 0 {
		t.Fatalf("spillway stat: exit %d\n%s", table.ExitCode, table.Stderr)
	}
	if len(s.Devices) != 2 {
		t.Fatalf("devices %+v, want 2", s.Devices)
	}
	checkShown(t, s, table.Stdout, 0, a, 0)
	checkShown(t, s, table.Stdout, 1, b, 0)
}

// A file that names no PCI location (its runtime would not say) is matched
// by its ordinal, and the table and the JSON say so.
func TestStatMatchesByIndexWithoutLocation(t *testing.T) {
	e := newEnv(t)
	w, err := stat.Create(e.runtime, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Publish([]stat.Device{{Ordinal: 1, Limited: true, Quota: 8 * mib, Used: 2 * mib}}, time.Now())
	s := statOnce(t, e)
	if len(s.Devices) != 2 || len(s.Devices[1].Processes) != 1 || len(s.Devices[0].Processes) != 0 {
		t.Fatalf("want this process alone under GPU 1: %+v", s.Devices)
	}
	p := s.Devices[1].Processes[0]
	if p.PID != os.Getpid() || p.MatchedBy != "index" || p.Spillway == nil || p.Spillway.PCIBusID != nil ||
		p.Spillway.Quota != 8*mib {
		t.Errorf("GPU 1 lists %+v (spillway %+v); want pid %d matched by index, no bus", p, p.Spillway, os.Getpid())
	}
	table := runStat(t, e)
	note := fmt.Sprintf("PID %d is shown by its device ordinal 1: it published no PCI location", os.Getpid())
	if table.ExitCode != 0 || !strings.Contains(tableSection(table.Stdout, 1), note) {
		t.Errorf("exit %d; GPU 1's table lacks %q:\n%s%s", table.ExitCode, note, table.Stdout, table.Stderr)
	}
}

// statOnce runs `spillway stat --json` once.
func statOnce(t *testing.T, e env) statJSON {
	t.Helper()
	res := runStat(t, e, "--json")
	var s statJSON
	if res.ExitCode != 0 || json.Unmarshal([]byte(res.Stdout), &s) != nil {
		t.Fatalf("spillway stat --json: exit %d, %q\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	return s
}

// human is how the table writes sizes (config.FormatBytes).
func human(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatUint(n, 10) + "B"
	}
	i, v := -1, n
	for v >= 1024 && v%1024 == 0 && i < len(units)-1 {
		v >>= 10
		i++
	}
	if i >= 0 && v < 1024 {
		return strconv.FormatUint(v, 10) + string(units[i]) + "iB"
	}
	f, j := float64(n), -1
	for f >= 1024 {
		f /= 1024
		j++
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + string(units[j]) + "iB"
}

// A process killed with SIGKILL leaves its file behind; stat ignores it,
// and the next process to publish there removes it.
func TestStatIgnoresKilled(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	h := startHolder(t, e, bin, "64MiB", "0", "0", strconv.Itoa(4*mib))
	statAfter(t, e, h)
	h.cmd.Process.Kill()
	h.cmd.Wait()
	if left, _ := filepath.Glob(filepath.Join(e.runtime, "*.stat")); len(left) != 1 {
		t.Fatalf("files after SIGKILL: %v, want the one left behind", left)
	}
	res := runStat(t, e, "--json")
	if res.ExitCode != 0 || strings.Contains(res.Stdout, fmt.Sprintf(`"pid":%d`, h.cmd.Process.Pid)) {
		t.Errorf("exit %d, the killed process listed: %s\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	next := startHolder(t, e, bin, "64MiB", "0", "0", strconv.Itoa(4*mib))
	left, _ := filepath.Glob(filepath.Join(e.runtime, "*.stat"))
	if len(left) != 1 || !strings.HasPrefix(filepath.Base(left[0]), strconv.Itoa(next.pid)+"-") {
		t.Errorf("files once another process published: %v, want only pid %d's", left, next.pid)
	}
}

// Without NVML, one line says so.
func TestStatWithoutNVML(t *testing.T) {
	cmd := harness.Command(t, harness.Bin(t, "spillway"), "stat")
	harness.SetEnv(cmd, "LD_LIBRARY_PATH="+t.TempDir())
	res := harness.Run(t, cmd)
	if res.ExitCode != 1 || strings.Count(res.Stderr, "\n") != 1 || !strings.Contains(res.Stderr, "cannot load NVML (libnvidia-ml.so.1)") {
		t.Errorf("exit %d, stderr %q: want 1 and one line about NVML", res.ExitCode, res.Stderr)
	}
}

// A SPILLWAY_RUNTIME_DIR the shim would refuse is the caller's to fix, as a
// bad flag is: one line naming it, exit status 2, whether or not NVML loads.
func TestStatBadRuntimeDir(t *testing.T) {
	for _, nvml := range []bool{true, false} {
		cmd := harness.Command(t, harness.Bin(t, "spillway"), "stat")
		newEnv(t).apply(cmd)
		harness.SetEnv(cmd, "SPILLWAY_RUNTIME_DIR=relative/dir")
		if !nvml {
			harness.SetEnv(cmd, "LD_LIBRARY_PATH="+t.TempDir())
		}
		res := harness.Run(t, cmd)
		if res.ExitCode != 2 || strings.Count(res.Stderr, "\n") != 1 || !strings.Contains(res.Stderr, "SPILLWAY_RUNTIME_DIR") || !strings.Contains(res.Stderr, "absolute path") {
			t.Errorf("NVML loadable %v: exit %d, stderr %q: want 2 and one line naming SPILLWAY_RUNTIME_DIR and what is valid", nvml, res.ExitCode, res.Stderr)
		}
	}
}

// --metrics-addr serves the same figures for Prometheus: each series has
// the value the process's exit report, or simcuda, gives it.
func TestStatMetrics(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	// Holds 8MiB, 4MiB freed (cached), one request refused at the quota.
	h := startHolder(t, e, bin, "64MiB", "0", "1", strconv.Itoa(4*mib), strconv.Itoa(8*mib), "?"+strconv.Itoa(128*mib))
	statAfter(t, e, h)
	body := scrapeOnce(t, e)
	pid := strconv.Itoa(h.cmd.Process.Pid)
	for _, want := range []string{
		"# TYPE spillway_process_quota_bytes gauge",
		`spillway_process_quota_bytes{gpu="0",UUID="GPU-`,
		fmt.Sprintf(`pid="%s",command="hold"} %d`, pid, 64*mib),
		"# TYPE spillway_process_refusals_total counter",
		`spillway_gpu_memory_total_bytes{gpu="0",`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	report, stats := h.finish(t, 0)
	held := stats.Devices[0].DeviceBytes
	if report.Refused != 1 || report.Cached != 4*mib || held != report.Reserved {
		t.Fatalf("the holder's report %+v, simcuda's device bytes %d: want one refusal, 4MiB cached, all it reserved on the device", report, held)
	}
	for _, c := range []struct {
		name string
		want uint64
	}{
		{"spillway_gpu_memory_total_bytes", 256*mib + harness.NVMLReserved},
		{"spillway_gpu_memory_used_bytes", held}, // its only process's; the driver's reserve apart
		{"spillway_process_nvml_used_bytes", held},
		{"spillway_process_quota_bytes", report.Quota},
		{"spillway_process_used_bytes", report.Reserved},
		{"spillway_process_pool_reserved_bytes", report.Reserved},
		{"spillway_process_pool_cached_bytes", report.Cached},
		{"spillway_process_live_bytes", report.Live},
		{"spillway_process_spilled_bytes", report.Spilled},
		{"spillway_process_host_outside_bytes", report.HostOutside},
		{"spillway_process_spilled_bytes_total", report.SpilledTotal},
		{"spillway_process_promoted_bytes_total", report.PromotedTotal},
		{"spillway_process_refusals_total", report.Refused},
		{"spillway_process_backing_errors_total", report.BackingErrors},
	} {
		if got, ok := seriesOnGPU0(body, c.name, pid); !ok || got != c.want {
			t.Errorf("%s on GPU 0 (pid %s): %d (found %v), want %d", c.name, pid, got, ok, c.want)
		}
	}
}

// scrapeOnce starts `spillway stat --metrics-addr` on a port of its
// choosing, returns what one scrape of its /metrics gives, and stops it.
func scrapeOnce(t *testing.T, e env) string {
	t.Helper()
	cmd := harness.Command(t, harness.Bin(t, "spillway"), "stat", "--metrics-addr", "127.0.0.1:0")
	e.apply(cmd)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	line, _ := bufio.NewReader(stderr).ReadString('\n')
	addr := regexp.MustCompile(`http://(\S+)/metrics`).FindStringSubmatch(line)
	if addr == nil {
		t.Fatalf("no address in %q", line)
	}
	return fetch(t, "http://"+addr[1]+"/metrics")
}

// A process without a quota beside one not running under Spillway, on one
// GPU: the first is listed with the quota none in the table, and in the
// JSON and the metrics the device's total as CUDA reports it (SIMCUDA_DEVICES),
// not NVML's; the second with NVML's figure alone, as simcuda counts it: its
// other columns '-', and in the JSON null figures, a null updated and no
// matched_by.
func TestStatWithoutQuotaBesideAProcessNotUnderSpillway(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	h := startHolderEnv(t, e, bin, nil, "0", "1", strconv.Itoa(4*mib), strconv.Itoa(8*mib))
	plainStats := filepath.Join(t.TempDir(), "stats.json")
	plain := harness.Command(t, bin, "0", "0", strconv.Itoa(2*mib))
	e.apply(plain)
	harness.SetEnv(plain, "SIMCUDA_STATS_FILE="+plainStats)
	plainIn, plainOut, plainErr := harness.StartPiped(t, plain)
	t.Cleanup(func() { plain.Process.Kill(); plain.Wait() })
	if !plainOut.Scan() || plainOut.Text() != "ready" {
		t.Fatalf("hold without the shim printed %q; stderr:\n%s", plainOut.Text(), plainErr.String())
	}

	statAfter(t, e, h)
	res := runStat(t, e, "--json")
	table := runStat(t, e)
	body := scrapeOnce(t, e)
	plainIn.Close()
	if err := harness.WaitWithin(t, plain, watchdog); err != nil {
		t.Fatalf("hold without the shim: %v; stderr:\n%s", err, plainErr.String())
	}
	plainHeld := harness.ReadStats(t, plainStats).Devices[0].DeviceBytes
	report, stats := h.finish(t, 0)
	const cudaTotal = 256 * mib // SIMCUDA_DEVICES

	var s struct {
		Devices []struct {
			Processes []map[string]json.RawMessage `json:"processes"`
		} `json:"devices"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &s); err != nil || len(s.Devices) != 2 || len(s.Devices[0].Processes) != 2 {
		t.Fatalf("spillway stat --json: %v, %s; want two processes on GPU 0", err, res.Stdout)
	}
	for _, p := range s.Devices[0].Processes {
		raw, _ := json.Marshal(p)
		switch pid := string(p["pid"]); pid {
		case strconv.Itoa(h.pid):
			var sp statProcessJSON
			json.Unmarshal(raw, &sp)
			if f := sp.Spillway; f == nil || f.Limited || f.Quota != cudaTotal || f.Used != report.Reserved || f.Cached != report.Cached ||
				sp.MatchedBy != "pci_bus_id" {
				t.Errorf("pid %s without a quota: %s; want limited false, quota_bytes %d, its report's %+v", pid, raw, uint64(cudaTotal), report)
			}
		case strconv.Itoa(plain.Process.Pid):
			_, matched := p["matched_by"]
			if string(p["spillway"]) != "null" || string(p["updated"]) != "null" || matched ||
				string(p["nvml_used_bytes"]) != strconv.FormatUint(plainHeld, 10) || string(p["command"]) != `"hold"` {
				t.Errorf("pid %s, not under Spillway: %s; want spillway and updated null, no matched_by, nvml_used_bytes %d",
					pid, raw, plainHeld)
			}
		default:
			t.Errorf("GPU 0 lists pid %s; want %d and %d", pid, h.pid, plain.Process.Pid)
		}
	}

	section := tableSection(table.Stdout, 0)
	for _, row := range []string{
		fmt.Sprintf(`%d\s+hold\s+none\s+%s\s+%s\s+%s\s+%d\s+%s`, h.pid, human(report.Reserved), human(report.Cached),
			human(report.Spilled), report.Refused, human(stats.Devices[0].DeviceBytes)),
		fmt.Sprintf(`%d\s+hold(\s+-){5}\s+%s`, plain.Process.Pid, human(plainHeld)),
	} {
		if !regexp.MustCompile(`(?m)^\s*` + row + `\s*$`).MatchString(section) {
			t.Errorf("GPU 0's table lacks a row %q:\n%s", row, table.Stdout)
		}
	}

	if got, ok := seriesOnGPU0(body, "spillway_process_quota_bytes", strconv.Itoa(h.pid)); !ok || got != cudaTotal {
		t.Errorf("spillway_process_quota_bytes of pid %d: %d (found %v), want %d", h.pid, got, ok, uint64(cudaTotal))
	}
	if got, ok := seriesOnGPU0(body, "spillway_process_nvml_used_bytes", strconv.Itoa(plain.Process.Pid)); !ok || got != plainHeld {
		t.Errorf("spillway_process_nvml_used_bytes of pid %d: %d (found %v), want %d", plain.Process.Pid, got, ok, plainHeld)
	}
	if _, ok := seriesOnGPU0(body, "spillway_process_quota_bytes", strconv.Itoa(plain.Process.Pid)); ok {
		t.Errorf("pid %d, not under Spillway, has a quota series:\n%s", plain.Process.Pid, body)
	}
}

// seriesOnGPU0 is the value of metric name on GPU 0 in a scrape's body:
// the process's series when pid is not empty, else the GPU's.
func seriesOnGPU0(body, name, pid string) (uint64, bool) {
	for _, line := range strings.Split(body, "\n") {
		labels, value, ok := strings.Cut(strings.TrimPrefix(line, name+"{"), "} ")
		if !ok || labels == line || !strings.HasPrefix(labels, `gpu="0",`) {
			continue
		}
		if strings.HasPrefix(name, "spillway_process_") && !strings.Contains(labels, `,pid="`+pid+`",`) {
			continue
		}
		v, err := strconv.ParseUint(value, 10, 64)
		return v, err == nil
	}
	return 0, false
}

func fetch(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v\n%s", url, resp.Status, err, body)
	}
	return string(body)
}

// A percentage quota: spillway stat (table and JSON) gives the quota the
// process is held to, 50% of the device's total as CUDA reports it, and so
// does NVML to a program started under the same setting (a monitoring tool
// beside the job), although NVML's own total is larger by the memory the
// driver reserves.
func TestStatPercentQuota(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	h := startHolder(t, e, bin, "50%", "0", "0", strconv.Itoa(8*mib))
	s := statAfter(t, e, h)
	table := runStat(t, e)
	const quota = 128 * mib // 50% of CUDA's 256 MiB
	if len(s.Devices) == 0 || len(s.Devices[0].Processes) != 1 || s.Devices[0].Processes[0].Spillway == nil {
		t.Fatalf("stat: %+v, want the holder on GPU 0", s.Devices)
	}
	if dev := s.Devices[0]; dev.TotalBytes != 256*mib+harness.NVMLReserved || dev.Processes[0].Spillway.Quota != quota {
		t.Errorf("stat: GPU total %d, quota %d; want NVML's %d and 50%% of CUDA's 256 MiB, %d",
			dev.TotalBytes, dev.Processes[0].Spillway.Quota, 256*mib+harness.NVMLReserved, quota)
	}
	row := regexp.MustCompile(fmt.Sprintf(`(?m)^\s*%d\s+hold\s+128MiB\s`, h.pid))
	if !row.MatchString(tableSection(table.Stdout, 0)) {
		t.Errorf("table: want a 128MiB quota for pid %d in:\n%s", h.pid, table.Stdout)
	}
	nvmlOnly := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/nvmltotal.c"}, ProjectHeaders: true,
		Flags: []string{"-L", harness.SimcudaDir(t), "-lnvidia-ml"}})
	cmd := harness.Shimmed(t, []string{"SPILLWAY_MEMORY_LIMIT=50%"}, nvmlOnly)
	e.apply(cmd)
	_, out := harness.RunOK(t, cmd)
	if total := out.Num(t, "t", 0, 1); total != quota {
		t.Errorf("NVML under SPILLWAY_MEMORY_LIMIT=50%%: total %d, want the quota spillway stat gives, %d", total, uint64(quota))
	}
	if report, _ := h.finish(t, 0); report.Quota != quota {
		t.Errorf("the holder's report: quota %d, want %d", report.Quota, uint64(quota))
	}
}
