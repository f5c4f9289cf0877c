package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spillway-gpu/spillway/bpf"
)

const traceUsage = `usage: spillway trace [-p PID]... [--interval 1s] [--duration D] [--json] [--events]
                      [--summary-json FILE] [--metrics-addr ADDR] [--lib PATH] [-- CMD ARGS...]

Traces the CUDA memory activity of running processes (-p, repeatable) and of
CMD, which is started under the shim, with their children. Each CUDA call is
counted once, at the layer the application called (shim, runtime or driver).
Needs root, or CAP_BPF with CAP_PERFMON.
`

// pidList collects repeated -p flags.
type pidList []int

func (p *pidList) String() string { return fmt.Sprint([]int(*p)) }

func (p *pidList) Set(v string) error {
	pid, err := strconv.Atoi(v)
	if err != nil || pid <= 0 {
		return fmt.Errorf("want a process id (a positive integer), got %q", v)
	}
	*p = append(*p, pid)
	return nil
}

var errFlagsReported = errors.New("bad flags")

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
}

func parseTraceFlags(args []string, out io.Writer) (traceOptions, error) {
	var o traceOptions
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), traceUsage)
		fs.PrintDefaults()
	}
	fs.Var(&o.pids, "p", "trace the running process `PID` (repeatable)")
	fs.DurationVar(&o.interval, "interval", time.Second, "refresh the view every `INTERVAL`")
	fs.DurationVar(&o.duration, "duration", 0, "stop tracing after `D` (default: when the traced processes exit, or on SIGINT)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per interval (per record with --events)")
	fs.BoolVar(&o.events, "events", false, "print every record instead of the per-interval view")
	fs.StringVar(&o.summaryPath, "summary-json", "", "write the totals to `FILE` at the end")
	fs.StringVar(&o.lib, "lib", "", "path of libspillway.so for CMD (default: ../lib beside this binary)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve the totals for Prometheus at http://`ADDR`/metrics (such as 127.0.0.1:9400)")
	fs.IntVar(&o.ringBuffer, "ring-buffer", bpf.DefaultRingBufferSize, "ring buffer size in `BYTES` (a power of two)")
	if err := fs.Parse(args); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			err = errFlagsReported // the flag package printed it with the usage
		}
		return o, err
	}
	o.argv = fs.Args()
	switch {
	case len(o.pids) == 0 && len(o.argv) == 0:
		return o, errors.New("nothing to trace: give -p PID or -- CMD ARGS")
	case o.interval <= 0:
		return o, fmt.Errorf("--interval %v: want a positive duration such as 1s or 500ms", o.interval)
	case o.duration < 0:
		return o, fmt.Errorf("--duration %v: want a positive duration, or none", o.duration)
	}
	return o, nil
}

func traceMain(args []string) int {
	o, err := parseTraceFlags(args, os.Stderr)
	if err != nil {
		switch {
		case errors.Is(err, flag.ErrHelp):
			return 0
		case !errors.Is(err, errFlagsReported):
			fmt.Fprintf(os.Stderr, "spillway trace: %v\n", err)
		}
		return 2
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

func runTrace(o traceOptions) (int, error) {
	if err := bpf.CheckPrivileges(); err != nil {
		return 1, err
	}
	tr, err := bpf.New(bpf.Options{RingBufferSize: o.ringBuffer})
	if err != nil {
		return 1, err
	}
	defer tr.Close()
	if st := tr.UVM(); !st.Available {
		fmt.Fprintf(os.Stderr, "spillway trace: %s\n", st)
	}

	s := &session{tr: tr, self: uint32(os.Getpid()), sum: bpf.NewSummary(), waiting: map[uint32]bool{}}
	if o.events {
		s.out = newEventPrinter(os.Stdout, o.json)
	}
	for _, pid := range o.pids {
		if err := tr.Trace(pid); err != nil {
			return 1, err
		}
		s.waiting[uint32(pid)] = true
		fmt.Fprintf(os.Stderr, "spillway trace: tracing pid %d\n", pid)
	}

	if o.metricsAddr != "" {
		bound, stop, err := s.serveMetrics(o.metricsAddr)
		if err != nil {
			return 1, err
		}
		defer stop()
		fmt.Fprintf(os.Stderr, "spillway trace: serving metrics at http://%s/metrics\n", bound)
	}

	readDone := make(chan error, 1)
	go func() { readDone <- s.read() }()

	var (
		cmd     *exec.Cmd
		cmdDone chan int
	)
	if len(o.argv) > 0 {
		var status int
		if cmd, status, err = s.startCommand(o.lib, o.argv); err != nil {
			return status, err
		}
		cmdDone = make(chan int, 1)
		go func() { cmdDone <- waitForwardingSignals(cmd) }()
	}

	var view intervalView
	if !o.events {
		view = newIntervalView(os.Stdout, o.json)
	}
	status := s.loop(o, view, cmdDone)
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

// startCommand starts argv under the shim, traced from its first
// instruction: the probes are attached to the libraries it will load before
// it starts, and this process is traced while it forks, so that the child
// inherits the tracing.
func (s *session) startCommand(lib string, argv []string) (*exec.Cmd, int, error) {
	lib, err := findLib(lib)
	if err != nil {
		return nil, 1, err
	}
	for _, path := range candidateLibraries(lib, argv[0]) {
		if err := s.tr.AttachFile(path); err != nil {
			return nil, 1, err
		}
	}
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
		return nil, 127, startErr // as a shell says of a command it cannot run
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

// candidateLibraries lists the files the command may load probed functions
// from: the shim, the CUDA runtime and driver found where the dynamic loader
// looks, and the executable itself (for a statically linked runtime).
func candidateLibraries(lib, arg0 string) []string {
	out := []string{lib}
	if exe, err := exec.LookPath(arg0); err == nil {
		out = append(out, exe)
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
// duration has passed or a signal arrives. It returns the command's exit
// status, or -1 when the command has not exited.
func (s *session) loop(o traceOptions, view intervalView, cmdDone <-chan int) int {
	sigs := make(chan os.Signal, 1)
	if cmdDone == nil {
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(sigs)
	}
	var deadline <-chan time.Time
	if o.duration > 0 {
		deadline = time.After(o.duration)
	}
	// Files mapped late (dlopen) are found by rescanning, more often than
	// the view is redrawn.
	rescan := time.NewTicker(min(o.interval, 200*time.Millisecond))
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
		case <-sigs:
			return -1
		case <-rescan.C:
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

func (s *session) allExited() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid := range s.waiting {
		if err := syscall.Kill(int(pid), 0); err == nil || errors.Is(err, syscall.EPERM) {
			return false
		}
		delete(s.waiting, pid) // exited before it was traced, or its exit record was dropped
	}
	return true
}

// traceSummary is the --summary-json document: the totals and the session.
type traceSummary struct {
	*bpf.Summary
	UVMTraced bool   `json:"uvm_traced"`
	UVMReason string `json:"uvm_unavailable_reason,omitempty"`
}

func writeSummary(path string, sum *bpf.Summary, uvm bpf.UVMStatus) error {
	data, err := json.MarshalIndent(traceSummary{sum, uvm.Available, uvm.Reason}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("--summary-json: %w", err)
	}
	return nil
}
