package shimtest

import (
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// TestLastError: after an interposed call, cudaPeekAtLastError and
// cudaGetLastError report what the real call would have left. Failures the
// shim recovers from inside a call (a reservation refused before a retry, an
// event not yet reached, polled by the pool or by the accounting of
// stream-ordered frees with the pool off) never show, and an error the application had
// pending survives them; a call the shim refuses itself (the quota, a double
// free, a stream-ordered call on a destroyed stream) leaves its error, as
// CUDA's would; a refusal for an invalid setting
// (cudaErrorInitializationError, which no real call can leave) is returned
// and leaves the last error as it was.
func TestLastError(t *testing.T) {
	const errInvalidResourceHandle = 400 // cudaErrorInvalidResourceHandle
	prog := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/lasterror.c"}, Cudart: true, ProjectHeaders: true})
	for _, tc := range []struct {
		name string
		arg  string // the program's case, where it is not name
		env  []string
		// want: per line, the call's result, the peek, the get, and the
		// get after it
		want map[string][4]int
	}{
		{"retry", "", []string{"SIMCUDA_FAIL=cudaMalloc:1,cudaMalloc:3"}, map[string][4]int{
			"malloc":  {0, 0, 0, 0},
			"pending": {0, harness.ErrInvalidValue, harness.ErrInvalidValue, 0},
		}},
		{"marker", "", nil, map[string][4]int{
			"setup": {0, 0, 0, 0}, "malloc": {0, 0, 0, 0}, "free": {0, 0, 0, 0}, "sync": {0, 0, 0, 0},
		}},
		{"inflight", "", []string{"SPILLWAY_POOL=0"}, map[string][4]int{
			"free": {0, 0, 0, 0}, "sync": {0, 0, 0, 0},
		}},
		{"refuse", "", []string{"SPILLWAY_MEMORY_LIMIT=1MiB"}, map[string][4]int{
			"malloc": {harness.ErrMemoryAllocation, harness.ErrMemoryAllocation, harness.ErrMemoryAllocation, 0},
		}},
		{"invalid", "", []string{"SPILLWAY_MEMORY_LIMIT=8gigs"}, map[string][4]int{
			"malloc": {harness.ErrInitialization, 0, 0, 0},
		}},
		{"double", "", nil, map[string][4]int{
			"free": {harness.ErrInvalidValue, harness.ErrInvalidValue, harness.ErrInvalidValue, 0},
		}},
		{"stream", "", nil, map[string][4]int{
			"alloc": {errInvalidResourceHandle, errInvalidResourceHandle, errInvalidResourceHandle, 0},
			"free":  {errInvalidResourceHandle, errInvalidResourceHandle, errInvalidResourceHandle, 0},
		}},
		{"stream-pool-off", "stream", []string{"SPILLWAY_POOL=0"}, map[string][4]int{
			"alloc": {errInvalidResourceHandle, errInvalidResourceHandle, errInvalidResourceHandle, 0},
			"free":  {errInvalidResourceHandle, errInvalidResourceHandle, errInvalidResourceHandle, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arg := tc.arg
			if arg == "" {
				arg = tc.name
			}
			res, out := harness.RunOK(t, harness.Shimmed(t, tc.env, prog, arg))
			if res.ExitCode != 0 {
				t.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
			}
			for name, want := range tc.want {
				var got [4]int
				for i := range got {
					got[i] = int(out.Num(t, name, 0, i+1))
				}
				if got != want {
					t.Errorf("%s: result, peek, get, get again = %v, want %v\nstderr: %s", name, got, want, res.Stderr)
				}
			}
		})
	}
}
