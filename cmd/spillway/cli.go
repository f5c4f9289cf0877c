package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-gpu/spillway/shim/config"
)

// flagSet is a command's flags. Errors are not printed by the flag package
// (which would print the whole usage) but returned, to be reported in one
// line by reportFlagError; -h and --help print the usage, then every flag,
// to out.
type flagSet struct {
	*flag.FlagSet
	usage string
	out   io.Writer
}

func newFlagSet(name, usage string, out io.Writer) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, usage: usage, out: out}
}

// printFlags lists every flag as --name VALUE (-p for one letter), with its
// description and default.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "flags:")
	fs.VisitAll(func(f *flag.Flag) {
		dash := "--"
		if len(f.Name) == 1 {
			dash = "-"
		}
		arg, usage := flag.UnquoteUsage(f)
		if isBoolFlag(f) {
			arg = ""
		}
		head := "  " + dash + f.Name
		if arg != "" {
			head += " " + arg
		}
		fmt.Fprintf(w, "%s\n      %s\n", head, usage)
	})
}

// errHelp says that help was asked for and shown.
var errHelp = flag.ErrHelp

// usageErr is a bad command line, reported in one line, or one line for
// each invalid setting where there are several (lines of msg).
type usageErr struct{ msg string }

func (e *usageErr) Error() string { return e.msg }

func usageError(_ *flagSet, msg string) error { return &usageErr{msg} }

// flagMessage rewrites the flag package's messages with --double-dash names
// and without repeating what a value's own error already says.
var (
	wrappedValueRE = regexp.MustCompile(`^invalid (?:boolean )?value ".*" for (?:flag )?-[\w-]+: (invalid --?[\w-]+=.*)$`)
	flagNameRE     = regexp.MustCompile(`(for|flag|defined:|argument:) -([\w-]{2,})`)
	// repeatedValueRE matches a Set error that begins with the value again.
	repeatedValueRE = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-+([\w-]+): "(.*)": (.*)$`)
	// badSwitchRE matches the flag package's refusal of a switch's value.
	badSwitchRE = regexp.MustCompile(`^invalid boolean value "(.*)" for -+([\w-]+): parse error$`)
)

// badSwitch says that value is not one a switch, flag, takes.
func badSwitch(flag, value string) string {
	return fmt.Sprintf("invalid %s=%q: want true or false (valid example: %s=false)", flag, value, flag)
}

func flagMessage(msg string) string {
	if m := badSwitchRE.FindStringSubmatch(msg); m != nil {
		return badSwitch("--"+m[2], m[1])
	}
	if m := wrappedValueRE.FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	if m := repeatedValueRE.FindStringSubmatch(msg); m != nil && m[1] == m[3] {
		dashes := "--"
		if len(m[2]) == 1 {
			dashes = "-"
		}
		return fmt.Sprintf("invalid %s%s=%q: %s", dashes, m[2], m[1], m[4])
	}
	msg = strings.Replace(msg, "flag provided but not defined: -", "unknown flag -", 1)
	msg = flagNameRE.ReplaceAllString(msg, "$1 --$2")
	msg = strings.Replace(msg, "unknown flag ---", "unknown flag --", 1)
	return msg
}

// parseFlags parses args, turning the flag package's errors into usageErr.
func parseFlags(fs *flagSet, args []string) error {
	if err := checkValuesGiven(fs.FlagSet, args); err != nil {
		return err
	}
	err := fs.Parse(args)
	switch {
	case err == nil:
		return checkGivenOnce(fs.FlagSet, args)
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(fs.out, fs.usage)
		printFlags(fs.out, fs.FlagSet)
		return errHelp
	}
	return &usageErr{flagMessage(err.Error())}
}

// checkValuesGiven refuses a flag that takes a value but is followed by
// "--" or by another of the command's flags, which the flag package would
// take as its value: "--output -- CMD" would write to a file called "--".
func checkValuesGiven(fs *flag.FlagSet, args []string) error {
	isFlag := func(a string) bool { return a == "--" || isOwnFlag(fs, a) }
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || a == "-" || !strings.HasPrefix(a, "-") {
			return nil // the flags end here
		}
		f := fs.Lookup(strings.TrimLeft(a, "-"))
		if f == nil || strings.Contains(a, "=") || isBoolFlag(f) {
			continue
		}
		if i+1 < len(args) && isFlag(args[i+1]) {
			arg, _ := flag.UnquoteUsage(f)
			return &usageErr{fmt.Sprintf("%s needs a value (%s %s), but %q follows it", a, a, arg, args[i+1])}
		}
		i++ // its value
	}
	return nil
}

// repeatable is a flag's value that collects each time it is given (-p
// PID, --memory-limit-device N=SIZE), and refuses an item twice itself.
type repeatable interface{ repeatable() }

// checkGivenOnce refuses a flag given more than once, unless it is
// repeatable: the flag package keeps the last value, so that
// "--memory-limit 8GiB ... --memory-limit 80GiB" would widen the quota
// without a word. Only the flags are read, not what follows them.
func checkGivenOnce(fs *flag.FlagSet, args []string) error {
	typed := map[string][]string{} // each time a flag was given, as typed
	var names []string             // in the order first given
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || a == "-" || !strings.HasPrefix(a, "-") {
			break // the flags end here
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		given := a
		if !hasValue && !isBoolFlag(f) && i+1 < len(args) {
			i++
			given += " " + args[i]
		}
		if _, ok := f.Value.(repeatable); ok {
			continue
		}
		if typed[f.Name] == nil {
			names = append(names, f.Name)
		}
		typed[f.Name] = append(typed[f.Name], given)
	}
	for _, name := range names {
		t := typed[name]
		if len(t) < 2 {
			continue
		}
		times := "twice"
		if len(t) > 2 {
			times = fmt.Sprintf("%d times", len(t))
		}
		quoted := make([]string, len(t))
		for i, g := range t {
			quoted[i] = strconv.Quote(g)
		}
		dashes := "--"
		if len(name) == 1 {
			dashes = "-"
		}
		return &usageErr{fmt.Sprintf("%s%s is given %s (%s, then %s): give it once",
			dashes, name, times, strings.Join(quoted[:len(t)-1], ", "), quoted[len(t)-1])}
	}
	return nil
}

// isOwnFlag reports whether a is one of the command's flags, with or
// without its value.
func isOwnFlag(fs *flag.FlagSet, a string) bool {
	if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
		return false
	}
	name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
	// -h and -help are every command's, though the FlagSet defines neither.
	return fs.Lookup(name) != nil || name == "h" || name == "help"
}

// checkNoFlagAsProgram refuses one of the command's flags where the
// program to run begins, after "--": it was meant for the command, and the
// program "--memory-limit" would not be found, or worse, the flag's value
// would be run.
func checkNoFlagAsProgram(fs *flagSet, args []string) error {
	argv := fs.Args()
	if len(argv) == 0 || !isOwnFlag(fs.FlagSet, argv[0]) {
		return nil
	}
	// The flag package stops at "--" only, when what follows starts with '-'.
	example := append([]string{"spillway", fs.Name()}, args[:len(args)-len(argv)-1]...)
	i := 0
	for ; i < len(argv) && isOwnFlag(fs.FlagSet, argv[i]); i++ {
		example = append(example, argv[i])
		name, _, hasValue := strings.Cut(strings.TrimLeft(argv[i], "-"), "=")
		if f := fs.Lookup(name); f != nil && !hasValue && !isBoolFlag(f) && i+1 < len(argv) {
			i++
			example = append(example, argv[i])
		}
	}
	if i < len(argv) {
		example = append(append(example, "--"), argv[i:]...)
	}
	return &usageErr{fmt.Sprintf("%q follows \"--\", where the program to run begins: spillway %s's flags go before \"--\" (valid example: %s)",
		argv[0], fs.Name(), strings.Join(example, " "))}
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// switchValueApart returns a switch and the value written apart from it
// ("--pool false"), which the flag package leaves as the first argument:
// it takes a switch's value only after '='.
func switchValueApart(fs *flagSet, args []string) (flagArg, value string, ok bool) {
	rest := fs.Args()
	i := len(args) - len(rest) - 1
	if len(rest) == 0 || i < 0 {
		return "", "", false
	}
	if _, err := strconv.ParseBool(rest[0]); err != nil {
		return "", "", false
	}
	flagArg = args[i]
	f := fs.Lookup(strings.TrimLeft(flagArg, "-"))
	if !strings.HasPrefix(flagArg, "-") || strings.Contains(flagArg, "=") || f == nil {
		return "", "", false
	}
	if !isBoolFlag(f) {
		return "", "", false
	}
	return flagArg, rest[0], true
}

// checkSwitchBeforeCommand refuses a switch's value written apart from it
// ("--pool false -- CMD"): "false" would be the program to run, and the job
// would not run at all, or run without the setting.
func checkSwitchBeforeCommand(fs *flagSet, args []string) error {
	flagArg, value, ok := switchValueApart(fs, args)
	if !ok {
		return nil
	}
	// The value may have been meant as the program, which "--" keeps one.
	return &usageErr{fmt.Sprintf("invalid %s %s: a switch takes its value after '=', else %q is read as the command (valid example: %s=%s; to run the program %q: %s -- %s)",
		flagArg, value, value, flagArg, value, value, flagArg, value)}
}

// reportFlagError prints a command-line error in one line, with where to
// find the flags, and returns the exit status: 0 after help, 2 otherwise.
// An error of several lines (several invalid settings) is printed a line
// each, each line naming the command, the last where to find the flags.
func reportFlagError(cmd string, err error) int {
	if errors.Is(err, errHelp) {
		return 0
	}
	writeFlagError(os.Stderr, cmd, err)
	return 2
}

func writeFlagError(w io.Writer, cmd string, err error) {
	lines := strings.Split(err.Error(), "\n")
	for _, l := range lines[:len(lines)-1] {
		fmt.Fprintf(w, "spillway %s: %s\n", cmd, l)
	}
	fmt.Fprintf(w, "spillway %s: %s (see 'spillway %s --help')\n", cmd, lines[len(lines)-1], cmd)
}

var (
	// plainSecondsRE is a duration given as a plain number of seconds: 2, 0.5, 1.0.
	plainSecondsRE = regexp.MustCompile(`^[0-9]+(?:\.[0-9]+)?$`)
	// goDurationRE is a duration written as Go writes them, which
	// time.ParseDuration refuses only when it is too long.
	goDurationRE = regexp.MustCompile(`^\+?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+$`)
)

// parseDuration reads the value of the flag called name: a duration as Go
// writes them (500ms, 1s, 1m30s) or a plain number of seconds (2, 0.5),
// above zero.
func parseDuration(name, v string) (time.Duration, error) {
	bad := func(reason string) error {
		return &config.Error{Name: name, Value: v, Reason: reason, Example: name + " 500ms"}
	}
	const tooLong = "too long; want at most 2562047h"
	const notAboveZero = "want a duration above zero, such as 500ms, 1s or 2m"
	d, err := time.ParseDuration(v)
	if err != nil {
		if goDurationRE.MatchString(v) {
			return 0, bad(tooLong)
		}
		// A negative number of seconds is a duration, not above zero.
		if strings.HasPrefix(v, "-") && plainSecondsRE.MatchString(v[1:]) {
			return 0, bad(notAboveZero)
		}
		if !plainSecondsRE.MatchString(v) {
			return 0, bad("not a duration such as 500ms, 1s or 2m")
		}
		secs, _ := strconv.ParseFloat(v, 64)
		// MaxInt64 is 2⁶³ as a float64, which a Duration cannot hold.
		if secs*float64(time.Second) >= math.MaxInt64 {
			return 0, bad(tooLong)
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d <= 0 {
		return 0, bad(notAboveZero)
	}
	return d, nil
}

// minRefresh is the shortest interval between two refreshes of a view
// (trace --interval, stat --watch): shorter, a view is redrawn without
// pause and its process spins on a processor of the machine it watches.
const minRefresh = 10 * time.Millisecond

// parseRefresh reads a refresh interval, the value of the flag called
// name: a duration (parseDuration) of at least minRefresh.
func parseRefresh(name, v string) (time.Duration, error) {
	d, err := parseDuration(name, v)
	if err == nil && d < minRefresh {
		return 0, &config.Error{Name: name, Value: v, Example: name + " 500ms",
			Reason: fmt.Sprintf("shorter than %v, a refresh without pause; want %v or more", minRefresh, minRefresh)}
	}
	return d, err
}

// durationFlag is a flag, called name, holding a duration above zero, or
// a refresh interval (parseRefresh).
type durationFlag struct {
	name    string
	d       *time.Duration
	refresh bool
}

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(v string) error {
	parse := parseDuration
	if f.refresh {
		parse = parseRefresh
	}
	d, err := parse(f.name, v)
	if err != nil {
		return err
	}
	*f.d = d
	return nil
}

// listenAddrWant says what an address to serve on is.
const listenAddrWant = "HOST:PORT, with a port from 0 to 65535"

// checkListenAddr checks an address to serve on, given as the flag called
// name, before anything starts: HOST:PORT, the host possibly empty (every
// address) and the port a number or a service name.
func checkListenAddr(name, addr string) error {
	bad := func(reason string) error {
		return &config.Error{Name: name, Value: addr, Reason: reason + "want " + listenAddrWant,
			Example: name + " 127.0.0.1:9400"}
	}
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return bad("")
	}
	// Listening would refuse it too, but only once the session has started.
	if _, err := netip.ParseAddr(host); host != "" && err != nil && !isHostName(host) {
		return bad(fmt.Sprintf("the host %q is neither an IP address nor a host name; ", host))
	}
	return nil
}

// isHostName reports whether h is written as a host name: labels of
// letters, digits, '-' and '_', none beginning or ending with '-', the last
// not all digits (1.2.3.4.5 and 256.1.1.1 are no IP addresses, and no names
// either), a final '.' allowed.
func isHostName(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if !hostLabelRE.MatchString(l) {
			return false
		}
	}
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}

var hostLabelRE = regexp.MustCompile(`^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$`)

// textFlag is a flag, called name, whose value is a file or an address
// that cannot be empty: an empty value, most often a variable that was not
// set (--output "$OUT"), would mean the flag had not been given, and the
// summary would not be written, the metrics not served.
type textFlag struct {
	s       *string
	name    string // --output
	want    string // what a value is, for the error
	example string // a valid value
	// dash, for a file to write to, says where "-" goes instead: many
	// tools read it as standard output, which this one would not.
	dash string
}

func (f textFlag) String() string {
	if f.s == nil {
		return ""
	}
	return *f.s
}

func (f textFlag) Set(v string) error {
	if v == "" {
		return &config.Error{Name: f.name, Value: v, Reason: "empty; want " + f.want, Example: f.name + " " + f.example}
	}
	if v == "-" && f.dash != "" {
		return &config.Error{Name: f.name, Value: v, Reason: "want " + f.want + "; " + f.dash + `, and a file called "-" is ./-`,
			Example: f.name + " " + f.example}
	}
	*f.s = v
	return nil
}

// The kinds of textFlag.
func outputFlag(s *string, name, example, dash string) textFlag {
	return textFlag{s, name, "the FILE to write to", example, dash}
}

func libFlag(s *string) textFlag {
	return textFlag{s, "--lib", "the PATH of libspillway.so, or no --lib for the one beside this binary", "/opt/spillway/lib/libspillway.so", ""}
}

func metricsAddrFlag(s *string) textFlag {
	return textFlag{s, "--metrics-addr", listenAddrWant, "127.0.0.1:9400", ""}
}
