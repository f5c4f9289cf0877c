// Command spillway runs programs under Spillway's CUDA shim, traces them and
// shows what the processes on a node hold.
//
//	spillway run [flags] -- CMD ARGS...   run CMD with the shim preloaded
//	spillway trace [flags] -- CMD ARGS... trace CMD's allocations (or a running process)
//	spillway stat [flags]                 show each GPU's processes, quotas and NVML's figures
//	spillway version                      print the version (also: spillway --version)
//	spillway help [COMMAND]               the commands, or COMMAND's flags
//
// It must never change what a program sees beyond the variables it is asked
// to set (LD_PRELOAD, GLIBC_TUNABLES, SPILLWAY_*), and never start one with
// an invalid flag: a bad value is an error before anything runs.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is set at link time with -ldflags "-X main.version=...".
var version = "dev"

// command is one subcommand.
type command struct {
	name, summary string
	main          func(args []string) int
}

var commands = []command{
	{"run", "run a program with the shim preloaded, under a quota", runMain},
	{"trace", "trace a program's or a running process's GPU memory with eBPF", traceMain},
	{"stat", "show each GPU's processes: quota, use, cache, spill and NVML's figures", statMain},
	{"version", "print the version", versionMain},
}

func main() {
	os.Exit(dispatch(os.Args[1:]))
}

func dispatch(args []string) int {
	if len(args) == 0 {
		usage(os.Stderr)
		return 2
	}
	switch a := args[0]; {
	case a == "help" || isHelpFlag(a):
		return help(args[1:])
	case a == "--version" || a == "-version":
		return versionMain(args[1:])
	}
	if c := lookupCommand(args[0]); c != nil {
		return c.main(args[1:])
	}
	if strings.HasPrefix(args[0], "-") && len(args[0]) > 1 {
		fmt.Fprintln(os.Stderr, flagBeforeCommand(args))
		return 2
	}
	fmt.Fprintf(os.Stderr, "spillway: unknown command %q (see 'spillway --help')\n", args[0])
	return 2
}

// flagBeforeCommand says that a flag, args[0], belongs after the command,
// with the command line meant where the command follows it.
func flagBeforeCommand(args []string) string {
	msg := fmt.Sprintf("spillway: %q is no command: a command's flags follow it", args[0])
	for i, a := range args {
		if a == "--" {
			break // the program's arguments
		}
		if lookupCommand(a) != nil {
			example := append(append([]string{"spillway", a}, args[:i]...), args[i+1:]...)
			return msg + " (valid example: " + strings.Join(example, " ") + ")"
		}
	}
	return msg + " (see 'spillway --help')"
}

func isHelpFlag(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

func lookupCommand(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// help shows the usage, or with a command's name that command's, as
// "spillway CMD --help" does; a word that names no command is refused, not
// answered with the usage as if it were understood.
func help(args []string) int {
	switch {
	case len(args) == 0 || len(args) == 1 && isHelpFlag(args[0]):
		usage(os.Stdout)
		return 0
	case len(args) > 1:
		fmt.Fprintf(os.Stderr, "spillway: help takes one command, not %q (see 'spillway --help')\n", strings.Join(args, " "))
		return 2
	}
	c := lookupCommand(args[0])
	if c == nil {
		fmt.Fprintf(os.Stderr, "spillway: unknown command %q (see 'spillway --help')\n", args[0])
		return 2
	}
	return c.main([]string{"--help"})
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: spillway <command> [flags] [-- CMD ARGS...]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'spillway <command> --help' for a command's flags; 'spillway --version' for the version.")
}

func versionMain(args []string) int {
	if len(args) == 1 && isHelpFlag(args[0]) {
		fmt.Println("usage: spillway version\n\nPrints the version, the commit it was built from and the Go toolchain.")
		return 0
	}
	if len(args) > 0 {
		fmt.Fprintln(os.Stderr, "spillway version: takes no arguments (see 'spillway --help')")
		return 2
	}
	rev := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				rev = " " + s.Value
			}
		}
	}
	fmt.Printf("spillway %s%s (%s %s/%s)\n", version, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return 0
}
