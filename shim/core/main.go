// The embedded Go runtime must not hold the cgroup files open (the host may
// count its descriptors) nor change GOMAXPROCS behind the host's back.

//go:debug containermaxprocs=0
//go:debug updatemaxprocs=0

// The core of Spillway's shim: built with -buildmode=c-shared into
// libspillway-core.so, which the C front (shim/front) loads with RTLD_LOCAL
// at the first interposed CUDA call and calls through the spillway_core_*
// entry points declared in abi.h.
//
// This package is the C boundary only: the exported entry points, their
// type checks against calls.h (entries.c) and the one process-wide pointer
// to the core (core.go), which each entry point forwards to. The logic
// (configuration, the per-device pools, the quota's ledger, spilling) is
// internal/devmem's.
//
// It must never install signal handlers (no os/signal), never do work in
// init (the host may call in from a library constructor, and package init
// runs concurrently with the host), never call an interposed CUDA symbol by
// name (calls go through interpose), never let a panic cross into C, and
// export nothing but spillway_core_*. The front never calls it from a forked
// child, re-entrantly, or before spillway_core_init has returned.
package main

func main() {}
