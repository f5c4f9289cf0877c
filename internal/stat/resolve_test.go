package stat

import (
	"encoding/binary"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeProc is a /proc of processes made up by a test: each has a stat (its
// start time), a status (its PIDs, NSpid) and an ns/pid, a link to a file
// standing for its PID namespace, which the file's inode names. self is
// the reader, in the namespace "".
type fakeProc struct {
	tb   testing.TB
	root string
}

func newFakeProc(tb testing.TB) fakeProc {
	p := fakeProc{tb: tb, root: tb.TempDir()}
	p.add("self", 1, "", 0)
	return p
}

// namespace is the inode of namespace name, made at the first need.
func (p fakeProc) namespace(name string) (path string, ino uint64) {
	path = filepath.Join(p.root, "namespace-"+name)
	if _, err := os.Stat(path); err != nil {
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			p.tb.Fatal(err)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		p.tb.Fatal(err)
	}
	return path, st.Ino
}

// add makes (or replaces) process here, started at start, in namespace ns
// ("": the reader's), where its PID is there.
func (p fakeProc) add(here string, start uint64, ns string, there int) {
	dir := filepath.Join(p.root, here)
	os.RemoveAll(dir)
	if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o700); err != nil {
		p.tb.Fatal(err)
	}
	nsFile, _ := p.namespace(ns)
	nspid := here
	if ns != "" {
		nspid = fmt.Sprintf("%s\t%d", here, there)
	}
	for name, text := range map[string]string{
		"stat":   fmt.Sprintf("%s (job) S%s %d 0 0\n", here, strings.Repeat(" 0", 18), start),
		"status": fmt.Sprintf("Name:\tjob\nState:\tS (sleeping)\nNSpid:\t%s\n", nspid),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			p.tb.Fatal(err)
		}
	}
	if err := os.Link(nsFile, filepath.Join(dir, "ns", "pid")); err != nil {
		p.tb.Fatal(err)
	}
}

// writeFigures writes the figures file of the process with PID pid in
// namespace ns that started at start, as its writer would.
func writeFigures(tb testing.TB, dir string, ns uint64, pid int, start uint64) {
	tb.Helper()
	buf := make([]byte, fileSize)
	le := binary.LittleEndian
	copy(buf, magic)
	le.PutUint32(buf[offVersion:], version)
	le.PutUint32(buf[offSlots:], MaxDevices)
	le.PutUint64(buf[offPID:], uint64(pid))
	le.PutUint64(buf[offStart:], start)
	le.PutUint64(buf[offPIDNS:], ns)
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d-%d.stat", pid, ns)), buf, 0o600); err != nil {
		tb.Fatal(err)
	}
}

// A reader keeps what its scan of /proc learned of a process of another
// namespace from one refresh to the next, checking it by the process's
// start time alone: no scan sees the status files again until a file
// names a process not met before.
func TestReaderKeepsWhatItsScanLearned(t *testing.T) {
	proc := newFakeProc(t)
	_, own := proc.namespace("")
	_, container := proc.namespace("container")
	proc.add("100", 50, "", 0)
	proc.add("101", 500, "container", 1)
	dir := t.TempDir()
	writeFigures(t, dir, own, 100, 50)
	writeFigures(t, dir, container, 1, 500)
	r := Reader{pids: pidResolver{proc: proc.root}}
	refresh := func(when string, want ...int) {
		t.Helper()
		procs, errs := r.ReadDirs(dir)
		var pids []int
		for _, p := range procs {
			pids = append(pids, p.PID)
		}
		slices.Sort(pids)
		if len(errs) > 0 || !slices.Equal(pids, want) {
			t.Errorf("%s: PIDs %v, errors %v; want %v", when, pids, errs, want)
		}
	}
	refresh("first refresh", 100, 101)

	for _, pid := range []string{"100", "101"} {
		os.Remove(filepath.Join(proc.root, pid, "status")) // a scan now finds no process of another namespace
	}
	refresh("with no status left to scan", 100, 101)

	proc.add("101", 700, "", 0) // it exited and a later process took its PID here
	refresh("its PID here taken", 100)

	proc.add("102", 800, "container", 2) // a new job in the container: a file not met before
	writeFigures(t, dir, container, 2, 800)
	refresh("a new job", 100, 102)
}

// The cost of one refresh of spillway stat --watch over seven jobs in
// containers of their own (each PID 1 there), a file a killed one left, and
// a process of the host, among n processes: kept, the reader learned the
// jobs' PIDs here at the first refresh; fresh, each refresh scans /proc
// again (a namespace and a status read per process).
func BenchmarkReadDirsOtherNamespaces(b *testing.B) {
	for _, n := range []int{256, 4096} {
		proc := newFakeProc(b)
		dir := b.TempDir()
		for here := 1000; here < 1000+n; here++ {
			proc.add(fmt.Sprint(here), uint64(here), "", 0)
		}
		for job := range 7 {
			name := fmt.Sprint("job", job)
			proc.add(fmt.Sprint(100+job), uint64(100+job), name, 1)
			_, ns := proc.namespace(name)
			writeFigures(b, dir, ns, 1, uint64(100+job))
		}
		_, killed := proc.namespace("killed")
		writeFigures(b, dir, killed, 1, 99)
		_, own := proc.namespace("")
		writeFigures(b, dir, own, 1000, 1000)

		for _, kept := range []bool{true, false} {
			name := fmt.Sprintf("processes=%d/fresh", n)
			if kept {
				name = fmt.Sprintf("processes=%d/kept", n)
			}
			b.Run(name, func(b *testing.B) {
				r := &Reader{pids: pidResolver{proc: proc.root}}
				if kept {
					r.ReadDirs(dir) // the first refresh scans: the steady state is what follows
				}
				for b.Loop() {
					if !kept {
						r = &Reader{pids: pidResolver{proc: proc.root}}
					}
					if procs, errs := r.ReadDirs(dir); len(procs) != 8 || len(errs) > 0 {
						b.Fatalf("%d processes, errors %v; want 8", len(procs), errs)
					}
				}
			})
		}
	}
}

// holdLock takes the lock of the figures file at path on an open file
// description of its own, as its writer does, until the test ends or
// release is called.
func holdLock(tb testing.TB, path string) (release func()) {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	return func() { f.Close() }
}

// A file whose lock is held belongs to a live writer even when /proc
// cannot show its process (another user's /proc/PID/ns, a start time read
// through another time namespace's offset): it is listed, under the PID it
// records, marked as its own namespace's when that is not the reader's. A
// locked file of this namespace whose PID has no /proc entry is stale (a
// child forked without exec keeps a killed parent's lock), an unlocked file
// /proc does not confirm is stale, and so is one of an older layout, which
// has no lock.
func TestReaderListsLockedFilesProcCannotShow(t *testing.T) {
	proc := newFakeProc(t)
	_, own := proc.namespace("")
	_, container := proc.namespace("container")
	proc.add("100", 70, "", 0) // its writer recorded 50: another time namespace
	dir := t.TempDir()
	path := func(ns uint64, pid int) string { return filepath.Join(dir, fmt.Sprintf("%d-%d.stat", pid, ns)) }
	releases := map[int]func(){}
	for _, f := range []struct {
		ns     uint64
		pid    int
		locked bool
	}{
		{own, 100, true},      // its start time read through another offset
		{own, 200, true},      // killed, its lock kept by a child it forked
		{container, 7, true},  // its namespace unreadable from here
		{own, 300, false},     // killed
		{container, 8, false}, // killed
		{0, 400, true},        // an older layout's, whose process is gone: a lock another program took says nothing
	} {
		writeFigures(t, dir, f.ns, f.pid, 50)
		if f.locked {
			releases[f.pid] = holdLock(t, path(f.ns, f.pid))
		}
	}

	r := Reader{pids: pidResolver{proc: proc.root}}
	listed := func() map[int]bool {
		t.Helper()
		procs, errs := r.ReadDirs(dir)
		if len(errs) > 0 {
			t.Errorf("errors %v", errs)
		}
		pids := map[int]bool{}
		for _, p := range procs {
			pids[p.PID] = p.PIDInItsNamespace
		}
		return pids
	}
	want := map[int]bool{100: false, 7: true}
	if got := listed(); !maps.Equal(got, want) {
		t.Errorf("listed (PID: in its namespace) %v; want %v", got, want)
	}
	if got := listed(); !maps.Equal(got, want) {
		t.Errorf("at the next refresh: %v; want %v", got, want)
	}
	releases[7]() // its writer killed
	delete(want, 7)
	if got := listed(); !maps.Equal(got, want) {
		t.Errorf("its lock released: %v; want %v", got, want)
	}
}

// timeNamespace puts process here in time namespace name ("": the
// reader's), as /proc/PID/ns/time shows it.
func (p fakeProc) timeNamespace(here, name string) {
	nsFile, _ := p.namespace("time-" + name)
	if err := os.Link(nsFile, filepath.Join(p.root, here, "ns", "time")); err != nil {
		p.tb.Fatal(err)
	}
}

// A killed writer's PID taken by an unrelated process of the reader's own
// time namespace, whose start time then reads as its writer's would, while
// a child the writer forked without exec keeps the file's lock: the file is
// stale, never shown as the new process's figures. The same start time
// mismatch in a process of another time namespace is its writer, read
// through another offset, and listed.
func TestReaderTellsReusedPIDFromTimeNamespace(t *testing.T) {
	proc := newFakeProc(t)
	_, own := proc.namespace("")
	proc.timeNamespace("self", "")
	proc.add("100", 70, "", 0) // its writer recorded 50: another time namespace
	proc.timeNamespace("100", "later")
	proc.add("200", 90, "", 0) // its writer, which recorded 50, was killed: another process
	proc.timeNamespace("200", "")
	dir := t.TempDir()
	for _, pid := range []int{100, 200} {
		writeFigures(t, dir, own, pid, 50)
		holdLock(t, filepath.Join(dir, fmt.Sprintf("%d-%d.stat", pid, own)))
	}
	r := Reader{pids: pidResolver{proc: proc.root}}
	procs, errs := r.ReadDirs(dir)
	var pids []int
	for _, p := range procs {
		pids = append(pids, p.PID)
	}
	if len(errs) > 0 || !slices.Equal(pids, []int{100}) {
		t.Errorf("listed %v, errors %v; want 100 alone, the process of another time namespace", pids, errs)
	}
}

// runsAs makes process here run as uid (its real, effective, saved and
// file system user), as /proc/PID/status says.
func (p fakeProc) runsAs(here string, uid int) {
	path := filepath.Join(p.root, here, "status")
	status, err := os.ReadFile(path)
	if err != nil {
		p.tb.Fatal(err)
	}
	status = fmt.Appendf(status, "Uid:\t%d\t%d\t%d\t%d\n", uid, uid, uid, uid)
	if err := os.WriteFile(path, status, 0o600); err != nil {
		p.tb.Fatal(err)
	}
}

// A figures file owned by another user than the process it names is not
// that process's: a user who can write in a folder the reader trusts (as
// root, every /run/user/*/spillway; a folder shared by all) could plant
// one naming another user's job, its start time read from /proc, with
// figures of their choosing. It is named as an error, never listed; the
// file of a process of its owner is.
func TestReaderRefusesFileOfAnotherUser(t *testing.T) {
	proc := newFakeProc(t)
	_, own := proc.namespace("")
	owner := os.Geteuid()
	proc.add("100", 50, "", 0) // another user's job, named by a planted file
	proc.runsAs("100", owner+4242)
	proc.add("101", 50, "", 0) // the file owner's job
	proc.runsAs("101", owner)
	dir := t.TempDir()
	writeFigures(t, dir, own, 100, 50)
	writeFigures(t, dir, own, 101, 50)
	planted := filepath.Join(dir, fmt.Sprintf("100-%d.stat", own))
	if owner == 0 {
		// Root's files are trusted: the planter is another user.
		if err := os.Chown(planted, 4343, 4343); err != nil {
			t.Fatal(err)
		}
	}
	r := Reader{pids: pidResolver{proc: proc.root}}
	procs, errs := r.ReadDirs(dir)
	var pids []int
	for _, p := range procs {
		pids = append(pids, p.PID)
	}
	if !slices.Equal(pids, []int{101}) || len(errs) != 1 || !strings.Contains(errs[0].Error(), planted) {
		t.Errorf("listed %v, errors %v; want 101 alone and an error naming %s", pids, errs, planted)
	}
}

// A file of root's names its process whatever user that process runs as
// now: a job may start CUDA as root, make its file, then drop its user;
// one of another user's is refused.
func TestReaderTrustsFileOfRoot(t *testing.T) {
	proc := newFakeProc(t)
	_, own := proc.namespace("")
	proc.add("100", 50, "", 0)
	proc.runsAs("100", 4242)
	dir := t.TempDir()
	writeFigures(t, dir, own, 100, 50)
	path := filepath.Join(dir, fmt.Sprintf("100-%d.stat", own))
	buf, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pids := pidResolver{proc: proc.root}
	locked := func() bool { return true }
	if p, err := parse(path, buf, 0, &pids, locked); err != nil || p.PID != 100 {
		t.Errorf("root's file: %+v, %v; want process 100 listed", p, err)
	}
	if _, err := parse(path, buf, 4343, &pids, locked); err == nil || !strings.Contains(err.Error(), "owned by user 4343") {
		t.Errorf("another user's file: %v, want it refused", err)
	}
}
