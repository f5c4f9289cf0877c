package main

import (
	"testing"

	"github.com/spillway-gpu/spillway/internal/devmem"
	"github.com/spillway-gpu/spillway/interpose"
)

func TestPanicBecomesCUDAError(t *testing.T) {
	call := func() (rc int32) {
		defer recoverTo(&rc, "cudaMalloc")
		var c *devmem.Core
		c.Malloc(devmem.RuntimeAPI, 0, 1) // nil dereference
		return 0
	}
	if rc := call(); interpose.Error(rc) != interpose.ErrorUnknown {
		t.Errorf("a panic returned %d, want cudaErrorUnknown", rc)
	}
}
