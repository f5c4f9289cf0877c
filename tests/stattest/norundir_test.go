package stattest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// checkNVMLOnly checks that a run of spillway stat showed simcuda's two GPUs
// and no process, and exited with status 0.
func checkNVMLOnly(t *testing.T, how string, res harness.Result) {
	t.Helper()
	if res.ExitCode != 0 || strings.Count(res.Stdout, "simcuda GPU") != 2 || !strings.Contains(res.Stdout, "no process") {
		t.Errorf("%s: exit %d, stdout:\n%s\nstderr:\n%s\nwant status 0 and both GPUs without processes", how, res.ExitCode, res.Stdout, res.Stderr)
	}
}

// On a node where no process has published yet, the runtime directory
// does not exist: not an error. Every form of spillway stat shows what
// NVML reports, says nothing on standard error and exits with status 0.
func TestStatBeforeAnyProcessPublished(t *testing.T) {
	e := newEnv(t) // e.runtime is not made
	checkNVMLOnly(t, "spillway stat", runStat(t, e))
	res := runStat(t, e, "--json")
	var s statJSON
	if err := json.Unmarshal([]byte(res.Stdout), &s); err != nil || res.ExitCode != 0 || res.Stderr != "" || len(s.Devices) != 2 {
		t.Errorf("--json: exit %d, %v, stdout %s, stderr %q; want status 0 and two GPUs", res.ExitCode, err, res.Stdout, res.Stderr)
	}

	// --watch: one refresh, then interrupted.
	watch := harness.Command(t, harness.Bin(t, "spillway"), "stat", "--watch", "50ms", "--json")
	e.apply(watch)
	out, stderr := startWatch(t, watch)
	first, _ := out.ReadString('\n')
	watch.Process.Signal(syscall.SIGINT)
	io.Copy(io.Discard, out) // to its end, before Wait
	if err := harness.WaitWithin(t, watch, watchdog); err != nil || !strings.Contains(first, `"processes":[]`) || stderr.Len() != 0 {
		t.Errorf("--watch: %v, first refresh %q, stderr %q; want status 0 and a refresh without processes", err, first, stderr.String())
	}

	metrics := harness.Command(t, harness.Bin(t, "spillway"), "stat", "--metrics-addr", "127.0.0.1:0")
	e.apply(metrics)
	lines, err := metrics.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := metrics.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { metrics.Process.Signal(syscall.SIGTERM); metrics.Wait() }()
	line, _ := bufio.NewReader(lines).ReadString('\n')
	addr := regexp.MustCompile(`http://(\S+)/metrics`).FindStringSubmatch(line)
	if addr == nil {
		t.Fatalf("--metrics-addr: no address in %q", line)
	}
	if body := fetch(t, "http://"+addr[1]+"/metrics"); !strings.Contains(body, `spillway_gpu_memory_total_bytes{gpu="1",`) {
		t.Errorf("--metrics-addr: no GPU's figures in:\n%s", body)
	}
}

// A user without XDG_RUNTIME_DIR (a cron job, a session no login manager
// opened) and without SPILLWAY_RUNTIME_DIR has no runtime directory: the
// processes they run publish nowhere. spillway stat there still shows what
// NVML reports, with one line on standard error saying why no figures are
// read and what to set, and exits with status 0, in every form.
// asNobodyIfRoot returns, for a test run as root, the credentials of user
// 65534 to run spillway stat with (root reads every folder and has a
// runtime directory of its own), and gives e a simcuda state folder that
// user can open; nil otherwise.
func asNobodyIfRoot(t *testing.T, e *env) *syscall.SysProcAttr {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	state, err := os.MkdirTemp("", "stattest-state")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	if err := os.Chmod(state, 0o777); err != nil {
		t.Fatal(err)
	}
	e.state = state
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
}

func TestStatWithoutRuntimeDirectory(t *testing.T) {
	e := newEnv(t)
	// As root, the default folder is /run/spillway: the test runs stat as
	// another user.
	asUser := asNobodyIfRoot(t, &e)
	command := func(args ...string) *exec.Cmd {
		cmd := harness.Command(t, harness.Bin(t, "spillway"), append([]string{"stat"}, args...)...)
		e.apply(cmd)
		kept := cmd.Env[:0]
		for _, kv := range cmd.Env {
			if !strings.HasPrefix(kv, "SPILLWAY_RUNTIME_DIR=") && !strings.HasPrefix(kv, "XDG_RUNTIME_DIR=") {
				kept = append(kept, kv)
			}
		}
		cmd.Env = kept
		if asUser != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: asUser.Credential}
		}
		return cmd
	}
	saysWhy := func(how, stderr string) {
		t.Helper()
		if strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "XDG_RUNTIME_DIR is unset") || !strings.Contains(stderr, "SPILLWAY_RUNTIME_DIR") {
			t.Errorf("%s: stderr %q; want one line saying XDG_RUNTIME_DIR is unset and naming SPILLWAY_RUNTIME_DIR", how, stderr)
		}
	}
	res := harness.Run(t, command())
	checkNVMLOnly(t, "spillway stat", res)
	saysWhy("spillway stat", res.Stderr)
	res = harness.Run(t, command("--json"))
	if !json.Valid([]byte(res.Stdout)) || res.ExitCode != 0 || !strings.Contains(res.Stdout, `"processes":[]`) {
		t.Errorf("--json: exit %d, stdout %q; want status 0 and the GPUs without processes", res.ExitCode, res.Stdout)
	}
	saysWhy("--json", res.Stderr)

	// --watch says it once, not at each refresh.
	watch := command("--watch", "20ms", "--json")
	out, stderr := startWatch(t, watch)
	for range 3 {
		if line, _ := out.ReadString('\n'); !strings.Contains(line, `"processes":[]`) {
			t.Errorf("--watch: refresh %q; want the GPUs without processes", line)
			break
		}
	}
	watch.Process.Signal(syscall.SIGINT)
	io.Copy(io.Discard, out) // to its end, before Wait
	if err := harness.WaitWithin(t, watch, watchdog); err != nil {
		t.Errorf("--watch: %v; want status 0 once interrupted", err)
	}
	saysWhy("--watch", stderr.String())
}

// startWatch starts a `spillway stat --watch` command and returns its
// standard output, read by lines, and what it writes on standard error.
func startWatch(t *testing.T, watch *exec.Cmd) (*bufio.Reader, *strings.Builder) {
	t.Helper()
	stderr := new(strings.Builder)
	watch.Stderr = stderr
	stdout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	return bufio.NewReader(stdout), stderr
}

// A runtime folder every user can write, without the sticky bit, lets any
// of them remove or replace a job's figures file: spillway stat names it
// and its mode on standard error, in one line, and goes on. A folder only
// its owner can write, or a sticky one (as /tmp is), says nothing.
func TestStatWarnsOfFolderOthersCanWrite(t *testing.T) {
	for _, c := range []struct {
		mode os.FileMode
		warn bool
	}{{0o777, true}, {0o757, true}, {0o700, false}, {0o777 | os.ModeSticky, false}} {
		e := newEnv(t)
		if err := os.Mkdir(e.runtime, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(e.runtime, c.mode); err != nil {
			t.Fatal(err)
		}
		res := runStat(t, e)
		checkNVMLOnly(t, c.mode.String(), res)
		said := strings.Contains(res.Stderr, e.runtime) && strings.Contains(res.Stderr, fmt.Sprintf("%04o", c.mode.Perm())) &&
			strings.Count(res.Stderr, "\n") == 1
		if said != c.warn || !c.warn && res.Stderr != "" {
			t.Errorf("folder of mode %v: stderr %q; want a line naming it and its mode: %v", c.mode, res.Stderr, c.warn)
		}
	}
}

// A runtime folder spillway stat cannot read (another user's, named by
// SPILLWAY_RUNTIME_DIR) is named on standard error, in one line, beside
// what NVML reports, with exit status 0: the other figures are shown, and
// the caller learns why a job is missing.
func TestStatNamesFolderItCannotRead(t *testing.T) {
	e := newEnv(t)
	if err := os.Mkdir(e.runtime, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := harness.Command(t, harness.Bin(t, "spillway"), "stat")
	// Root reads any folder: stat runs as another user.
	if cmd.SysProcAttr = asNobodyIfRoot(t, &e); cmd.SysProcAttr == nil {
		if err := os.Chmod(e.runtime, 0); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(e.runtime, 0o700) })
	}
	e.apply(cmd)
	res := harness.Run(t, cmd)
	checkNVMLOnly(t, "spillway stat", res)
	if strings.Count(res.Stderr, "\n") != 1 || !strings.Contains(res.Stderr, e.runtime) || !strings.Contains(res.Stderr, "permission denied") {
		t.Errorf("stderr %q; want one line naming %s and why it cannot be read", res.Stderr, e.runtime)
	}
}
