// Package config parses and validates the SPILLWAY_* environment variables
// that configure the shim, and the equivalent flags of the spillway command.
//
// It is pure Go and has no side effects: it reads the environment it is
// given, never the process's, and opens no files. Invalid input is an error
// that names the variable, the value and a valid example; nothing is ever
// silently widened (an unparsable quota is never "no quota").
//
// Sizes are a decimal number (a fraction is allowed) followed by an optional
// unit, case-insensitive:
//
//	B or none            bytes
//	K  Ki  KiB           2^10   (binary)
//	M  Mi  MiB           2^20   (binary)
//	G  Gi  GiB           2^30   (binary)
//	T  Ti  TiB           2^40   (binary)
//	KB MB GB TB          10^3, 10^6, 10^9, 10^12 (decimal)
//
// The single letters are binary, as in docker run -m, ulimit and most
// GPU tooling; only the two-letter "B" forms are decimal. A size that is
// not a whole number of bytes (0.1GiB) is rounded up to a multiple of
// AllocationUnit, the unit in which the shim accounts memory.
//
// A limit is either a size or a percentage of the device's real total
// memory ("50%", "12.5%"), in (0, 100].
package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Variable names read by the shim.
const (
	EnvMemoryLimit = "SPILLWAY_MEMORY_LIMIT"
	// EnvMemoryLimitDevicePrefix is followed by a device ordinal:
	// SPILLWAY_MEMORY_LIMIT_0.
	EnvMemoryLimitDevicePrefix = "SPILLWAY_MEMORY_LIMIT_"
	EnvLogLevel                = "SPILLWAY_LOG_LEVEL"
	EnvLogFormat               = "SPILLWAY_LOG_FORMAT"
	EnvLogFile                 = "SPILLWAY_LOG_FILE"
	EnvDisable                 = "SPILLWAY_DISABLE"
	EnvPool                    = "SPILLWAY_POOL"
	EnvPoolReleaseThreshold    = "SPILLWAY_POOL_RELEASE_THRESHOLD"
	EnvPoolReserve             = "SPILLWAY_POOL_RESERVE"
	EnvFreeSync                = "SPILLWAY_FREE_SYNC"
	EnvReport                  = "SPILLWAY_REPORT"
	EnvOversubscribe           = "SPILLWAY_OVERSUBSCRIBE"
	EnvSpill                   = "SPILLWAY_SPILL"
	EnvHostLimit               = "SPILLWAY_HOST_LIMIT"
	// EnvVMM turns the pool's use of CUDA's virtual memory management off
	// (0) or leaves it on where the device supports it (1, the default).
	EnvVMM = "SPILLWAY_VMM"
	// EnvMigrate turns on the migration of live blocks' granules between
	// the device and the host at the application's device
	// synchronizations (1), off by default (0).
	EnvMigrate = "SPILLWAY_MIGRATE"
	// EnvRuntimeDir is the folder of the per-process figures files that
	// `spillway stat` reads (internal/stat).
	EnvRuntimeDir = "SPILLWAY_RUNTIME_DIR"
	// EnvCore overrides the path of the Go core; read by the C front only.
	EnvCore = "SPILLWAY_CORE"
)

// otherKnown are SPILLWAY_* variables owned by other parts of Spillway
// (tracing, the C front). They are validated where they are used; here they
// only keep Parse from calling them unknown.
var otherKnown = map[string]bool{
	"SPILLWAY_REQUIRE_BPF": true,
	EnvCore:                true,
}

// Level is a logging threshold.
type Level string

// Log levels, most to least severe.
const (
	LevelError Level = "error"
	LevelWarn  Level = "warn"
	LevelInfo  Level = "info"
	LevelDebug Level = "debug"
)

// Format is the log line format.
type Format string

// Log formats.
const (
	FormatText Format = "text"
	FormatJSON Format = "json"
)

// Limit is a memory quota: an absolute byte count or a percentage of a
// device's total memory. The zero Limit means "no limit".
type Limit struct {
	Bytes   uint64  // absolute quota; used when Percent is 0
	Percent float64 // in (0, 100]; 0 when the limit is absolute
}

// IsSet reports whether the limit constrains anything.
func (l Limit) IsSet() bool { return l.Bytes > 0 || l.Percent > 0 }

// Resolve returns the quota in bytes for a device of the given total size.
func (l Limit) Resolve(deviceTotal uint64) uint64 {
	if l.Percent == 0 {
		return l.Bytes
	}
	return uint64(math.Floor(float64(deviceTotal) * l.Percent / 100))
}

// String renders the limit the way it would be written.
func (l Limit) String() string {
	switch {
	case l.Percent > 0:
		return strconv.FormatFloat(l.Percent, 'f', -1, 64) + "%"
	case l.Bytes > 0:
		return strconv.FormatUint(l.Bytes, 10)
	}
	return "none"
}

// Spill says how memory spilled to the host is made.
type Spill string

// Spill kinds.
const (
	SpillManaged Spill = "managed" // cudaMallocManaged, preferred on the host
	SpillPinned  Spill = "pinned"  // cudaHostAlloc(cudaHostAllocMapped)
)

// Config is the validated shim configuration.
type Config struct {
	MemoryLimit  Limit         // all devices
	DeviceLimits map[int]Limit // per ordinal; wins over MemoryLimit
	LogLevel     Level
	LogFormat    Format
	LogFile      string // empty: standard error
	Disable      bool

	// Pool serves allocations from pooled segments (default); false passes
	// each one to CUDA, with the quota's accounting.
	Pool bool
	// ReleaseThreshold is the cached memory the pool keeps before it returns
	// empty segments: bytes, or a percentage of the quota. Nil: the pool's
	// default.
	ReleaseThreshold *Limit
	PoolReserve      uint64 // bytes reserved at a device's first allocation; 0: none
	FreeSync         bool   // every cudaFree synchronizes the device
	Report           bool   // one line of pool statistics per device at exit
	Oversubscribe    bool   // spill what the quota cannot hold to host memory
	Spill            Spill
	HostLimit        uint64 // most host memory used for spilling; 0: the pool's default
	// VMM lets the pool map physical granules into reserved address ranges
	// where the device supports CUDA's virtual memory management (default);
	// false: fixed segments everywhere.
	VMM bool
	// Migrate moves granules of live blocks between the device and the
	// host at the application's device synchronizations (pool.Options.Migrate).
	Migrate bool
	// SpillSet says SPILLWAY_SPILL was given (it has no effect without
	// oversubscription).
	SpillSet bool
	// RuntimeDir is where the figures file is published; empty: the default
	// (internal/stat.DefaultDir).
	RuntimeDir string
	// Written holds each SPILLWAY_* variable's value as written, blanks
	// included, by name: a setting found invalid only once a device's total
	// is known is quoted this way, so that it can be found where it was set.
	Written map[string]string
	// Unknown lists SPILLWAY_* variables that no part of Spillway reads,
	// most likely misspellings (spillway_* too: names are read in capitals
	// only); the caller should warn about them.
	Unknown []string
}

// LimitFor returns the limit that applies to a device.
func (c Config) LimitFor(device int) Limit {
	if l, ok := c.DeviceLimits[device]; ok {
		return l
	}
	return c.MemoryLimit
}

// Error is an invalid variable or flag value.
type Error struct {
	Name    string // variable or flag name
	Value   string
	Reason  string
	Example string // a valid setting, written as NAME=VALUE or --flag VALUE
}

func (e *Error) Error() string {
	return fmt.Sprintf("invalid %s=%q: %s (valid example: %s)", e.Name, e.Value, e.Reason, e.Example)
}

// Parse reads the configuration from environment entries in os.Environ
// form ("KEY=VALUE"). It reports every invalid variable at once, so that
// fixing one never reveals the next: one *Error for each, in name order,
// joined with errors.Join (errors.As finds the first; Errors lists them),
// and the zero Config.
func Parse(environ []string) (Config, error) {
	cfg := Config{LogLevel: LevelWarn, LogFormat: FormatText, Pool: true, VMM: true, Spill: SpillManaged}
	env := map[string]string{}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		// Ours in any case: one but for its case (spillway_memory_limit) is
		// read by nothing, and is listed as unknown, not passed over.
		if ok && len(k) >= len("SPILLWAY_") && strings.EqualFold(k[:len("SPILLWAY_")], "SPILLWAY_") {
			env[k] = v
		}
	}
	var errs []error
	poolInvalid := false // the check across variables reads only a valid SPILLWAY_POOL
	// In name order: the errors always come in the same order.
	for _, name := range slices.Sorted(maps.Keys(env)) {
		value := env[name]
		var err error
		switch {
		case name == EnvMemoryLimit:
			cfg.MemoryLimit, err = parseLimitVar(name, value)
		case strings.HasPrefix(name, EnvMemoryLimitDevicePrefix):
			var ordinal int
			ordinal, err = parseOrdinalSuffix(name, value)
			if err == nil {
				var l Limit
				l, err = parseLimitVar(name, value)
				if cfg.DeviceLimits == nil {
					cfg.DeviceLimits = map[int]Limit{}
				}
				cfg.DeviceLimits[ordinal] = l
			}
		case name == EnvLogLevel:
			cfg.LogLevel, err = ParseLevel(name, value)
		case name == EnvLogFormat:
			cfg.LogFormat, err = parseFormat(name, value)
		case name == EnvLogFile:
			if value == "" {
				err = &Error{name, value, "empty; unset it to log to standard error", name + "=/var/log/spillway.log"}
			}
			cfg.LogFile = value
		case name == EnvDisable:
			cfg.Disable, err = parseSwitch(name, value)
		case name == EnvPool:
			cfg.Pool, err = parseSwitch(name, value)
			poolInvalid = err != nil
		case name == EnvPoolReleaseThreshold:
			var l Limit
			l, err = ParseThreshold(name, value)
			cfg.ReleaseThreshold = &l
		case name == EnvPoolReserve:
			cfg.PoolReserve, err = parsePositiveSize(name, value, "a reserve of zero bytes reserves nothing; leave it unset instead")
		case name == EnvFreeSync:
			cfg.FreeSync, err = parseSwitch(name, value)
		case name == EnvVMM:
			cfg.VMM, err = parseSwitch(name, value)
		case name == EnvMigrate:
			cfg.Migrate, err = parseSwitch(name, value)
		case name == EnvReport:
			cfg.Report, err = parseSwitch(name, value)
		case name == EnvOversubscribe:
			cfg.Oversubscribe, err = parseSwitch(name, value)
		case name == EnvSpill:
			cfg.Spill, err = ParseSpill(name, value)
			cfg.SpillSet = true
		case name == EnvRuntimeDir:
			cfg.RuntimeDir, err = ParseRuntimeDir(name, value)
		case name == EnvHostLimit:
			cfg.HostLimit, err = parsePositiveSize(name, value, "a host limit of zero bytes would refuse every spill; leave oversubscription off instead")
		case otherKnown[name]:
		default:
			cfg.Unknown = append(cfg.Unknown, name)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	// An invalid variable has left its field at a value of its own (an
	// invalid SPILLWAY_POOL reads as off, an invalid quota as none): a
	// check that reads one would report what was never set.
	if cfg.PoolReserve > 0 && !cfg.Pool && !poolInvalid {
		errs = append(errs, &Error{EnvPoolReserve, env[EnvPoolReserve], "a reserve needs the pool, but " + EnvPool + "=0",
			EnvPool + "=1 " + EnvPoolReserve + "=4GiB"})
	} else if err := cfg.checkReserve(env[EnvPoolReserve]); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		// The checks across variables are about SPILLWAY_POOL_RESERVE,
		// which is valid when they run: in name order with the others.
		name := func(err error) string {
			if e, ok := err.(*Error); ok {
				return e.Name
			}
			return ""
		}
		slices.SortStableFunc(errs, func(a, b error) int { return strings.Compare(name(a), name(b)) })
		return Config{}, errors.Join(errs...)
	}
	cfg.Written = env
	return cfg, nil
}

// Errors lists the errors in err one by one: those Parse joined, in name
// order, or err alone; nil for nil. A caller reports each on a line of
// its own.
func Errors(err error) []error {
	if err == nil {
		return nil
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		return joined.Unwrap()
	}
	return []error{err}
}

// checkReserve refuses a reserve larger than a quota given in bytes; one
// above a percentage quota is refused when the device's total is known. An
// invalid quota, left as none, is not checked against.
func (c Config) checkReserve(value string) error {
	if c.PoolReserve == 0 {
		return nil
	}
	check := func(l Limit, where string) error {
		if l.Percent == 0 && l.Bytes > 0 && c.PoolReserve > l.Bytes {
			return &Error{EnvPoolReserve, value, LargerThan(c.PoolReserve, l.Bytes, "the quota "+where),
				EnvPoolReserve + "=" + FormatBytes(l.Bytes/2)}
		}
		return nil
	}
	if err := check(c.MemoryLimit, "of every device"); err != nil {
		return err
	}
	for _, n := range c.Ordinals() {
		if err := check(c.DeviceLimits[n], fmt.Sprintf("of device %d", n)); err != nil {
			return err
		}
	}
	return nil
}

// Warnings lists settings that have no effect as given; the caller warns
// about each once.
func (c Config) Warnings() []string {
	var w []string
	if !c.Oversubscribe && c.HostLimit > 0 {
		w = append(w, EnvHostLimit+" has no effect without "+EnvOversubscribe+"=1")
	}
	if !c.Oversubscribe && c.SpillSet {
		w = append(w, EnvSpill+" has no effect without "+EnvOversubscribe+"=1")
	}
	// With the pool off every call goes to CUDA: nothing is cached, and
	// cudaFree synchronizes as CUDA's does.
	if !c.Pool && c.ReleaseThreshold != nil {
		w = append(w, EnvPoolReleaseThreshold+" has no effect with "+EnvPool+"=0")
	}
	if !c.Pool && c.FreeSync {
		w = append(w, EnvFreeSync+" has no effect with "+EnvPool+"=0 (every cudaFree goes to CUDA, which synchronizes)")
	}
	if c.Migrate && !c.Oversubscribe {
		w = append(w, EnvMigrate+" has no effect without "+EnvOversubscribe+"=1")
	} else if c.Migrate && (!c.VMM || !c.Pool) {
		w = append(w, EnvMigrate+" has no effect without virtual memory ("+EnvVMM+"=1 and "+EnvPool+"=1)")
	}
	return w
}

// Ordinals returns the device ordinals that have a limit of their own, in order.
func (c Config) Ordinals() []int { return slices.Sorted(maps.Keys(c.DeviceLimits)) }

// FormatBytes writes a byte count for people: exact in the largest binary
// unit that divides it below 1024 (8GiB, 768MiB), else with one decimal
// (1.5MiB, 976.6KiB); a count below 1KiB in bytes (512B).
func FormatBytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1<<10 {
		return strconv.FormatUint(n, 10) + "B"
	}
	i, v := -1, n
	for v >= 1<<10 && v%(1<<10) == 0 && i < len(units)-1 {
		v >>= 10
		i++
	}
	if i >= 0 && v < 1<<10 {
		return strconv.FormatUint(v, 10) + string(units[i]) + "iB"
	}
	f, j := float64(n), -1
	for f >= 1024 && j < len(units)-1 {
		f /= 1024
		j++
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + string(units[j]) + "iB"
}

// LargerThan says for people that larger bytes exceed limit, the size of
// what ("the quota of device 0"): "larger than the quota of device 0
// (1.6GiB)", with both counts in bytes when FormatBytes writes them alike,
// as one decimal may (1.6GiB against 1.6GiB would not say which is larger).
func LargerThan(larger, limit uint64, what string) string {
	if FormatBytes(larger) != FormatBytes(limit) {
		return fmt.Sprintf("larger than %s (%s)", what, FormatBytes(limit))
	}
	return fmt.Sprintf("%d bytes, larger than %s (%s, %d bytes)", larger, what, FormatBytes(limit), limit)
}

func parseOrdinalSuffix(name, value string) (int, error) {
	n, ok := ParseOrdinal(strings.TrimPrefix(name, EnvMemoryLimitDevicePrefix))
	if !ok {
		return 0, &Error{name, value, "the suffix must be a device ordinal from 0 to 1023", EnvMemoryLimitDevicePrefix + "0=8GiB"}
	}
	return n, nil
}

// ParseOrdinal reads a device ordinal with a quota of its own, from 0 to
// 1023, as SPILLWAY_MEMORY_LIMIT_<n> and spillway run's
// --memory-limit-device write it: digits only, without a leading zero.
func ParseOrdinal(s string) (int, bool) {
	// Digits only: strconv.Atoi would also take a sign, so that
	// SPILLWAY_MEMORY_LIMIT_+1 would be device 1 and _-0 device 0.
	if s == "" || (len(s) > 1 && s[0] == '0') || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > 1023 {
		return 0, false
	}
	return n, true
}

func parseLimitVar(name, value string) (Limit, error) {
	l, reason := parseLimit(value)
	if reason != "" {
		return Limit{}, &Error{name, value, reason, name + "=8GiB"}
	}
	return l, nil
}

// ParseLimit parses a quota given as a flag or variable called name.
func ParseLimit(name, value string) (Limit, error) {
	l, reason := parseLimit(value)
	if reason != "" {
		return Limit{}, &Error{name, value, reason, name + "=8GiB"}
	}
	return l, nil
}

// ParseSize parses a byte size with an optional unit (see the package
// comment); zero is allowed. name is used in the error.
func ParseSize(name, value string) (uint64, error) {
	n, reason := parseSize(value, sizeHelp)
	if reason != "" {
		return 0, &Error{name, value, reason, name + "=512MiB"}
	}
	return n, nil
}

// blanks are what may surround a value: the C front trims exactly these
// from SPILLWAY_DISABLE, so that a value it does not read as 1 is not read
// as 1 here. Other spaces (Unicode's no-break space) make a value invalid.
const blanks = " \t\n\v\f\r"

func trimBlanks(value string) string { return strings.Trim(value, blanks) }

var (
	numberRE  = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)$`)
	percentRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*%$`)
)

var units = map[string]uint64{
	"": 1, "b": 1,
	"k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

// sizeHelp says what a size may be; limitHelp what a quota or a threshold,
// which may also be a percentage, may be.
const (
	sizeHelp  = "expected a size such as 512MiB, 8GiB, 8GB or 8G"
	limitHelp = sizeHelp + ", or a percentage such as 50%"
)

func parseLimit(value string) (Limit, string) {
	v := trimBlanks(value)
	if v == "" {
		return Limit{}, "empty; " + limitHelp
	}
	if strings.HasSuffix(v, "%") {
		m := percentRE.FindStringSubmatch(v)
		if m == nil {
			return Limit{}, "not a percentage; " + limitHelp
		}
		p, err := strconv.ParseFloat(m[1], 64)
		if err != nil || p <= 0 || p > 100 {
			return Limit{}, "a percentage must be above 0% and at most 100%"
		}
		return Limit{Percent: p}, ""
	}
	n, reason := parseSize(v, limitHelp)
	if reason != "" {
		return Limit{}, reason
	}
	if n == 0 {
		return Limit{}, "a quota of zero bytes would refuse every allocation; leave the quota unset for no limit"
	}
	if n < AllocationUnit {
		// "8" is most often 8GiB with its unit forgotten, or written as a
		// separate word (--memory-limit 8 GiB).
		return Limit{}, fmt.Sprintf("a quota of %d bytes, less than the smallest allocation (%d bytes), would refuse every allocation; %s", n, AllocationUnit, limitHelp)
	}
	return Limit{Bytes: n}, ""
}

// parseSize reads a size; a reason it is invalid ends with help, what the
// value may be.
func parseSize(value, help string) (uint64, string) {
	v := trimBlanks(value)
	if v == "" {
		return 0, "empty; " + help
	}
	// Only a number is negative: "--" is a flag's forgotten value.
	if strings.HasPrefix(v, "-") && numberRE.MatchString(v[1:]) {
		return 0, "negative; " + help
	}
	m := numberRE.FindStringSubmatch(v)
	if m == nil {
		return 0, "not a number with a unit; " + help
	}
	mult, ok := units[strings.ToLower(m[2])]
	if !ok {
		return 0, fmt.Sprintf("unknown unit %q; %s", m[2], help)
	}
	num, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return 0, "not a number; " + help
	}
	num.Mul(num, new(big.Rat).SetInt(new(big.Int).SetUint64(mult)))
	bytes := new(big.Int).Quo(num.Num(), num.Denom())
	if !num.IsInt() { // round up to the allocation unit
		unit := big.NewInt(AllocationUnit)
		bytes.Add(bytes, unit)
		bytes.Sub(bytes, new(big.Int).Mod(bytes, unit))
	}
	if bytes.Cmp(new(big.Int).SetUint64(math.MaxInt64)) > 0 {
		return 0, "too large (at most 2^63-1 bytes)"
	}
	return bytes.Uint64(), ""
}

// AllocationUnit is the granule in which the shim accounts memory (the
// pool's alignment); fractional sizes are rounded up to a multiple of it.
const AllocationUnit = 512

// ParseThreshold parses a release threshold given as a flag or variable
// called name: a size (zero allowed: release every empty segment at once) or
// a percentage of the quota in [0, 100].
func ParseThreshold(name, value string) (Limit, error) {
	v := trimBlanks(value)
	example := name + "=512MiB or " + name + "=25%"
	if m := percentRE.FindStringSubmatch(v); m != nil {
		p, err := strconv.ParseFloat(m[1], 64)
		if err != nil || p > 100 {
			return Limit{}, &Error{name, value, "a percentage of the quota must be at most 100%", example}
		}
		if p == 0 {
			return Limit{}, nil
		}
		return Limit{Percent: p}, nil
	}
	if strings.HasSuffix(v, "%") {
		return Limit{}, &Error{name, value, "not a percentage; " + limitHelp, example}
	}
	n, reason := parseSize(v, limitHelp)
	if reason != "" {
		return Limit{}, &Error{name, value, reason, example}
	}
	return Limit{Bytes: n}, nil
}

func parsePositiveSize(name, value, zero string) (uint64, error) {
	n, reason := parseSize(value, sizeHelp)
	if reason == "" && n == 0 {
		reason = zero
	}
	if reason != "" {
		return 0, &Error{name, value, reason, name + "=4GiB"}
	}
	return n, nil
}

// ParseRuntimeDir checks the folder of the figures files given as a
// variable called name: an absolute path, so that a process and
// `spillway stat` started elsewhere agree on it.
func ParseRuntimeDir(name, value string) (string, error) {
	if !strings.HasPrefix(value, "/") {
		return "", &Error{name, value, "not an absolute path", name + "=/run/user/1000/spillway"}
	}
	return value, nil
}

// ParseSpill parses a spill kind given as a flag or variable called name.
func ParseSpill(name, value string) (Spill, error) {
	switch s := Spill(strings.ToLower(trimBlanks(value))); s {
	case SpillManaged, SpillPinned:
		return s, nil
	}
	return "", &Error{name, value, "expected managed or pinned", name + "=pinned"}
}

// ParseLevel parses a log level given as a flag or variable called name.
func ParseLevel(name, value string) (Level, error) {
	switch l := Level(strings.ToLower(trimBlanks(value))); l {
	case LevelError, LevelWarn, LevelInfo, LevelDebug:
		return l, nil
	}
	return "", &Error{name, value, "expected one of error, warn, info, debug", name + "=info"}
}

func parseFormat(name, value string) (Format, error) {
	switch f := Format(strings.ToLower(trimBlanks(value))); f {
	case FormatText, FormatJSON:
		return f, nil
	}
	return "", &Error{name, value, "expected text or json", name + "=json"}
}

func parseSwitch(name, value string) (bool, error) {
	switch trimBlanks(value) {
	case "1":
		return true, nil
	case "0":
		return false, nil
	}
	return false, &Error{name, value, "expected 1 (on) or 0 (off)", name + "=1"}
}
