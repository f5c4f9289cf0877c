package simcudatest

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// TestPerThreadNames: under CUDA_API_PER_THREAD_DEFAULT_STREAM the
// project's cuda_runtime.h turns every call it declares that CUDA's header
// turns into a per-thread entry point into that same name, so that a
// program built so either runs with the calling thread's default stream or
// fails to link against simcuda; none keeps the legacy stream's name.
func TestPerThreadNames(t *testing.T) {
	obj := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/per_thread_names.c"},
		Out: "per_thread_names.o", ProjectHeaders: true, Flags: []string{"-c"}})
	out, err := exec.Command("nm", "--undefined-only", "--format=just-symbols", obj).Output()
	if err != nil {
		t.Fatalf("nm %s: %v", obj, err)
	}
	got := map[string]bool{}
	for _, name := range strings.Fields(string(out)) {
		got[name] = true
	}
	// CUDA's cuda_runtime_api.h: __CUDART_API_PTDS for the calls without a
	// stream, __CUDART_API_PTSZ for those with one.
	want := []string{
		"cudaMemcpy_ptds", "cudaMemset_ptds",
		"cudaMemcpyAsync_ptsz", "cudaMemsetAsync_ptsz", "cudaMallocAsync_ptsz", "cudaFreeAsync_ptsz",
		"cudaMallocFromPoolAsync_ptsz", "cudaMemPrefetchAsync_ptsz", "cudaStreamSynchronize_ptsz",
		"cudaStreamQuery_ptsz", "cudaEventRecord_ptsz", "cudaStreamWaitEvent_ptsz",
		"cudaLaunchHostFunc_ptsz", "cudaStreamBeginCapture_ptsz", "cudaStreamEndCapture_ptsz",
		"cudaStreamIsCapturing_ptsz", "cudaStreamGetCaptureInfo_ptsz",
		"cudaStreamGetCaptureInfo_v2_ptsz", "cudaGraphLaunch_ptsz", "cudaGetDriverEntryPoint_ptsz",
		"cudaGetDriverEntryPointByVersion_ptsz",
	}
	for _, name := range want {
		if !got[name] {
			legacy := strings.TrimSuffix(strings.TrimSuffix(name, "_ptsz"), "_ptds")
			t.Errorf("a per-thread build calls %s: want %s, as with CUDA's header", legacy, name)
		}
	}
	if len(got) != len(want) {
		t.Errorf("a per-thread build calls %d functions, want the %d listed: %v", len(got), len(want), got)
	}
}

// TestPerThreadStreams runs testdata/per_thread.c, built as with
// --default-stream per-thread: the runtime's _ptsz/_ptds entry points use
// the calling thread's default stream, not the legacy one.
func TestPerThreadStreams(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/per_thread.c"}, Cudart: true,
		ProjectHeaders: true})
	cases := []struct {
		name, why string
		calls     []string
	}{
		{"threads", "another thread's held default stream holds none of this thread's copies, memsets, allocations, prefetches, event waits or synchronizations",
			[]string{"cudaMallocAsync_ptsz", "cudaMemset_ptds", "cudaMemcpy_ptds", "cudaMemsetAsync_ptsz",
				"cudaMemcpyAsync_ptsz", "cudaFreeAsync_ptsz", "cudaStreamSynchronize_ptsz",
				"cudaStreamQuery_ptsz", "cudaEventRecord_ptsz", "cudaLaunchHostFunc_ptsz",
				"cudaMallocFromPoolAsync_ptsz", "cudaMemPrefetchAsync_ptsz", "cudaStreamWaitEvent_ptsz"}},
		{"own_order", "a copy without a stream waits for the work the thread queued on its default stream",
			[]string{"cudaMemcpy_ptds", "cudaMemsetAsync_ptsz", "cudaLaunchHostFunc_ptsz"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Logf("expect: %s", c.why)
			_, stats := runCase(t, bin, c.name)
			for _, name := range c.calls {
				if stats.Calls[name] == 0 {
					t.Errorf("the case never called %s: it did not run the per-thread entry points", name)
				}
			}
		})
	}
}
