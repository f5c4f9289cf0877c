package config

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
	}{
		{"0", 0},
		{"4096", 4096},
		{"4096B", 4096},
		{"1K", 1 << 10},
		{"1KiB", 1 << 10},
		{"512MiB", 512 << 20},
		{"512mib", 512 << 20},
		{"8GiB", 8 << 30},
		{"8Gi", 8 << 30},
		{"8G", 8 << 30},
		{"8g", 8 << 30},
		{"8GB", 8e9},
		{"1.5GiB", 3 << 29},
		{"2TB", 2e12},
		{"1TiB", 1 << 40},
		{" 64 MiB ", 64 << 20},
		// Fractions of a byte count round up to the allocation unit.
		{"0.1GiB", 107374592},
		{"0.5", 512},
		{"1.0001KiB", 1536},
		{"0.5MiB", 512 << 10}, // a whole number of bytes stays exact
		{"1000.5", 1024},
	} {
		got, err := ParseSize("SIZE", tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestParseLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Limit
	}{
		{"8GiB", Limit{Bytes: 8 << 30}},
		{"50%", Limit{Percent: 50}},
		{"12.5%", Limit{Percent: 12.5}},
		{"100%", Limit{Percent: 100}},
		{"512", Limit{Bytes: 512}},
	} {
		got, err := ParseLimit("L", tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseLimit(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	if got := (Limit{Percent: 50}).Resolve(1000); got != 500 {
		t.Errorf("50%% of 1000 = %d", got)
	}
	if got := (Limit{Bytes: 7}).Resolve(1000); got != 7 {
		t.Errorf("absolute limit resolved to %d", got)
	}
}

// badLimits are values every quota variable must refuse, with a word the
// reason must contain.
var badLimits = []struct{ value, reason string }{
	{"", "empty"},
	{"   ", "empty"},
	{"0", "zero"},
	{"0GiB", "zero"},
	{"8", "smallest allocation"}, // 8 GiB with its unit forgotten, or a separate word
	{"511", "smallest allocation"},
	{"0%", "above 0%"},
	{"-1", "negative"},
	{"-8GiB", "negative"},
	{"-5%", "not a percentage"},
	{"8GIBS", "unknown unit"},
	{"8Gb", ""}, // decimal GB: valid, checked separately below
	{"8 GiB B", "not a number"},
	{"8XB", "unknown unit"},
	{"8gigabytes", "unknown unit"},
	{"GiB", "not a number"},
	{"8.GiB", "not a number"},
	{"1e9", "not a number"},
	{"0x100", "not a number"},
	{"101%", "at most 100%"},
	{"1000%", "at most 100%"},
	{"50%%", "not a percentage"},
	{"fifty%", "not a percentage"},
	{"99999999999999999999", "too large"},
	{"9999999999TiB", "too large"},
	{"8388608TiB", "too large"},
	{"18446744073709551616", "too large"},
	{"unlimited", "not a number"},
	{"none", "not a number"},
}

func TestBadLimits(t *testing.T) {
	for _, tc := range badLimits {
		if tc.reason == "" {
			continue
		}
		for _, name := range []string{EnvMemoryLimit, "SPILLWAY_MEMORY_LIMIT_1"} {
			_, err := Parse([]string{name + "=" + tc.value})
			var cerr *Error
			if !errors.As(err, &cerr) {
				t.Errorf("%s=%q: got %v, want a config error", name, tc.value, err)
				continue
			}
			msg := err.Error()
			for _, want := range []string{name, tc.value, tc.reason, "8GiB"} {
				if !strings.Contains(msg, want) {
					t.Errorf("%s=%q: error %q does not mention %q", name, tc.value, msg, want)
				}
			}
		}
	}
	if c, err := Parse([]string{"SPILLWAY_MEMORY_LIMIT=8Gb"}); err != nil || c.MemoryLimit.Bytes != 8e9 {
		t.Errorf("8Gb: %+v %v", c, err)
	}
}

func TestBadVariables(t *testing.T) {
	for _, tc := range []struct{ env, mention string }{
		{"SPILLWAY_MEMORY_LIMIT_=1GiB", "ordinal"},
		{"SPILLWAY_MEMORY_LIMIT_GPU0=1GiB", "ordinal"},
		{"SPILLWAY_MEMORY_LIMIT_01=1GiB", "ordinal"},
		{"SPILLWAY_MEMORY_LIMIT_-1=1GiB", "ordinal"},
		{"SPILLWAY_MEMORY_LIMIT_-0=1GiB", "ordinal"},
		{"SPILLWAY_MEMORY_LIMIT_+1=1GiB", "ordinal"},
		{"SPILLWAY_MEMORY_LIMIT_ 1=1GiB", "ordinal"},
		{"SPILLWAY_MEMORY_LIMIT_99999=1GiB", "ordinal from 0 to 1023"},
		{"SPILLWAY_MEMORY_LIMIT_1024=1GiB", "ordinal from 0 to 1023"},
		{"SPILLWAY_LOG_LEVEL=verbose", "error, warn, info, debug"},
		{"SPILLWAY_LOG_LEVEL=", "error, warn, info, debug"},
		{"SPILLWAY_LOG_FORMAT=xml", "text or json"},
		{"SPILLWAY_LOG_FILE=", "empty"},
		{"SPILLWAY_DISABLE=yes", "expected 1"},
		{"SPILLWAY_DISABLE=", "expected 1"},
		{"SPILLWAY_POOL=yes", "expected 1"},
		{"SPILLWAY_FREE_SYNC=true", "expected 1"},
		{"SPILLWAY_REPORT=", "expected 1"},
		{"SPILLWAY_OVERSUBSCRIBE=on", "expected 1"},
		{"SPILLWAY_POOL_RELEASE_THRESHOLD=150%", "at most 100%"},
		{"SPILLWAY_POOL_RELEASE_THRESHOLD=1x", "unknown unit"},
		{"SPILLWAY_POOL_RELEASE_THRESHOLD=-5%", "not a percentage"},
		{"SPILLWAY_POOL_RESERVE=0", "reserves nothing"},
		{"SPILLWAY_POOL_RESERVE=50%", "not a number"},
		{"SPILLWAY_SPILL=disk", "managed or pinned"},
		{"SPILLWAY_HOST_LIMIT=0", "refuse every spill"},
		{"SPILLWAY_HOST_LIMIT=-1GiB", "negative"},
	} {
		_, err := Parse([]string{tc.env})
		var cerr *Error
		if !errors.As(err, &cerr) || !strings.Contains(err.Error(), tc.mention) || !strings.Contains(err.Error(), "valid example") {
			t.Errorf("%s: got %v, want an error mentioning %q", tc.env, err, tc.mention)
		}
	}
}

// A value that only a quota or a threshold may take is never offered as
// valid where a plain size is wanted (a reserve, a host limit, a ring
// buffer), and "negative" is said only of a number with a minus sign: "--"
// (the value of a flag whose value was forgotten) is not a number at all.
func TestSizeErrorsOfferOnlyWhatIsValid(t *testing.T) {
	for _, tc := range []struct {
		value, reason string
	}{
		{"50%", "not a number with a unit"},
		{"lots", "not a number with a unit"},
		{"", "empty"},
		{"-1GiB", "negative"},
		{"--", "not a number with a unit"},
		{"--pool=false", "not a number with a unit"},
	} {
		for _, parse := range []func() error{
			func() error { _, err := ParseSize("--host-limit", tc.value); return err },
			func() error { _, err := Parse([]string{EnvHostLimit + "=" + tc.value}); return err },
			func() error { _, err := Parse([]string{EnvPoolReserve + "=" + tc.value}); return err },
		} {
			err := parse()
			if err == nil || !strings.Contains(err.Error(), tc.reason) || strings.Contains(err.Error(), "percentage") {
				t.Errorf("size %q: %v; want %q and no word of a percentage", tc.value, err, tc.reason)
			}
		}
	}
	// A quota may be a percentage, and its errors say so.
	if _, err := ParseLimit("--memory-limit", "--"); err == nil || strings.Contains(err.Error(), "negative") ||
		!strings.Contains(err.Error(), "or a percentage such as 50%") {
		t.Errorf(`quota "--": %v`, err)
	}
}

// TestDeviceOrdinals: a device quota's variable names any ordinal from 0 to
// 1023, in digits, and the quota is that device's.
func TestDeviceOrdinals(t *testing.T) {
	cfg, err := Parse([]string{"SPILLWAY_MEMORY_LIMIT_0=1GiB", "SPILLWAY_MEMORY_LIMIT_10=2GiB", "SPILLWAY_MEMORY_LIMIT_1023=3GiB"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]uint64{0: 1 << 30, 10: 2 << 30, 1023: 3 << 30}
	if got := cfg.Ordinals(); !slices.Equal(got, []int{0, 10, 1023}) {
		t.Errorf("ordinals %v, want [0 10 1023]", got)
	}
	for ordinal, bytes := range want {
		if l := cfg.DeviceLimits[ordinal]; l.Bytes != bytes {
			t.Errorf("device %d: quota %+v, want %d bytes", ordinal, l, bytes)
		}
	}
}

func TestParseConfig(t *testing.T) {
	cfg, err := Parse([]string{
		"PATH=/bin",
		"SPILLWAY_MEMORY_LIMIT=8GiB",
		"SPILLWAY_MEMORY_LIMIT_1=50%",
		"SPILLWAY_LOG_LEVEL=DEBUG",
		"SPILLWAY_LOG_FORMAT=json",
		"SPILLWAY_LOG_FILE=/tmp/x.log",
		"SPILLWAY_DISABLE=0",
		"SPILLWAY_POOL=0",
		"SPILLWAY_MEMORY_LIMT=1GiB",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LimitFor(0) != (Limit{Bytes: 8 << 30}) || cfg.LimitFor(1) != (Limit{Percent: 50}) || cfg.LimitFor(7) != (Limit{Bytes: 8 << 30}) {
		t.Errorf("limits: %+v", cfg)
	}
	if cfg.LogLevel != LevelDebug || cfg.LogFormat != FormatJSON || cfg.LogFile != "/tmp/x.log" || cfg.Disable {
		t.Errorf("log settings: %+v", cfg)
	}
	if len(cfg.Unknown) != 1 || cfg.Unknown[0] != "SPILLWAY_MEMORY_LIMT" {
		t.Errorf("unknown = %v", cfg.Unknown)
	}

	def, err := Parse(nil)
	if err != nil || def.LogLevel != LevelWarn || def.LogFormat != FormatText || def.LimitFor(0).IsSet() ||
		!def.Pool || def.ReleaseThreshold != nil || def.PoolReserve != 0 || def.FreeSync || def.Report ||
		def.Oversubscribe || def.Spill != SpillManaged || def.HostLimit != 0 {
		t.Errorf("defaults: %+v %v", def, err)
	}

	pool, err := Parse([]string{"SPILLWAY_POOL_RELEASE_THRESHOLD=25%", "SPILLWAY_POOL_RESERVE=1GiB",
		"SPILLWAY_FREE_SYNC=1", "SPILLWAY_REPORT=1", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_SPILL=Pinned",
		"SPILLWAY_HOST_LIMIT=64GiB"})
	if err != nil || *pool.ReleaseThreshold != (Limit{Percent: 25}) || pool.PoolReserve != 1<<30 || !pool.FreeSync ||
		!pool.Report || !pool.Oversubscribe || pool.Spill != SpillPinned || pool.HostLimit != 64<<30 || len(pool.Unknown) != 0 {
		t.Errorf("pool and spill settings: %+v %v", pool, err)
	}
	if zero, err := Parse([]string{"SPILLWAY_POOL_RELEASE_THRESHOLD=0"}); err != nil || zero.ReleaseThreshold == nil || zero.ReleaseThreshold.Resolve(1<<30) != 0 {
		t.Errorf("a zero threshold: %+v %v", zero, err)
	}
	if _, err := Parse([]string{"SPILLWAY_POOL=0", "SPILLWAY_POOL_RESERVE=1GiB"}); err == nil || !strings.Contains(err.Error(), "SPILLWAY_POOL_RESERVE") {
		t.Errorf("a reserve without the pool: %v", err)
	}
}

// The allocation unit must be what the pool accounts in.
func TestAllocationUnitIsThePoolsAlignment(t *testing.T) {
	if AllocationUnit != pool.Alignment {
		t.Errorf("AllocationUnit %d, pool.Alignment %d", AllocationUnit, pool.Alignment)
	}
}

func TestReserveAboveLimit(t *testing.T) {
	for _, env := range [][]string{
		{"SPILLWAY_MEMORY_LIMIT=1GiB", "SPILLWAY_POOL_RESERVE=2GiB"},
		{"SPILLWAY_MEMORY_LIMIT_3=1GiB", "SPILLWAY_POOL_RESERVE=1.5GiB"},
	} {
		_, err := Parse(env)
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Name != EnvPoolReserve || !strings.Contains(err.Error(), "larger than the quota") ||
			!strings.Contains(err.Error(), "1GiB") || !strings.Contains(err.Error(), "valid example: SPILLWAY_POOL_RESERVE=512MiB") {
			t.Errorf("%v: %v, want the reserve refused naming the 1GiB quota", env, err)
		}
	}
	// Sizes that one decimal writes alike are told apart by their bytes.
	_, err := Parse([]string{"SPILLWAY_MEMORY_LIMIT=1000000000", "SPILLWAY_POOL_RESERVE=953.7MiB"})
	if err == nil || !strings.Contains(err.Error(), "1000027136 bytes") || !strings.Contains(err.Error(), "1000000000 bytes") {
		t.Errorf("a reserve of 953.7MiB above a quota of 1000000000 bytes: %v, want both in bytes", err)
	}
	for _, env := range [][]string{
		{"SPILLWAY_MEMORY_LIMIT=2GiB", "SPILLWAY_POOL_RESERVE=2GiB"},
		{"SPILLWAY_MEMORY_LIMIT=10%", "SPILLWAY_POOL_RESERVE=2GiB"}, // checked when the device's total is known
		{"SPILLWAY_POOL_RESERVE=2GiB"},
	} {
		if _, err := Parse(env); err != nil {
			t.Errorf("%v: %v", env, err)
		}
	}
}

func TestWarnings(t *testing.T) {
	cfg, err := Parse([]string{"SPILLWAY_HOST_LIMIT=1GiB", "SPILLWAY_SPILL=pinned"})
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Warnings()
	if len(w) != 2 || !strings.Contains(w[0], "SPILLWAY_HOST_LIMIT has no effect without SPILLWAY_OVERSUBSCRIBE=1") ||
		!strings.Contains(w[1], "SPILLWAY_SPILL") {
		t.Errorf("warnings %q", w)
	}
	cfg, _ = Parse([]string{"SPILLWAY_HOST_LIMIT=1GiB", "SPILLWAY_SPILL=pinned", "SPILLWAY_OVERSUBSCRIBE=1"})
	if w := cfg.Warnings(); len(w) != 0 {
		t.Errorf("with oversubscription: warnings %q", w)
	}
	// The pool's own settings do nothing with the pool off.
	cfg, _ = Parse([]string{"SPILLWAY_POOL=0", "SPILLWAY_POOL_RELEASE_THRESHOLD=10%", "SPILLWAY_FREE_SYNC=1"})
	if w := cfg.Warnings(); len(w) != 2 || !strings.HasPrefix(w[0], "SPILLWAY_POOL_RELEASE_THRESHOLD has no effect with SPILLWAY_POOL=0") ||
		!strings.HasPrefix(w[1], "SPILLWAY_FREE_SYNC has no effect with SPILLWAY_POOL=0") {
		t.Errorf("pool settings with the pool off: warnings %q", w)
	}
	cfg, _ = Parse([]string{"SPILLWAY_POOL_RELEASE_THRESHOLD=10%", "SPILLWAY_FREE_SYNC=1"})
	if w := cfg.Warnings(); len(w) != 0 {
		t.Errorf("pool settings with the pool on: warnings %q", w)
	}
}

func TestRuntimeDir(t *testing.T) {
	if cfg, err := Parse([]string{"SPILLWAY_RUNTIME_DIR=/tmp/s"}); err != nil || cfg.RuntimeDir != "/tmp/s" {
		t.Errorf("%+v, %v", cfg, err)
	}
	if _, err := Parse([]string{"SPILLWAY_RUNTIME_DIR=rel"}); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("relative path: %v", err)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0B", 512: "512B", 1024: "1KiB", 1536 << 10: "1.5MiB",
		8 << 30: "8GiB", 1000001: "976.6KiB", 3 << 29: "1.5GiB", 1025: "1.0KiB", 1 << 60: "1EiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestVMMSwitch(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want bool
	}{{nil, true}, {[]string{"SPILLWAY_VMM=1"}, true}, {[]string{"SPILLWAY_VMM=0"}, false}, {[]string{"SPILLWAY_VMM= 0 "}, false}} {
		cfg, err := Parse(tc.env)
		if err != nil || cfg.VMM != tc.want || len(cfg.Unknown) != 0 {
			t.Errorf("%v: VMM %v, unknown %v, err %v; want VMM %v", tc.env, cfg.VMM, cfg.Unknown, err, tc.want)
		}
	}
	for _, bad := range []string{"", "yes", "true", "2", "off"} {
		_, err := Parse([]string{"SPILLWAY_VMM=" + bad})
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Name != EnvVMM || cerr.Value != bad || !strings.Contains(err.Error(), "SPILLWAY_VMM=1") {
			t.Errorf("SPILLWAY_VMM=%q: %v; want an error naming the variable, the value and an example", bad, err)
		}
	}
}

func TestMigrateSwitch(t *testing.T) {
	for _, tc := range []struct {
		env     []string
		want    bool
		warning string
	}{
		{nil, false, ""},
		{[]string{"SPILLWAY_MIGRATE=1", "SPILLWAY_OVERSUBSCRIBE=1"}, true, ""},
		{[]string{"SPILLWAY_MIGRATE=0", "SPILLWAY_OVERSUBSCRIBE=1"}, false, ""},
		{[]string{"SPILLWAY_MIGRATE=1"}, true, "SPILLWAY_MIGRATE has no effect without SPILLWAY_OVERSUBSCRIBE=1"},
		{[]string{"SPILLWAY_MIGRATE=1", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_VMM=0"}, true, "SPILLWAY_MIGRATE has no effect without virtual memory (SPILLWAY_VMM=1 and SPILLWAY_POOL=1)"},
		{[]string{"SPILLWAY_MIGRATE=1", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_POOL=0"}, true, "SPILLWAY_MIGRATE has no effect without virtual memory (SPILLWAY_VMM=1 and SPILLWAY_POOL=1)"},
	} {
		cfg, err := Parse(tc.env)
		if err != nil || cfg.Migrate != tc.want || len(cfg.Unknown) != 0 {
			t.Errorf("%v: Migrate %v, unknown %v, err %v; want %v", tc.env, cfg.Migrate, cfg.Unknown, err, tc.want)
		}
		w := cfg.Warnings()
		if tc.warning == "" && len(w) != 0 || tc.warning != "" && (len(w) != 1 || w[0] != tc.warning) {
			t.Errorf("%v: warnings %q, want %q", tc.env, w, tc.warning)
		}
	}
	for _, bad := range []string{"", "yes", "2"} {
		_, err := Parse([]string{"SPILLWAY_MIGRATE=" + bad})
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Name != EnvMigrate || cerr.Value != bad || !strings.Contains(err.Error(), "SPILLWAY_MIGRATE=1") {
			t.Errorf("SPILLWAY_MIGRATE=%q: %v; want an error naming the variable, the value and an example", bad, err)
		}
	}
}

// Values are read with the blanks the front trims from SPILLWAY_DISABLE
// around them (space, tab, newline, vertical tab, form feed, carriage
// return), and with no other: a value the front does not read as 1 must not
// be read as 1 here, or the core would run enforcing while configured off.
// Unicode spaces (no-break space, next line) make a value invalid.
func TestValuesTrimTheFrontsBlanks(t *testing.T) {
	cfg, err := Parse([]string{"SPILLWAY_DISABLE= \t1\r\n", "SPILLWAY_MEMORY_LIMIT=\v8GiB\f"})
	if err != nil || !cfg.Disable || cfg.MemoryLimit.Bytes != 8<<30 {
		t.Errorf("ASCII blanks around values: disable %v, limit %+v, err %v", cfg.Disable, cfg.MemoryLimit, err)
	}
	for _, env := range []string{"SPILLWAY_DISABLE=1\u00a0", "SPILLWAY_DISABLE=\u00851", "SPILLWAY_POOL=0\u00a0",
		"SPILLWAY_MEMORY_LIMIT=8GiB\u00a0", "SPILLWAY_LOG_LEVEL=\u00a0info", "SPILLWAY_SPILL=pinned\u0085"} {
		name, value, _ := strings.Cut(env, "=")
		_, err := Parse([]string{env})
		var cerr *Error
		if !errors.As(err, &cerr) || cerr.Name != name || cerr.Value != value || !strings.Contains(err.Error(), "valid example") {
			t.Errorf("%q: %v; want an error naming the variable, the value and a valid one", env, err)
		}
	}
}

// TestEveryInvalidVariableAtOnce: every invalid variable is reported, each
// as an *Error of its own, in name order, so that fixing one never reveals
// the next. A check across variables (a reserve needs the pool, fits in the
// quota) is reported beside them, but only when the variables it reads are
// valid: an invalid SPILLWAY_POOL is no SPILLWAY_POOL=0.
func TestEveryInvalidVariableAtOnce(t *testing.T) {
	for _, tc := range []struct {
		env   []string
		names []string
	}{
		{[]string{"SPILLWAY_POOL=yes", "SPILLWAY_MEMORY_LIMIT=8gigs"}, []string{EnvMemoryLimit, EnvPool}},
		{[]string{"SPILLWAY_SPILL=disk", "SPILLWAY_MEMORY_LIMIT_1=0", "SPILLWAY_LOG_LEVEL=verbose"},
			[]string{EnvLogLevel, "SPILLWAY_MEMORY_LIMIT_1", EnvSpill}},
		{[]string{"SPILLWAY_VMM=2", "SPILLWAY_POOL=0", "SPILLWAY_POOL_RESERVE=1GiB", "SPILLWAY_LOG_FORMAT=xml"},
			[]string{EnvLogFormat, EnvPoolReserve, EnvVMM}},
		{[]string{"SPILLWAY_MEMORY_LIMIT_3=1GiB", "SPILLWAY_POOL_RESERVE=2GiB", "SPILLWAY_DISABLE=yes"},
			[]string{EnvDisable, EnvPoolReserve}},
		{[]string{"SPILLWAY_POOL=off", "SPILLWAY_POOL_RESERVE=1GiB"}, []string{EnvPool}},
		{[]string{"SPILLWAY_MEMORY_LIMIT=1GiBs", "SPILLWAY_POOL_RESERVE=2GiB"}, []string{EnvMemoryLimit}},
		{[]string{"SPILLWAY_MEMORY_LIMIT_3=0", "SPILLWAY_POOL_RESERVE=2GiB"}, []string{"SPILLWAY_MEMORY_LIMIT_3"}},
		{[]string{"SPILLWAY_MEMORY_LIMIT=1GiB", "SPILLWAY_POOL_RESERVE=0"}, []string{EnvPoolReserve}},
	} {
		cfg, err := Parse(tc.env)
		if !reflect.DeepEqual(cfg, Config{}) {
			t.Errorf("%v: config %+v, want the zero Config with an error", tc.env, cfg)
		}
		var first *Error
		if !errors.As(err, &first) || first.Name != tc.names[0] {
			t.Errorf("%v: %v, want errors.As to find the first invalid variable, %s", tc.env, err, tc.names[0])
			continue
		}
		var names []string
		for _, e := range Errors(err) {
			if cerr, ok := e.(*Error); ok {
				names = append(names, cerr.Name)
			} else {
				t.Errorf("%v: %T %v among the errors, want each an *Error", tc.env, e, e)
			}
		}
		if !slices.Equal(names, tc.names) {
			t.Errorf("%v: errors name %v, want %v", tc.env, names, tc.names)
		}
		// The message has a line for each, in the same order.
		lines := strings.Split(err.Error(), "\n")
		if len(lines) != len(tc.names) {
			t.Errorf("%v: message %q, want %d lines", tc.env, err.Error(), len(tc.names))
			continue
		}
		for i, l := range lines {
			if !strings.HasPrefix(l, "invalid "+tc.names[i]+"=") || !strings.Contains(l, "valid example") {
				t.Errorf("%v: line %d %q, want the error of %s", tc.env, i, l, tc.names[i])
			}
		}
	}
	if got := Errors(nil); got != nil {
		t.Errorf("Errors(nil) = %v, want nil", got)
	}
	single := &Error{EnvPool, "yes", "expected 1 (on) or 0 (off)", EnvPool + "=1"}
	if got := Errors(single); len(got) != 1 || got[0] != single {
		t.Errorf("Errors of one error = %v, want it alone", got)
	}
}

// TestMiscasedVariablesAreUnknown: a variable that is one of ours but for
// its case (spillway_memory_limit) is read by no part of Spillway: it is
// listed with the unknown ones, to be warned about, where it was passed
// over as another program's and the quota silently not set.
func TestMiscasedVariablesAreUnknown(t *testing.T) {
	cfg, err := Parse([]string{"spillway_memory_limit=8GiB", "Spillway_Pool=0", "SPILLWAY_MEMORY_LIMIT=4GiB", "SPILLWAYS=1", "PATH=/bin"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"Spillway_Pool", "spillway_memory_limit"}; !slices.Equal(cfg.Unknown, want) {
		t.Errorf("unknown = %q, want %q", cfg.Unknown, want)
	}
	if cfg.MemoryLimit.Bytes != 4<<30 || !cfg.Pool {
		t.Errorf("a miscased variable was read: %+v", cfg)
	}
}
