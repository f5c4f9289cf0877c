package main

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestSignalsCaughtAfterTheChild: once the child has exited, the launcher
// still has work to do (spillway trace writes its summary): a SIGTERM or
// ^C arriving then is caught, not left to end the process, until the
// caller stops catching.
func TestSignalsCaughtAfterTheChild(t *testing.T) {
	sigs := catchSignals()
	defer sigs.stop()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if status := sigs.wait(cmd); status != 0 {
		t.Fatalf("true exited with %d", status)
	}
	// Left uncaught, this would end the test binary.
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-sigs.ch:
		if s != syscall.SIGTERM {
			t.Errorf("caught %v, want SIGTERM", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the SIGTERM sent after the child exited was not caught")
	}
}
