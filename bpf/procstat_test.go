package bpf

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestProcStatusNameWithParentheses: a process's name (comm) may hold
// spaces and parentheses, here "a) Z 1 (b", which would pass for a zombie of
// pid 1 where the fields follow the name on one line (/proc/PID/stat): its
// process, parent and state are read as the running process it is, and
// Running reports it running.
func TestProcStatusNameWithParentheses(t *testing.T) {
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
	pid := cmd.Process.Pid
	tgid, parent, state, err := procStatus(pid)
	if err != nil {
		t.Fatal(err)
	}
	if tgid != pid || state == 'Z' || state == 'X' || parent != os.Getpid() {
		t.Errorf("procStatus of a running child named %q, pid %d: process %d, state %q, parent %d; want it its own process, running, with parent %d",
			filepath.Base(named), pid, tgid, state, parent, os.Getpid())
	}
	if !Running(cmd.Process.Pid) {
		t.Errorf("Running of a running child named %q: false", filepath.Base(named))
	}
}
