// Command spillway runs programs under Spillway's CUDA shim and traces them.
//
//	spillway run [flags] -- CMD ARGS...   run CMD with the shim preloaded
//	spillway trace [flags] -- CMD ARGS... trace CMD's allocations (or a running process)
//	spillway version                      print the version
//
// It must never change what a program sees beyond the variables it is asked
// to set (LD_PRELOAD, GLIBC_TUNABLES, SPILLWAY_*), and never start one with
// an invalid flag: a bad value is an error before anything runs.
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
)

// version is set at link time with -ldflags "-X main.version=...".
var version = "dev"

var commands = map[string]func(args []string) int{
	"run":     runMain,
	"trace":   traceMain,
	"version": versionMain,
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		if a := os.Args[1]; a == "help" || a == "-h" || a == "--help" {
			usage()
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "spillway: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	os.Exit(cmd(os.Args[2:]))
}

func usage() {
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: spillway <command> [arguments]\ncommands: %v\nrun 'spillway <command> -h' for a command's flags\n", names)
}

func versionMain(args []string) int {
	if len(args) > 0 {
		fmt.Fprintln(os.Stderr, "usage: spillway version")
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
