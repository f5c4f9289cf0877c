// Running programs under the preloaded shim and reading what they print.

package harness

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// CUDA runtime error codes the tests expect.
const (
	ErrInvalidValue     = 1
	ErrMemoryAllocation = 2
	ErrInitialization   = 3
	// cudaErrorHostMemoryNotRegistered: cudaHostUnregister of memory not registered.
	ErrHostMemoryNotRegistered = 713
)

// Front returns the preloaded library, failing the test when the shim is not built.
func Front(t testing.TB) string {
	t.Helper()
	lib := filepath.Join(LibDir(t), "libspillway.so")
	mustExist(t, lib)
	mustExist(t, filepath.Join(LibDir(t), "libspillway-core.so"))
	return lib
}

// Ops builds tests/harness/testdata/ops.c, the scriptable CUDA program the
// pool's and the host tier's tests share.
func Ops(t testing.TB) string {
	t.Helper()
	src := filepath.Join(Root(t), "tests", "harness", "testdata", "ops.c")
	return Compile(t, CBuild{Sources: []string{src}, Cudart: true, ProjectHeaders: true,
		Flags: []string{"-lcuda"}})
}

// Shimmed prepares prog under the shim, with env added to the clean
// environment Command gives.
func Shimmed(t testing.TB, env []string, prog string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := Command(t, prog, args...)
	SetEnv(cmd, "LD_PRELOAD="+Front(t))
	SetEnv(cmd, env...)
	return cmd
}

// Output is a program's stdout as lines of fields.
type Output [][]string

// ParseOutput splits s into lines of fields, dropping empty lines.
func ParseOutput(s string) Output {
	var out Output
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// Line returns the i-th line (from 0) whose first field is op.
func (o Output) Line(t testing.TB, op string, i int) []string {
	t.Helper()
	for _, l := range o {
		if l[0] == op {
			if i == 0 {
				return l
			}
			i--
		}
	}
	t.Fatalf("no line %q #%d in output %v", op, i, o)
	return nil
}

// Count returns how many lines start with op.
func (o Output) Count(op string) int {
	n := 0
	for _, l := range o {
		if l[0] == op {
			n++
		}
	}
	return n
}

// Num returns field of the i-th line for op as a number.
func (o Output) Num(t testing.TB, op string, i, field int) uint64 {
	t.Helper()
	l := o.Line(t, op, i)
	if field >= len(l) {
		t.Fatalf("line %v has no field %d", l, field)
	}
	n, err := strconv.ParseInt(l[field], 10, 64)
	if err != nil {
		t.Fatalf("line %v field %d: %v", l, field, err)
	}
	return uint64(n)
}

// Code returns the return code (field 1) of the i-th line for op.
func (o Output) Code(t testing.TB, op string, i int) int {
	t.Helper()
	return int(int64(o.Num(t, op, i, 1)))
}

// RunOK runs cmd like Run and fails the test unless it exits 0.
func RunOK(t testing.TB, cmd *exec.Cmd) (Result, Output) {
	t.Helper()
	res := Run(t, cmd)
	if res.ExitCode != 0 {
		t.Fatalf("%v exited %d\nstdout:\n%s\nstderr:\n%s", cmd.Args, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res, ParseOutput(res.Stdout)
}
