// Package stat is the per-process figures file through which each shim core
// publishes its live per-device figures (quota, in use, pool reserved and
// cached, spilled, promoted, refusals, backing errors, and the device's PCI
// location, which names it whatever ordinal the process gave it) and
// `spillway stat` reads them.
//
// A file is a fixed layout, mapped shared by its writer and rewritten in
// place under a sequence lock: the writer's owner refreshes it from a ticker,
// so the allocation path never makes a system call for it. Files live in a
// runtime directory (/run/spillway as root, $XDG_RUNTIME_DIR/spillway
// otherwise, or SPILLWAY_RUNTIME_DIR), one per process, named PID-NS.stat
// (NS: the inode of its PID namespace, so that processes of containers
// sharing the directory never take each other's file), readable by their
// owner only, and removed at exit. A writer holds a lock on its file while
// it lives; the next process that creates its file there removes those
// nobody holds, and the temporaries (PID-NS.stat.new, skipped by readers)
// of writers killed while they laid their files out. A process of another PID namespace is found by its
// namespace and its PID there, and shown under the PID the reader sees
// (which NVML reports). A file whose process /proc does not show (no
// /proc/PID, or one with another start time: the PID was reused) is stale
// and ignored, unless its lock is held and its process, if of the reader's
// namespace, still has a /proc entry, of another time namespace than the
// reader's: then its writer lives where /proc cannot show it (another
// user's /proc/PID/ns, another time namespace), and it is shown under the
// PID it records, as its process sees it when that is another namespace's.
// (A child forked without exec keeps its parent's lock: a killed parent of
// this namespace is told by its missing /proc entry, or by a process of
// the reader's time namespace, whose start time reads as its writer's
// would, that took its PID.)
//
// A file owned by another user than the process /proc shows under its
// PID is an error, never that process's figures: in a folder others can
// write (as root, the reader trusts every user's), anyone could name
// another user's job, its start time being public. A file of root's is
// trusted (a job may drop its user after making its file).
//
// It must never make a system call from Publish, never block its writer on
// a reader, and never trust a file beyond its fixed layout: a reader checks
// the magic, the version, the size and the sequence before believing one.
package stat

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MaxDevices is how many devices one file describes.
const MaxDevices = 64

const (
	magic       = "SPLWSTAT"
	version     = 2 // 2: HostOutside
	headerSize  = 128
	deviceWords = 17
	deviceSize  = deviceWords * 8
	fileSize    = headerSize + MaxDevices*deviceSize

	// Header offsets.
	offVersion = 8
	offSlots   = 12
	offSeq     = 16
	offPID     = 24
	offStart   = 32
	offUpdated = 40
	offDevices = 48
	offComm    = 56
	commSize   = 16
	offPIDNS   = 72 // the inode of the writer's PID namespace; 0 in files of older versions
)

// Device is one device's figures, in bytes and counts.
type Device struct {
	Ordinal       int    `json:"ordinal"`
	Limited       bool   `json:"limited"` // a quota is configured; else Quota is the device's total
	Quota         uint64 `json:"quota_bytes"`
	Used          uint64 `json:"used_bytes"`     // held against the quota: pool reserved plus memory outside the pool
	Reserved      uint64 `json:"reserved_bytes"` // the pool's device memory, in use or cached
	Cached        uint64 `json:"cached_bytes"`   // reserved, not in use
	Live          uint64 `json:"live_bytes"`     // in use by the application, all tiers
	Spilled       uint64 `json:"spilled_bytes"`  // on the host now
	SpilledTotal  uint64 `json:"spilled_total_bytes"`
	Promoted      uint64 `json:"promoted_bytes"` // promoted back, live now
	PromotedTotal uint64 `json:"promoted_total_bytes"`
	Refused       uint64 `json:"refusals"`
	BackingErrors uint64 `json:"backing_errors"`
	PeakReserved  uint64 `json:"peak_reserved_bytes"`
	HostLimit     uint64 `json:"host_limit_bytes"` // 0 without oversubscription
	// HostOutside is the program's own physical memory (cuMemCreate) placed
	// on the host because the quota could not hold it: host memory beside
	// Spilled, under the same HostLimit.
	HostOutside uint64 `json:"host_outside_bytes"`
	// PCI is where the device sits, as CUDA told the process: what names
	// the same GPU in NVML whatever ordinal the process gave it
	// (CUDA_VISIBLE_DEVICES). Nil when the process could not learn it.
	PCI *PCILocation `json:"pci_bus_id"`
}

// PCILocation is a device's PCI domain, bus and device (slot) number.
type PCILocation struct {
	Domain uint32
	Bus    uint8
	Device uint8
}

// MarshalText writes the location as NVML's busId does: "00000000:18:00.0".
func (l PCILocation) MarshalText() ([]byte, error) {
	return []byte(fmt.Sprintf("%08x:%02x:%02x.0", l.Domain, l.Bus, l.Device)), nil
}

// pciKnown marks the word that holds a location.
const pciKnown = 1 << 63

func (l *PCILocation) word() uint64 {
	if l == nil {
		return 0
	}
	return pciKnown | uint64(l.Domain)<<16 | uint64(l.Bus)<<8 | uint64(l.Device)
}

func pciFrom(w uint64) *PCILocation {
	if w&pciKnown == 0 {
		return nil
	}
	return &PCILocation{Domain: uint32(w >> 16), Bus: uint8(w >> 8), Device: uint8(w)}
}

// words lays d out as the file stores it.
func (d *Device) words() [deviceWords]uint64 {
	var flags uint64
	if d.Limited {
		flags = 1
	}
	return [deviceWords]uint64{uint64(d.Ordinal), flags, d.Quota, d.Used, d.Reserved, d.Cached, d.Live,
		d.Spilled, d.SpilledTotal, d.Promoted, d.PromotedTotal, d.Refused, d.BackingErrors, d.PeakReserved, d.HostLimit,
		d.PCI.word(), d.HostOutside}
}

func deviceFrom(w [deviceWords]uint64) Device {
	return Device{Ordinal: int(w[0]), Limited: w[1]&1 != 0, Quota: w[2], Used: w[3], Reserved: w[4], Cached: w[5],
		Live: w[6], Spilled: w[7], SpilledTotal: w[8], Promoted: w[9], PromotedTotal: w[10], Refused: w[11],
		BackingErrors: w[12], PeakReserved: w[13], HostLimit: w[14], PCI: pciFrom(w[15]), HostOutside: w[16]}
}

// Process is one file's contents.
type Process struct {
	PID int `json:"pid"` // as the reader sees it, whatever namespace the writer is in, unless PIDInItsNamespace
	// PIDInItsNamespace says PID is as the process sees it in another PID
	// namespace, where the reader could not find it: it is alive (its file
	// is locked) but hidden from this /proc.
	PIDInItsNamespace bool `json:"pid_in_its_namespace"`
	// PIDNamespace names that namespace (its inode) when PIDInItsNamespace:
	// two such processes may have the same PID.
	PIDNamespace uint64    `json:"pid_namespace,omitempty"`
	Command      string    `json:"command"`
	Updated      time.Time `json:"updated"`
	Devices      []Device  `json:"devices"`
	start        uint64
}

// ErrNoRuntimeDir says a user other than root has no default runtime
// directory: XDG_RUNTIME_DIR is unset, or not an absolute path.
var ErrNoRuntimeDir = errors.New("no runtime directory")

// DefaultDir is the runtime directory for a process of effective user euid
// with the given $XDG_RUNTIME_DIR, or an error wrapping ErrNoRuntimeDir. A
// relative XDG_RUNTIME_DIR is ignored, as the XDG Base Directory
// specification asks: it would name another folder in every working
// directory, where spillway stat would not find the process.
func DefaultDir(euid int, xdgRuntimeDir string) (string, error) {
	if euid == 0 {
		return "/run/spillway", nil
	}
	if xdgRuntimeDir == "" {
		return "", fmt.Errorf("%w: XDG_RUNTIME_DIR is unset (set SPILLWAY_RUNTIME_DIR to a private folder)", ErrNoRuntimeDir)
	}
	if !filepath.IsAbs(xdgRuntimeDir) {
		return "", fmt.Errorf("%w: XDG_RUNTIME_DIR=%q is not an absolute path, so it is ignored (set SPILLWAY_RUNTIME_DIR to a private folder)", ErrNoRuntimeDir, xdgRuntimeDir)
	}
	return filepath.Join(xdgRuntimeDir, "spillway"), nil
}

// Writer is this process's file, mapped.
type Writer struct {
	path string
	mem  []byte
	fd   int // holds the file's lock, which says its writer lives
}

// Create makes dir (0700 when new) and the file of process pid in it, and
// removes the files there whose writers were killed (removeStale). pid is
// the caller's (os.Getpid()), or in tests a child's.
func Create(dir string, pid int) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("stat directory: %w", err)
	}
	// The caller reads its own identity from /proc/self: in a PID
	// namespace without a /proc of its own, /proc/PID (PID as it sees it)
	// is another process.
	proc := "/proc/" + strconv.Itoa(pid)
	if pid == os.Getpid() {
		proc = "/proc/self"
	}
	start, err := startTime(proc)
	if err != nil {
		return nil, err
	}
	ns, err := pidNamespace(proc)
	if err != nil {
		return nil, err
	}
	removeStale(dir)
	path := filepath.Join(dir, fmt.Sprintf("%d-%d.stat", pid, ns))
	comm, _ := os.ReadFile(proc + "/comm")
	// A process publishing here at the same moment may remove our
	// temporary, taken for the one a killed process of our PID left and
	// replaced between its checks: the rename then finds nothing, and a
	// second try makes the file again.
	for tries := 1; ; tries++ {
		w, err := layOut(path, pid, start, ns, bytes.TrimSpace(comm))
		if err == nil || !errors.Is(err, fs.ErrNotExist) || tries == 3 {
			return w, err
		}
	}
}

// temporarySuffix ends the name a file is laid out under, beside its own.
const temporarySuffix = ".new"

// layOut makes the file at path of the process with PID pid in namespace
// ns that started at start: it is locked and laid out under a name readers
// skip, then renamed into place, so that a file named .stat always has its
// header, and its lock for as long as its writer lives.
func layOut(path string, pid int, start, ns uint64, comm []byte) (*Writer, error) {
	building := path + temporarySuffix
	// One left under this name is a killed process's that had this PID:
	// removed, never reused, so that a file that has its header always
	// had its writer's lock before (removeStale relies on it).
	if err := os.Remove(building); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("stat file %s: %w", building, err)
	}
	fd, err := unix.Open(building, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("stat file %s: %w", building, err)
	}
	fail := func(err error) (*Writer, error) {
		unix.Close(fd)
		os.Remove(building)
		return nil, fmt.Errorf("stat file %s: %w", building, err)
	}
	if err := unix.Fchmod(fd, 0o600); err != nil { // the umask may have taken bits the mode had
		return fail(err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fail(fmt.Errorf("locking it: %w", err))
	}
	if err := unix.Ftruncate(fd, fileSize); err != nil {
		return fail(err)
	}
	mem, err := unix.Mmap(fd, 0, fileSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(err)
	}
	copy(mem, magic)
	binary.LittleEndian.PutUint32(mem[offVersion:], version)
	binary.LittleEndian.PutUint32(mem[offSlots:], MaxDevices)
	binary.LittleEndian.PutUint64(mem[offPID:], uint64(pid))
	binary.LittleEndian.PutUint64(mem[offStart:], start)
	binary.LittleEndian.PutUint64(mem[offPIDNS:], ns)
	copy(mem[offComm:offComm+commSize], comm)
	if err := os.Rename(building, path); err != nil {
		unix.Munmap(mem)
		return fail(err)
	}
	return &Writer{path: path, mem: mem, fd: fd}, nil
}

// Path is the file's path.
func (w *Writer) Path() string { return w.path }

func (w *Writer) word(off int) *uint64 { return (*uint64)(unsafe.Pointer(&w.mem[off])) }

// Publish replaces the figures with devs (at most MaxDevices; the rest are
// left out and reported by the return value). Only one goroutine may call it.
func (w *Writer) Publish(devs []Device, now time.Time) (published int) {
	n := min(len(devs), MaxDevices)
	seq := w.word(offSeq)
	atomic.AddUint64(seq, 1) // odd: being written
	atomic.StoreUint64(w.word(offUpdated), uint64(now.UnixNano()))
	atomic.StoreUint64(w.word(offDevices), uint64(n))
	for i := range n {
		for j, v := range devs[i].words() {
			atomic.StoreUint64(w.word(headerSize+i*deviceSize+j*8), v)
		}
	}
	atomic.AddUint64(seq, 1) // even: consistent
	return n
}

// Close unmaps and removes the file.
func (w *Writer) Close() error {
	err := unix.Munmap(w.mem)
	if rmErr := os.Remove(w.path); rmErr != nil && err == nil {
		err = rmErr
	}
	unix.Close(w.fd)
	return err
}

// ErrStale says a file belongs to a process that no longer runs.
var ErrStale = errors.New("stale: its process has exited")

// Read returns the figures in one file, or ErrStale.
func Read(path string) (Process, error) {
	return read(path, &pidResolver{})
}

func read(path string, pids *pidResolver) (Process, error) {
	f, err := openRegular(path)
	if err != nil {
		return Process{}, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return Process{}, fmt.Errorf("%s: %w", path, err)
	}
	buf := make([]byte, fileSize)
	var seq [8]byte
	for range 100 {
		n, err := f.ReadAt(buf, 0)
		if err != nil && n < fileSize {
			if err := otherVersion(path, buf[:n]); err != nil {
				return Process{}, err
			}
			return Process{}, fmt.Errorf("%s: %d bytes, want %d: not a stat file", path, n, fileSize)
		}
		if _, err := f.ReadAt(seq[:], offSeq); err != nil {
			return Process{}, fmt.Errorf("%s: %w", path, err)
		}
		s := binary.LittleEndian.Uint64(buf[offSeq:])
		if s%2 == 0 && s == binary.LittleEndian.Uint64(seq[:]) {
			return parse(path, buf, st.Uid, pids, func() bool { return lockHeld(f) })
		}
		if writerGone(buf, f) {
			return Process{}, ErrStale // killed in the middle of a refresh, which nobody will end
		}
		time.Sleep(time.Millisecond) // a refresh is under way
	}
	return Process{}, fmt.Errorf("%s: still being written after 100 tries", path)
}

// writerGone reports whether the writer of a file of this version, whose
// head is head, is gone: every such writer holds its file's lock while it
// lives (a file without a namespace, an older version's, takes none).
func writerGone(head []byte, f *os.File) bool {
	le := binary.LittleEndian
	return string(head[:len(magic)]) == magic && le.Uint32(head[offVersion:]) == version &&
		le.Uint64(head[offPIDNS:]) != 0 && !lockHeld(f)
}

// otherVersion returns an error naming the version of head, the start of a
// stat file written by another version of Spillway (whose layout may differ
// in size), or nil. A file whose process, named by the file's name, has
// exited is ErrStale whatever its version: a crash left it behind.
func otherVersion(path string, head []byte) error {
	if len(head) < offVersion+4 || string(head[:len(magic)]) != magic {
		return nil
	}
	if v := binary.LittleEndian.Uint32(head[offVersion:]); v != version {
		name, _, _ := strings.Cut(strings.TrimSuffix(filepath.Base(path), ".stat"), "-")
		if pid, err := strconv.Atoi(name); err == nil {
			if _, err := StartTime(pid); err != nil {
				return ErrStale
			}
		}
		return fmt.Errorf("%s: a version %d stat file, written by another version of Spillway; this one reads version %d", path, v, version)
	}
	return nil
}

// parse reads the contents of a file owned by owner; locked says whether
// its writer holds its lock, asked only when /proc does not show the
// process.
func parse(path string, buf []byte, owner uint32, pids *pidResolver, locked func() bool) (Process, error) {
	le := binary.LittleEndian
	if err := otherVersion(path, buf); err != nil {
		return Process{}, err
	}
	if string(buf[:len(magic)]) != magic || le.Uint32(buf[offSlots:]) != MaxDevices {
		return Process{}, fmt.Errorf("%s: not a version %d stat file", path, version)
	}
	p := Process{
		PID:     int(le.Uint64(buf[offPID:])),
		Command: string(bytes.TrimRight(buf[offComm:offComm+commSize], "\x00")),
		start:   le.Uint64(buf[offStart:]),
	}
	if u := le.Uint64(buf[offUpdated:]); u > 0 {
		p.Updated = time.Unix(0, int64(u))
	}
	ns := le.Uint64(buf[offPIDNS:])
	pid, ok := pids.resolve(ns, p.PID, p.start)
	switch {
	case ok:
		p.PID = pid
	case ns != 0 && !pids.goneHere(ns, p.PID) && !pids.takenHere(ns, p.PID) && locked(): // an older version's file, without a namespace, has no lock
		if p.PIDInItsNamespace = ns != pids.own; p.PIDInItsNamespace {
			p.PIDNamespace = ns
		}
	default:
		return Process{}, ErrStale
	}
	// A process's file is its user's: one of another user's, in a folder
	// others can write, names a job it does not describe. Root's is
	// trusted: root can write anything anyway, and a job that started
	// CUDA as root and then dropped its user keeps the file it made.
	if !p.PIDInItsNamespace && owner != 0 {
		if uids, ok := pids.users(p.PID); ok && !slices.Contains(uids, owner) {
			return Process{}, fmt.Errorf("%s: owned by user %d, but process %d runs as user %d: not its figures, not listed",
				path, owner, p.PID, uids[1])
		}
	}
	n := le.Uint64(buf[offDevices:])
	if n > MaxDevices {
		return Process{}, fmt.Errorf("%s: %d devices, at most %d", path, n, MaxDevices)
	}
	for i := range int(n) {
		var w [deviceWords]uint64
		for j := range w {
			w[j] = le.Uint64(buf[headerSize+i*deviceSize+j*8:])
		}
		p.Devices = append(p.Devices, deviceFrom(w))
	}
	return p, nil
}

// Reader reads the files of runtime directories, refresh after refresh. It
// keeps what it learned of the processes of other PID namespaces, so that
// a steady refresh reads each file and its process's stat, never all of
// /proc again. Its zero value is ready; one goroutine at a time may use it.
type Reader struct {
	pids pidResolver
}

// ReadDirs returns the live processes published in dirs, dir by dir, in
// one refresh; stale files are skipped, unreadable ones (another user's)
// are returned as errors beside the rest. A missing dir publishes nothing.
func (r *Reader) ReadDirs(dirs ...string) ([]Process, []error) {
	defer r.pids.refreshed()
	var procs []Process
	var errs []error
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".stat") {
				continue
			}
			p, err := read(filepath.Join(dir, e.Name()), &r.pids)
			switch {
			case errors.Is(err, ErrStale):
			case err != nil:
				errs = append(errs, err)
			default:
				procs = append(procs, p)
			}
		}
	}
	return procs, errs
}

// StartTime returns the start time of process pid in clock ticks after
// boot (field 22 of /proc/PID/stat), which tells a process from a later
// one with the same PID; ErrStale when it has exited but is not yet reaped.
func StartTime(pid int) (uint64, error) {
	return startTime("/proc/" + strconv.Itoa(pid))
}

// startTime is StartTime of the process /proc describes at proc
// (/proc/PID, /proc/self).
func startTime(proc string) (uint64, error) {
	path := proc + "/stat"
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// The command (field 2) is in parentheses and may hold anything.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command field", path)
	}
	fields := strings.Fields(string(data[i+1:]))
	const startField = 22 - 3 // fields after the command start at field 3
	if len(fields) <= startField {
		return 0, fmt.Errorf("%s: %d fields", path, len(fields)+2)
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, fmt.Errorf("%s: %w", proc, ErrStale) // exited, not yet reaped
	}
	start, err := strconv.ParseUint(fields[startField], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: start time: %w", path, err)
	}
	return start, nil
}

// pidNamespace is the inode of the PID namespace of the process /proc
// describes at proc, which names the namespace while it lives.
func pidNamespace(proc string) (uint64, error) {
	ino, err := nsInode(proc + "/ns/pid")
	if err != nil {
		return 0, fmt.Errorf("PID namespace of %s: %w", proc, err)
	}
	return ino, nil
}

// pidResolver finds, under the PID this process sees, a process named by
// its PID namespace and its PID there. A process of another namespace is
// looked up in a scan of /proc, made at most once a refresh and only for a
// file not met before; what it found is kept while the file is read at
// each refresh, and checked by the process's start time alone.
type pidResolver struct {
	proc    string // where /proc is mounted; "" is /proc
	own     uint64 // this process's PID namespace; 0 until known
	ownTime uint64 // this process's time namespace; 0 until known, or without time namespaces
	known   map[foreignKey]foreignPID
	met     map[foreignKey]foreignPID // in this refresh: known in the next
	scanned map[foreignKey]int        // this refresh's scan of /proc; nil until made
}

// foreignKey is a process of another namespace: the namespace and its PID there.
type foreignKey struct {
	ns  uint64
	pid int
}

// foreignPID is what was learned of the process that started at start: its
// PID here, or 0 when it is gone or cannot be seen from here (for good: a
// process that started then is never seen again).
type foreignPID struct {
	here  int
	start uint64
}

func (r *pidResolver) procDir(pid string) string {
	if r.proc == "" {
		return "/proc/" + pid
	}
	return r.proc + "/" + pid
}

// refreshed ends a refresh: what it met is what the next one knows.
func (r *pidResolver) refreshed() {
	r.known, r.met, r.scanned = r.met, nil, nil
}

// resolve returns the PID here of the process with PID pid in namespace ns
// (0: a file of an older version, whose PID is taken as this namespace's)
// that started at start, or false when it is gone or cannot be seen from
// this namespace.
func (r *pidResolver) resolve(ns uint64, pid int, start uint64) (int, bool) {
	if r.own == 0 {
		r.own, _ = pidNamespace(r.procDir("self"))
	}
	if ns == 0 || ns == r.own {
		s, err := startTime(r.procDir(strconv.Itoa(pid)))
		return pid, err == nil && s == start
	}
	key := foreignKey{ns, pid}
	f, ok := r.known[key]
	if !ok || f.start != start {
		if r.scanned == nil {
			r.scan()
		}
		f = foreignPID{here: r.scanned[key], start: start}
	}
	if f.here != 0 {
		if s, err := startTime(r.procDir(strconv.Itoa(f.here))); err != nil || s != start {
			f.here = 0 // it exited; its PID here may be another's now
		}
	}
	if r.met == nil {
		r.met = map[foreignKey]foreignPID{}
	}
	r.met[key] = f
	return f.here, f.here != 0
}

// goneHere reports whether the process with PID pid of the reader's own
// namespace has no /proc entry: it has exited, whatever its file's lock
// says, since the children it forked without exec keep that lock, and a
// reader that can read its file (its user, or root) sees it in /proc while
// it lives.
func (r *pidResolver) goneHere(ns uint64, pid int) bool {
	if ns != r.own {
		return false
	}
	_, err := os.Stat(r.procDir(strconv.Itoa(pid)))
	return errors.Is(err, fs.ErrNotExist)
}

// takenHere reports whether the PID pid of the reader's own namespace,
// whose start time is not the one its file records, belongs to another
// process than the file's writer: the process there reads start times as
// the reader does, in the reader's time namespace, as its writer would
// have. A killed writer's file may keep its lock (a child forked without
// exec holds it) after its PID went to another process, whose figures it
// would then pass for. False when that cannot be told (a kernel without
// time namespaces, another user's process).
func (r *pidResolver) takenHere(ns uint64, pid int) bool {
	if ns != r.own {
		return false
	}
	if r.ownTime == 0 {
		r.ownTime, _ = nsInode(r.procDir("self") + "/ns/time")
	}
	theirs, err := nsInode(r.procDir(strconv.Itoa(pid)) + "/ns/time")
	return err == nil && r.ownTime != 0 && theirs == r.ownTime
}

// users returns the real, effective, saved and file system user of the
// process with PID pid here, as /proc/PID/status gives them; false when
// they cannot be read.
func (r *pidResolver) users(pid int) ([]uint32, bool) {
	status, err := os.ReadFile(r.procDir(strconv.Itoa(pid)) + "/status")
	if err != nil {
		return nil, false
	}
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) != 5 || f[0] != "Uid:" {
			continue
		}
		uids := make([]uint32, 0, 4)
		for _, v := range f[1:] {
			uid, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return nil, false
			}
			uids = append(uids, uint32(uid))
		}
		return uids, true
	}
	return nil, false
}

// nsInode is the inode of the namespace link at path.
func nsInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// scan records every visible process of another PID namespace by its PID
// there: the last of the PIDs its status lists (NSpid), from this
// namespace inwards.
func (r *pidResolver) scan() {
	r.scanned = map[foreignKey]int{}
	entries, _ := os.ReadDir(r.procDir(""))
	for _, e := range entries {
		here, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ns, err := pidNamespace(r.procDir(e.Name()))
		if err != nil || ns == r.own {
			continue
		}
		status, err := os.ReadFile(r.procDir(e.Name()) + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "NSpid:" {
				if there, err := strconv.Atoi(f[len(f)-1]); err == nil {
					r.scanned[foreignKey{ns, there}] = here
				}
			}
		}
	}
}

// lockHeld reports whether another open file description holds f's lock,
// as a live writer does. The attempt is shared and released at once: it
// never stands in a writer's way, which takes its lock before its file has
// a name a reader opens, and it works for a reader of any user that can
// read the file.
func lockHeld(f *os.File) bool {
	fd := int(f.Fd())
	if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	unix.Flock(fd, unix.LOCK_UN)
	return false
}

// openRegular opens path for reading if it is a regular file, never
// blocking: in a folder others can write, a FIFO named like a figures file
// would stop a reader, or a process publishing, for good.
func openRegular(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	return f, nil
}

// removeStale removes the files of dir whose writers were killed (a
// process that exits removes its own): those whose lock nobody holds. The
// lock tells a live writer in whatever PID, user or time namespace it runs,
// which its PID and start time, read from here, may not. A file without a
// namespace, an older version's, has no lock and is left: readers ignore
// it once its process is gone.
//
// It removes as well the temporaries (PID-NS.stat.new) of writers killed
// while they made their files, which no exit removes: one with its header,
// which a writer writes only once it holds its lock, by the same rule; an
// empty one, which a live writer may not have locked yet, only when its PID
// is of this namespace and has no /proc entry.
func removeStale(dir string) {
	entries, _ := os.ReadDir(dir)
	own, _ := pidNamespace("/proc/self")
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		switch {
		case strings.HasSuffix(e.Name(), ".stat"):
			removeIfUnlocked(path, nil)
		case strings.HasSuffix(e.Name(), ".stat"+temporarySuffix):
			removeIfUnlocked(path, func() bool { return temporaryWriterGone(e.Name(), own) })
		}
	}
}

// temporaryWriterGone reports whether the writer named by the name of a
// temporary, PID-NS.stat.new, is surely gone: its namespace is own, where
// its PID has no /proc entry.
func temporaryWriterGone(name string, own uint64) bool {
	pidText, nsText, _ := strings.Cut(strings.TrimSuffix(name, ".stat"+temporarySuffix), "-")
	pid, pidErr := strconv.Atoi(pidText)
	ns, nsErr := strconv.ParseUint(nsText, 10, 64)
	if pidErr != nil || nsErr != nil || pid <= 0 || own == 0 || ns != own {
		return false
	}
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return errors.Is(err, fs.ErrNotExist)
}

// removeIfUnlocked removes the file at path if it has a header of this
// version, with a namespace, and nobody holds its lock; one without such a
// header only when headerless says its writer is gone (nil: never).
func removeIfUnlocked(path string, headerless func() bool) {
	f, err := openRegular(path)
	if err != nil {
		return
	}
	defer f.Close()
	head := make([]byte, headerSize)
	le := binary.LittleEndian
	if n, _ := f.ReadAt(head, 0); n < headerSize || string(head[:len(magic)]) != magic ||
		le.Uint32(head[offVersion:]) != version || le.Uint64(head[offPIDNS:]) == 0 {
		if headerless == nil || !headerless() {
			return
		}
		// Its writer is gone, and no lock is tried: a process that took
		// its PID since, about to lock a file of its own under this name,
		// would fail to.
	} else if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return // its writer lives
	}
	held, err := f.Stat()
	if err != nil {
		return
	}
	if named, err := os.Lstat(path); err == nil && os.SameFile(held, named) {
		os.Remove(path)
	}
}
