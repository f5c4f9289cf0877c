package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// SystemPython is Debian's interpreter, the one its python3-* packages are
// built for (a python3 earlier on PATH, such as a pyenv shim, may not see them).
const SystemPython = "/usr/bin/python3"

// EverythingMustRun reports whether this run is one where no test may skip
// for a missing prerequisite: CI sets CI=true, and SPILLWAY_REQUIRE_BPF=1
// asks the same of every suite.
func EverythingMustRun() bool {
	return os.Getenv("CI") == "true" || os.Getenv("SPILLWAY_REQUIRE_BPF") == "1"
}

// Unavailable skips t because what names is missing, or fails it when
// EverythingMustRun: a run that must run everything never passes by skipping.
func Unavailable(t testing.TB, what, why string) {
	t.Helper()
	if EverythingMustRun() {
		t.Fatalf("%s is required (CI=true or SPILLWAY_REQUIRE_BPF=1) but unavailable: %s", what, why)
	}
	t.Skipf("%s unavailable: %s (.ci/run installs it; CI=true makes this a failure)", what, why)
}

// ClientsDir returns build/clients, where .ci/run unpacks the Debian CUDA
// clients that cannot be installed without NVIDIA's driver packages.
func ClientsDir(t testing.TB) string {
	t.Helper()
	return filepath.Join(Root(t), "build", "clients")
}

// PythonCommand prepares Debian's python3 running args against simcuda (see
// Command), with the unpacked clients on PYTHONPATH.
func PythonCommand(t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	cmd := Command(t, SystemPython, args...)
	SetEnv(cmd, "PYTHONPATH="+filepath.Join(ClientsDir(t), "usr", "lib", "python3", "dist-packages"),
		"PYTHONDONTWRITEBYTECODE=1")
	return cmd
}

// RequirePythonModules makes sure Debian's python3 can import every module,
// or reports the missing ones through Unavailable.
func RequirePythonModules(t testing.TB, modules ...string) {
	t.Helper()
	if _, err := os.Stat(SystemPython); err != nil {
		Unavailable(t, SystemPython, err.Error())
		return
	}
	for _, m := range modules {
		res := Run(t, PythonCommand(t, "-c", "import "+m))
		if res.ExitCode != 0 {
			Unavailable(t, "python module "+m, strings.TrimSpace(lastLine(res.Stderr)))
			return
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
