package main

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/spillway-gpu/spillway/internal/devmem"
	"github.com/spillway-gpu/spillway/interpose"
)

// theCore is the core of this process. The entry points reach it through
// this one process-wide pointer: C calls carry no context.
var theCore atomic.Pointer[devmem.Core]

// start is the first call into the core; the front makes it exactly once,
// before any other entry point. frontABI is the front's ABI version.
func start(frontABI int32, real, probes unsafe.Pointer) interpose.Error {
	c, rc := devmem.Start(frontABI, abiVersion, real, probes)
	if c != nil {
		theCore.Store(c)
	}
	return rc
}

// running returns the started core. The front calls no other entry point
// before start has returned, so a nil here is a broken front.
func running() *devmem.Core {
	c := theCore.Load()
	if c == nil {
		panic("spillway core called before spillway_core_init")
	}
	return c
}

// recoverTo turns a panic at an entry point into cudaErrorUnknown and a log line.
func recoverTo[T ~int32](rc *T, call string) {
	r := recover()
	if r == nil {
		return
	}
	*rc = T(interpose.ErrorUnknown)
	msg := fmt.Sprintf("internal error in %s: %v; the call fails with cudaErrorUnknown", call, r)
	if c := theCore.Load(); c != nil {
		c.LogError(msg)
	} else {
		fmt.Fprintln(os.Stderr, "spillway: "+msg)
	}
}
