package main

import (
	"sync"
	"testing"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/shim/config"
)

// fakeRuntime is one device of a given size whose allocations are plain
// counters; the current device is whatever the test says it is.
type fakeRuntime struct {
	mu       sync.Mutex
	capacity uint64
	used     uint64
	next     interpose.DevicePtr
	live     map[interpose.DevicePtr]uint64
	failNext interpose.Error
}

func newFake(capacity uint64) *fakeRuntime {
	return &fakeRuntime{capacity: capacity, next: 0x1000, live: map[interpose.DevicePtr]uint64{}}
}

func (f *fakeRuntime) alloc(size uint64) (interpose.DevicePtr, interpose.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rc := f.failNext; rc != interpose.Success {
		f.failNext = interpose.Success
		return 0, rc
	}
	if f.used+size > f.capacity {
		return 0, interpose.ErrorMemoryAllocation
	}
	p := f.next
	f.next += interpose.DevicePtr(size + 512)
	f.live[p] = size
	f.used += size
	return p, interpose.Success
}

func (f *fakeRuntime) Malloc(size uint64) (interpose.DevicePtr, interpose.Error) {
	return f.alloc(size)
}
func (f *fakeRuntime) MallocManaged(size uint64, _ uint32) (interpose.DevicePtr, interpose.Error) {
	return f.alloc(size)
}
func (f *fakeRuntime) MallocAsync(size uint64, _ interpose.Stream) (interpose.DevicePtr, interpose.Error) {
	return f.alloc(size)
}
func (f *fakeRuntime) MallocPitch(w, h uint64) (interpose.DevicePtr, uint64, interpose.Error) {
	pitch := (w + 511) / 512 * 512
	p, rc := f.alloc(pitch * h)
	return p, pitch, rc
}
func (f *fakeRuntime) Free(p interpose.DevicePtr) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p == 0 {
		return interpose.Success
	}
	size, ok := f.live[p]
	if !ok {
		return interpose.ErrorInvalidValue
	}
	delete(f.live, p)
	f.used -= size
	return interpose.Success
}
func (f *fakeRuntime) FreeAsync(p interpose.DevicePtr, _ interpose.Stream) interpose.Error {
	return f.Free(p)
}
func (f *fakeRuntime) MemGetInfo() (uint64, uint64, interpose.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.capacity - f.used, f.capacity, interpose.Success
}
func (f *fakeRuntime) DeviceReset() interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live = map[interpose.DevicePtr]uint64{}
	f.used = 0
	return interpose.Success
}

type refusal struct {
	size, used, quota uint64
	device            int
}

func newTestPassThrough(t *testing.T, rt realRuntime, env ...string) (*passThrough, *[]refusal) {
	t.Helper()
	cfg, err := config.Parse(env)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var refusals []refusal
	m := newPassThrough(rt, cfg, func(_ allocKind, size uint64, device int, used, quota uint64) {
		mu.Lock()
		refusals = append(refusals, refusal{size, used, quota, device})
		mu.Unlock()
	})
	return m, &refusals
}

func TestQuotaAdmitsAndRefuses(t *testing.T) {
	m, refusals := newTestPassThrough(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=1MiB")
	a, _, rc := m.malloc(request{device: 0, size: 768 << 10})
	if rc != interpose.Success {
		t.Fatal(rc)
	}
	if _, _, rc := m.malloc(request{device: 0, size: 512 << 10}); rc != interpose.ErrorMemoryAllocation {
		t.Fatalf("over quota: %v", rc)
	}
	if len(*refusals) != 1 || (*refusals)[0] != (refusal{512 << 10, 768 << 10, 1 << 20, 0}) {
		t.Errorf("refusals %+v", *refusals)
	}
	// Another device has its own quota.
	if _, _, rc := m.malloc(request{device: 1, size: 768 << 10}); rc != interpose.Success {
		t.Errorf("device 1: %v", rc)
	}
	if b, owned, rc := m.free(a, 0, false); rc != interpose.Success || !owned || b.size != 768<<10 {
		t.Errorf("free: %+v %v %v", b, owned, rc)
	}
	if _, _, rc := m.malloc(request{device: 0, size: 1 << 20}); rc != interpose.Success {
		t.Errorf("after the free the whole quota is available: %v", rc)
	}
}

func TestFailedCallsRollBack(t *testing.T) {
	rt := newFake(1 << 30)
	m, _ := newTestPassThrough(t, rt, "SPILLWAY_MEMORY_LIMIT=1MiB")
	rt.failNext = interpose.ErrorInitialization
	if _, _, rc := m.malloc(request{size: 512 << 10}); rc != interpose.ErrorInitialization {
		t.Fatalf("the runtime's error must pass: %v", rc)
	}
	if free, total, _ := m.memGetInfo(0); free != 1<<20 || total != 1<<20 {
		t.Errorf("a failed call left accounting behind: free %d total %d", free, total)
	}
	// Unknown pointers and double frees get the runtime's answer and change nothing.
	p, _, _ := m.malloc(request{size: 4096})
	m.free(p, 0, false)
	if _, owned, rc := m.free(p, 0, false); owned || rc != interpose.ErrorInvalidValue {
		t.Errorf("double free: owned %v rc %v", owned, rc)
	}
	if free, _, _ := m.memGetInfo(0); free != 1<<20 {
		t.Errorf("free %d after a double free", free)
	}
}

func TestPitchCountsPadding(t *testing.T) {
	m, _ := newTestPassThrough(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=100000")
	// 100 rows of 600 bytes fit unpadded (60000) but not padded to 1024 (102400).
	if _, _, _, rc := m.mallocPitch(0, 600, 100); rc != interpose.ErrorMemoryAllocation {
		t.Errorf("padded allocation over quota: %v", rc)
	}
	if free, _, _ := m.memGetInfo(0); free != 100000 {
		t.Errorf("refused pitched allocation left free %d", free)
	}
	p, pitch, b, rc := m.mallocPitch(0, 600, 50)
	if rc != interpose.Success || pitch != 1024 || b.size != 1024*50 || p == 0 {
		t.Errorf("pitched allocation: pitch %d block %+v rc %v", pitch, b, rc)
	}
}

func TestMemGetInfoAndPercent(t *testing.T) {
	rt := newFake(1 << 30)
	m, _ := newTestPassThrough(t, rt, "SPILLWAY_MEMORY_LIMIT=25%", "SPILLWAY_MEMORY_LIMIT_1=4GiB")
	if free, total, _ := m.memGetInfo(0); free != 256<<20 || total != 256<<20 {
		t.Errorf("25%% of 1 GiB: free %d total %d", free, total)
	}
	m.malloc(request{device: 0, size: 56 << 20})
	if free, _, _ := m.memGetInfo(0); free != 200<<20 {
		t.Errorf("free %d after 56 MiB", free)
	}
	// A quota above the device: free is what the device really has.
	if free, total, _ := m.memGetInfo(1); free != 1<<30-56<<20 || total != 4<<30 {
		t.Errorf("device 1: free %d total %d", free, total)
	}
}

func TestDeviceResetAndAdopt(t *testing.T) {
	m, _ := newTestPassThrough(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=1MiB")
	m.adopt(0x42, 512<<10, 0)
	if _, _, rc := m.malloc(request{size: 768 << 10}); rc != interpose.ErrorMemoryAllocation {
		t.Errorf("an adopted allocation does not count: %v", rc)
	}
	m.malloc(request{device: 1, size: 768 << 10})
	if rc := m.deviceReset(0); rc != interpose.Success {
		t.Fatal(rc)
	}
	if free, _, _ := m.memGetInfo(0); free != 1<<20 {
		t.Errorf("device 0 after reset: free %d", free)
	}
	if free, _, _ := m.memGetInfo(1); free != 256<<10 {
		t.Errorf("a reset of device 0 changed device 1: free %d", free)
	}
}

func TestConcurrentAccounting(t *testing.T) {
	m, _ := newTestPassThrough(t, newFake(1<<40), "SPILLWAY_MEMORY_LIMIT=8MiB")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []interpose.DevicePtr
			for i := range 2000 {
				size := uint64(1+(g*7919+i*104729)%(1<<20)) | 1
				if p, _, rc := m.malloc(request{size: size}); rc == interpose.Success {
					held = append(held, p)
				}
				if len(held) > 4 {
					m.free(held[0], 0, false)
					held = held[1:]
				}
				if used := m.quotas[0].used.Load(); used > 8<<20 {
					t.Errorf("used %d over the quota", used)
					return
				}
			}
			for _, p := range held {
				m.free(p, 0, false)
			}
		}()
	}
	wg.Wait()
	if used := m.quotas[0].used.Load(); used != 0 {
		t.Errorf("%d bytes still accounted after every block was freed", used)
	}
}

func TestPanicBecomesCUDAError(t *testing.T) {
	call := func() (rc int32) {
		defer recoverTo(&rc, "cudaMalloc")
		var m *passThrough
		m.malloc(request{size: 1}) // nil dereference
		return 0
	}
	if rc := call(); interpose.Error(rc) != interpose.ErrorUnknown {
		t.Errorf("a panic returned %d, want cudaErrorUnknown", rc)
	}
}
