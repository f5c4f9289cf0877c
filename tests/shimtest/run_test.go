package shimtest

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// runWatchdog bounds waits in these tests; a hang, not a speed goal.
const runWatchdog = time.Minute

// Flag combinations the shim would reject are refused before anything
// runs, in one line naming the flag and the value as typed, with exit 2.
func TestSpillwayRunCombinations(t *testing.T) {
	spillway := harness.Bin(t, "spillway")
	for _, tc := range []struct {
		args    []string
		env     []string
		mention []string
	}{
		{[]string{"--pool=false", "--pool-reserve", "1GiB"}, nil, []string{`--pool-reserve="1GiB"`, "needs the pool", "--pool=true"}},
		{[]string{"--lib", "/tmp"}, nil, []string{`--lib="/tmp"`, "is not a file"}},
		{[]string{"--lib", "/etc/passwd"}, nil, []string{`--lib="/etc/passwd"`, "not a shared object"}},
		{[]string{"--memory-limit", "1GiB", "--pool-reserve", "1.5GiB"}, nil, []string{`--pool-reserve="1.5GiB"`, "larger than the quota of every device (1GiB)", "--pool-reserve 512MiB"}},
		{[]string{"--memory-limit-device", "1=0.5GiB", "--pool-reserve", "1GiB"}, nil, []string{"larger than the quota of device 1 (512MiB)"}},
		{[]string{"--pool-reserve", "1GiB"}, []string{"SPILLWAY_POOL=0"}, []string{`--pool-reserve="1GiB"`, "needs the pool, but SPILLWAY_POOL=0"}},
		{[]string{"--memory-limit", "8GiBs"}, nil, []string{`--memory-limit="8GiBs"`, "unknown unit"}},
		{[]string{"--memory-limit-device", "0=0"}, nil, []string{`--memory-limit-device="0=0"`, "--memory-limit-device 0=8GiB"}},
		{[]string{"--pool=maybe"}, nil, []string{`--pool="maybe"`, "want true or false"}},
		{[]string{"--pool", "false"}, nil, []string{"--pool false", "(valid example: --pool=false; to run the program \"false\": --pool -- false)"}},
		{[]string{"--oversubscribe", "1"}, nil, []string{"--oversubscribe 1", "(valid example: --oversubscribe=1; to run the program \"1\": --oversubscribe -- 1)"}},
		{[]string{"--vmm=maybe"}, nil, []string{`--vmm="maybe"`, "want true or false"}},
		{[]string{"--no-such-flag"}, nil, []string{"unknown flag --no-such-flag"}},
		{[]string{"--memory-limit", "0"}, nil, []string{`--memory-limit="0"`, "zero bytes"}},
		// A size's unit written as a word of its own: no 8-byte quota, no program "GiB".
		{[]string{"--memory-limit", "8", "GiB"}, nil, []string{`--memory-limit="8"`, "a quota of 8 bytes, less than the smallest allocation (512 bytes)", "8GiB"}},
		{[]string{"--oversubscribe", "--host-limit", "0"}, nil, []string{`--host-limit="0"`, "zero bytes"}},
		{[]string{"--pool-reserve", "0"}, nil, []string{`--pool-reserve="0"`, "zero bytes"}},
		// A device is numbered as in SPILLWAY_MEMORY_LIMIT_<n>: digits, no sign, no leading zero.
		{[]string{"--memory-limit-device", "+1=1GiB"}, nil, []string{`--memory-limit-device="+1=1GiB"`, "DEVICE from 0 to 1023"}},
		{[]string{"--memory-limit-device", "01=1GiB"}, nil, []string{`--memory-limit-device="01=1GiB"`, "DEVICE from 0 to 1023"}},
		{[]string{"--memory-limit-device", " 1=1GiB"}, nil, []string{`--memory-limit-device=" 1=1GiB"`, "DEVICE from 0 to 1023"}},
		// A core that is not where SPILLWAY_CORE says would leave the job without its quota.
		{nil, []string{"SPILLWAY_CORE=/nonexistent/libspillway-core.so"}, []string{`invalid SPILLWAY_CORE="/nonexistent/libspillway-core.so"`, "no such file", "(in the environment)"}},
		{nil, []string{"SPILLWAY_CORE=/etc/passwd"}, []string{`invalid SPILLWAY_CORE="/etc/passwd"`, "not a shared object"}},
		// A log file the core cannot open would refuse every allocation.
		{nil, []string{"SPILLWAY_LOG_FILE=/nonexistent-dir/spillway.log"}, []string{`invalid SPILLWAY_LOG_FILE="/nonexistent-dir/spillway.log"`, "no such file", "(in the environment)"}},
		// A size that cannot be a percentage is not offered one.
		{[]string{"--oversubscribe", "--host-limit", "50%"}, nil, []string{`--host-limit="50%"`, "expected a size such as 512MiB, 8GiB, 8GB or 8G (valid example"}},
		{[]string{"--pool-reserve", "10%"}, nil, []string{`--pool-reserve="10%"`, "expected a size such as 512MiB, 8GiB, 8GB or 8G (valid example"}},
	} {
		cmd := harness.Command(t, spillway, append(append([]string{"run"}, tc.args...), "--", "sh", "-c", "echo ran")...)
		harness.SetEnv(cmd, tc.env...)
		res := harness.Run(t, cmd)
		lines := strings.Split(strings.TrimSpace(res.Stderr), "\n")
		if res.ExitCode != 2 || res.Stdout != "" || len(lines) != 1 || !strings.HasSuffix(lines[0], "(see 'spillway run --help')") {
			t.Errorf("spillway run %v: exit %d, stdout %q, stderr %q: want 2, nothing run, one line", tc.args, res.ExitCode, res.Stdout, res.Stderr)
		}
		for _, m := range tc.mention {
			if !strings.Contains(res.Stderr, m) {
				t.Errorf("spillway run %v: stderr %q does not mention %q", tc.args, res.Stderr, m)
			}
		}
		// Given only flags, the line speaks of flags: a variable the user
		// never set would send them looking for it.
		if strings.Contains(res.Stderr, "map[") || tc.env == nil && (strings.Contains(res.Stderr, "SPILLWAY_") || strings.Contains(res.Stderr, "variable")) {
			t.Errorf("spillway run %v: %q names variables or Go values, not flags", tc.args, res.Stderr)
		}
	}
}

// Every invalid setting is refused at once, a line each in name order:
// fixing one never reveals the next. Exit 2, nothing run.
func TestSpillwayRunEveryInvalidSetting(t *testing.T) {
	cmd := harness.Command(t, harness.Bin(t, "spillway"), "run", "--pool=false", "--pool-reserve", "1GiB", "--", "sh", "-c", "echo ran")
	harness.SetEnv(cmd, "SPILLWAY_SPILL=disk", "SPILLWAY_LOG_LEVEL=verbose")
	res := harness.Run(t, cmd)
	lines := nonEmptyLines(res.Stderr)
	want := []string{`spillway run: invalid SPILLWAY_LOG_LEVEL="verbose": expected one of error, warn, info, debug`,
		`spillway run: invalid --pool-reserve="1GiB": a reserve needs the pool, but --pool=false`,
		`spillway run: invalid SPILLWAY_SPILL="disk": expected managed or pinned`}
	if res.ExitCode != 2 || res.Stdout != "" || len(lines) != len(want) || !strings.HasSuffix(lines[len(lines)-1], "(see 'spillway run --help')") {
		t.Fatalf("exit %d, stdout %q, stderr %q: want 2, nothing run, %d lines, the last with the help", res.ExitCode, res.Stdout, res.Stderr, len(want))
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, want[i]) {
			t.Errorf("line %d %q, want it to begin %q", i, l, want[i])
		}
	}
}

// Help lists every flag with two dashes and a description; the top level
// lists each command in one line; --version works.
func TestSpillwayHelp(t *testing.T) {
	spillway := harness.Bin(t, "spillway")
	res := harness.Run(t, harness.Command(t, spillway, "run", "--help"))
	for _, flag := range []string{"--memory-limit SIZE", "--memory-limit-device N=SIZE", "--log-level LEVEL", "--lib PATH",
		"--oversubscribe\n", "--spill KIND", "--host-limit SIZE", "--pool\n", "--pool-reserve SIZE",
		"--pool-release-threshold SIZE", "--free-sync\n", "--report\n", "--vmm\n"} {
		if !strings.Contains(res.Stdout, "  "+flag) {
			t.Errorf("run --help lacks %q:\n%s", flag, res.Stdout)
		}
	}
	// A flag's value name appears once, beside the flag, not again in brackets.
	if res.ExitCode != 0 || strings.Contains(res.Stdout, "\n  -memory") || strings.Contains(res.Stdout, "(LEVEL)") {
		t.Errorf("run --help: exit %d\n%s", res.ExitCode, res.Stdout)
	}
	// Every command's help goes to standard output, to be paged or searched.
	for _, c := range []string{"trace", "stat", "version"} {
		if res := harness.Run(t, harness.Command(t, spillway, c, "--help")); res.ExitCode != 0 || !strings.Contains(res.Stdout, "usage: spillway "+c) || res.Stderr != "" {
			t.Errorf("spillway %s --help: exit %d, stdout %q, stderr %q", c, res.ExitCode, res.Stdout, res.Stderr)
		}
	}
	res = harness.Run(t, harness.Command(t, spillway, "--help"))
	for _, c := range []string{"run", "trace", "stat", "version"} {
		if !regexpLine(res.Stdout, "  "+c+" ") {
			t.Errorf("top-level help lacks a line for %s:\n%s", c, res.Stdout)
		}
	}
	if res := harness.Run(t, harness.Command(t, spillway, "--version")); res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "spillway ") {
		t.Errorf("spillway --version: %+v", res)
	}
}

func regexpLine(text, prefix string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

// With standard input at /dev/null (a character device, not a terminal),
// SIGINT and SIGQUIT sent to the launcher reach the job, and the launcher
// exits 128+signal.
func TestSpillwayRunForwardsInterrupt(t *testing.T) {
	spillway := harness.Bin(t, "spillway")
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGQUIT} {
		cmd := harness.Command(t, spillway, "run", "--", "sh", "-c", "echo started; exec sleep 300")
		devnull, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdin = devnull
		launcher, _ := startReading(t, cmd)
		launcher.Process.Signal(sig)
		code := waitCode(t, launcher)
		devnull.Close()
		if code != 128+int(sig) {
			t.Errorf("%v to the launcher: exit %d, want %d", sig, code, 128+int(sig))
		}
	}
}

// SIGKILL of the launcher kills the job too: it is never left orphaned.
func TestSpillwayRunKilledLauncher(t *testing.T) {
	spillway := harness.Bin(t, "spillway")
	cmd := harness.Command(t, spillway, "run", "--", "sh", "-c", "echo $$; exec sleep 300")
	launcher, first := startReading(t, cmd)
	job, err := strconv.Atoi(first)
	if err != nil {
		t.Fatalf("job pid %q: %v", first, err)
	}
	launcher.Process.Kill()
	waitCode(t, launcher)
	deadline := time.Now().Add(runWatchdog)
	for syscall.Kill(job, 0) == nil {
		if state, _ := os.ReadFile("/proc/" + first + "/stat"); strings.Contains(string(state), ") Z ") {
			break // dead, waiting for its new parent to reap it
		}
		if time.Now().After(deadline) {
			syscall.Kill(job, syscall.SIGKILL)
			t.Fatalf("job %d still running %v after its launcher was killed", job, runWatchdog)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startReading starts cmd and returns it with the first line it printed.
func startReading(t *testing.T, cmd *exec.Cmd) (*exec.Cmd, string) {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case s := <-line:
		return cmd, s
	case <-time.After(runWatchdog):
		t.Fatalf("%v printed nothing within %v", cmd.Args, runWatchdog)
	}
	return nil, ""
}

func waitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(runWatchdog):
		t.Fatalf("%v did not exit within %v", cmd.Args, runWatchdog)
	}
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return -int(ws.Signal())
	}
	return ws.ExitStatus()
}

// SIGHUP or SIGINT that the launcher was started ignoring (SIGHUP under
// nohup, SIGINT in a background job of a script) stays ignored, by the
// launcher and by the program, as it would be without the launcher: a job
// under nohup outlives a hangup.
func TestSpillwayRunKeepsIgnoredSignals(t *testing.T) {
	spillway := harness.Bin(t, "spillway")
	job := `echo started; sleep 1; grep SigIgn /proc/$$/status`
	cmd := harness.Command(t, "/bin/sh", "-c", `trap "" HUP INT; exec "$0" run -- /bin/sh -c "$1"`, spillway, job)
	cmd.Stdin = nil // /dev/null: no terminal sends these signals itself
	out := &strings.Builder{}
	launcher, first, restRead := startReadingAll(t, cmd, out)
	if first != "started" {
		t.Fatalf("first line %q, want started", first)
	}
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGINT} {
		launcher.Process.Signal(sig)
	}
	code := waitCode(t, launcher)
	<-restRead
	if code != 0 {
		t.Fatalf("SIGHUP and SIGINT, ignored, sent to the launcher: exit %d, want 0 (output %q)", code, out.String())
	}
	mask := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(out.String()), "SigIgn:"))
	ignored, err := strconv.ParseUint(mask, 16, 64)
	if err != nil {
		t.Fatalf("the job's SigIgn %q: %v", out.String(), err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGINT} {
		if ignored&(1<<(sig-1)) == 0 {
			t.Errorf("%v is not ignored by the job (SigIgn %s), as it was by its launcher", sig, mask)
		}
	}
}

// startReadingAll is startReading, what cmd prints after its first line
// going to rest, read whole once the returned channel is closed.
func startReadingAll(t *testing.T, cmd *exec.Cmd, rest *strings.Builder) (*exec.Cmd, string, <-chan struct{}) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	line := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer r.Close()
		br := bufio.NewReader(r)
		s, _ := br.ReadString('\n')
		line <- strings.TrimSpace(s)
		io.Copy(rest, br)
	}()
	select {
	case s := <-line:
		return cmd, s, done
	case <-time.After(runWatchdog):
		t.Fatalf("%v printed nothing within %v", cmd.Args, runWatchdog)
	}
	return nil, "", nil
}

// A ^C typed at the terminal whose foreground the launcher runs in reaches
// the program once, from the terminal, whatever the launcher's standard
// input: redirected from /dev/null, the launcher passed it on as well, and
// the program was interrupted twice.
func TestSpillwayRunInterruptFromTerminalOnce(t *testing.T) {
	spillway := harness.Bin(t, "spillway")
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/sigcount.c"}})
	for _, stdin := range []string{"the terminal", os.DevNull} {
		master, terminal := openPTY(t)
		cmd := harness.Command(t, spillway, "run", "--", prog)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = terminal, terminal, terminal
		if stdin == os.DevNull {
			cmd.Stdin = nil
		}
		// A session of its own, whose controlling terminal is the new one,
		// with the launcher in its foreground, as a shell would start it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 1}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		terminal.Close()
		lines := make(chan string, 16)
		go func() {
			defer close(lines)
			r := bufio.NewReader(master)
			for {
				s, err := r.ReadString('\n')
				if s != "" {
					lines <- strings.TrimSpace(s)
				}
				if err != nil {
					return // EIO once the last writer is gone
				}
			}
		}()
		var got []string
		for l := range lines {
			got = append(got, l)
			if l == "ready" {
				master.Write([]byte{3}) // ^C, as typed
			}
		}
		code := waitCode(t, cmd)
		master.Close()
		if code != 0 || !strings.Contains(strings.Join(got, "\n"), "SIGINT x1") {
			t.Errorf("^C at the terminal, standard input %s: exit %d, output %q; want the program interrupted once", stdin, code, got)
		}
	}
}

// openPTY opens a new pseudo-terminal: its master, and the terminal a
// program is given.
func openPTY(t *testing.T) (master, terminal *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		harness.Unavailable(t, "a pseudo-terminal (/dev/ptmx)", err.Error())
	}
	t.Cleanup(func() { master.Close() })
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlocking the pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("numbering the pseudo-terminal: %v", err)
	}
	terminal, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening the pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { terminal.Close() })
	return master, terminal
}
