package bpf

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Finding the files of traced processes and attaching the uprobes to them.
// Uprobes belong to a file (an inode), not a process: a file is attached once
// and serves every process that maps it; the traced map decides which
// processes' calls are recorded.

// Rescan attaches to files that traced processes have mapped since they were
// last scanned (a library opened with dlopen, a child's executable).
func (t *Tracer) Rescan() error {
	pids, err := t.TracedPIDs()
	if err != nil {
		return err
	}
	var errs []error
	for _, pid := range pids {
		if !isProcess(pid) {
			continue // a thread: its process is scanned
		}
		if err := t.ScanProcess(pid); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ScanProcess attaches to every file mapped executable in the process that
// defines a probed function, once per file. The files are attached from the
// layer a program calls down (the shim, then the runtime, then the driver):
// in a traced process that has just mapped them (exec, dlopen), a call made
// while they are being attached is then counted at its own layer, never as
// the calls that layer makes below while serving it.
func (t *Tracer) ScanProcess(pid int) error {
	maps, err := processMaps(pid)
	if err != nil {
		return fmt.Errorf("scan: %w", err)
	}
	var (
		errs   []error
		found  = map[fileID]bool{}
		unseen []*filePlan
	)
	for _, m := range maps {
		id, err := mappingID(m)
		if err != nil {
			errs = append(errs, fmt.Errorf("pid %d: %w", pid, err))
			continue
		}
		t.mu.Lock()
		_, seen := t.files[id]
		t.mu.Unlock()
		if seen || found[id] {
			continue
		}
		found[id] = true
		unseen = append(unseen, planFile(id, openablePath(pid, m, id)))
	}
	sort.SliceStable(unseen, func(i, j int) bool { return unseen[i].layer() < unseen[j].layer() })
	for _, plan := range unseen {
		if err := t.attachPlanned(plan); err != nil {
			errs = append(errs, fmt.Errorf("pid %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// AttachFile attaches to a file by path before any process maps it, so that a
// process started afterwards is traced from its first call.
func (t *Tracer) AttachFile(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("attach %s: %w", path, err)
	}
	id := fileID{unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino}
	return t.attachPlanned(planFile(id, path))
}

// Files returns the probed files and what is probed in each, one line each.
func (t *Tracer) Files() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, f := range t.files {
		if len(f.links) > 0 {
			out = append(out, fmt.Sprintf("%s: %d API functions, %d probe points", f.path, len(f.funcs), len(f.probes)))
		}
	}
	sort.Strings(out)
	return out
}

// Probed reports what the probed files a process maps define: probed API
// functions (a CUDA runtime or driver, or the shim), and the shim's probe
// points (it runs under Spillway).
func (t *Tracer) Probed(pid int) (api, probePoints bool, err error) {
	maps, err := processMaps(pid)
	if err != nil {
		return false, false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range maps {
		id, err := mappingID(m)
		if err != nil {
			continue
		}
		if tf, ok := t.files[id]; ok && len(tf.links) > 0 {
			api = api || len(tf.funcs) > 0
			probePoints = probePoints || len(tf.probes) > 0
		}
	}
	return api, probePoints, nil
}

// filePlan is what a file defines of the probed functions and probe points,
// read before it is attached.
type filePlan struct {
	id                       fileID
	path                     string
	err                      error // reading its symbols failed
	apiSyms, probeSyms       []string
	apiCookies, probeCookies []uint64
	semaphore                uint64
}

func planFile(id fileID, path string) *filePlan {
	p := &filePlan{id: id, path: path}
	defined, semaphore, err := readSymbols(path)
	if err != nil {
		p.err = err
		return p
	}
	p.semaphore = semaphore
	for _, fn := range Funcs() {
		if defined[fn.String()] {
			p.apiSyms = append(p.apiSyms, fn.String())
			p.apiCookies = append(p.apiCookies, fn.cookie())
		}
	}
	for pp := ProbeAlloc; pp <= ProbeRefuse; pp++ {
		if defined[probeSymbols[pp]] {
			p.probeSyms = append(p.probeSyms, probeSymbols[pp])
			p.probeCookies = append(p.probeCookies, uint64(pp))
		}
	}
	return p
}

// layer orders files from the one a program calls down: the shim (it
// defines the probe points), then a runtime (the CUDA runtime, or an
// executable linked with it statically), then the driver.
func (p *filePlan) layer() int {
	if len(p.probeSyms) > 0 {
		return 0
	}
	for _, sym := range p.apiSyms {
		if strings.HasPrefix(sym, "cuda") {
			return 1
		}
	}
	return 2
}

func (t *Tracer) attachPlanned(plan *filePlan) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, seen := t.files[plan.id]; seen {
		return nil
	}
	tf := &tracedFile{path: plan.path}
	t.files[plan.id] = tf
	if plan.err != nil {
		return plan.err
	}
	if len(plan.apiSyms) == 0 && len(plan.probeSyms) == 0 {
		return nil
	}
	ex, err := link.OpenExecutable(plan.path)
	if err != nil {
		return fmt.Errorf("open %s: %w", plan.path, err)
	}
	// The return probes go first: a call that enters between the two
	// attachments then returns unseen instead of leaving its thread inside
	// a call forever.
	// The probe points take the shim's probe semaphore as their reference
	// counter: while they are attached, the kernel keeps it non-zero in
	// every process that maps the file, and the shim fires them only then.
	probes := []struct {
		syms          []string
		cookies       []uint64
		multi, single *ebpf.Program
		ret           bool
		refCtr        uint64
	}{
		{plan.apiSyms, plan.apiCookies, t.objs.ApiExitMulti, t.objs.ApiExit, true, 0},
		{plan.apiSyms, plan.apiCookies, t.objs.ApiEnterMulti, t.objs.ApiEnter, false, 0},
		{plan.probeSyms, plan.probeCookies, t.objs.ProbePointMulti, t.objs.ProbePoint, false, plan.semaphore},
	}
	for _, p := range probes {
		if len(p.syms) == 0 {
			continue
		}
		var (
			links []link.Link
			err   error
		)
		if t.multi {
			links, err = attachMulti(ex, p.syms, p.cookies, p.multi, p.ret, p.refCtr)
		} else {
			links, err = attachEach(ex, p.syms, p.cookies, p.single, p.ret, p.refCtr)
		}
		tf.links = append(tf.links, links...)
		if err != nil {
			return fmt.Errorf("attach to %s: %w", plan.path, err)
		}
	}
	tf.funcs, tf.probes = plan.apiSyms, plan.probeSyms
	return nil
}

// attachMulti attaches prog to every symbol with one uprobe_multi link:
// detaching a link costs a grace period, once per link. refCtr, if not
// zero, is the file offset of their reference counter.
func attachMulti(ex *link.Executable, syms []string, cookies []uint64, prog *ebpf.Program, ret bool, refCtr uint64) ([]link.Link, error) {
	opts := &link.UprobeMultiOptions{Cookies: cookies}
	if refCtr != 0 {
		opts.RefCtrOffsets = make([]uint64, len(syms))
		for i := range opts.RefCtrOffsets {
			opts.RefCtrOffsets[i] = refCtr
		}
	}
	var (
		l   link.Link
		err error
	)
	if ret {
		l, err = ex.UretprobeMulti(syms, prog, opts)
	} else {
		l, err = ex.UprobeMulti(syms, prog, opts)
	}
	if err != nil {
		return nil, err
	}
	return []link.Link{l}, nil
}

// attachEach attaches prog to every symbol with a link each.
func attachEach(ex *link.Executable, syms []string, cookies []uint64, prog *ebpf.Program, ret bool, refCtr uint64) ([]link.Link, error) {
	var links []link.Link
	for i, sym := range syms {
		var (
			l   link.Link
			err error
		)
		o := &link.UprobeOptions{Cookie: cookies[i], RefCtrOffset: refCtr}
		if ret {
			l, err = ex.Uretprobe(sym, prog, o)
		} else {
			l, err = ex.Uprobe(sym, prog, o)
		}
		if err != nil {
			return links, fmt.Errorf("%s: %w", sym, err)
		}
		links = append(links, l)
	}
	return links, nil
}

// ProbeSemaphoreSymbol names the shim's probe semaphore: a 2-byte counter
// the probe points' uprobes take as their reference counter.
const ProbeSemaphoreSymbol = "spillway_probe_semaphore"

// readSymbols returns the names of the functions a file defines (not those
// it imports), from its symbol table and dynamic symbol table, and the file
// offset of the probe semaphore if it defines one (0 if not).
func readSymbols(path string) (defined map[string]bool, semaphore uint64, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("read symbols of %s: %w", path, err)
	}
	defer f.Close()
	defined = map[string]bool{}
	for _, read := range []func() ([]elf.Symbol, error){f.Symbols, f.DynamicSymbols} {
		syms, err := read()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return nil, 0, fmt.Errorf("read symbols of %s: %w", path, err)
		}
		for _, s := range syms {
			if s.Section == elf.SHN_UNDEF || s.Value == 0 {
				continue
			}
			switch {
			case elf.ST_TYPE(s.Info) == elf.STT_FUNC:
				defined[s.Name] = true
			case s.Name == ProbeSemaphoreSymbol && semaphore == 0:
				if semaphore, err = fileOffset(f, s); err != nil {
					return nil, 0, fmt.Errorf("%s in %s: %w", s.Name, path, err)
				}
			}
		}
	}
	return defined, semaphore, nil
}

// ProbeSemaphoreOffset returns the file offset of the probe semaphore in
// the ELF file at path, or an error if it defines none.
func ProbeSemaphoreOffset(path string) (uint64, error) {
	_, off, err := readSymbols(path)
	if err == nil && off == 0 {
		err = fmt.Errorf("%s defines no %s", path, ProbeSemaphoreSymbol)
	}
	return off, err
}

// fileOffset returns where a symbol's 2 bytes lie in the file. The kernel
// updates a reference counter only in a writable mapping of the file, so
// the symbol must be in a writable section with contents in the file.
func fileOffset(f *elf.File, s elf.Symbol) (uint64, error) {
	if int(s.Section) >= len(f.Sections) {
		return 0, fmt.Errorf("in section %d, which is not in the file", s.Section)
	}
	sec := f.Sections[s.Section]
	if sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_WRITE == 0 || sec.Flags&elf.SHF_ALLOC == 0 {
		return 0, fmt.Errorf("in section %s (%v, %v), want a writable one with contents in the file", sec.Name, sec.Type, sec.Flags)
	}
	if s.Value < sec.Addr || s.Value+2 > sec.Addr+sec.Size {
		return 0, fmt.Errorf("at %#x, outside its section %s", s.Value, sec.Name)
	}
	return s.Value - sec.Addr + sec.Offset, nil
}

// mappingID parses the device of a maps line ("fd:01", hex).
func mappingID(m mapping) (fileID, error) {
	major, minor, ok := strings.Cut(m.dev, ":")
	maj, err1 := strconv.ParseUint(major, 16, 32)
	min, err2 := strconv.ParseUint(minor, 16, 32)
	if !ok || err1 != nil || err2 != nil {
		return fileID{}, fmt.Errorf("mapping of %s: bad device %q", m.path, m.dev)
	}
	return fileID{uint32(maj), uint32(min), m.inode}, nil
}

// openablePath returns a path to the mapped file as this process sees it:
// the path itself when it names the same inode here, else through the
// process's root (another mount namespace), else its map_files entry (a file
// deleted or replaced since it was mapped).
func openablePath(pid int, m mapping, id fileID) string {
	same := func(p string) bool {
		var st unix.Stat_t
		return unix.Stat(p, &st) == nil && st.Ino == id.inode &&
			unix.Major(st.Dev) == id.major && unix.Minor(st.Dev) == id.minor
	}
	if same(m.path) {
		return m.path
	}
	if p := filepath.Join(fmt.Sprintf("/proc/%d/root", pid), m.path); same(p) {
		return p
	}
	return fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, m.start, m.end)
}

// isProcess reports whether id is a live thread-group leader (not a thread).
func isProcess(id int) bool {
	tgid, _, _, err := procStatus(id)
	return err == nil && tgid == id
}

// Running reports whether a process or thread exists and has not exited. A
// zombie, exited but not yet reaped by its parent, has exited.
func Running(id int) bool {
	_, _, state, err := procStatus(id)
	return err == nil && state != 'Z' && state != 'X'
}

// procStatus returns the process (thread group) a thread id belongs to, its
// parent and its state letter (R, S, Z, ...), from /proc/PID/status: one
// field a line, where /proc/PID/stat puts the name, which may hold spaces
// and parentheses, before them.
func procStatus(id int) (tgid, parent int, state byte, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", id))
	if err != nil {
		return 0, 0, 0, err
	}
	var seen int
	for _, line := range strings.Split(string(data), "\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		switch key {
		case "Tgid":
			if tgid, err = strconv.Atoi(value); err != nil {
				return 0, 0, 0, fmt.Errorf("/proc/%d/status: Tgid %q: %w", id, value, err)
			}
			seen |= 1
		case "PPid":
			if parent, err = strconv.Atoi(value); err != nil {
				return 0, 0, 0, fmt.Errorf("/proc/%d/status: PPid %q: %w", id, value, err)
			}
			seen |= 2
		case "State":
			if value == "" {
				return 0, 0, 0, fmt.Errorf("/proc/%d/status: empty State", id)
			}
			state = value[0]
			seen |= 4
		}
	}
	if seen != 7 {
		return 0, 0, 0, fmt.Errorf("/proc/%d/status lacks a Tgid, PPid or State line", id)
	}
	return tgid, parent, state, nil
}
