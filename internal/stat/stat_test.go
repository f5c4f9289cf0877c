package stat

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestPublishRead(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	w, err := Create(dir, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(w.Path())
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("file mode %v, %v; want 0600", st.Mode(), err)
	}
	if d, _ := os.Stat(dir); d.Mode().Perm() != 0o700 {
		t.Errorf("new directory mode %v, want 0700", d.Mode().Perm())
	}
	devs := []Device{
		{Ordinal: 0, Limited: true, Quota: 8 << 20, Used: 6 << 20, Reserved: 4 << 20, Cached: 1 << 20, Live: 5 << 20,
			Spilled: 2 << 20, SpilledTotal: 3 << 20, Promoted: 512, PromotedTotal: 1024, Refused: 7, BackingErrors: 2,
			PeakReserved: 4 << 20, HostLimit: 8 << 20, PCI: &PCILocation{Domain: 0x10002, Bus: 0xc1, Device: 0x1f},
			HostOutside: 2 << 20},
		{Ordinal: 3, Quota: 1 << 30, Used: 12},
	}
	now := time.Unix(1700000000, 5)
	if n := w.Publish(devs, now); n != 2 {
		t.Fatalf("published %d devices", n)
	}
	procs, errs := new(Reader).ReadDirs(dir)
	if len(errs) > 0 || len(procs) != 1 {
		t.Fatalf("ReadDir: %v, %v", procs, errs)
	}
	p := procs[0]
	if p.PID != os.Getpid() || p.Command == "" || !p.Updated.Equal(now) || !reflect.DeepEqual(p.Devices, devs) {
		t.Errorf("read back %+v, want pid %d and %+v", p, os.Getpid(), devs)
	}
	// A later refresh replaces the figures, fewer devices included.
	w.Publish(devs[1:], now)
	if p, err := Read(w.Path()); err != nil || !reflect.DeepEqual(p.Devices, devs[1:]) {
		t.Errorf("after refresh: %+v, %v", p, err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(w.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("file left after Close: %v", err)
	}
}

// The PCI location reads as NVML writes busId, and null when unknown.
func TestPCILocationJSON(t *testing.T) {
	data, err := json.Marshal([]Device{{PCI: &PCILocation{Domain: 0x10002, Bus: 0xc1, Device: 0x1f}}, {}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"pci_bus_id":"00010002:c1:1f.0"`, `"pci_bus_id":null`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("%s lacks %s", data, want)
		}
	}
}

func TestTooManyDevices(t *testing.T) {
	w, err := Create(t.TempDir(), os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	devs := make([]Device, MaxDevices+3)
	if n := w.Publish(devs, time.Now()); n != MaxDevices {
		t.Errorf("published %d of %d devices, want %d", n, len(devs), MaxDevices)
	}
}

// A file left by a process that has exited (SIGKILL), its lock released,
// is ignored, and so is one whose PID now belongs to another process.
func TestStaleIgnored(t *testing.T) {
	dir := t.TempDir()
	child, w := childWriter(t, dir)
	w.Publish([]Device{{Quota: 1}}, time.Now())
	if procs, errs := new(Reader).ReadDirs(dir); len(procs) != 1 || len(errs) > 0 {
		t.Fatalf("live child: %v, %v", procs, errs)
	}
	child.Process.Kill()
	unix.Flock(w.fd, unix.LOCK_UN) // its writer's lock goes with it
	var info unix.Siginfo          // wait until it is a zombie, without reaping it
	if err := unix.Waitid(unix.P_PID, child.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	if procs, errs := new(Reader).ReadDirs(dir); len(procs) != 0 || len(errs) > 0 {
		t.Errorf("zombie child listed: %v, %v", procs, errs)
	}
	child.Wait()
	if _, err := Read(w.Path()); !errors.Is(err, ErrStale) {
		t.Errorf("reaped child: %v, want ErrStale", err)
	}

	// Our own PID with another start time: a reused PID.
	mine, err := Create(t.TempDir(), os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	unix.Flock(mine.fd, unix.LOCK_UN) // the file a killed writer left
	mine.mem[offStart]++
	if _, err := Read(mine.Path()); !errors.Is(err, ErrStale) {
		t.Errorf("reused PID: %v, want ErrStale", err)
	}
}

func TestReadRejectsOtherFiles(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, strconv.Itoa(os.Getpid())+".stat")
	if err := os.WriteFile(bad, make([]byte, fileSize), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errs := new(Reader).ReadDirs(dir); len(errs) != 1 {
		t.Errorf("zeroed file: errors %v, want one", errs)
	}
	os.WriteFile(bad, []byte("short"), 0o600)
	if _, err := Read(bad); err == nil {
		t.Error("short file accepted")
	}
	// Version 1 had 16 words a device: a smaller file, named for what it is.
	old := make([]byte, headerSize+MaxDevices*16*8)
	copy(old, magic)
	binary.LittleEndian.PutUint32(old[offVersion:], 1)
	os.WriteFile(bad, old, 0o600)
	if _, err := Read(bad); err == nil || !strings.Contains(err.Error(), "a version 1 stat file") {
		t.Errorf("version 1 file: %v, want it named", err)
	}
	full := make([]byte, fileSize)
	copy(full, old)
	os.WriteFile(bad, full, 0o600)
	if _, err := Read(bad); err == nil || !strings.Contains(err.Error(), "a version 1 stat file") {
		t.Errorf("version 1 file of this version's size: %v, want it named", err)
	}
	// One left by a process that has exited is stale, whatever its version.
	for _, name := range []string{"4194305.stat", "4194305-4026531836.stat"} { // above Linux's largest PID
		dead := filepath.Join(dir, name)
		os.WriteFile(dead, old, 0o600)
		if _, err := Read(dead); !errors.Is(err, ErrStale) {
			t.Errorf("version 1 file %s of an exited process: %v, want ErrStale", name, err)
		}
	}
	if procs, errs := new(Reader).ReadDirs(filepath.Join(dir, "absent")); procs != nil || errs != nil {
		t.Errorf("missing directory: %v, %v", procs, errs)
	}
}

func TestDefaultDir(t *testing.T) {
	if d, err := DefaultDir(0, "/run/user/1000"); d != "/run/spillway" || err != nil {
		t.Errorf("root: %q, %v", d, err)
	}
	if d, err := DefaultDir(1000, "/run/user/1000"); d != "/run/user/1000/spillway" || err != nil {
		t.Errorf("user: %q, %v", d, err)
	}
	if _, err := DefaultDir(1000, ""); !errors.Is(err, ErrNoRuntimeDir) {
		t.Errorf("no XDG_RUNTIME_DIR: %v, want ErrNoRuntimeDir", err)
	}
	// A relative path is ignored, as the XDG specification asks: it names
	// another folder in every working directory.
	if d, err := DefaultDir(1000, "run/user/1000"); !errors.Is(err, ErrNoRuntimeDir) || !strings.Contains(fmt.Sprint(err), `XDG_RUNTIME_DIR="run/user/1000" is not an absolute path`) {
		t.Errorf("relative XDG_RUNTIME_DIR: %q, %v; want ErrNoRuntimeDir naming the value", d, err)
	}
}

// The cost of one refresh of a file describing 8 devices, which the core
// pays every statRefresh on a goroutine of its own.
func BenchmarkPublish(b *testing.B) {
	w, err := Create(b.TempDir(), os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	devs := make([]Device, 8)
	now := time.Now()
	for b.Loop() {
		w.Publish(devs, now)
	}
}

// A process publishing its file removes the files of killed writers, and
// only those: a live writer holds its file's lock whether or not its
// process can be found from here (another PID, user or time namespace, a
// /proc that hides it, a start time read through another boot-time
// offset), and a file without a namespace (an older version's, which takes
// no lock) is left for readers to judge.
func TestCreateRemovesOnlyKilledWritersFiles(t *testing.T) {
	dir := t.TempDir()
	live, err := Create(dir, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	live.mem[offStart]++ // its start time as read through another boot-time offset
	layout, err := os.ReadFile(live.Path())
	if err != nil {
		t.Fatal(err)
	}
	killed := filepath.Join(dir, "4194305-1.stat") // above Linux's largest PID; no writer holds it
	binary.LittleEndian.PutUint64(layout[offPID:], 4194305)
	os.WriteFile(killed, layout, 0o600)
	older := filepath.Join(dir, "4194306.stat") // an older version's, of a process in another namespace
	binary.LittleEndian.PutUint64(layout[offPID:], 4194306)
	binary.LittleEndian.PutUint64(layout[offPIDNS:], 0)
	os.WriteFile(older, layout, 0o600)

	_, w := childWriter(t, dir)
	defer w.Close()
	for path, want := range map[string]bool{live.Path(): true, older: true, killed: false, w.Path(): true} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", filepath.Base(path), err == nil, want)
		}
	}
}

// A FIFO (or anything else not a regular file) named like a figures file,
// in a folder others can write, neither blocks a process that publishes
// nor a reader: the reader names it.
func TestNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "1-2.stat")
	if err := unix.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	w, err := Create(dir, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	procs, errs := new(Reader).ReadDirs(dir)
	if len(procs) != 1 || len(errs) != 1 || !strings.Contains(errs[0].Error(), fifo) {
		t.Errorf("ReadDir beside a FIFO: %v, %v; want this process and an error naming %s", procs, errs, fifo)
	}
}

// A writer killed in the middle of a refresh leaves its sequence odd for
// good: its file is stale, skipped at once like any other a killed process
// left, never reported as "still being written" after a wait.
func TestKilledMidRefreshIsStale(t *testing.T) {
	dir := t.TempDir()
	child, w := childWriter(t, dir)
	w.Publish([]Device{{Quota: 1}}, time.Now())
	atomic.AddUint64(w.word(offSeq), 1) // a refresh begun, never ended
	child.Process.Kill()
	child.Wait()
	unix.Flock(w.fd, unix.LOCK_UN) // its writer's lock goes with it
	// Waited on, it would be reported as still being written.
	if procs, errs := new(Reader).ReadDirs(dir); len(procs) != 0 || len(errs) != 0 {
		t.Errorf("a file left in the middle of a refresh: %v, %v; want it skipped as stale", procs, errs)
	}
}

// childWriter starts a process that sleeps and creates in dir a figures
// file in its name, as if it wrote one; the process is killed when the
// test ends, if the test has not.
func childWriter(t *testing.T, dir string) (*exec.Cmd, *Writer) {
	t.Helper()
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
	})
	w, err := Create(dir, child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return child, w
}

// A process killed while it made its file leaves the temporary it lays the
// file out under (PID-NS.stat.new), which no exit removes: the next process
// that publishes there removes it when its writer is surely gone (its lock
// is free and its header written, which its writer does only under that
// lock; or, still empty, its PID of this namespace has no /proc entry),
// and keeps one a live writer may still be making. Readers neither list
// nor report temporaries.
func TestCreateRemovesKilledWritersTemporaries(t *testing.T) {
	dir := t.TempDir()
	live, err := Create(dir, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	layout, err := os.ReadFile(live.Path())
	if err != nil {
		t.Fatal(err)
	}
	own, err := pidNamespace("/proc/self")
	if err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
	temporary := func(pid int, ns uint64) string {
		return filepath.Join(dir, fmt.Sprintf("%d-%d.stat.new", pid, ns))
	}
	// PIDs above Linux's largest are gone in this namespace.
	laidOut := temporary(4194305, 1)               // killed before its rename
	empty := temporary(4194306, own)               // killed before it wrote its header
	locking := temporary(sleeper.Process.Pid, own) // a live writer about to take its lock
	elsewhere := temporary(4194307, 1)             // empty, of a namespace whose PIDs /proc cannot tell
	renaming := temporary(4194308, 1)              // a live writer about to rename its file
	for path, contents := range map[string][]byte{laidOut: layout, empty: nil, locking: nil, elsewhere: nil, renaming: layout} {
		if err := os.WriteFile(path, contents, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	holdLock(t, renaming)

	if procs, errs := new(Reader).ReadDirs(dir); len(procs) != 1 || len(errs) != 0 {
		t.Errorf("beside temporaries: %v, %v; want this process alone, no error", procs, errs)
	}
	_, w := childWriter(t, dir)
	defer w.Close()
	for path, want := range map[string]bool{laidOut: false, empty: false, locking: true, elsewhere: true, renaming: true, w.Path(): true} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", filepath.Base(path), err == nil, want)
		}
	}
}
