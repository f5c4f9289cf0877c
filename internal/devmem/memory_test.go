package devmem

import (
	"errors"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/shim/config"
)

// fakeRuntime is a device of a given size whose allocations are plain
// counters; work completes at once, so every event is complete.
type fakeRuntime struct {
	mu        sync.Mutex
	capacity  uint64
	used      uint64 // device bytes: plain allocations and managed bytes on the device
	next      interpose.DevicePtr
	live      map[interpose.DevicePtr]fakeAlloc
	failNext  interpose.Error
	failFree  interpose.Error // the next release fails with it
	failSync  interpose.Error // the next cudaStreamSynchronize fails with it
	noManaged bool
	events    int // live events
	calls     map[string]int
	invalid   map[interpose.Stream]bool // streams never created or destroyed
	capturing map[interpose.Stream]bool // streams capturing a graph
	recorded  map[interpose.Stream]int  // events recorded, by stream
	queried   map[interpose.Stream]int  // cudaStreamGetCaptureInfo calls, by stream
}

type fakeAlloc struct {
	size     uint64
	kind     string // "device", "managed", "pinned"
	onDevice bool   // managed memory prefetched to the device
}

func newFake(capacity uint64) *fakeRuntime {
	return &fakeRuntime{capacity: capacity, next: 0x100000, live: map[interpose.DevicePtr]fakeAlloc{}, calls: map[string]int{},
		invalid: map[interpose.Stream]bool{}, capturing: map[interpose.Stream]bool{}, recorded: map[interpose.Stream]int{}, queried: map[interpose.Stream]int{}}
}

func (f *fakeRuntime) alloc(size uint64, kind string) (interpose.DevicePtr, interpose.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[kind]++
	if rc := f.failNext; rc != interpose.Success {
		f.failNext = interpose.Success
		return 0, rc
	}
	if kind == "device" && f.used+size > f.capacity {
		return 0, interpose.ErrorMemoryAllocation
	}
	p := f.next
	f.next += interpose.DevicePtr((size + 1<<20) &^ 511)
	f.live[p] = fakeAlloc{size: size, kind: kind}
	if kind == "device" {
		f.used += size
	}
	return p, interpose.Success
}

func (f *fakeRuntime) Malloc(size uint64) (interpose.DevicePtr, interpose.Error) {
	return f.alloc(size, "device")
}
func (f *fakeRuntime) MallocManaged(size uint64, _ uint32) (interpose.DevicePtr, interpose.Error) {
	return f.alloc(size, "managed")
}
func (f *fakeRuntime) MallocAsync(size uint64, _ interpose.Stream) (interpose.DevicePtr, interpose.Error) {
	return f.alloc(size, "device")
}
func (f *fakeRuntime) release(p interpose.DevicePtr, kind string) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p == 0 {
		return interpose.Success
	}
	if rc := f.failFree; rc != interpose.Success {
		f.failFree = interpose.Success
		return rc
	}
	a, ok := f.live[p]
	if !ok || (a.kind == "pinned") != (kind == "pinned") {
		return interpose.ErrorInvalidValue
	}
	delete(f.live, p)
	if a.kind == "device" || a.onDevice {
		f.used -= a.size
	}
	return interpose.Success
}
func (f *fakeRuntime) Free(p interpose.DevicePtr) interpose.Error { return f.release(p, "device") }
func (f *fakeRuntime) FreeAsync(p interpose.DevicePtr, _ interpose.Stream) interpose.Error {
	return f.release(p, "device")
}
func (f *fakeRuntime) MemGetInfo() (uint64, uint64, interpose.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.capacity - f.used, f.capacity, interpose.Success
}
func (f *fakeRuntime) DeviceReset() interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live = map[interpose.DevicePtr]fakeAlloc{}
	f.used = 0
	return interpose.Success
}
func (f *fakeRuntime) DeviceSynchronize() interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["sync"]++
	return interpose.Success
}
func (f *fakeRuntime) StreamSynchronize(interpose.Stream) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rc := f.failSync
	f.failSync = interpose.Success
	return rc
}
func (f *fakeRuntime) StreamDestroy(s interpose.Stream) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.invalid[s] = true
	return interpose.Success
}
func (f *fakeRuntime) StreamQuery(s interpose.Stream) interpose.Error {
	_, _, rc := f.StreamCapture(s)
	return rc
}

// StreamCapture: a capturing stream builds the graph numbered like the
// stream, plus 0x9000.
func (f *fakeRuntime) StreamCapture(s interpose.Stream) (interpose.CaptureStatus, uint64, interpose.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queried[s]++
	if f.invalid[s] {
		return interpose.CaptureNone, 0, interpose.ErrorInvalidResourceHandle
	}
	if f.capturing[s] {
		return interpose.CaptureActive, 0x9000 + uint64(s), interpose.Success
	}
	return interpose.CaptureNone, 0, interpose.Success
}
func (f *fakeRuntime) EventCreate(uint32) (interpose.Event, interpose.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events++
	return interpose.Event(f.events), interpose.Success
}
func (f *fakeRuntime) EventRecord(_ interpose.Event, s interpose.Stream) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recorded[s]++
	return interpose.Success
}
func (f *fakeRuntime) EventQuery(interpose.Event) interpose.Error       { return interpose.Success }
func (f *fakeRuntime) EventSynchronize(interpose.Event) interpose.Error { return interpose.Success }
func (f *fakeRuntime) EventDestroy(interpose.Event) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events--
	return interpose.Success
}
func (f *fakeRuntime) DeviceGetAttribute(interpose.DeviceAttr, int) (int, interpose.Error) {
	if f.noManaged {
		return 0, interpose.Success
	}
	return 1, interpose.Success
}
func (f *fakeRuntime) HostAlloc(size uint64, _ uint32) (uint64, interpose.Error) {
	p, rc := f.alloc(size, "pinned")
	return uint64(p), rc
}
func (f *fakeRuntime) FreeHost(host uint64) interpose.Error {
	return f.release(interpose.DevicePtr(host), "pinned")
}
func (f *fakeRuntime) HostGetDevicePointer(host uint64) (interpose.DevicePtr, interpose.Error) {
	return interpose.DevicePtr(host), interpose.Success
}
func (f *fakeRuntime) MemAdvise(interpose.DevicePtr, uint64, interpose.Advice, int) interpose.Error {
	return interpose.Success
}
func (f *fakeRuntime) MemPrefetchAsync(p interpose.DevicePtr, _ uint64, device int, _ interpose.Stream) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.live[p]
	switch {
	case !ok:
	case device >= 0 && !a.onDevice:
		a.onDevice = true
		f.used += a.size
	case device < 0 && a.onDevice:
		a.onDevice = false
		f.used -= a.size
	}
	if ok {
		f.live[p] = a
	}
	return interpose.Success
}

func (f *fakeRuntime) count(kind string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[kind]
}

// probeLog records the probes fired, as a tracer attached all along would.
type probeLog struct {
	mu                                           sync.Mutex
	allocs, frees, syncs, spills, promotes, refs int
	alloc, free                                  block  // the last of each
	refusedSize                                  uint64 // the last refuse probe's size
	onFree                                       func(interpose.DevicePtr)
}

// block is what an alloc or free probe reported.
type block struct {
	ptr    interpose.DevicePtr
	size   uint64
	device int
	tier   interpose.Tier
	source interpose.Source
}

func (p *probeLog) Enabled() bool { return true }

func (p *probeLog) Alloc(ptr interpose.DevicePtr, size uint64, device int, tier interpose.Tier, source interpose.Source) {
	p.mu.Lock()
	p.allocs++
	p.alloc = block{ptr, size, device, tier, source}
	p.mu.Unlock()
}
func (p *probeLog) Free(ptr interpose.DevicePtr, size uint64, device int, tier interpose.Tier) {
	p.mu.Lock()
	p.frees++
	p.free = block{ptr, size, device, tier, 0}
	onFree := p.onFree
	p.mu.Unlock()
	if onFree != nil {
		onFree(ptr)
	}
}
func (p *probeLog) Sync(int, uint64) { p.mu.Lock(); p.syncs++; p.mu.Unlock() }
func (p *probeLog) Spill(interpose.DevicePtr, uint64, int, interpose.Tier) {
	p.mu.Lock()
	p.spills++
	p.mu.Unlock()
}
func (p *probeLog) Promote(interpose.DevicePtr, uint64, int, interpose.Tier) {
	p.mu.Lock()
	p.promotes++
	p.mu.Unlock()
}
func (p *probeLog) Refuse(size uint64, _ int, _, _ uint64) {
	p.mu.Lock()
	p.refs++
	p.refusedSize = size
	p.mu.Unlock()
}

type refusal struct {
	size, used, quota uint64
	device            int
}

type testMemory struct {
	*memory
	probes   *probeLog
	refusals *[]refusal
	logged   *strings.Builder
}

func newTestMemory(t testing.TB, rt realRuntime, env ...string) testMemory {
	t.Helper()
	return newTestMemoryOver(t, RuntimeAPI, rt, env...)
}

// newTestMemoryOver is newTestMemory with rt calling api's functions.
func newTestMemoryOver(t testing.TB, api API, rt realRuntime, env ...string) testMemory {
	t.Helper()
	cfg, err := config.Parse(env)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var refusals []refusal
	logged := &strings.Builder{}
	log := newLogger(io.Discard, config.FormatText, config.LevelWarn)
	log.SetOutput(logged)
	probes := &probeLog{}
	on := func(int) realRuntime { return rt }
	m := newMemory(rt, on, api, cfg, probes, log, func(_ string, size uint64, device int, used, quota uint64) {
		mu.Lock()
		refusals = append(refusals, refusal{size, used, quota, device})
		mu.Unlock()
	})
	return testMemory{m, probes, &refusals, logged}
}

func TestQuotaAdmitsAndRefuses(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=1MiB")
	a, rc := m.malloc(request{device: 0, size: 768 << 10})
	if b := m.probes.alloc; rc != interpose.Success || b != (block{a, 768 << 10, 0, interpose.TierDevice, interpose.SourceReservation}) {
		t.Fatalf("first allocation: %+v %v", b, rc)
	}
	if _, rc := m.malloc(request{device: 0, size: 512 << 10}); rc != interpose.ErrorMemoryAllocation {
		t.Fatalf("over quota: %v", rc)
	}
	if len(*m.refusals) != 1 || (*m.refusals)[0] != (refusal{512 << 10, 768 << 10, 1 << 20, 0}) {
		t.Errorf("refusals %+v", *m.refusals)
	}
	if m.probes.refs != 1 {
		t.Errorf("%d refusal probes, want 1", m.probes.refs)
	}
	if rc := m.free(a, 0, false); rc != interpose.Success || m.probes.free != (block{a, 768 << 10, 0, interpose.TierDevice, 0}) {
		t.Errorf("free: %+v %v", m.probes.free, rc)
	}
	// The pool synchronizes for the freed block, then releases its segment.
	if _, rc := m.malloc(request{device: 0, size: 1 << 20}); rc != interpose.Success {
		t.Errorf("after the free the whole quota is available: %v", rc)
	}
}

// TestReserveAboveQuotaInBytes: a reserve and a percentage quota that one
// decimal writes alike (1.6GiB each) are told apart by their bytes.
func TestReserveAboveQuotaInBytes(t *testing.T) {
	cfg, err := config.Parse([]string{"SPILLWAY_MEMORY_LIMIT=10%", "SPILLWAY_POOL_RESERVE=1.6GiB"})
	if err != nil {
		t.Fatal(err)
	}
	err = deviceSettingError(cfg, 0, 16<<30)
	if err == nil || !strings.Contains(err.Error(), "1717987328 bytes") || !strings.Contains(err.Error(), "1717986918 bytes") {
		t.Errorf("a reserve of 1.6GiB above 10%% of 16GiB: %v, want both in bytes", err)
	}
}

// TestDeviceSettingErrorQuotesTheValueAsWritten: a setting found invalid
// once the device's total is known is quoted as the user wrote it, so that
// it can be found where it was set, not as the shim reformats it.
func TestDeviceSettingErrorQuotesTheValueAsWritten(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"SPILLWAY_MEMORY_LIMIT=10%", "SPILLWAY_POOL_RESERVE=2048MiB"}, `invalid SPILLWAY_POOL_RESERVE="2048MiB": `},
		{[]string{"SPILLWAY_MEMORY_LIMIT=10%", "SPILLWAY_POOL_RESERVE= 2147483648"}, `invalid SPILLWAY_POOL_RESERVE=" 2147483648": `},
		{[]string{"SPILLWAY_MEMORY_LIMIT=0.00000000010%"}, `invalid SPILLWAY_MEMORY_LIMIT="0.00000000010%": `},
		{[]string{"SPILLWAY_MEMORY_LIMIT_0=0.000000000100%"}, `invalid SPILLWAY_MEMORY_LIMIT_0="0.000000000100%": `},
	} {
		cfg, err := config.Parse(tc.env)
		if err != nil {
			t.Fatal(err)
		}
		if err := deviceSettingError(cfg, 0, 16<<30); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%v: %v, want it to begin %q", tc.env, err, tc.want)
		}
	}
}

// TestReserveAboveDeviceWithoutQuota: without a quota, a reserve above the
// device's memory is refused as larger than that memory: no quota was
// configured for the message to speak of.
func TestReserveAboveDeviceWithoutQuota(t *testing.T) {
	cfg, err := config.Parse([]string{"SPILLWAY_POOL_RESERVE=2GiB"})
	if err != nil {
		t.Fatal(err)
	}
	err = deviceSettingError(cfg, 0, 1<<30)
	if err == nil || !strings.Contains(err.Error(), "larger than the memory of device 0 (1GiB)") || strings.Contains(err.Error(), "quota") {
		t.Errorf("a reserve of 2GiB on a device of 1GiB without a quota: %v, want it larger than the device's memory, and no word of a quota", err)
	}
}

func TestCacheHitAfterSynchronize(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=64MiB")
	a, _ := m.malloc(request{size: 4096})
	m.free(a, 0, false)
	if rc := m.deviceSynchronize(0); rc != interpose.Success {
		t.Fatal(rc)
	}
	b, rc := m.malloc(request{size: 4096})
	if ev := m.probes.alloc; rc != interpose.Success || a != b || ev.source != interpose.SourceCache || ev.ptr != b {
		t.Errorf("after cudaDeviceSynchronize the block is reused from the cache: %#x vs %#x %+v", uint64(a), uint64(b), ev)
	}
	st := m.existing(0).pool.Stats()
	if st.ExternalSyncs != 1 || st.CacheHits != 1 {
		t.Errorf("stats %v", st)
	}
}

func TestPassThroughMode(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_POOL=0", "SPILLWAY_MEMORY_LIMIT=1MiB")
	a, rc := m.malloc(request{size: 4096})
	if ev := m.probes.alloc; rc != interpose.Success || ev.source != interpose.SourcePassThrough || rt.count("device") != 1 {
		t.Fatalf("%+v %v", ev, rc)
	}
	if rc := m.free(a, 0, false); rc != interpose.Success {
		t.Fatal(rc)
	}
	m.malloc(request{size: 4096})
	if rt.count("device") != 2 {
		t.Errorf("with the pool off every allocation reaches the runtime: %d calls", rt.count("device"))
	}
}

func TestFailedCallsRollBack(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_POOL=0")
	m.malloc(request{size: 512}) // creates the pool
	rt.failNext = interpose.ErrorInitialization
	if _, rc := m.malloc(request{size: 512 << 10}); rc != interpose.ErrorInitialization {
		t.Fatalf("the runtime's error must pass: %v", rc)
	}
	if free, total, _ := m.memGetInfo(0); free != 1<<20-512 || total != 1<<20 {
		t.Errorf("a failed call left accounting behind: free %d total %d", free, total)
	}
	// Unknown pointers get the runtime's answer and change nothing.
	if rc := m.free(0xdead000, 0, false); m.probes.frees != 0 || rc != interpose.ErrorInvalidValue {
		t.Errorf("unknown pointer: %d free probes, rc %v", m.probes.frees, rc)
	}
}

func TestDoubleFreeInPool(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=64MiB")
	a, _ := m.malloc(request{size: 4096})
	m.malloc(request{size: 4096}) // keeps the segment
	if rc := m.free(a, 0, false); rc != interpose.Success {
		t.Fatal(rc)
	}
	if rc := m.free(a, 0, false); m.probes.frees != 1 || rc != interpose.ErrorInvalidValue {
		t.Errorf("double free: %d free probes, rc %v", m.probes.frees, rc)
	}
	if rc := m.free(0, 0, false); rc != interpose.Success {
		t.Errorf("cudaFree(NULL): %v", rc)
	}
}

func TestPitch(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=100000")
	// 100 rows of 600 bytes fit unpadded (60000) but not padded to 1024 (102400).
	if _, _, rc := m.mallocPitch(RuntimeAPI, 0, 600, 100); rc != interpose.ErrorMemoryAllocation {
		t.Errorf("padded allocation over quota: %v", rc)
	}
	p, pitch, rc := m.mallocPitch(RuntimeAPI, 0, 600, 50)
	if b := m.probes.alloc; rc != interpose.Success || pitch != 1024 || b.size != 1024*50 || p == 0 || b.ptr != p {
		t.Errorf("pitched allocation: pitch %d block %+v rc %v", pitch, b, rc)
	}
	if _, _, rc := m.mallocPitch(RuntimeAPI, 0, 0, 5); rc != interpose.ErrorInvalidValue {
		t.Errorf("zero width: %v", rc)
	}
}

func TestMemGetInfoAndPercent(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=25%", "SPILLWAY_MEMORY_LIMIT_1=4GiB")
	if free, total, _ := m.memGetInfo(0); free != 256<<20 || total != 256<<20 {
		t.Errorf("25%% of 1 GiB: free %d total %d", free, total)
	}
	p, _ := m.malloc(request{device: 0, size: 56 << 20})
	if free, _, _ := m.memGetInfo(0); free != 200<<20 {
		t.Errorf("free %d after 56 MiB", free)
	}
	m.free(p, 0, false)
	if free, _, _ := m.memGetInfo(0); free != 256<<20 {
		t.Errorf("free %d after the free: cached memory is the application's", free)
	}
	// A quota above the device: free is what the device really has.
	if free, total, _ := m.memGetInfo(1); free != 1<<30-56<<20 || total != 4<<30 {
		t.Errorf("device 1: free %d total %d", free, total)
	}
	// And once the device is used: the quota's room counts only as far as
	// the device has free, and the pool's cache on top.
	if _, rc := m.malloc(request{device: 1, size: 100 << 20}); rc != interpose.Success {
		t.Fatal(rc)
	}
	realFree, _, _ := rt.MemGetInfo()
	cached := m.existing(1).pool.Stats().CachedBytes
	if free, total, _ := m.memGetInfo(1); free != realFree+cached || total != 4<<30 {
		t.Errorf("device 1 in use: free %d total %d, want the device's %d free and %d cached", free, total, realFree, cached)
	}
	// And after a reset, before the device's next use.
	if rc := m.deviceReset(1, rt.DeviceReset); rc != interpose.Success {
		t.Fatal(rc)
	}
	realFree, _, _ = rt.MemGetInfo()
	if free, total, _ := m.memGetInfo(1); free != realFree || total != 4<<30 {
		t.Errorf("device 1 after a reset: free %d total %d, want the device's %d free", free, total, realFree)
	}
}

func TestManagedAndAdoptedCountAgainstTheQuota(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=1MiB")
	m.adopt(0x42000, 256<<10, 0)
	p, rc := m.malloc(request{size: 512 << 10, kind: kindManaged})
	if ev := m.probes.alloc; rc != interpose.Success || ev.tier != interpose.TierHostManaged || ev.source != interpose.SourcePassThrough || ev.ptr != p {
		t.Fatalf("managed: %+v %v", ev, rc)
	}
	if _, rc := m.malloc(request{size: 512 << 10}); rc != interpose.ErrorMemoryAllocation {
		t.Errorf("managed and adopted memory do not count: %v", rc)
	}
	if _, rc := m.malloc(request{size: 512 << 10, kind: kindManaged}); rc != interpose.ErrorMemoryAllocation {
		t.Errorf("managed memory over the quota: %v", rc)
	}
	if rc := m.free(p, 0, false); rc != interpose.Success || m.probes.free != (block{p, 512 << 10, 0, interpose.TierHostManaged, 0}) {
		t.Errorf("free of managed memory: %+v %v", m.probes.free, rc)
	}
	if _, rc := m.malloc(request{size: 512 << 10}); rc != interpose.Success {
		t.Errorf("after the managed free: %v", rc)
	}
}

func TestDeviceReset(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=1MiB")
	m.malloc(request{size: 768 << 10})
	m.malloc(request{device: 1, size: 768 << 10})
	if rc := m.deviceReset(0, m.rt.DeviceReset); rc != interpose.Success {
		t.Fatal(rc)
	}
	if free, _, _ := m.memGetInfo(0); free != 1<<20 {
		t.Errorf("device 0 after reset: free %d", free)
	}
	if _, rc := m.malloc(request{size: 1 << 20}); rc != interpose.Success {
		t.Errorf("a new pool after the reset: %v", rc)
	}
	if free, _, _ := m.memGetInfo(1); free != 256<<10 {
		t.Errorf("a reset of device 0 changed device 1: free %d", free)
	}
}

func TestSpillAndPromote(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       []string
		noManaged bool
		tier      interpose.Tier
	}{
		{"managed", nil, false, interpose.TierHostManaged},
		{"pinned", []string{"SPILLWAY_SPILL=pinned"}, false, interpose.TierHostPinned},
		{"fallback", nil, true, interpose.TierHostPinned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newFake(1 << 30)
			rt.noManaged = tc.noManaged
			m := newTestMemory(t, rt, append(tc.env, "SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=2MiB")...)
			a, _ := m.malloc(request{size: 768 << 10})
			s, rc := m.malloc(request{size: 768 << 10})
			if ev := m.probes.alloc; rc != interpose.Success || ev.tier != tc.tier || ev.source != interpose.SourceReservation || m.probes.spills != 1 {
				t.Fatalf("spilled allocation: %+v %v, %d spill probes", ev, rc, m.probes.spills)
			}
			if free, total, _ := m.memGetInfo(0); total != 1<<20 || free != 256<<10 {
				t.Errorf("cudaMemGetInfo counts host memory: free %d total %d", free, total)
			}
			if _, rc := m.malloc(request{size: 2 << 20}); rc != interpose.ErrorMemoryAllocation {
				t.Errorf("past the host limit: %v", rc)
			}
			if strings.Contains(m.logged.String(), "does not support managed memory") != tc.noManaged {
				t.Errorf("log: %q", m.logged.String())
			}
			m.free(a, 0, false)
			m.deviceSynchronize(0)
			st := m.existing(0).pool.Stats()
			if tc.tier == interpose.TierHostManaged {
				if st.PromotedBytes != 768<<10 || m.probes.promotes != 1 || rt.used != 768<<10 {
					t.Errorf("no promotion after the free: %v, device holds %d", st, rt.used)
				}
			} else if st.PromotedBytes != 0 {
				t.Errorf("pinned memory promoted: %v", st)
			}
			if rc := m.free(s, 0, false); rc != interpose.Success {
				t.Errorf("free of the spilled block: %v", rc)
			}
			// The empty segment exceeds the release threshold (1/8 of the quota).
			if n := len(rt.live); n != 0 || rt.used != 0 {
				t.Errorf("%d allocations (%d device bytes) left in the runtime", n, rt.used)
			}
		})
	}
}

func TestConcurrentAccounting(t *testing.T) {
	rt := newFake(1 << 40)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=8MiB")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []interpose.DevicePtr
			for i := range 2000 {
				size := uint64(1+(g*7919+i*104729)%(1<<20)) | 1
				if p, rc := m.malloc(request{size: size}); rc == interpose.Success {
					held = append(held, p)
				}
				if len(held) > 4 {
					m.free(held[0], 0, false)
					held = held[1:]
				}
				if used := m.existing(0).ledger.used(); used > 8<<20 {
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
	d := m.existing(0)
	if st := d.pool.Stats(); st.LiveBytes != 0 || st.ReservedBytes != d.ledger.used() || rt.used != d.ledger.used() {
		t.Errorf("after every block was freed: %v, ledger %d, runtime %d", st, d.ledger.used(), rt.used)
	}
}

// The free probe of memory on the host (spilled by the pool, or the
// application's own managed memory) fires while the runtime still holds the
// memory: fired after, another thread could be handed the same address and
// report it first, and a tracer would forget the new block's range.
func TestFreeProbeFiresBeforeRelease(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_OVERSUBSCRIBE=1")
	held := map[interpose.DevicePtr]bool{}
	m.probes.onFree = func(p interpose.DevicePtr) {
		rt.mu.Lock()
		_, ok := rt.live[p]
		rt.mu.Unlock()
		held[p] = ok
	}
	m.malloc(request{size: 768 << 10})
	spilled, rc := m.malloc(request{size: 768 << 10})
	if rc != interpose.Success || m.probes.spills != 1 || rt.live[spilled].kind != "managed" {
		t.Fatalf("no managed spill: %v, %d spills", rc, m.probes.spills)
	}
	managed, rc := m.malloc(request{size: 4096, kind: kindManaged})
	if rc != interpose.Success {
		t.Fatal(rc)
	}
	for _, p := range []interpose.DevicePtr{spilled, managed} {
		if rc := m.free(p, 0, false); rc != interpose.Success {
			t.Fatal(rc)
		}
		if held, fired := held[p]; !fired || !held {
			t.Errorf("free of %#x: probe fired %v, while the runtime held it %v", uint64(p), fired, held)
		}
		if _, ok := rt.live[p]; ok {
			t.Errorf("%#x was not released", uint64(p))
		}
	}
}

func TestManagedWithoutQuotaMayExceedTheDevice(t *testing.T) {
	m := newTestMemory(t, newFake(1<<20))
	if _, rc := m.malloc(request{size: 4 << 20, kind: kindManaged}); rc != interpose.Success {
		t.Errorf("managed memory larger than the device, without a quota: %v", rc)
	}
	if _, rc := m.malloc(request{size: 512 << 10}); rc != interpose.Success {
		t.Errorf("device memory beside it: %v", rc)
	}
}

// BenchmarkPairOnLastDevice measures a cudaMalloc/cudaFree pair on device 7
// while devices 0-6 are in use too: the free must find its device without
// trying the others' pools.
func BenchmarkPairOnLastDevice(b *testing.B) {
	m := newTestMemory(b, newFake(1<<40), "SPILLWAY_MEMORY_LIMIT=1GiB")
	for d := range 8 {
		if _, rc := m.malloc(request{device: d, size: 4096}); rc != interpose.Success {
			b.Fatal(rc)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		p, rc := m.malloc(request{device: 7, size: 4096})
		if rc != interpose.Success {
			b.Fatal(rc)
		}
		if rc := m.free(p, 0, false); rc != interpose.Success {
			b.Fatal(rc)
		}
	}
}

// A cudaDeviceReset racing with allocations on other threads: no pool may
// hold memory the reset destroyed, and what stays charged is what the
// device really holds.
func TestDeviceResetRacesWithAllocations(t *testing.T) {
	rt := newFake(1 << 40)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []interpose.DevicePtr
			for i := 0; ; i++ {
				select {
				case <-stop:
					for _, p := range held {
						m.free(p, 0, false)
					}
					return
				default:
				}
				kind := kindDevice
				if i%5 == 0 {
					kind = kindManaged
				}
				if p, rc := m.malloc(request{size: uint64(4096 + (g*31+i)%64*8192), kind: kind}); rc == interpose.Success {
					held = append(held, p)
				}
				if len(held) > 8 {
					m.free(held[0], 0, false)
					held = held[1:]
				}
			}
		}()
	}
	for range 300 {
		before := rt.count("device") + rt.count("managed")
		for rt.count("device")+rt.count("managed") < before+3 {
			runtime.Gosched()
		}
		if rc := m.deviceReset(0, m.rt.DeviceReset); rc != interpose.Success {
			t.Fatal(rc)
		}
	}
	close(stop)
	wg.Wait()
	d := m.existing(0)
	if d == nil {
		return
	}
	rt.mu.Lock()
	used := rt.used
	rt.mu.Unlock()
	if st := d.pool.Stats(); d.ledger.used() != used || st.ReservedBytes != d.ledger.pool {
		t.Errorf("the device holds %d bytes, the ledger %d (pool %d), the pool reserved %d", used, d.ledger.used(), d.ledger.pool, st.ReservedBytes)
	}
}

// A spilled block freed in stream order holds no device bytes: making room
// for a reservation must not count on it (it once indexed an empty list).
func TestMakeRoomWithSpilledStreamFree(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_OVERSUBSCRIBE=1")
	// The application's managed memory holds most of the quota.
	if _, rc := m.malloc(request{size: 768 << 10, kind: kindManaged}); rc != interpose.Success {
		t.Fatal(rc)
	}
	spilled, rc := m.malloc(request{size: 512 << 10})
	if rc != interpose.Success || m.probes.spills != 1 {
		t.Fatalf("no spill: %v", rc)
	}
	if rc := m.free(spilled, 7, true); rc != interpose.Success {
		t.Fatal(rc)
	}
	if _, rc := m.malloc(request{size: 512 << 10}); rc != interpose.Success || m.probes.spills != 2 {
		t.Errorf("spilled again after a stream-ordered free: %v, %d spills", rc, m.probes.spills)
	}
}

// Return codes as CUDA's: an invalid or destroyed stream, a pitched size
// that overflows.
func TestReturnCodesAsCUDA(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB")
	const bogus, s = interpose.Stream(0xbad0), interpose.Stream(0x5000)
	rt.invalid[bogus] = true
	if _, rc := m.malloc(request{size: 4096, kind: kindAsync, stream: bogus}); rc != interpose.ErrorInvalidResourceHandle {
		t.Errorf("cudaMallocAsync on an invalid stream: %v", rc)
	}
	p, rc := m.malloc(request{size: 4096, kind: kindAsync, stream: s})
	if rc != interpose.Success {
		t.Fatal(rc)
	}
	m.streamDestroy(s)
	if rc := m.free(p, s, true); rc != interpose.ErrorInvalidResourceHandle {
		t.Errorf("cudaFreeAsync on a destroyed stream: %v", rc)
	}
	if rc := m.free(p, 0, true); rc != interpose.Success {
		t.Errorf("the block is still allocated after the refused free: %v", rc)
	}
	for range 3 {
		q, _ := m.malloc(request{size: 4096, kind: kindAsync, stream: 0x6000})
		m.free(q, 0x6000, true)
	}
	// Each marker recorded asked too, before recording.
	if n := rt.queried[0x6000] - rt.recorded[0x6000]; n != 1 {
		t.Errorf("a valid stream checked %d times, want once", n)
	}
	if _, _, rc := m.mallocPitch(RuntimeAPI, 0, 1<<40, 1<<40); rc != interpose.ErrorMemoryAllocation {
		t.Errorf("cudaMallocPitch with width*height overflowing: %v", rc)
	}
}

// While a stream captures a graph, the backing neither synchronizes nor
// records a marker there: it answers pool.ErrStreamCapture.
func TestNoSyncNorMarkerDuringCapture(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB")
	const s = interpose.Stream(0x7000)
	a, _ := m.malloc(request{size: 4096, kind: kindAsync, stream: s})
	m.malloc(request{size: 4096, kind: kindAsync, stream: s}) // keeps the segment
	rt.capturing[s], rt.capturing[0] = true, true
	if rc := m.free(a, s, true); rc != interpose.Success {
		t.Fatal(rc)
	}
	if rt.recorded[s] != 0 {
		t.Errorf("%d events recorded on a capturing stream", rt.recorded[s])
	}
	d := m.existing(0)
	if err := d.back.Synchronize(); !errors.Is(err, pool.ErrStreamCapture) || rt.count("sync") != 0 {
		t.Errorf("synchronize during capture: %v, %d device synchronizations", err, rt.count("sync"))
	}
	if _, err := d.back.RecordMarker(pool.Stream(s)); !errors.Is(err, pool.ErrStreamCapture) {
		t.Errorf("marker during capture: %v", err)
	}
	delete(rt.capturing, s)
	delete(rt.capturing, 0)
	if err := d.back.Synchronize(); err != nil || rt.count("sync") != 1 {
		t.Errorf("synchronize after the capture: %v", err)
	}
}

// A thread's per-thread identity, retired at the thread's exit, is
// forgotten by the pools and never reaches the real cudaStreamDestroy.
func TestRetirePerThreadIdentity(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB")
	const self = interpose.Stream(perThreadBit | 5)
	a, _ := m.malloc(request{size: 4096, kind: kindAsync, stream: self})
	m.malloc(request{size: 4096}) // keeps the segment
	if rc := m.free(a, self, true); rc != interpose.Success {
		t.Fatal(rc)
	}
	if rc := m.streamDestroy(self); rc != interpose.Success || rt.invalid[self] {
		t.Errorf("retiring a per-thread identity: %v, real cudaStreamDestroy called %v", rc, rt.invalid[self])
	}
	// Its freed block now waits for a synchronization like any cudaFree'd one.
	m.deviceSynchronize(0)
	if b, rc := m.malloc(request{size: 4096}); rc != interpose.Success || b != a {
		t.Errorf("the retired identity's block is not reused: %#x vs %#x %v", uint64(b), uint64(a), rc)
	}
}

// Failures nobody would see otherwise are counted in the report line and
// warned about: a release the runtime refuses, an allocation made while the
// core started that cannot be counted.
func TestFailuresReportedAndWarned(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_POOL_RELEASE_THRESHOLD=0")
	a, _ := m.malloc(request{size: 4096})
	m.free(a, 0, false)
	rt.failFree = interpose.ErrorUnknown
	m.deviceSynchronize(0) // releases the empty segment, which fails
	var report strings.Builder
	m.report(&report, config.FormatText)
	if !strings.Contains(report.String(), " release_errors=1 ") {
		t.Errorf("report: %q", report.String())
	}
	m.adopt(0x9000, 4096, -1)
	if log := m.logged.String(); !strings.Contains(log, "stays allocated") || !strings.Contains(log, "cannot be counted") {
		t.Errorf("warnings: %q", log)
	}
}

// A failed release names the function the core called: cuMemFree_v2 in a
// process with only the driver, cudaFree with the runtime.
func TestFailedReleaseNamesTheCoreCall(t *testing.T) {
	for _, c := range []struct {
		api       API
		call, not string
	}{
		{RuntimeAPI, "cudaFree(", "cuMemFree_v2"},
		{DriverAPI, "cuMemFree_v2(", "cudaFree"},
	} {
		rt := newFake(1 << 30)
		m := newTestMemoryOver(t, c.api, rt, "SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_POOL_RELEASE_THRESHOLD=0")
		a, _ := m.malloc(request{size: 4096})
		m.free(a, 0, false)
		rt.failFree = interpose.ErrorUnknown
		m.deviceSynchronize(0) // releases the empty segment, which fails
		log := m.logged.String()
		if !strings.Contains(log, "stays allocated") || !strings.Contains(log, c.call) || strings.Contains(log, c.not) {
			t.Errorf("API %d: want %q, not %q, in %q", c.api, c.call, c.not, log)
		}
	}
}

func TestLimiterPerKind(t *testing.T) {
	var a, b limiter
	if _, ok := a.allow(); !ok {
		t.Fatal("the first warning is held back")
	}
	if _, ok := a.allow(); ok {
		t.Error("a second warning within the interval passes")
	}
	if _, ok := b.allow(); !ok {
		t.Error("one kind's warning holds back another's")
	}
}

// A promotion whose wait fails moves the block back to the host, or keeps
// its bytes counted: the device never holds more than the quota.
func TestFailedPromotionKeepsTheQuota(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=1MiB", "SPILLWAY_OVERSUBSCRIBE=1")
	a, _ := m.malloc(request{size: 768 << 10})
	s, rc := m.malloc(request{size: 768 << 10})
	if rc != interpose.Success || m.probes.spills != 1 {
		t.Fatalf("no spill: %v", rc)
	}
	m.free(a, 0, false)
	rt.failSync = interpose.ErrorUnknown
	m.deviceSynchronize(0) // the promotion of s fails in its wait
	if st := m.existing(0).pool.Stats(); st.PromotedBytes != 0 {
		t.Fatalf("promoted although the wait failed: %v", st)
	}
	if _, rc := m.malloc(request{size: 768 << 10}); rc != interpose.Success {
		t.Fatal(rc)
	}
	rt.mu.Lock()
	used := rt.used
	rt.mu.Unlock()
	if used > 1<<20 {
		t.Errorf("the device holds %d bytes under a 1 MiB quota", used)
	}
	if rc := m.free(s, 0, false); rc != interpose.Success {
		t.Error(rc)
	}
}

// One rounding rule: a request that fits by cudaMemGetInfo's free figure is
// served, whatever the quota (which sets the pool's segment sizes).
func TestRequestThatFitsByFreeIsServed(t *testing.T) {
	const size = 1000001
	for _, quota := range []string{"8MiB", "32MiB", "64MiB", "100MiB", "1GiB"} {
		for _, env := range [][]string{nil, {"SPILLWAY_POOL=0"}} {
			m := newTestMemory(t, newFake(1<<34), append(env, "SPILLWAY_MEMORY_LIMIT="+quota)...)
			for i := 0; ; i++ {
				free, _, _ := m.memGetInfo(0)
				if free < size {
					break
				}
				if _, rc := m.malloc(request{size: size}); rc != interpose.Success {
					t.Errorf("quota %s %v: request %d of %d bytes refused with %d bytes free: %v", quota, env, i, size, free, rc)
					break
				}
			}
		}
	}
}

// TestNVMLMemoryPercentOfCUDATotal: NVML's quota is a share of the total
// CUDA reports (the front passes cuDeviceTotalMem's), the one the pool is
// built with at the first use: the same before it as after. A device
// without a quota gets quota 0, leaving NVML's own figures.
func TestNVMLMemoryPercentOfCUDATotal(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT_0=25%")
	c := &Core{cfg: m.cfg, mem: m.memory}
	if quota, used, rc := c.NVMLMemory(0, 1<<30); rc != interpose.Success || quota != 256<<20 || used != 0 {
		t.Errorf("before the first use: quota %d used %d (%v), want 256 MiB, 0", quota, used, rc)
	}
	if _, rc := m.malloc(request{device: 0, size: 56 << 20}); rc != interpose.Success {
		t.Fatalf("malloc: %v", rc)
	}
	_, total, _ := m.memGetInfo(0)
	if quota, used, rc := c.NVMLMemory(0, 1<<30); rc != interpose.Success || quota != total || quota != 256<<20 || used == 0 {
		t.Errorf("after it: quota %d used %d (%v), want cudaMemGetInfo's %d and the bytes held", quota, used, rc, total)
	}
	if quota, _, rc := c.NVMLMemory(1, 1<<30); rc != interpose.Success || quota != 0 {
		t.Errorf("a device without a quota: quota %d (%v), want 0", quota, rc)
	}
}
