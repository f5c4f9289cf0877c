package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/spillway-gpu/spillway/internal/stat"
	"github.com/spillway-gpu/spillway/shim/config"
)

const statUsage = `usage: spillway stat [--json] [--watch [INTERVAL]] [--metrics-addr ADDR]

Shows, for each GPU, what NVML reports (name, UUID, total and used memory,
each process's memory) joined with the figures every process running under
Spillway publishes: its quota, what it holds against it, what its pool has
cached and what it has spilled to the host. Without root, only the caller's
own processes publish where it reads (SPILLWAY_RUNTIME_DIR, else
$XDG_RUNTIME_DIR/spillway; /run/spillway and every /run/user/*/spillway as
root).

`

// statOptions are spillway stat's flags.
type statOptions struct {
	json        bool
	watch       time.Duration // 0: once
	metricsAddr string
}

// watchFlag is --watch, alone (every second) or with an interval.
type watchFlag struct{ d *time.Duration }

func (w watchFlag) String() string {
	if w.d == nil || *w.d == 0 {
		return ""
	}
	return w.d.String()
}
func (w watchFlag) IsBoolFlag() bool { return true }

func (w watchFlag) Set(v string) error {
	if v == "true" {
		*w.d = time.Second
		return nil
	}
	d, err := parseRefresh("--watch", v)
	if err != nil {
		return err
	}
	*w.d = d
	return nil
}

// joinOptionalValue turns "--watch 2s" into "--watch=2s", so that --watch
// takes a value only when one follows it: anything that starts as a number
// does ("--watch 0" and "--watch -1s" are then refused as intervals), and
// so does an empty one (--watch "$INTERVAL" with the variable unset).
func joinOptionalValue(args []string, names ...string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		name := strings.TrimLeft(a, "-")
		if strings.HasPrefix(a, "-") && !strings.Contains(a, "=") && contains(names, name) && i+1 < len(args) &&
			(args[i+1] == "" || startsAsNumber(args[i+1])) {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

// startsAsNumber reports whether s begins as a number, signed or not.
func startsAsNumber(s string) bool {
	s = strings.TrimLeft(s, "+-")
	return s != "" && (s[0] >= '0' && s[0] <= '9' || s[0] == '.')
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func parseStatFlags(args []string, out io.Writer) (statOptions, error) {
	var o statOptions
	fs := newFlagSet("stat", statUsage, out)
	fs.BoolVar(&o.json, "json", false, "print one JSON document (one per refresh with --watch)")
	fs.Var(watchFlag{&o.watch}, "watch", "refresh every `INTERVAL` (default 1s when given alone) until interrupted")
	fs.Var(metricsAddrFlag(&o.metricsAddr), "metrics-addr", "serve the figures for Prometheus at http://`ADDR`/metrics until interrupted")
	args = joinOptionalValue(args, "watch")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	// --watch takes an interval, not true or false.
	if flagArg, value, ok := switchValueApart(fs, args); ok && strings.TrimLeft(flagArg, "-") != "watch" {
		return o, usageError(fs, fmt.Sprintf("invalid %s %s: a switch takes its value after '=' (valid example: %s=%s)", flagArg, value, flagArg, value))
	}
	if fs.NArg() > 0 {
		return o, usageError(fs, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	}
	if o.metricsAddr != "" {
		if err := checkListenAddr("--metrics-addr", o.metricsAddr); err != nil {
			return o, usageError(fs, err.Error())
		}
	}
	if o.json && o.metricsAddr != "" {
		return o, usageError(fs, "--json and --metrics-addr cannot be combined")
	}
	// The metrics are read afresh at each scrape, until interrupted.
	if o.watch > 0 && o.metricsAddr != "" {
		return o, usageError(fs, "--watch and --metrics-addr cannot be combined")
	}
	return o, nil
}

func statMain(args []string) int {
	o, err := parseStatFlags(args, os.Stdout)
	if err != nil {
		return reportFlagError("stat", err)
	}
	dirs, err := statDirs()
	if errors.As(err, new(*config.Error)) {
		// A variable set wrong is the caller's to fix, as a bad flag is,
		// and said as run and trace say one.
		return reportFlagError("stat", &usageErr{environmentLines(err)})
	}
	lib, nvmlErr := openNVML()
	if nvmlErr != nil {
		fmt.Fprintf(os.Stderr, "spillway stat: %v\n", nvmlErr)
		return 1
	}
	defer lib.Shutdown()
	if errors.Is(err, stat.ErrNoRuntimeDir) {
		// The caller's processes publish nowhere either (the shim says so
		// at info): NVML's view is all there is to show, and no error.
		fmt.Fprintf(os.Stderr, "spillway stat: %v; your processes publish figures only where SPILLWAY_RUNTIME_DIR names (set it here too to read them); showing what NVML reports\n", err)
	}
	warnWritableByOthers(os.Stderr, dirs)
	var files stat.Reader // one for every refresh: it keeps what it learned of other PID namespaces
	snapshot := func() (*statReport, error) {
		return collect(lib, &files, dirs)
	}
	if o.metricsAddr != "" {
		return serveStatMetrics(o.metricsAddr, snapshot)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	for {
		r, err := snapshot()
		if err != nil {
			fmt.Fprintf(os.Stderr, "spillway stat: %v\n", err)
			return 1
		}
		if o.json {
			data, _ := json.Marshal(r)
			os.Stdout.Write(append(data, '\n'))
		} else {
			if o.watch > 0 && isTTY(os.Stdout) {
				io.WriteString(os.Stdout, "\x1b[H\x1b[2J") // redraw from the top, as watch(1) does
			}
			writeStatTable(os.Stdout, r)
		}
		for _, e := range r.unreadable {
			fmt.Fprintf(os.Stderr, "spillway stat: %v\n", e)
		}
		if o.watch == 0 {
			return 0
		}
		select {
		case <-time.After(o.watch):
		case <-sigs:
			return 0
		}
	}
}

// gpuMemory is a GPU's total and used bytes as NVML's second memory query
// gives them, as nvidia-smi shows them: used leaves out what the driver
// reserves for itself, which the first query (for older drivers, that lack
// the second) counts as used, hundreds of MiB on an idle GPU.
func gpuMemory(dev nvml.Device) (total, used uint64) {
	if mem, ret := dev.GetMemoryInfo_v2(); ret == nvml.SUCCESS {
		return mem.Total, mem.Used
	}
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		return mem.Total, mem.Used
	}
	return 0, 0
}

// openNVML loads and initialises NVML, or says in one line why not.
func openNVML() (nvml.Interface, error) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, errors.New("cannot load NVML (libnvidia-ml.so.1): is the NVIDIA driver installed and on the library path?")
		}
		return nil, fmt.Errorf("cannot initialise NVML: %s", nvml.ErrorString(ret))
	}
	return lib, nil
}

// statDirs are the runtime directories to read: the caller's, and as root
// every user's. SPILLWAY_RUNTIME_DIR is checked as the shim checks it: a
// value the shim refuses would show no process, not an error. Without it
// or an absolute XDG_RUNTIME_DIR, a user other than root has none
// (stat.ErrNoRuntimeDir).
func statDirs() ([]string, error) {
	if d, ok := os.LookupEnv(config.EnvRuntimeDir); ok {
		d, err := config.ParseRuntimeDir(config.EnvRuntimeDir, d)
		if err != nil {
			return nil, err
		}
		return []string{d}, nil
	}
	d, err := stat.DefaultDir(os.Geteuid(), os.Getenv("XDG_RUNTIME_DIR"))
	if err != nil {
		return nil, err // stat.ErrNoRuntimeDir: no folder to read
	}
	dirs := []string{d}
	if os.Geteuid() == 0 {
		users, _ := filepath.Glob("/run/user/*/spillway")
		dirs = append(dirs, users...)
	}
	return dirs, nil
}

// warnWritableByOthers names on w, once, each folder of dirs that every
// user can write and that is not sticky: any of them can remove a job's
// figures file there, or replace it with one of theirs (which is refused
// as another user's, and the job is no longer listed).
func warnWritableByOthers(w io.Writer, dirs []string) {
	for _, dir := range dirs {
		info, err := os.Stat(dir)
		if err != nil || !info.IsDir() {
			continue // a missing folder lists nothing; an unreadable one is named at each refresh
		}
		if mode := info.Mode(); mode.Perm()&0o002 != 0 && mode&os.ModeSticky == 0 {
			fmt.Fprintf(w, "spillway stat: warning: %s (mode %04o) is writable by every user and not sticky: any of them can remove or replace the figures files in it; make it 0700\n",
				dir, mode.Perm())
		}
	}
}

// statReport is spillway stat's JSON document.
type statReport struct {
	Time       time.Time `json:"time"`
	Devices    []statGPU `json:"devices"`
	unreadable []error   // files that could not be read (another user's)
}

// statGPU is one device: NVML's view and the processes on it.
type statGPU struct {
	Index      int           `json:"index"` // -1: a device the processes name that NVML does not list
	Name       string        `json:"name"`
	UUID       string        `json:"uuid"`
	PCIBusID   string        `json:"pci_bus_id"`
	TotalBytes uint64        `json:"total_bytes"`
	UsedBytes  uint64        `json:"used_bytes"`
	Processes  []statProcess `json:"processes"`
}

// statProcess is one process on a device: Spillway's figures when it
// publishes them, NVML's when NVML lists it.
type statProcess struct {
	PID int `json:"pid"`
	// PIDInItsNamespace: PID is as the process sees it in another PID
	// namespace, which this /proc does not show (its file's lock says it
	// lives): not the PID NVML would list it under.
	PIDInItsNamespace bool `json:"pid_in_its_namespace"`
	// PIDNamespace: that namespace (its inode), when PIDInItsNamespace.
	PIDNamespace  uint64       `json:"pid_namespace,omitempty"`
	Command       string       `json:"command"`
	Updated       *time.Time   `json:"updated"`              // when the process last refreshed its figures
	Spillway      *stat.Device `json:"spillway"`             // null: not running under Spillway (or not readable)
	NVMLUsedBytes *uint64      `json:"nvml_used_bytes"`      // null: NVML does not list it on this device
	MatchedBy     string       `json:"matched_by,omitempty"` // how its figures found this device: pci_bus_id, or index
}

// How a process's published device is matched to NVML's.
const (
	matchedByPCI   = "pci_bus_id" // the location the process's CUDA gave: the same GPU whatever its ordinal there
	matchedByIndex = "index"      // the process published no location: its ordinal, which CUDA_VISIBLE_DEVICES may renumber
)

// figuresReader reads the figures files of runtime directories (a
// stat.Reader).
type figuresReader interface {
	ReadDirs(dirs ...string) ([]stat.Process, []error)
}

// collect joins NVML's devices and processes with the files published in
// dirs, read by files.
// A published device is matched to NVML's by its PCI location, which names
// the same GPU whatever ordinal the process's CUDA_VISIBLE_DEVICES gave it;
// by its ordinal only when the process published no location.
func collect(lib nvml.Interface, files figuresReader, dirs []string) (*statReport, error) {
	r := &statReport{Time: time.Now()}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML device count: %s", nvml.ErrorString(ret))
	}
	gpus := map[int]*statGPU{}
	byPCI := map[stat.PCILocation]*statGPU{}
	for i := range count {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML device %d: %s", i, nvml.ErrorString(ret))
		}
		g := &statGPU{Index: i, Processes: []statProcess{}} // [] in JSON when none
		g.Name, _ = dev.GetName()
		g.UUID, _ = dev.GetUUID()
		if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS && pci.Bus <= 0xff && pci.Device <= 0xff {
			loc := stat.PCILocation{Domain: pci.Domain, Bus: uint8(pci.Bus), Device: uint8(pci.Device)}
			byPCI[loc] = g
			text, _ := loc.MarshalText()
			g.PCIBusID = string(text)
		}
		g.TotalBytes, g.UsedBytes = gpuMemory(dev)
		procs, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
			return nil, fmt.Errorf("NVML processes on device %d: %s", i, nvml.ErrorString(ret))
		}
		for _, p := range procs {
			used := p.UsedGpuMemory
			g.Processes = append(g.Processes, statProcess{PID: int(p.Pid), NVMLUsedBytes: &used})
		}
		gpus[i] = g
	}
	seen := map[int]bool{}
	var unlisted []*statGPU
	procs, errs := files.ReadDirs(dirs...)
	r.unreadable = errs
	for _, p := range procs {
		if !p.PIDInItsNamespace { // PIDs of other namespaces may repeat, each another process
			if seen[p.PID] {
				continue
			}
			seen[p.PID] = true
		}
		for _, d := range p.Devices {
			var g *statGPU
			by := matchedByPCI
			switch {
			case d.PCI != nil:
				if g = byPCI[*d.PCI]; g == nil { // a location NVML does not list
					text, _ := d.PCI.MarshalText()
					g = &statGPU{Index: -1, PCIBusID: string(text)}
					byPCI[*d.PCI] = g
					unlisted = append(unlisted, g)
				}
			case gpus[d.Ordinal] != nil:
				g, by = gpus[d.Ordinal], matchedByIndex
			default: // an ordinal NVML does not know
				g, by = &statGPU{Index: d.Ordinal}, matchedByIndex
				gpus[d.Ordinal] = g
			}
			g.attach(p, d, by)
		}
	}
	all := unlisted
	for _, g := range gpus {
		all = append(all, g)
	}
	for _, g := range all {
		for i := range g.Processes {
			if g.Processes[i].Command == "" && !g.Processes[i].PIDInItsNamespace {
				g.Processes[i].Command = processCommand(g.Processes[i].PID)
			}
		}
		sort.Slice(g.Processes, func(a, b int) bool { return g.Processes[a].PID < g.Processes[b].PID })
		r.Devices = append(r.Devices, *g)
	}
	sort.Slice(r.Devices, func(a, b int) bool {
		da, db := &r.Devices[a], &r.Devices[b]
		if (da.Index < 0) != (db.Index < 0) {
			return db.Index < 0 // NVML's devices first
		}
		return da.Index < db.Index || da.Index == db.Index && da.PCIBusID < db.PCIBusID
	})
	return r, nil
}

func (g *statGPU) attach(p stat.Process, d stat.Device, by string) {
	updated := p.Updated
	for i := range g.Processes {
		// NVML's processes are this namespace's: a PID of another is not theirs.
		if q := &g.Processes[i]; q.PID == p.PID && !q.PIDInItsNamespace && !p.PIDInItsNamespace {
			q.Command, q.Spillway, q.Updated, q.MatchedBy = p.Command, &d, &updated, by
			return
		}
	}
	g.Processes = append(g.Processes, statProcess{PID: p.PID, PIDInItsNamespace: p.PIDInItsNamespace, PIDNamespace: p.PIDNamespace, Command: p.Command,
		Updated: &updated, Spillway: &d, MatchedBy: by})
}

// processCommand is a process's command name, or "?" when it cannot be read.
func processCommand(pid int) string {
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(comm))
}

// writeStatTable prints one table per device.
func writeStatTable(w io.Writer, r *statReport) {
	if len(r.Devices) == 0 {
		fmt.Fprintln(w, "no GPU")
		return
	}
	for i, g := range r.Devices {
		if i > 0 {
			fmt.Fprintln(w)
		}
		index, name := strconv.Itoa(g.Index), printable(g.Name)
		if g.Index < 0 {
			index = "?"
		}
		if name == "" {
			name = "(not listed by NVML)"
		}
		fmt.Fprintf(w, "GPU %s  %s  %s  %s used of %s\n", index, name, g.UUID,
			config.FormatBytes(g.UsedBytes), config.FormatBytes(g.TotalBytes))
		if g.UUID == "" && g.PCIBusID != "" {
			fmt.Fprintf(w, "  at PCI %s\n", g.PCIBusID)
		}
		if len(g.Processes) == 0 {
			fmt.Fprintln(w, "  no process")
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "PID\tCOMMAND\tQUOTA\tUSED\tCACHED\tSPILLED\tREFUSED\tNVML\t")
		for _, p := range g.Processes {
			quota, used, cached, spilled, refused := "-", "-", "-", "-", "-"
			if s := p.Spillway; s != nil {
				quota = "none"
				if s.Limited {
					quota = config.FormatBytes(s.Quota)
				}
				used, cached = config.FormatBytes(s.Used), config.FormatBytes(s.Cached)
				// Host memory now, whoever placed it there: the pool or
				// the program's own cuMemCreate.
				spilled, refused = config.FormatBytes(s.Spilled+s.HostOutside), strconv.FormatUint(s.Refused, 10)
			}
			nv := "-"
			if p.NVMLUsedBytes != nil {
				nv = config.FormatBytes(*p.NVMLUsedBytes)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", p.PID, printable(p.Command), quota, used, cached, spilled, refused, nv)
		}
		tw.Flush()
		for _, p := range g.Processes {
			if p.MatchedBy == matchedByIndex {
				fmt.Fprintf(w, "  PID %d is shown by its device ordinal %d: it published no PCI location (wrong if CUDA_VISIBLE_DEVICES renumbers its devices)\n",
					p.PID, p.Spillway.Ordinal)
			}
			if p.PIDInItsNamespace {
				fmt.Fprintf(w, "  PID %d (%s) is its PID in another PID namespace, where this /proc cannot find it\n", p.PID, printable(p.Command))
			}
		}
	}
}

// printable is s for the table, its control characters shown as '?': a
// process may name itself anything, and a newline, a tab or a terminal
// escape in its name would break the table's rows and columns, or clear
// the screen.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s)
}

// serveStatMetrics serves the figures at http://addr/metrics until SIGINT
// or SIGTERM.
func serveStatMetrics(addr string, snapshot func() (*statReport, error)) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "spillway stat: --metrics-addr %s: %v\n", addr, err)
		return 1
	}
	var mu sync.Mutex // NVML calls, and the figures' reader, for one request at a time
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		r, err := snapshot()
		mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		writeStatMetrics(w, r)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	fmt.Fprintf(os.Stderr, "spillway stat: serving metrics at http://%s/metrics\n", ln.Addr())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	<-sigs
	srv.Close()
	return 0
}

// writeStatMetrics writes the figures in the Prometheus text format, named
// and labelled as dcgm-exporter does (gpu, UUID, modelName; pid).
func writeStatMetrics(w io.Writer, r *statReport) {
	type metric struct {
		name, kind, help string
		gpu              func(g *statGPU) (uint64, bool)
		proc             func(p *statProcess) (uint64, bool)
	}
	spill := func(f func(s *stat.Device) uint64) func(p *statProcess) (uint64, bool) {
		return func(p *statProcess) (uint64, bool) {
			if p.Spillway == nil {
				return 0, false
			}
			return f(p.Spillway), true
		}
	}
	metrics := []metric{
		{name: "spillway_gpu_memory_total_bytes", kind: "gauge", help: "Device memory, as NVML reports it.",
			gpu: func(g *statGPU) (uint64, bool) { return g.TotalBytes, g.UUID != "" }},
		{name: "spillway_gpu_memory_used_bytes", kind: "gauge", help: "Device memory in use by all processes, as NVML reports it.",
			gpu: func(g *statGPU) (uint64, bool) { return g.UsedBytes, g.UUID != "" }},
		{name: "spillway_process_nvml_used_bytes", kind: "gauge", help: "Device memory NVML attributes to the process.",
			proc: func(p *statProcess) (uint64, bool) {
				if p.NVMLUsedBytes == nil {
					return 0, false
				}
				return *p.NVMLUsedBytes, true
			}},
		{name: "spillway_process_quota_bytes", kind: "gauge", help: "The process's quota on the device (its total when it has none).",
			proc: spill(func(s *stat.Device) uint64 { return s.Quota })},
		{name: "spillway_process_used_bytes", kind: "gauge", help: "Device memory the process holds against its quota.",
			proc: spill(func(s *stat.Device) uint64 { return s.Used })},
		{name: "spillway_process_pool_reserved_bytes", kind: "gauge", help: "Device memory the process's pool holds, in use or cached.",
			proc: spill(func(s *stat.Device) uint64 { return s.Reserved })},
		{name: "spillway_process_pool_cached_bytes", kind: "gauge", help: "Device memory the process's pool holds but the application does not use.",
			proc: spill(func(s *stat.Device) uint64 { return s.Cached })},
		{name: "spillway_process_live_bytes", kind: "gauge", help: "Memory in use by the application, device and host.",
			proc: spill(func(s *stat.Device) uint64 { return s.Live })},
		{name: "spillway_process_spilled_bytes", kind: "gauge", help: "Memory served from the host now.",
			proc: spill(func(s *stat.Device) uint64 { return s.Spilled })},
		{name: "spillway_process_host_outside_bytes", kind: "gauge", help: "The program's own physical memory (cuMemCreate) placed on the host now.",
			proc: spill(func(s *stat.Device) uint64 { return s.HostOutside })},
		{name: "spillway_process_spilled_bytes_total", kind: "counter", help: "Memory ever served from the host.",
			proc: spill(func(s *stat.Device) uint64 { return s.SpilledTotal })},
		{name: "spillway_process_promoted_bytes_total", kind: "counter", help: "Spilled memory ever moved back to the device.",
			proc: spill(func(s *stat.Device) uint64 { return s.PromotedTotal })},
		{name: "spillway_process_refusals_total", kind: "counter", help: "Allocations refused: at the quota, at the host limit, or with the device itself full below the quota.",
			proc: spill(func(s *stat.Device) uint64 { return s.Refused })},
		{name: "spillway_process_backing_errors_total", kind: "counter", help: "Failed CUDA calls the pool recovered from.",
			proc: spill(func(s *stat.Device) uint64 { return s.BackingErrors })},
	}
	for _, m := range metrics {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, m.kind)
		for i := range r.Devices {
			g := &r.Devices[i]
			labels := fmt.Sprintf(`gpu="%d",UUID="%s",modelName="%s"`, g.Index, promLabel(g.UUID), promLabel(g.Name))
			if m.gpu != nil {
				if v, ok := m.gpu(g); ok {
					fmt.Fprintf(w, "%s{%s} %d\n", m.name, labels, v)
				}
				continue
			}
			for j := range g.Processes {
				p := &g.Processes[j]
				if v, ok := m.proc(p); ok {
					pid := fmt.Sprintf(`pid="%d"`, p.PID)
					if p.PIDInItsNamespace { // its own namespace's PID, which another may repeat
						pid += fmt.Sprintf(`,pid_namespace="%d"`, p.PIDNamespace)
					}
					fmt.Fprintf(w, "%s{%s,%s,command=\"%s\"} %d\n", m.name, labels, pid, promLabel(p.Command), v)
				}
			}
		}
	}
}

// promLabelEscaper escapes a label value as the Prometheus text format
// does, and only so: Go's quoting writes \t or \x01, which a scraper
// refuses, failing the whole scrape.
var promLabelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// promLabel is v as a label value: escaped, and UTF-8 (a command name may
// hold any bytes; those that are not UTF-8 become U+FFFD).
func promLabel(v string) string {
	return promLabelEscaper.Replace(strings.ToValidUTF8(v, "\uFFFD"))
}
