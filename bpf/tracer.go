package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// pollPeriod bounds how long a record waits in the ring buffer unread.
const pollPeriod = 10 * time.Millisecond

// DefaultRingBufferSize is the ring buffer's size unless Options say otherwise.
const DefaultRingBufferSize = 8 << 20

// ErrFlushed is returned by ReadEvent once the records pending at Flush have
// all been read.
var ErrFlushed = ringbuf.ErrFlushed

// MaxTraced is how many processes and threads a session traces at once: the
// entries of the kernel's traced set (traced in spillway.bpf.c).
const MaxTraced = 8192

// ErrTracedFull is wrapped by the error of Trace or Follow for a process the
// session has no room left to trace.
var ErrTracedFull = fmt.Errorf("the session already traces %d processes and threads, its limit", MaxTraced)

// Options configure a Tracer.
type Options struct {
	// RingBufferSize in bytes: a power of two and a multiple of the page
	// size. Zero means DefaultRingBufferSize.
	RingBufferSize int
	// PerSymbolLinks attaches a link per probed function even where the
	// kernel offers uprobe_multi links (one per file), as older kernels must.
	PerSymbolLinks bool
}

// Tracer is a tracing session: the loaded probes, the files they are attached
// to and the reader of their records. Its methods may be called from several
// goroutines, except ReadEvent, which has one reader.
type Tracer struct {
	objs   spillwayObjects
	reader *ringbuf.Reader
	rec    ringbuf.Record // reused by ReadEvent
	links  []link.Link    // tracepoints and kprobes
	uvm    UVMStatus
	multi  bool // uprobe_multi links are available

	mu    sync.Mutex
	files map[fileID]*tracedFile // every file looked at, probed or not
}

// fileID identifies a file the way uprobes do: by device and inode.
type fileID struct {
	major, minor uint32
	inode        uint64
}

type tracedFile struct {
	path   string
	funcs  []string // probed API functions
	probes []string // probed shim probe points
	links  []link.Link
}

// New checks privileges, loads the probes and attaches the tracepoints. No
// process is traced until Trace is called.
func New(opts Options) (*Tracer, error) {
	if err := CheckPrivileges(); err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("lift the locked-memory limit: %w", err)
	}
	if err := ensureTracefs(); err != nil {
		return nil, err
	}
	size := opts.RingBufferSize
	if size == 0 {
		size = DefaultRingBufferSize
	}
	if size < os.Getpagesize() || size&(size-1) != 0 {
		return nil, fmt.Errorf("ring buffer size %d: want a power of two of at least %d bytes", size, os.Getpagesize())
	}

	spec, err := loadSpillway()
	if err != nil {
		return nil, err
	}
	spec.Maps[spillwayMapEvents].MaxEntries = uint32(size)
	if err := spec.Variables[spillwayVarWakeupBytes].Set(uint64(size / 8)); err != nil {
		return nil, fmt.Errorf("set wakeup_bytes: %w", err)
	}
	forkOff, err := tracepointFieldOffset("sched", "sched_process_fork", "child_pid")
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[spillwayVarForkChildPidOffset].Set(forkOff); err != nil {
		return nil, fmt.Errorf("set fork_child_pid_offset: %w", err)
	}
	// Without uprobe_multi links (before Linux 6.6) the multi programs
	// would not load; they are replaced by the plain ones, unused.
	multi := !opts.PerSymbolLinks && features.HaveBPFLinkUprobeMulti() == nil
	if !multi {
		for m, plain := range map[string]string{
			spillwayProgApiEnterMulti:   spillwayProgApiEnter,
			spillwayProgApiExitMulti:    spillwayProgApiExit,
			spillwayProgProbePointMulti: spillwayProgProbePoint,
		} {
			spec.Programs[m] = spec.Programs[plain].Copy()
		}
	}
	layout, uvm := detectUVM()
	if err := layout.apply(spec); err != nil {
		return nil, err
	}

	t := &Tracer{uvm: uvm, multi: multi, files: make(map[fileID]*tracedFile)}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load probes: %+v", verr)
		}
		return nil, fmt.Errorf("load probes: %w", err)
	}
	if err := t.attachKernel(); err != nil {
		t.Close()
		return nil, err
	}
	if t.reader, err = ringbuf.NewReader(t.objs.Events); err != nil {
		t.Close()
		return nil, fmt.Errorf("open ring buffer: %w", err)
	}
	return t, nil
}

func (t *Tracer) attachKernel() error {
	tps := []struct {
		group, name string
		prog        *ebpf.Program
	}{
		{"exceptions", "page_fault_user", t.objs.PageFault},
		{"sched", "sched_process_fork", t.objs.ProcessFork},
		{"sched", "sched_process_exit", t.objs.ProcessExit},
	}
	for _, tp := range tps {
		l, err := link.Tracepoint(tp.group, tp.name, tp.prog, nil)
		if err != nil {
			return fmt.Errorf("attach tracepoint %s:%s: %w", tp.group, tp.name, err)
		}
		t.links = append(t.links, l)
	}
	if t.uvm.Available {
		l, err := link.Kprobe(uvmNotifySymbol, t.objs.UvmEvent, nil)
		if err != nil {
			t.uvm = UVMStatus{Version: t.uvm.Version, Reason: fmt.Sprintf("kprobe %s: %v", uvmNotifySymbol, err)}
		} else {
			t.links = append(t.links, l)
		}
	}
	return nil
}

// UVM reports whether nvidia-uvm faults and migrations are traced, and why not.
func (t *Tracer) UVM() UVMStatus { return t.uvm }

// Trace attaches to the files a process has mapped and adds it (and, from
// now on, the children it forks) to the traced set. The files are attached
// before the process is traced: while a process calls, with the shim probed
// and the runtime or driver below it not yet (or the reverse), its calls
// would be counted at the wrong layer or not at all.
func (t *Tracer) Trace(pid int) error {
	if err := CheckTarget(pid); err != nil {
		return err
	}
	before := children(pid)
	if err := t.ScanProcess(pid); err != nil {
		return err
	}
	if err := t.Follow(pid); err != nil {
		return err
	}
	// The children it forked meanwhile, and their descendants, are followed
	// as the kernel follows those it forks from now on.
	if err := followForked(pid, before, children, t.Follow); err != nil {
		return err
	}
	// What it mapped while the files were attached.
	return t.ScanProcess(pid)
}

// CheckTarget reports whether pid names a process Trace can trace: one
// that exists, has not exited, and is a process, not one of its threads.
// It needs no privilege and loads nothing, so a command line can be
// checked before a session starts.
func CheckTarget(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("pid %d: want a positive process id", pid)
	}
	switch tgid, parent, state, err := procStatus(pid); {
	case err != nil:
		return fmt.Errorf("pid %d: no such process", pid)
	case tgid != pid:
		return fmt.Errorf("pid %d is a thread of process %d: give the process id", pid, tgid)
	case state == 'Z':
		return fmt.Errorf("pid %d has exited (its parent, pid %d, has not reaped it yet): nothing to trace", pid, parent)
	}
	return nil
}

// followForked follows the children of pid that are not in before, and
// every descendant of theirs. Each process is followed before its children
// are listed, so a child forked after the listing is the kernel's to follow,
// and one forked before it is listed; only a child whose parent exits in
// between, reparented to a reaper, is missed. (A child in before was running
// before the trace began: neither it nor its descendants are followed.)
func followForked(pid int, before map[int]bool, list func(int) map[int]bool, follow func(int) error) error {
	var queue []int
	for child := range list(pid) {
		if !before[child] {
			queue = append(queue, child)
		}
	}
	followed := map[int]bool{}
	for len(queue) > 0 {
		child := queue[0]
		queue = queue[1:]
		if followed[child] {
			continue
		}
		if err := follow(child); err != nil {
			return err
		}
		followed[child] = true
		for grandchild := range list(child) {
			queue = append(queue, grandchild)
		}
	}
	return nil
}

// children returns the processes pid's threads have forked and not yet
// reaped; none when it has gone.
func children(pid int) map[int]bool {
	out := map[int]bool{}
	lists, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, path := range lists {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, field := range strings.Fields(string(data)) {
			if child, err := strconv.Atoi(field); err == nil {
				out[child] = true
			}
		}
	}
	return out
}

// Follow adds a process to the traced set without scanning its files, so that
// the children it forks from now on are traced from their first instruction.
func (t *Tracer) Follow(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("pid %d: want a positive process id", pid)
	}
	key, one := uint32(pid), uint8(1)
	err := t.objs.Traced.Put(key, one)
	// A full hash map refuses a new key with E2BIG, which cilium/ebpf
	// reports as "key too big for map".
	if errors.Is(err, unix.E2BIG) {
		return fmt.Errorf("cannot trace pid %d: %w", pid, ErrTracedFull)
	}
	if err != nil {
		return fmt.Errorf("trace pid %d: %w", pid, err)
	}
	return nil
}

// Untrace removes a process from the traced set and forgets its spilled ranges.
func (t *Tracer) Untrace(pid int) error {
	if err := t.objs.Traced.Delete(uint32(pid)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("untrace pid %d: %w", pid, err)
	}
	return t.forgetSpills(uint32(pid))
}

// forgetSpills drops the spilled ranges of a process that has gone.
func (t *Tracer) forgetSpills(tgid uint32) error {
	if err := deleteKeys(t.objs.Spilled, func(k *spillwaySpillKey, _ *uint64) bool { return k.Tgid == tgid }); err != nil {
		return fmt.Errorf("forget spills of %d: %w", tgid, err)
	}
	if err := deleteKeys(t.objs.SpilledRanges, func(k *spillwayRangeKey, _ *uint64) bool { return k.Tgid == tgid }); err != nil {
		return fmt.Errorf("forget spilled ranges of %d: %w", tgid, err)
	}
	return nil
}

// deleteKeys deletes the entries of m that match. The keys are collected
// first, as deleting while iterating a hash map can make the iteration restart
// or skip entries.
func deleteKeys[K, V any](m *ebpf.Map, match func(*K, *V) bool) error {
	var (
		k    K
		v    V
		keys []K
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if match(&k, &v) {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return it.Err()
}

// TracedPIDs returns the ids in the kernel's traced set: the processes asked
// for, their descendants, and their threads.
func (t *Tracer) TracedPIDs() ([]int, error) {
	var (
		key uint32
		val uint8
		out []int
	)
	it := t.objs.Traced.Iterate()
	for it.Next(&key, &val) {
		out = append(out, int(key))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list traced pids: %w", err)
	}
	sort.Ints(out)
	return out, nil
}

// ReadEvent blocks until a record arrives and decodes it into e. It returns
// os.ErrClosed after Close, and ErrFlushed once the records pending at Flush
// have been read.
func (t *Tracer) ReadEvent(e *Event) error {
	for {
		// The probes wake the reader only once a backlog builds up, so it
		// polls for the records in between.
		t.reader.SetDeadline(time.Now().Add(pollPeriod))
		err := t.reader.ReadInto(&t.rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			return err
		}
		return DecodeEvent(t.rec.RawSample, e)
	}
}

// Flush makes ReadEvent return the records pending now, then ErrFlushed.
func (t *Tracer) Flush() error { return t.reader.Flush() }

// Drops returns how many records the kernel could not fit in the ring buffer.
func (t *Tracer) Drops() (uint64, error) {
	var perCPU []uint64
	if err := t.objs.Drops.Lookup(uint32(0), &perCPU); err != nil {
		return 0, fmt.Errorf("read drops: %w", err)
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n, nil
}

// Close detaches every probe and frees the maps.
func (t *Tracer) Close() error {
	var errs []error
	if t.reader != nil {
		errs = append(errs, t.reader.Close())
	}
	t.mu.Lock()
	links := t.links
	for _, f := range t.files {
		links = append(links, f.links...)
	}
	t.files = nil
	t.mu.Unlock()
	// Each detach waits for a grace period; waiting for them together
	// takes one.
	closeErrs := make([]error, len(links))
	var wg sync.WaitGroup
	for i, l := range links {
		wg.Add(1)
		go func() {
			defer wg.Done()
			closeErrs[i] = l.Close()
		}()
	}
	wg.Wait()
	errs = append(errs, closeErrs...)
	errs = append(errs, t.objs.Close())
	return errors.Join(errs...)
}
