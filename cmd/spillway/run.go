package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-gpu/spillway/shim/config"
)

// staticTLSTunable gives the late dlopen of the Go core room in the static
// TLS block even in processes whose libraries used up glibc's default surplus.
const staticTLSTunable = "glibc.rtld.optional_static_tls=16384"

// launchOptions says how to start a program under the shim. Empty fields
// leave the corresponding variables as the environment has them.
type launchOptions struct {
	Lib          string               // libspillway.so, as findLib found it
	MemoryLimit  *config.Limit        // SPILLWAY_MEMORY_LIMIT
	DeviceLimits map[int]config.Limit // SPILLWAY_MEMORY_LIMIT_<n>
	LogLevel     config.Level         // SPILLWAY_LOG_LEVEL
	Env          []string             // further KEY=VALUE entries, applied last
}

// startUnderShim starts argv with the shim preloaded and the options turned
// into variables; stdio is the caller's. The caller waits (see
// signalForwarder). Its errors are all the command's: the shim was found
// before (findLib).
func startUnderShim(opts launchOptions, argv []string) (*exec.Cmd, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command to run")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, err
	}
	env := shimEnvironment(opts, os.Environ())
	env.set("LD_PRELOAD", prependList(opts.Lib, env.get("LD_PRELOAD")))
	env.set("GLIBC_TUNABLES", withTunable(env.get("GLIBC_TUNABLES")))
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = env.list()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// If this launcher dies, even by SIGKILL, the kernel kills the job
	// rather than leave it running unsupervised.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// shimEnvironment is environ with the options turned into variables.
func shimEnvironment(opts launchOptions, inherited []string) environ {
	env := environ(append([]string(nil), inherited...))
	if opts.MemoryLimit != nil {
		env.set(config.EnvMemoryLimit, limitValue(*opts.MemoryLimit))
	}
	for n, l := range opts.DeviceLimits {
		env.set(config.EnvMemoryLimitDevicePrefix+strconv.Itoa(n), limitValue(l))
	}
	if opts.LogLevel != "" {
		env.set(config.EnvLogLevel, string(opts.LogLevel))
	}
	for _, kv := range opts.Env {
		k, v, _ := strings.Cut(kv, "=")
		env.set(k, v)
	}
	return env
}

// checkSharedObject fails unless path is a regular file that starts as an
// ELF object does: the dynamic loader ignores anything else in LD_PRELOAD,
// and the job would run without the shim, and without its quota.
func checkSharedObject(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a file", path)
	}
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil || string(magic) != "\x7fELF" {
		return fmt.Errorf("%s is not a shared object (no ELF header)", path)
	}
	return nil
}

// findLib returns the absolute path of the front, checking that the core
// is beside it (the front loads it from there).
func findLib(lib string) (string, error) {
	if lib == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("locating the shim: %w (use --lib)", err)
		}
		if exe, err = filepath.EvalSymlinks(exe); err != nil {
			return "", fmt.Errorf("locating the shim: %w (use --lib)", err)
		}
		lib = filepath.Join(filepath.Dir(exe), "..", "lib", "libspillway.so")
	}
	lib, err := filepath.Abs(lib)
	if err != nil {
		return "", err
	}
	if err := checkSharedObject(lib); err != nil {
		return "", fmt.Errorf("the shim library: %w (use --lib PATH of libspillway.so)", err)
	}
	core := filepath.Join(filepath.Dir(lib), "libspillway-core.so")
	if _, err := os.Stat(core); err != nil && os.Getenv("SPILLWAY_CORE") == "" {
		return "", fmt.Errorf("the shim's core must sit beside %s: %w", lib, err)
	}
	return lib, nil
}

// checkShimFiles checks the files the shim's variables in env name, as the
// shim will find them: a SPILLWAY_CORE the front cannot load leaves the job
// without its quota (every allocation refused) or without Spillway at all,
// and a SPILLWAY_LOG_FILE the core cannot open refuses every allocation.
func checkShimFiles(env []string) error {
	// A name without a slash is searched on the library path by the
	// front's dlopen, which only the loader can answer for.
	if path := environ(env).get(config.EnvCore); strings.Contains(path, "/") {
		if err := checkSharedObject(path); err != nil {
			return &config.Error{Name: config.EnvCore, Value: path, Reason: err.Error(),
				Example: config.EnvCore + "=/opt/spillway/lib/libspillway-core.so"}
		}
	}
	if path := environ(env).get(config.EnvLogFile); path != "" {
		if err := checkWritable(path); err != nil {
			return &config.Error{Name: config.EnvLogFile, Value: path, Reason: err.Error(),
				Example: config.EnvLogFile + "=/tmp/spillway.log"}
		}
	}
	return nil
}

func limitValue(l config.Limit) string {
	if l.Percent > 0 {
		return l.String()
	}
	return strconv.FormatUint(l.Bytes, 10)
}

func prependList(item, list string) string {
	if list == "" {
		return item
	}
	return item + ":" + list
}

func withTunable(tunables string) string {
	if strings.Contains(tunables, "glibc.rtld.optional_static_tls=") {
		return tunables // the user's choice wins
	}
	if tunables == "" {
		return staticTLSTunable
	}
	return tunables + ":" + staticTLSTunable
}

// forwarded are the signals passed on to the child. SIGINT and SIGQUIT
// typed at the terminal already reach the child (same foreground process
// group), so they are forwarded only when spillway is not in the foreground
// of its controlling terminal, whatever its stdin: with none, in the
// background, or in a session of its own. In the foreground, one sent with
// kill is not forwarded either: a caught signal does not say who sent it.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2,
	syscall.SIGWINCH, syscall.SIGCONT}

// signalForwarder catches the signals to pass on from before the child
// starts, so that none sent in between is lost or kills the launcher.
type signalForwarder struct {
	ch  chan os.Signal
	tty *os.File // the controlling terminal; nil without one
}

func catchSignals() *signalForwarder {
	f := &signalForwarder{ch: make(chan os.Signal, 8), tty: controllingTerminal()}
	// Caught, not ignored, even when they are not passed on: an ignored
	// signal would stay ignored in the child. SIGHUP or SIGINT this process
	// was started ignoring (nohup, a background job of a script) is left so,
	// for the child to inherit: catching it would undo nohup. Go keeps no
	// such record of the others, which its runtime handles from the start.
	for _, s := range append(forwarded, syscall.SIGINT, syscall.SIGQUIT) {
		if !signal.Ignored(s) {
			signal.Notify(f.ch, s)
		}
	}
	return f
}

// stop stops catching. Until then a signal that arrives once the child
// has exited is caught and dropped: what the caller does after the child
// (spillway trace writing its summary) is not cut short.
func (f *signalForwarder) stop() {
	signal.Stop(f.ch)
	if f.tty != nil {
		f.tty.Close()
	}
}

// wait waits for cmd, passing signals on to it, and returns the status to
// exit with: the child's, or 128+signal if a signal killed it.
func (f *signalForwarder) wait(cmd *exec.Cmd) int {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-f.ch:
				// Asked when the signal comes: the job may have been moved
				// between foreground and background since it started.
				if (s == syscall.SIGINT || s == syscall.SIGQUIT) && inTerminalForeground(f.tty) {
					continue // the terminal sent it to the child as well
				}
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	return exitStatus(cmd, err)
}

func exitStatus(cmd *exec.Cmd, err error) int {
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		if ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
	if err != nil {
		return 1
	}
	return 0
}

// controllingTerminal opens this process's controlling terminal, the one
// that sends ^C to its foreground even when stdin is not it (a job run
// "< /dev/null" at a shell prompt); nil without one.
func controllingTerminal() *os.File {
	tty, err := os.Open("/dev/tty")
	if err != nil {
		return nil
	}
	return tty
}

// inTerminalForeground reports whether tty, a terminal or nil, has this
// process's group in its foreground: then what is typed at it (^C, ^\)
// reaches the child directly.
func inTerminalForeground(tty *os.File) bool {
	if tty == nil {
		return false
	}
	fg, err := unix.IoctlGetInt(int(tty.Fd()), unix.TIOCGPGRP)
	return err == nil && fg == unix.Getpgrp()
}

// deviceLimits collects repeated --memory-limit-device N=SIZE flags,
// keeping each size as typed for messages.
type deviceLimits struct {
	limits map[int]config.Limit
	typed  map[int]string
}

func newDeviceLimits() *deviceLimits {
	return &deviceLimits{limits: map[int]config.Limit{}, typed: map[int]string{}}
}

func (d *deviceLimits) String() string {
	if d == nil {
		return ""
	}
	keys := make([]int, 0, len(d.typed))
	for k := range d.typed {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = strconv.Itoa(k) + "=" + d.typed[k]
	}
	return strings.Join(parts, ",")
}

func (d *deviceLimits) repeatable() {}

func (d *deviceLimits) Set(v string) error {
	n, size, hasSize := strings.Cut(v, "=")
	ordinal, ok := config.ParseOrdinal(n)
	if !hasSize || !ok {
		return fmt.Errorf("invalid --memory-limit-device=%q: want DEVICE=SIZE with DEVICE from 0 to 1023 (valid example: --memory-limit-device 0=8GiB)", v)
	}
	if first, given := d.typed[ordinal]; given {
		// The last would win, and may be the larger.
		had := fmt.Sprintf("%d=%s", ordinal, first)
		return fmt.Errorf("invalid --memory-limit-device=%q: device %d has a quota already (%s); give each device once (valid example: --memory-limit-device %s)",
			v, ordinal, had, had)
	}
	l, err := config.ParseLimit("--memory-limit-device", size)
	if cerr := (*config.Error)(nil); errors.As(err, &cerr) {
		// The value as typed, and an example of the DEVICE=SIZE form.
		e := *cerr
		e.Value, e.Example = v, fmt.Sprintf("--memory-limit-device %d=8GiB", ordinal)
		return &e
	} else if err != nil {
		return err
	}
	d.limits[ordinal], d.typed[ordinal] = l, size
	return nil
}

type limitFlag struct {
	l     *config.Limit
	typed string
}

func (f *limitFlag) String() string {
	if f == nil || f.l == nil {
		return ""
	}
	return f.typed
}

func (f *limitFlag) Set(v string) error {
	l, err := config.ParseLimit("--memory-limit", v)
	if err != nil {
		return err
	}
	f.l, f.typed = &l, v
	return nil
}

type levelFlag struct{ level config.Level }

func (f *levelFlag) String() string {
	if f == nil {
		return ""
	}
	return string(f.level)
}

func (f *levelFlag) Set(v string) error {
	l, err := config.ParseLevel("--log-level", v)
	f.level = l
	return err
}

const runUsage = `usage: spillway run [flags] -- CMD ARGS...

Runs CMD with the shim preloaded (LD_PRELOAD), each flag setting the
SPILLWAY_* variable of the same name; flags are checked as the shim checks
the variables, together, before anything runs. Signals are forwarded; the
exit status is CMD's, or 128+N if signal N killed it. If spillway itself is
killed, CMD is killed too.

`

// runOptions are spillway run's parsed flags.
type runOptions struct {
	launch   launchOptions
	argv     []string
	disabled bool // SPILLWAY_DISABLE=1 is inherited: the shim will do nothing
}

// disabledNotice is said when a program is started under the shim with
// SPILLWAY_DISABLE=1 inherited, which no flag overrides: a quota asked for
// would otherwise go unenforced without a word.
const disabledNotice = "SPILLWAY_DISABLE=1 in the environment turns Spillway off: the program runs with no quota, no pool and no oversubscription, whatever the flags say"

func parseRunFlags(args []string, environ []string, out io.Writer) (runOptions, error) {
	var o runOptions
	fs := newFlagSet("run", runUsage, out)
	limit := &limitFlag{}
	devices := newDeviceLimits()
	level := &levelFlag{}
	fs.Var(limit, "memory-limit", "device memory quota for every device: a `SIZE` (512MiB, 8GiB, 8GB, 0.5GiB) or a percentage (50%)")
	fs.Var(devices, "memory-limit-device", "quota for one device, as `N=SIZE` (repeatable; wins over --memory-limit)")
	fs.Var(level, "log-level", "the shim's log `LEVEL`: error, warn (default), info or debug")
	fs.Var(libFlag(&o.launch.Lib), "lib", "`PATH` of libspillway.so (default: ../lib/libspillway.so beside this binary)")
	shimFlags := shimVariableFlags(fs)
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
	if len(o.argv) == 0 {
		return o, usageError(fs, "no command given: spillway run [flags] -- CMD ARGS...")
	}
	if o.launch.Lib != "" {
		if _, err := findLib(o.launch.Lib); err != nil {
			return o, usageError(fs, fmt.Sprintf("invalid --lib=%q: %v", o.launch.Lib, err))
		}
	}
	o.launch.MemoryLimit, o.launch.DeviceLimits, o.launch.LogLevel = limit.l, devices.limits, level.level
	o.launch.Env = shimFlags.variables(fs)
	cfg, err := checkCombination(o.launch, environ, shimFlags, limit, devices)
	if err != nil {
		return o, err
	}
	if err := checkDevicesOverride(cfg, environ, limit, devices); err != nil {
		return o, err
	}
	o.disabled = cfg.Disable
	if err := checkShimFiles(environ); err != nil {
		return o, usageError(fs, environmentLines(err))
	}
	return o, nil
}

// environmentLines writes the errors in err (those config.Parse joined, or
// err alone) one a line, each marked as found in the environment the
// command inherited, where a flag's would name the flag.
func environmentLines(err error) string {
	var lines []string
	for _, err := range config.Errors(err) {
		lines = append(lines, err.Error()+" (in the environment)")
	}
	return strings.Join(lines, "\n")
}

// checkCombination validates the environment the job will get, flags and
// inherited SPILLWAY_* variables together, with the shim's own rules; an
// error about a flag names the flag and shows its value as typed. Every
// invalid setting is reported, one line each.
func checkCombination(opts launchOptions, environ []string, flags variableFlags, limit *limitFlag, devices *deviceLimits) (config.Config, error) {
	env := shimEnvironment(opts, environ)
	cfg, err := config.Parse(env.list())
	if err == nil {
		return cfg, nil
	}
	typed := map[string][2]string{} // variable -> flag, value as typed
	var setting []string            // VARIABLE=value, --flag=typed: a flag's setting named in a reason
	for _, f := range flags {
		if f.given {
			typed[f.env] = [2]string{"--" + f.name, f.typed}
			setting = append(setting, f.env+"="+f.value, "--"+f.name+"="+f.typed)
		}
	}
	if limit.l != nil {
		typed[config.EnvMemoryLimit] = [2]string{"--memory-limit", limit.typed}
	}
	for n, v := range devices.typed {
		typed[config.EnvMemoryLimitDevicePrefix+strconv.Itoa(n)] = [2]string{"--memory-limit-device", strconv.Itoa(n) + "=" + v}
	}
	var lines []string
	for _, err := range config.Errors(err) {
		var cerr *config.Error
		if !errors.As(err, &cerr) {
			return cfg, err
		}
		t, ok := typed[cerr.Name]
		if !ok {
			lines = append(lines, environmentLines(cerr))
			continue
		}
		e := *cerr
		e.Name, e.Value = t[0], t[1]
		e.Reason = strings.NewReplacer(setting...).Replace(e.Reason)
		// The pool's example first: the flags' replacement below would make
		// it "--pool 1", which the command line reads as the program.
		e.Example = strings.ReplaceAll(e.Example, config.EnvPool+"=1", "--pool=true")
		for variable, t := range typed {
			e.Example = strings.ReplaceAll(e.Example, variable+"=", t[0]+" ")
		}
		lines = append(lines, e.Error())
	}
	return cfg, &usageErr{strings.Join(lines, "\n")}
}

// checkDevicesOverride refuses --memory-limit, the quota of every device,
// where a SPILLWAY_MEMORY_LIMIT_<n> inherited from the environment would
// win over it on device n, unseen, and might be the larger: the flags give
// that device its quota (--memory-limit-device), or the variable goes.
func checkDevicesOverride(cfg config.Config, inherited []string, limit *limitFlag, devices *deviceLimits) error {
	if limit.l == nil {
		return nil
	}
	var settings, ordinals, example []string
	for _, n := range cfg.Ordinals() {
		if _, byFlag := devices.limits[n]; byFlag {
			continue
		}
		name := config.EnvMemoryLimitDevicePrefix + strconv.Itoa(n)
		settings = append(settings, name+"="+environ(inherited).get(name))
		ordinals = append(ordinals, strconv.Itoa(n))
		example = append(example, fmt.Sprintf("--memory-limit-device %d=%s", n, limit.typed))
	}
	if len(settings) == 0 {
		return nil
	}
	wins, devicesWord, them, variables := "wins", "device", "it", "the variable"
	if len(settings) > 1 {
		wins, devicesWord, them, variables = "win", "devices", "each", "the variables"
	}
	return &usageErr{fmt.Sprintf("invalid --memory-limit=%q: %s in the environment %s over it on %s %s; give %s its quota with --memory-limit-device, or unset %s (valid example: --memory-limit %s %s)",
		limit.typed, joinAnd(settings), wins, devicesWord, joinAnd(ordinals), them, variables, limit.typed, strings.Join(example, " "))}
}

// joinAnd writes a list as a sentence does: "a", "a and b", "a, b and c".
func joinAnd(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

func runMain(args []string) int {
	o, err := parseRunFlags(args, os.Environ(), os.Stdout)
	if err != nil {
		return reportFlagError("run", err)
	}
	// The launcher's own failure, not the command's: 127 and 126 would say
	// the command was not found or cannot be executed.
	if o.launch.Lib, err = findLib(o.launch.Lib); err != nil {
		fmt.Fprintf(os.Stderr, "spillway run: %v\n", err)
		return 1
	}
	if o.disabled {
		fmt.Fprintln(os.Stderr, "spillway run: "+disabledNotice)
	}
	sigs := catchSignals()
	defer sigs.stop()
	cmd, err := startUnderShim(o.launch, o.argv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "spillway run: %v\n", err)
		return cannotRun(err)
	}
	return sigs.wait(cmd)
}

// cannotRun is the status for a command that could not be started, as a
// shell gives it: 126 for one found but not executable (a directory, no
// permission, not a program), 127 otherwise (not found).
func cannotRun(err error) int {
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOEXEC) || errors.Is(err, syscall.EISDIR) {
		return 126
	}
	return 127
}

// variableFlag is a flag that sets one SPILLWAY_* variable, validated as
// the shim validates it, and only when given.
type variableFlag struct {
	name  string
	env   string
	value string
	check func(name, value string) error
	bool  bool
	given bool
	typed string // the value as typed, for messages
}

func (f *variableFlag) String() string {
	if f == nil {
		return ""
	}
	return f.value
}
func (f *variableFlag) IsBoolFlag() bool { return f.bool }

func (f *variableFlag) Set(v string) error {
	f.typed = v
	if f.bool {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New(badSwitch("--"+f.name, v))
		}
		v = "0"
		if b {
			v = "1"
		}
	} else if err := f.check("--"+f.name, v); err != nil {
		return err
	}
	f.value, f.given = v, true
	return nil
}

type variableFlags map[string]*variableFlag

// shimVariableFlags declares the flags of the pool and of oversubscription.
func shimVariableFlags(fs *flagSet) variableFlags {
	size := func(name, v string) error { _, err := config.ParseSize(name, v); return err }
	threshold := func(name, v string) error { _, err := config.ParseThreshold(name, v); return err }
	spill := func(name, v string) error { _, err := config.ParseSpill(name, v); return err }
	flags := variableFlags{}
	for _, d := range []struct {
		name, env, usage string
		check            func(name, value string) error
	}{
		{"oversubscribe", config.EnvOversubscribe, "serve what the quota cannot hold from host memory (SPILLWAY_OVERSUBSCRIBE=1)", nil},
		{"spill", config.EnvSpill, "how spilled memory is made: `KIND` managed (default) or pinned; needs --oversubscribe", spill},
		{"migrate", config.EnvMigrate, "move live blocks' 2 MiB granules between host and device at the program's device synchronizations (SPILLWAY_MIGRATE=1); needs --oversubscribe and virtual memory, and a program whose other threads queue no work while one synchronizes", nil},
		{"host-limit", config.EnvHostLimit, "most host memory used for spilling, a `SIZE` (default: as much as the quota); needs --oversubscribe", size},
		{"pool", config.EnvPool, "serve allocations from the pool (default true; --pool=false: pass-through with the quota's accounting)", nil},
		{"pool-reserve", config.EnvPoolReserve, "device memory, a `SIZE`, the pool reserves at a device's first allocation and keeps; at most the quota", size},
		{"pool-release-threshold", config.EnvPoolReleaseThreshold, "cached memory kept before empty segments are released: a `SIZE` or a percentage of the quota (default 12.5%)", threshold},
		{"vmm", config.EnvVMM, "map the pool's memory in 2 MiB granules with CUDA's virtual memory management where the device supports it (default true; --vmm=false: fixed segments)", nil},
		{"free-sync", config.EnvFreeSync, "every cudaFree synchronizes the device, as CUDA's does", nil},
		{"report", config.EnvReport, "print each device's pool statistics at exit", nil},
	} {
		f := &variableFlag{name: d.name, env: d.env, check: d.check, bool: d.check == nil}
		flags[d.name] = f
		fs.Var(f, d.name, d.usage)
	}
	return flags
}

// variables returns KEY=VALUE for the flags given on the command line.
func (v variableFlags) variables(fs *flagSet) []string {
	var env []string
	fs.Visit(func(f *flag.Flag) {
		if vf, ok := v[f.Name]; ok {
			env = append(env, vf.env+"="+vf.value)
		}
	})
	return env
}

// environ is an environment in os.Environ form with replace-in-place updates.
type environ []string

func (e environ) get(key string) string {
	for _, kv := range e {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

func (e *environ) set(key, value string) {
	for i, kv := range *e {
		if k, _, ok := strings.Cut(kv, "="); ok && k == key {
			(*e)[i] = key + "=" + value
			return
		}
	}
	*e = append(*e, key+"="+value)
}

func (e environ) list() []string { return e }
