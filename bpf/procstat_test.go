package bpf

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestProcStatNameWithParentheses: a process's name (comm) may hold spaces
// and parentheses, here "a) Z 1 (b": its state and parent are read after
// the name's last parenthesis, so that a running process is not taken for
// a zombie of pid 1, and Running reports it running.
func TestProcStatNameWithParentheses(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatalf("sleep: %v", err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	named := filepath.Join(t.TempDir(), "a) Z 1 (b")
	if err := os.WriteFile(named, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(named, "60")
	// A multi-call binary picks its program by argv[0]; comm is the file's name.
	cmd.Args[0] = "sleep"
	// Start returns once the program is executed.
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	state, parent, err := procStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if state == 'Z' || parent != os.Getpid() {
		t.Errorf("procStat of a running child named %q: state %q, parent %d; want it running, with parent %d", filepath.Base(named), state, parent, os.Getpid())
	}
	if !Running(cmd.Process.Pid) {
		t.Errorf("Running of a running child named %q: false", filepath.Base(named))
	}
}
