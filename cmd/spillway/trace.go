package main

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-gpu/spillway/bpf"
	"github.com/spillway-gpu/spillway/shim/config"
)

const traceUsage = `usage: spillway trace [flags] [-p PID]... [-- CMD ARGS...]

Traces the CUDA memory activity of running processes (-p, repeatable) and of
CMD, which is started under the shim, with their children. CMD may be any
program: a binary, a #! script, a wrapper or a virtualenv launcher; libraries
are found in what each process maps once it runs. Each CUDA call is counted
once, at the layer the application called (shim, runtime or driver). Needs
root, or CAP_BPF with CAP_PERFMON.

`

// maxRingBuffer is the largest ring buffer the kernel accepts: its size is
// a 32-bit power of two.
const maxRingBuffer = 1 << 31

// pidList collects repeated -p flags.
type pidList []int

func (p *pidList) String() string { return fmt.Sprint([]int(*p)) }

func (p *pidList) repeatable() {}

func (p *pidList) Set(v string) error {
	pid, err := strconv.Atoi(v)
	if err != nil || pid <= 0 {
		return &config.Error{Name: "-p", Value: v, Reason: "want a process id, a positive integer", Example: "-p 4242"}
	}
	if slices.Contains(*p, pid) {
		return &config.Error{Name: "-p", Value: v, Reason: fmt.Sprintf("pid %d is given already; give each process once", pid),
			Example: fmt.Sprintf("-p %d", pid)}
	}
	*p = append(*p, pid)
	return nil
}

type traceOptions struct {
	pids        pidList
	argv        []string
	interval    time.Duration
	duration    time.Duration
	json        bool
	events      bool
	summaryPath string
	ringBuffer  int
	lib         string
	metricsAddr string
	output      string // --output FILE; empty: standard output
	disabled    bool   // SPILLWAY_DISABLE=1 is inherited by CMD
}

// rescanPeriod is the longest wait between two rescans of the traced
// processes' files: a library opened late (dlopen) is probed within it.
const rescanPeriod = 200 * time.Millisecond

// rescanEvery is how often the traced processes' files are rescanned: more
// often than the view is redrawn.
func (o traceOptions) rescanEvery() time.Duration { return min(o.interval, rescanPeriod) }

func parseTraceFlags(args, environ []string, out io.Writer) (traceOptions, error) {
	o := traceOptions{interval: time.Second, ringBuffer: bpf.DefaultRingBufferSize}
	fs := newFlagSet("trace", traceUsage, out)
	fs.Var(&o.pids, "p", "trace the running process `PID` (repeatable)")
	fs.Var(durationFlag{"--interval", &o.interval, true}, "interval", "refresh the view every `INTERVAL` (500ms, 1s, 2m; default 1s)")
	fs.Var(durationFlag{"--duration", &o.duration, false}, "duration", "stop tracing after `D` (default: when the traced processes exit, or on SIGINT, SIGTERM or SIGHUP)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per interval (per record with --events)")
	fs.BoolVar(&o.events, "events", false, "print every record instead of the per-interval view")
	fs.Var(outputFlag(&o.output, "--output", "trace.txt", "standard output is where the view goes without --output"),
		"output", "write the view or the records to `FILE` instead of standard output")
	fs.Var(outputFlag(&o.summaryPath, "--summary-json", "totals.json", "the totals go to a file only"),
		"summary-json", "write the totals to `FILE` at the end")
	fs.Var(libFlag(&o.lib), "lib", "`PATH` of libspillway.so for CMD (default: ../lib/libspillway.so beside this binary)")
	fs.Var(metricsAddrFlag(&o.metricsAddr), "metrics-addr", "serve the totals for Prometheus at http://`ADDR`/metrics (such as 127.0.0.1:9400)")
	fs.Var(sizeFlag{&o.ringBuffer}, "ring-buffer", "ring buffer `SIZE`, a power of two from the page size to 2GiB (default 8MiB)")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	if err := checkSwitchBeforeCommand(fs, args); err != nil {
		return o, err
	}
	if err := checkNoFlagAsProgram(fs, args); err != nil {
		return o, err
	}
	o.argv = fs.Args()
	if len(o.pids) == 0 && len(o.argv) == 0 {
		return o, usageError(fs, "nothing to trace: give -p PID or -- CMD ARGS")
	}
	if o.metricsAddr != "" {
		if err := checkListenAddr("--metrics-addr", o.metricsAddr); err != nil {
			return o, usageError(fs, err.Error())
		}
	}
	if o.output != "" && o.summaryPath != "" && sameFile(o.output, o.summaryPath) {
		return o, usageError(fs, fmt.Sprintf("--output %s and --summary-json %s are the same file: the totals would replace the view",
			o.output, o.summaryPath))
	}
	if o.output == "" && o.summaryPath != "" && isStdoutFile(o.summaryPath) {
		return o, usageError(fs, fmt.Sprintf("--summary-json %s is standard output's file, where the view goes without --output: the totals would replace the view",
			o.summaryPath))
	}
	if o.lib != "" && len(o.argv) == 0 {
		return o, usageError(fs, fmt.Sprintf("--lib %s is the shim to start CMD under, but no CMD is given: -p traces a process as it runs (valid example: --lib %s -- CMD ARGS)",
			o.lib, o.lib))
	}
	if o.lib != "" {
		if _, err := findLib(o.lib); err != nil {
			return o, usageError(fs, fmt.Sprintf("invalid --lib=%q: %v", o.lib, err))
		}
	}
	// CMD gets this environment, as under spillway run: a setting the shim
	// would refuse is refused before anything starts, not found out by a
	// job whose every allocation fails.
	if len(o.argv) > 0 {
		cfg, err := config.Parse(environ)
		if err != nil {
			return o, usageError(fs, environmentLines(err))
		}
		o.disabled = cfg.Disable
		if err := checkShimFiles(environ); err != nil {
			return o, usageError(fs, environmentLines(err))
		}
	}
	return o, nil
}

// sizeFlag is a byte size written as run's are (8MiB, 64K, 1048576).
type sizeFlag struct{ n *int }

func (f sizeFlag) String() string {
	if f.n == nil {
		return ""
	}
	return config.FormatBytes(uint64(*f.n))
}

func (f sizeFlag) Set(v string) error {
	n, err := config.ParseSize("--ring-buffer", v)
	if err != nil {
		return err
	}
	page := uint64(os.Getpagesize())
	if n < page || n > maxRingBuffer || n&(n-1) != 0 {
		reason := "want a power of two"
		if n > maxRingBuffer {
			reason = "above the kernel's limit; want a power of two"
		}
		return fmt.Errorf("invalid --ring-buffer=%q: %s from %s to %s (valid example: --ring-buffer 64MiB)",
			v, reason, config.FormatBytes(page), config.FormatBytes(maxRingBuffer))
	}
	*f.n = int(n)
	return nil
}

// sameFile reports whether the paths a and b name one regular file, or
// will once it is created: what is written to one would overwrite the
// other. Two writers of a terminal or a pipe (/dev/stdout) each add theirs.
func sameFile(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	if errA == nil && errB == nil {
		return os.SameFile(fa, fb) && fa.Mode().IsRegular()
	}
	absA, errA := filepath.Abs(a)
	absB, errB := filepath.Abs(b)
	return errA == nil && errB == nil && absA == absB
}

// isStdoutFile reports whether path is the regular file standard output
// writes to (> out.txt), which writing path would truncate.
func isStdoutFile(path string) bool {
	out, err := os.Stdout.Stat()
	if err != nil || !out.Mode().IsRegular() {
		return false
	}
	fi, err := os.Stat(path)
	return err == nil && os.SameFile(out, fi)
}

// checkWritable checks, before anything starts, that path can be
// written, so that a bad path is not found out after the job ran, and
// leaves it as it was: an existing file is not truncated, and one that did
// not exist is not left behind.
func checkWritable(path string) error {
	info, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		f.Close()
		return os.Remove(path)
	case err != nil:
		return err
	case info.IsDir():
		return fmt.Errorf("%s is a folder", path)
	}
	if err := unix.Access(path, unix.W_OK); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// sessionOutput is where the view or the records go: standard output, or
// --output FILE, opened before CMD starts but left as it was until the
// session is under way, so that a CMD that cannot be run leaves an existing
// file unchanged and no new one behind.
type sessionOutput struct {
	file    *os.File
	path    string
	created bool // the file did not exist before this session
}

// openOutput opens --output FILE without changing it; standard output
// without one. It is opened for reading too, as os.Create does, so that a
// named pipe with no reader yet does not block.
func openOutput(path string) (*sessionOutput, error) {
	if path == "" {
		return &sessionOutput{file: os.Stdout}, nil
	}
	out := &sessionOutput{path: path}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		out.created = err == nil
	}
	if err != nil {
		return nil, fmt.Errorf("--output: %w", err)
	}
	out.file = f
	return out, nil
}

// begin empties the file the last session left, now that this one is
// under way. A pipe or a terminal has nothing to empty.
func (o *sessionOutput) begin() error {
	if o.path == "" || o.created {
		return nil
	}
	info, err := o.file.Stat()
	if err == nil && info.Mode().IsRegular() {
		err = o.file.Truncate(0)
	}
	if err != nil {
		return fmt.Errorf("--output: %w", err)
	}
	return nil
}

// abandon removes the file of a session that did not start if this
// session made it (runTrace closes it).
func (o *sessionOutput) abandon() {
	if o.created {
		os.Remove(o.path)
	}
}

func traceMain(args []string) int {
	o, err := parseTraceFlags(args, os.Environ(), os.Stdout)
	if err != nil {
		return reportFlagError("trace", err)
	}
	for _, file := range []struct{ flag, path string }{{"--summary-json", o.summaryPath}, {"--output", o.output}} {
		if file.path == "" {
			continue
		}
		if err := checkWritable(file.path); err != nil {
			fmt.Fprintf(os.Stderr, "spillway trace: %s: %v\n", file.flag, err)
			return 2
		}
	}
	// A -p that names no process to trace is the command line's mistake,
	// told as such before anything is loaded (Trace would refuse it too,
	// once the probes are).
	for _, pid := range o.pids {
		if err := bpf.CheckTarget(pid); err != nil {
			fmt.Fprintf(os.Stderr, "spillway trace: invalid -p=%d: %v\n", pid, err)
			return 2
		}
	}
	if o.disabled {
		fmt.Fprintln(os.Stderr, "spillway trace: "+disabledNotice)
	}
	status, err := runTrace(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "spillway trace: %v\n", err)
		if status == 0 {
			status = 1
		}
	}
	return status
}

// session is a running trace: the tracer, the totals and the targets.
type session struct {
	tr   *bpf.Tracer
	self uint32 // this process, which is traced while it starts CMD

	mu      sync.Mutex
	sum     *bpf.Summary
	waiting map[uint32]bool // -p targets not yet exited
	out     *eventPrinter   // with --events
}

// runTrace runs a session, printing the view or the records to standard
// output or --output. The output is opened only once what can stop the
// session before it starts has been checked: the privileges, the targets,
// the metrics address, and CMD with the files to probe for it.
func runTrace(o traceOptions) (int, error) {
	if err := bpf.CheckPrivileges(); err != nil {
		return 1, err
	}
	// Without CMD, whose exit ends the session (these signals are passed
	// on to it), they end the session, caught from before it attaches to
	// after it has detached: one that arrives while it attaches or stops
	// ends it as one while it runs does, with its files written. SIGHUP is
	// the terminal it was started from closing, SIGPIPE (when standard
	// output is closed) its reader going (| head).
	var endSignals chan os.Signal
	if len(o.argv) == 0 {
		endSignals = make(chan os.Signal, 1)
		signal.Notify(endSignals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
		defer signal.Stop(endSignals)
	} else {
		// With CMD, whose exit ends the session, a reader of standard
		// output that stops early (| head) ends the view only. Caught,
		// SIGPIPE makes a write to the closed output fail, where it would
		// kill this process, and with it CMD (Pdeathsig), with no summary.
		// A caught signal is not inherited by CMD, as an ignored one is.
		brokenPipe := make(chan os.Signal, 1)
		signal.Notify(brokenPipe, syscall.SIGPIPE)
		defer signal.Stop(brokenPipe)
	}
	tr, err := bpf.New(bpf.Options{RingBufferSize: o.ringBuffer})
	if err != nil {
		return 1, err
	}
	defer tr.Close()

	s := &session{tr: tr, self: uint32(os.Getpid()), sum: bpf.NewSummary(), waiting: map[uint32]bool{}}
	for _, pid := range o.pids {
		if err := tr.Trace(pid); err != nil {
			return 1, err
		}
		s.waiting[uint32(pid)] = true
		fmt.Fprintf(os.Stderr, "spillway trace: tracing pid %d\n", pid)
		// A wrong pid (the launcher, not the worker) would otherwise show
		// zeros with no word of why.
		switch api, shim, err := tr.Probed(pid); {
		case err != nil: // gone already: the session ends with it
		case !api:
			fmt.Fprintf(os.Stderr, "spillway trace: pid %d maps no CUDA runtime or driver and no libspillway.so yet: "+
				"its calls are counted once it loads one (rescanned every %v)\n", pid, o.rescanEvery())
		case !shim:
			fmt.Fprintf(os.Stderr, "spillway trace: pid %d is not running under Spillway (no libspillway.so mapped): "+
				"its CUDA calls are counted, the pool's figures stay zero\n", pid)
		}
	}

	if o.metricsAddr != "" {
		bound, stop, err := s.serveMetrics(o.metricsAddr)
		if err != nil {
			return 1, err
		}
		defer stop()
		fmt.Fprintf(os.Stderr, "spillway trace: serving metrics at http://%s/metrics\n", bound)
	}

	var lib string
	if len(o.argv) > 0 {
		var status int
		if lib, status, err = s.prepareCommand(o.lib, o.argv); err != nil {
			return status, err
		}
	}

	output, err := openOutput(o.output)
	if err != nil {
		return 1, err
	}
	out := output.file
	if out != os.Stdout {
		defer out.Close()
	}

	var (
		cmd     *exec.Cmd
		cmdDone chan int
	)
	if len(o.argv) > 0 {
		var status int
		// Caught until the session ends: a ^C or SIGTERM after CMD exited,
		// while the summary is written, must not cut it short.
		sigs := catchSignals()
		defer sigs.stop()
		if cmd, status, err = s.startCommand(lib, o.argv); err != nil {
			output.abandon()
			return status, err
		}
		cmdDone = make(chan int, 1)
		go func() { cmdDone <- sigs.wait(cmd) }()
	}
	// Records made meanwhile wait in the ring buffer; they are read once
	// the output is emptied, so that none is written before it is.
	if err := output.begin(); err != nil {
		// The job runs already: the session goes on, after what was there.
		fmt.Fprintf(os.Stderr, "spillway trace: %v\n", err)
	}
	if o.events {
		// Records written where the job writes too go out whole, in
		// writes no larger than a pipe writes atomically.
		s.out = newEventPrinter(out, o.json, out == os.Stdout)
	}
	readDone := make(chan error, 1)
	go func() { readDone <- s.read() }()

	// Said once, when the session is under way, not ahead of an error
	// that stops it.
	if st := tr.UVM(); !st.Available {
		fmt.Fprintf(os.Stderr, "spillway trace: %s\n", st)
	}
	var view intervalView
	if !o.events {
		// A table redrawn in place would overwrite what the job prints on
		// the same terminal: then each one is printed below the last.
		inPlace := cmd == nil || out != os.Stdout
		view = newIntervalView(out, o.json, o.interval, inPlace)
	}
	status := s.loop(o, view, cmdDone, endSignals)
	if err := tr.Flush(); err != nil {
		return 1, err
	}
	if err := <-readDone; err != nil {
		return 1, err
	}
	drops, err := tr.Drops()
	if err != nil {
		return 1, err
	}
	s.sum.Drops = drops
	if view != nil {
		view.final(s.sum)
	}
	if s.out != nil {
		s.out.flush()
	}
	if o.summaryPath != "" {
		if err := writeSummary(o.summaryPath, s.sum, tr.UVM()); err != nil {
			return 1, err
		}
	}
	if cmd != nil && status < 0 {
		status = <-cmdDone // tracing ended first (--duration); the job goes on
	}
	if status < 0 {
		status = 0
	}
	return status, nil
}

// prepareCommand attaches the probes to the libraries argv will load, before
// it starts, and checks that it can be run. It returns the shim's path.
func (s *session) prepareCommand(lib string, argv []string) (string, int, error) {
	lib, err := findLib(lib)
	if err != nil {
		return "", 1, err
	}
	if err := s.tr.AttachFile(lib); err != nil {
		return "", 1, err
	}
	// The rescans find these files too, once mapped: one that cannot be
	// probed is said, as a rescan says it, and the command still runs.
	for _, path := range candidateLibraries(argv[0]) {
		if err := s.tr.AttachFile(path); err != nil {
			fmt.Fprintf(os.Stderr, "spillway trace: %v\n", err)
		}
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		return "", cannotRun(err), err // as a shell says of a command it cannot run
	}
	return lib, 0, nil
}

// startCommand starts argv under the shim lib, prepared by prepareCommand,
// traced from its first instruction: this process is traced while it forks,
// so that the child inherits the tracing.
func (s *session) startCommand(lib string, argv []string) (*exec.Cmd, int, error) {
	if err := s.tr.Follow(int(s.self)); err != nil {
		return nil, 1, err
	}
	cmd, startErr := startUnderShim(launchOptions{Lib: lib}, argv)
	if err := s.tr.Untrace(int(s.self)); err != nil {
		if startErr == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		return nil, 1, err
	}
	if startErr != nil {
		return nil, cannotRun(startErr), startErr // as a shell says of a command it cannot run
	}
	// The child is traced already (it was forked by a traced process); this
	// finds what it has mapped beyond the files attached above. It may have
	// exited already.
	pid := cmd.Process.Pid
	if err := s.tr.ScanProcess(pid); err != nil && syscall.Kill(pid, 0) == nil {
		fmt.Fprintf(os.Stderr, "spillway trace: %v\n", err)
	}
	fmt.Fprintf(os.Stderr, "spillway trace: tracing pid %d (%s)\n", pid, argv[0])
	return cmd, 0, nil
}

// candidateLibraries lists the files besides the shim that the command may
// load probed functions from: the executable itself (for a statically linked
// runtime) and the libraries it is linked with, and the CUDA runtime and
// driver found where the dynamic loader looks for what is opened later with
// dlopen.
func candidateLibraries(arg0 string) []string {
	var out []string
	if exe, err := exec.LookPath(arg0); err == nil {
		for _, path := range executables(exe) {
			out = append(out, path)
			out = append(out, linkedLibraries(path)...)
		}
	}
	var dirs []string
	for _, d := range strings.Split(os.Getenv("LD_LIBRARY_PATH"), ":") {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	for _, pattern := range []string{"libcudart.so*", "libcuda.so*"} {
		for _, d := range dirs {
			matches, _ := filepath.Glob(filepath.Join(d, pattern))
			out = append(out, matches...)
		}
	}
	out = append(out, ldCacheLibraries("libcudart.so", "libcuda.so")...)
	return out
}

// maxInterpreterDepth bounds a chain of #! scripts, as the kernel does.
const maxInterpreterDepth = 4

// executables returns the ELF file that exec of path runs: path itself, or
// the interpreter its #! line names (followed through env and further
// scripts). A script's own text has no symbols to probe; what the program
// maps once it runs (the interpreter a wrapper script starts, a
// virtualenv's libraries) is found by rescanning the traced processes.
func executables(path string) []string {
	for range maxInterpreterDepth {
		f, err := os.Open(path)
		if err != nil {
			return nil
		}
		head := make([]byte, 256)
		n, _ := io.ReadFull(f, head)
		f.Close()
		head = head[:n]
		if bytes.HasPrefix(head, []byte("\x7fELF")) {
			return []string{path}
		}
		if !bytes.HasPrefix(head, []byte("#!")) {
			return nil
		}
		line, _, _ := bytes.Cut(head[2:], []byte("\n"))
		fields := strings.Fields(string(line))
		if len(fields) == 0 {
			return nil
		}
		next := fields[0]
		if filepath.Base(next) == "env" { // #!/usr/bin/env [-S] python3
			args := fields[1:]
			for len(args) > 0 && strings.HasPrefix(args[0], "-") {
				args = args[1:]
			}
			if len(args) == 0 {
				return nil
			}
			if next, err = exec.LookPath(args[0]); err != nil {
				return nil
			}
		}
		path = next
	}
	return nil
}

// linkedLibraries returns the libraries the dynamic loader maps with the
// executable at path, resolved as it resolves them (its run paths with
// $ORIGIN, LD_LIBRARY_PATH, its cache): the executable's own loader lists
// them without running the program, as ldd does. None for a static
// executable, or when the loader cannot say.
func linkedLibraries(path string) []string {
	f, err := elf.Open(path)
	if err != nil {
		return nil
	}
	var loader string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			data, err := io.ReadAll(p.Open())
			if err == nil {
				loader = string(bytes.TrimRight(data, "\x00"))
			}
		}
	}
	f.Close()
	if loader == "" {
		return nil
	}
	text, err := exec.Command(loader, "--list", path).Output()
	if err != nil {
		return nil
	}
	return loaderListPaths(string(text))
}

// loaderListPaths returns the paths in the loader's --list output: lines
// "\tlibcudart.so.12 => /path/libcudart.so.12 (0x...)", or "\t/path (0x...)"
// for a library named by its path (the loader itself). A folder's name may
// hold " (" or " => " too: the address is the last parenthesis, and a name
// before " => " is a file name, without a slash.
func loaderListPaths(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimPrefix(line, "\t")
		if i := strings.LastIndex(line, " ("); i >= 0 {
			line = line[:i]
		}
		if name, resolved, ok := strings.Cut(line, " => "); ok && !strings.Contains(name, "/") {
			line = resolved
		}
		if strings.HasPrefix(line, "/") {
			out = append(out, line)
		}
	}
	return out
}

// ldCacheLibraries returns the paths the loader's cache gives for libraries
// whose names start with one of prefixes; none when ldconfig is missing.
func ldCacheLibraries(prefixes ...string) []string {
	text, err := exec.Command("ldconfig", "-p").Output()
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(text), "\n") {
		name, path, ok := strings.Cut(strings.TrimSpace(line), " => ")
		if !ok {
			continue
		}
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				out = append(out, path)
			}
		}
	}
	return out
}

// read accounts for records until the tracer is flushed.
func (s *session) read() error {
	var e bpf.Event
	for {
		if err := s.tr.ReadEvent(&e); err != nil {
			if errors.Is(err, bpf.ErrFlushed) {
				return nil
			}
			return fmt.Errorf("read records: %w", err)
		}
		if e.PID == s.self {
			continue // this process, while it started CMD
		}
		s.mu.Lock()
		s.sum.Add(&e)
		if e.Kind == bpf.KindExit {
			delete(s.waiting, e.PID)
		}
		s.mu.Unlock()
		if e.Kind == bpf.KindExit {
			if err := s.tr.Untrace(int(e.PID)); err != nil {
				fmt.Fprintf(os.Stderr, "spillway trace: %v\n", err)
			}
		}
		if s.out != nil {
			s.out.print(&e)
		}
	}
}

// loop redraws the view each interval and rescans the traced processes'
// files until the command exits, the -p targets have all exited, the
// duration has passed or a signal arrives on stop. It returns the command's
// exit status, or -1 when the command has not exited.
func (s *session) loop(o traceOptions, view intervalView, cmdDone <-chan int, stop <-chan os.Signal) int {
	var deadline <-chan time.Time
	if o.duration > 0 {
		deadline = time.After(o.duration)
	}
	// Files mapped late (dlopen) are found by rescanning.
	rescan := time.NewTicker(o.rescanEvery())
	defer rescan.Stop()
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	draw := func() {
		if view == nil {
			return
		}
		s.mu.Lock()
		cur := s.sum.Clone()
		s.mu.Unlock()
		if drops, err := s.tr.Drops(); err == nil {
			cur.Drops = drops
		}
		view.draw(cur)
	}
	for {
		select {
		case status := <-cmdDone:
			return status
		case <-deadline:
			return -1
		case sig := <-stop:
			// A write to any broken pipe or socket raises SIGPIPE, a
			// metrics scrape cut short too: only a closed standard
			// output ends the session.
			if sig != syscall.SIGPIPE || stdoutClosed() {
				return -1
			}
		case <-rescan.C:
			if s.out != nil {
				s.out.flush()
			}
			if err := s.tr.Rescan(); err != nil {
				fmt.Fprintf(os.Stderr, "spillway trace: %v\n", err)
			}
			if cmdDone == nil && s.allExited() {
				return -1
			}
		case <-tick.C:
			draw()
		}
	}
}

// stdoutClosed reports whether standard output is a pipe or socket whose
// reader has gone.
func stdoutClosed() bool {
	fds := []unix.PollFd{{Fd: 1, Events: unix.POLLOUT}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0
}

// allExited reports whether the -p targets and every process they started
// since (which the kernel traces too) have exited.
func (s *session) allExited() bool {
	s.mu.Lock()
	for pid := range s.waiting {
		if bpf.Running(int(pid)) { // a zombie has exited: it would hold the session open
			s.mu.Unlock()
			return false
		}
		delete(s.waiting, pid) // exited before it was traced, or its exit record was dropped
	}
	s.mu.Unlock()
	traced, err := s.tr.TracedPIDs()
	if err != nil {
		fmt.Fprintf(os.Stderr, "spillway trace: %v\n", err)
		return false
	}
	for _, pid := range traced {
		if bpf.Running(pid) {
			return false
		}
	}
	return true
}

// traceSummary is the --summary-json document: the totals and the session.
type traceSummary struct {
	*bpf.Summary
	MovedBytesPerStep *float64 `json:"moved_bytes_per_step"` // null without steps
	UVMTraced         bool     `json:"uvm_traced"`
	UVMReason         string   `json:"uvm_unavailable_reason,omitempty"`
}

func writeSummary(path string, sum *bpf.Summary, uvm bpf.UVMStatus) error {
	doc := traceSummary{Summary: sum, UVMTraced: uvm.Available, UVMReason: uvm.Reason}
	if v, ok := bpf.PerStep(sum.MovedBytes, sum.Steps); ok {
		doc.MovedBytesPerStep = &v
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("--summary-json: %w", err)
	}
	return nil
}
