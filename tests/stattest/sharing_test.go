package stattest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// processFigures is what spillway stat publishes for pid on GPU gpu.
func processFigures(t *testing.T, s statJSON, gpu, pid int) statProcessJSON {
	t.Helper()
	for _, p := range s.Devices[gpu].Processes {
		if p.PID == pid && p.Spillway != nil {
			return p
		}
	}
	t.Fatalf("GPU %d does not list pid %d with its figures: %+v", gpu, pid, s.Devices[gpu].Processes)
	return statProcessJSON{}
}

// Two processes share a 256 MiB device, each under its own quota (default
// virtual memory). a holds 192 MiB of its 200 MiB quota: its 16 MiB more is
// the quota's refusal. b holds 32 MiB of its 128 MiB quota, and its 64 MiB
// more finds the device full below its quota: CUDA's out-of-memory error, a
// line that says the device is full (not the quota), the refusal counted,
// and none of what b mapped trying kept from a.
func TestDeviceFullBelowQuota(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	a := startHolder(t, e, bin, "200MiB", "0", "0", strconv.Itoa(192*mib), "?"+strconv.Itoa(16*mib))
	b := startHolder(t, e, bin, "128MiB", "0", "0", strconv.Itoa(32*mib), "?"+strconv.Itoa(64*mib))
	s := statAfter(t, e, a, b)
	pa, pb := processFigures(t, s, 0, a.cmd.Process.Pid), processFigures(t, s, 0, b.cmd.Process.Pid)
	if sp := pa.Spillway; sp.Used != 192*mib || sp.Refused != 1 {
		t.Errorf("a published %+v: want 192MiB used and one refusal", sp)
	}
	if sp := pb.Spillway; sp.Used != 32*mib || sp.Cached != 0 || sp.Refused != 1 {
		t.Errorf("b published %+v: want 32MiB used, nothing cached, one refusal", sp)
	}
	if pb.NVMLUsed == nil || *pb.NVMLUsed != 32*mib {
		t.Errorf("NVML does not give b %d bytes: %+v", 32*mib, pb)
	}
	ra, _ := a.finish(t, 0)
	rb, stats := b.finish(t, 0)
	if ra.Refused != 1 || rb.Refused != 1 || rb.Reserved != 32*mib || stats.Devices[0].DeviceBytesPeak > 64*mib {
		t.Errorf("a's report %+v, b's %+v, b's simcuda peak %d", ra, rb, stats.Devices[0].DeviceBytesPeak)
	}
	quotaLine := "cudaMalloc of 16MiB refused on device 0: 192MiB in use of a quota of 200MiB"
	if !strings.Contains(a.stderr.String(), quotaLine) || !strings.Contains(a.stderr.String(), "hold: cudaMalloc of 16777216 refused: 2") {
		t.Errorf("a's stderr lacks the quota's refusal %q:\n%s", quotaLine, a.stderr.String())
	}
	deviceLine := "cudaMalloc of 64MiB refused on device 0: the device is out of memory (32MiB free on it) though the quota is not (32MiB in use of 128MiB)"
	if !strings.Contains(b.stderr.String(), deviceLine) || !strings.Contains(b.stderr.String(), "hold: cudaMalloc of 67108864 refused: 2") {
		t.Errorf("b's stderr lacks the device's refusal %q:\n%s", deviceLine, b.stderr.String())
	}
}

// With oversubscription, what the full device cannot give below the quota
// spills, granule by granule: b's 64 MiB takes the 32 MiB the device has
// left and 32 MiB of host memory, and the device never holds more than it
// has.
func TestDeviceFullBelowQuotaSpills(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	a := startHolder(t, e, bin, "200MiB", "0", "0", strconv.Itoa(192*mib))
	b := startHolderEnv(t, e, bin, []string{"SPILLWAY_MEMORY_LIMIT=128MiB", "SPILLWAY_OVERSUBSCRIBE=1"},
		"0", "0", strconv.Itoa(32*mib), strconv.Itoa(64*mib))
	s := statAfter(t, e, a, b)
	pb := processFigures(t, s, 0, b.cmd.Process.Pid)
	if sp := pb.Spillway; sp.Used != 64*mib || sp.Spilled != 32*mib || sp.Live != 96*mib || sp.Refused != 0 {
		t.Errorf("b published %+v: want 64MiB used, 32MiB spilled, 96MiB live, no refusal", sp)
	}
	a.finish(t, 0)
	rb, stats := b.finish(t, 0)
	if rb.Spilled != 32*mib || rb.Refused != 0 || stats.Devices[0].DeviceBytesPeak != 64*mib {
		t.Errorf("b's report %+v, simcuda peak %d: want 32MiB spilled and the device's 64MiB", rb, stats.Devices[0].DeviceBytesPeak)
	}
	// The totals, as its report gives them; the host limit, by default the quota.
	if sp := pb.Spillway; sp.SpilledTotal != rb.SpilledTotal || sp.PeakReserved != rb.PeakReserved || sp.HostLimit != 128*mib {
		t.Errorf("b published %+v; its report says %+v, and its host limit is its 128MiB quota", sp, rb)
	}
	if strings.Contains(b.stderr.String(), "refused on device") || strings.Contains(b.stderr.String(), "hold: cudaMalloc") {
		t.Errorf("b's stderr tells of a refusal:\n%s", b.stderr.String())
	}
}

// With oversubscription, a spill that cannot be made for what the full
// device cannot give below the quota is said to be the device's doing, with
// what is free on it, as the refusal without oversubscription is: not the
// quota's. The first spill passes its host limit; the second's host memory
// cannot be made.
func TestDeviceFullBelowQuotaSpillFails(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	a := startHolder(t, e, bin, "200MiB", "0", "0", strconv.Itoa(192*mib))
	deviceFull := "the device is out of memory (32MiB free on it) though the quota is not (32MiB in use of 128MiB) and "
	for _, c := range []struct {
		name, want string
		env        []string
	}{
		{"past the host limit", "cudaMalloc of 64MiB refused on device 0: " + deviceFull +
			"spilling it would pass the host limit (SPILLWAY_HOST_LIMIT=16MiB; 0B spilled)",
			[]string{"SPILLWAY_VMM=0", "SPILLWAY_HOST_LIMIT=16MiB"}},
		{"host memory failing", "cudaMalloc of 64MiB on device 0 failed: " + deviceFull + "spilling 67108864 bytes to managed memory",
			[]string{"SPILLWAY_VMM=0", "SIMCUDA_FAIL=cudaMallocManaged:1"}},
		// The granules mapped trying go back to the device, as without
		// oversubscription: they are neither in use nor held from a.
		{"past the host limit, virtual memory", "cudaMalloc of 64MiB refused on device 0: " + deviceFull +
			"spilling it would pass the host limit (SPILLWAY_HOST_LIMIT=16MiB; 0B spilled)",
			[]string{"SPILLWAY_HOST_LIMIT=16MiB"}},
	} {
		b := startHolderEnv(t, e, bin, append([]string{"SPILLWAY_MEMORY_LIMIT=128MiB", "SPILLWAY_OVERSUBSCRIBE=1"}, c.env...),
			"0", "0", strconv.Itoa(32*mib), "?"+strconv.Itoa(64*mib))
		rb, _ := b.finish(t, 0)
		if rb.Reserved != 32*mib || rb.Refused != 1 || rb.Spilled != 0 || rb.SpilledTotal != 0 {
			t.Errorf("%s: b's report %+v; want the 32MiB it holds reserved, nothing cached, one refusal and nothing spilled", c.name, rb)
		}
		if stderr := b.stderr.String(); !strings.Contains(stderr, c.want) || strings.Contains(stderr, "quota is full") ||
			!strings.Contains(stderr, "hold: cudaMalloc of 67108864 refused: 2") {
			t.Errorf("%s: stderr lacks %q:\n%s", c.name, c.want, stderr)
		}
	}
	a.finish(t, 0)
}

// startInPIDNamespace runs hold under the shim in a PID namespace of its
// own, where it is PID 1, as a container's main process is (it needs root,
// and unshare); h.pid is its PID here. With ownProc the namespace mounts a
// /proc of its own; without, hold sees this one, where /proc/1 is another
// process.
func startInPIDNamespace(t *testing.T, e env, bin string, ownProc bool, extra []string, args ...string) *holder {
	t.Helper()
	flags := []string{"--pid"}
	if ownProc {
		flags = append(flags, "--mount-proc")
	}
	return startUnshared(t, e, bin, flags, extra, args...)
}

// startUnshared runs hold under the shim in the namespaces unshare's flags
// make (it needs root, and unshare); h.pid is its PID here.
func startUnshared(t *testing.T, e env, bin string, flags, extra []string, args ...string) *holder {
	t.Helper()
	unshare, err := exec.LookPath("unshare")
	if err == nil && os.Geteuid() != 0 {
		err = errors.New("not running as root")
	}
	if err != nil {
		harness.Unavailable(t, "namespaces of its own (root and unshare)", err.Error())
	}
	flags = append([]string{"--fork", "--kill-child"}, flags...)
	h := startWrapped(t, e, extra, unshare, append(append(flags, bin), args...)...)
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", h.cmd.Process.Pid, h.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if h.pid, err = strconv.Atoi(strings.TrimSpace(string(children))); err != nil {
		t.Fatalf("unshare's children: %q", children)
	}
	return h
}

// Two jobs in containers of their own (PID namespaces, each job PID 1
// there) share the device and the figures' folder: each has a file of its
// own, and spillway stat, outside them, lists each under the PID it sees
// with its own figures. One killed leaves its file, ignored, which the
// next process to publish from here removes.
func TestStatPIDNamespaces(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	a := startInPIDNamespace(t, e, bin, true, []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, "0", "0", strconv.Itoa(8*mib))
	b := startInPIDNamespace(t, e, bin, true, []string{"SPILLWAY_MEMORY_LIMIT=32MiB"}, "0", "0", strconv.Itoa(4*mib))
	files, _ := filepath.Glob(filepath.Join(e.runtime, "1-*.stat"))
	if len(files) != 2 {
		t.Fatalf("files of the two PID 1s: %v, want two", files)
	}
	s := statAfter(t, e, a, b)
	for _, c := range []struct {
		h           *holder
		quota, used uint64
	}{{a, 64 * mib, 8 * mib}, {b, 32 * mib, 4 * mib}} {
		p := processFigures(t, s, 0, c.h.pid)
		if sp := p.Spillway; sp.Quota != c.quota || sp.Used != c.used || p.Command != "hold" {
			t.Errorf("pid %d: %s published %+v; want a quota of %d and %d used", c.h.pid, p.Command, sp, c.quota, c.used)
		}
	}
	table := runStat(t, e)
	for _, h := range []*holder{a, b} {
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^\s*%d\s+hold\s`, h.pid)).MatchString(table.Stdout) {
			t.Errorf("table lacks pid %d:\n%s", h.pid, table.Stdout)
		}
	}

	syscall.Kill(b.pid, syscall.SIGKILL)
	b.cmd.Wait()
	if res := runStat(t, e, "--json"); strings.Contains(res.Stdout, fmt.Sprintf(`"pid":%d,`, b.pid)) {
		t.Errorf("the killed process is listed: %s", res.Stdout)
	}
	c := startHolder(t, e, bin, "16MiB", "0", "0", strconv.Itoa(mib))
	// What is left: a's file (one of the two PID 1s') and c's.
	left, _ := filepath.Glob(filepath.Join(e.runtime, "*.stat"))
	if len(left) != 2 || slices.Contains(files, left[0]) == slices.Contains(files, left[1]) {
		t.Errorf("files after c started: %v; want a's (one of %v) and c's", left, files)
	}
	a.finish(t, 0)
	c.finish(t, 0)
	if left, _ := filepath.Glob(filepath.Join(e.runtime, "*.stat")); len(left) != 0 {
		t.Errorf("files left after exit: %v", left)
	}
}

// A job in a PID namespace without a /proc of its own (unshare --pid
// without --mount-proc) sees this /proc, where its PID there, 1, is another
// process: its file still names its own namespace and start time, so
// spillway stat lists it under the PID it has here, with its figures.
func TestStatPIDNamespaceWithoutItsOwnProc(t *testing.T) {
	bin := compileHold(t)
	e := newEnv(t)
	h := startInPIDNamespace(t, e, bin, false, []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, "0", "0", strconv.Itoa(8*mib))
	var ns syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/pid", h.pid), &ns); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(e.runtime, fmt.Sprintf("1-%d.stat", ns.Ino))
	if files, _ := filepath.Glob(filepath.Join(e.runtime, "*.stat")); len(files) != 1 || files[0] != want {
		t.Fatalf("figures files %v; want %s alone; hold's stderr:\n%s", files, want, h.stderr.String())
	}
	s := statAfter(t, e, h)
	p := processFigures(t, s, 0, h.pid)
	if sp := p.Spillway; sp.Quota != 64*mib || sp.Used != 8*mib || p.Command != "hold" {
		t.Errorf("pid %d: %s published %+v; want hold with a quota of 64MiB and 8MiB used", h.pid, p.Command, sp)
	}
	h.finish(t, 0)
}

// A job in another time namespace, whose boot time is a day later, reads
// its start time through that offset, so /proc here shows another: its
// file's lock says it lives, and spillway stat lists it. In this PID
// namespace it is under its PID here; in a PID namespace of its own, which
// /proc here cannot match, under its PID there, 1, said so.
func TestStatTimeNamespace(t *testing.T) {
	if _, err := os.Stat("/proc/self/ns/time"); err != nil {
		harness.Unavailable(t, "time namespaces", err.Error())
	}
	bin := compileHold(t)
	e := newEnv(t)
	later := []string{"--time", "--boottime", "86400"}
	a := startUnshared(t, e, bin, later, []string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, "0", "0", strconv.Itoa(8*mib))
	b := startUnshared(t, e, bin, append(later, "--pid", "--mount-proc"), []string{"SPILLWAY_MEMORY_LIMIT=32MiB"},
		"0", "0", strconv.Itoa(4*mib))
	var ns syscall.Stat_t // b's PID namespace, which the JSON names beside its PID there
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/pid", b.pid), &ns); err != nil {
		t.Fatal(err)
	}
	b.pid = 1 // as it sees itself: this /proc cannot map it
	s := statAfter(t, e, a, b)
	for _, c := range []struct {
		h           *holder
		quota, used uint64
		own         bool
	}{{a, 64 * mib, 8 * mib, false}, {b, 32 * mib, 4 * mib, true}} {
		p := processFigures(t, s, 0, c.h.pid)
		if sp := p.Spillway; sp.Quota != c.quota || sp.Used != c.used || p.Command != "hold" || p.PIDInItsNamespace != c.own {
			t.Errorf("pid %d: %s published %+v, pid_in_its_namespace %v; want a quota of %d, %d used, pid_in_its_namespace %v",
				c.h.pid, p.Command, sp, p.PIDInItsNamespace, c.quota, c.used, c.own)
		}
		if named := p.PIDNamespace != nil; named != c.own || named && *p.PIDNamespace != ns.Ino {
			t.Errorf("pid %d: pid_namespace %v; want it only in its own namespace, %d", c.h.pid, p.PIDNamespace, ns.Ino)
		}
	}
	table := runStat(t, e)
	if note := "PID 1 (hold) is its PID in another PID namespace"; !strings.Contains(tableSection(table.Stdout, 0), note) {
		t.Errorf("GPU 0's table lacks %q:\n%s", note, table.Stdout)
	}
	body := scrapeOnce(t, e)
	series := fmt.Sprintf(`(?m)^spillway_process_quota_bytes\{gpu="0",[^}]*,pid="1",pid_namespace="%d",command="hold"\} %d$`, ns.Ino, 32*mib)
	if !regexp.MustCompile(series).MatchString(body) {
		t.Errorf("metrics lack b's quota series %s:\n%s", series, body)
	}
	a.finish(t, 0)
	b.finish(t, 0)
}
