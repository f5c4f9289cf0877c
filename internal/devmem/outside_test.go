package devmem

import (
	"slices"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/interpose"
)

// TestVMMLedger: a handle's bytes are taken once at cuMemCreate however
// often it is mapped, and given back only once it is released (every
// reference) and unmapped (every mapping), in either order.
func TestVMMLedger(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=8MiB")
	c := &Core{mem: m.memory}
	const granule = 2 << 20
	create := func(h uint64) interpose.Error {
		rc := c.Take(0, granule, TakeVMM)
		if rc == interpose.Success {
			c.VMMCreated(h, 0, granule, TakeVMM)
		}
		return rc
	}
	used := func() uint64 { return m.existing(0).ledger.used() }
	for h := uint64(1); h <= 4; h++ {
		if rc := create(h); rc != interpose.Success {
			t.Fatalf("handle %d of 2 MiB under 8 MiB: %v", h, rc)
		}
	}
	if rc := create(5); rc != interpose.ErrorMemoryAllocation || m.probes.refs != 1 {
		t.Fatalf("a fifth 2 MiB handle under 8 MiB: %v, %d refuse probes", rc, m.probes.refs)
	}
	c.VMMMapped(0x100000000, granule, 1)
	c.VMMMapped(0x100200000, granule, 1) // the same handle twice
	c.VMMRetained(1)                     // through one of its mappings
	c.VMMReleased(1)
	c.VMMUnmapped(0x100000000, 2*granule) // both mappings at once
	if got := used(); got != 8<<20 {
		t.Errorf("a handle still retained once gave its bytes back: used %d", got)
	}
	c.VMMReleased(1)
	if got := used(); got != 6<<20 {
		t.Errorf("after the last release of an unmapped handle: used %d, want 6 MiB", got)
	}
	c.VMMMapped(0x100000000, granule, 2)
	c.VMMReleased(2)
	if got := used(); got != 6<<20 {
		t.Errorf("a released handle still mapped gave its bytes back: used %d", got)
	}
	c.VMMUnmapped(0x100000000, granule)
	c.VMMReleased(2) // released twice: CUDA refuses it, nothing changes
	c.VMMUnmapped(0x200000000, granule)
	c.VMMReleased(99)
	if got := used(); got != 4<<20 {
		t.Errorf("after unmapping a released handle: used %d, want 4 MiB", got)
	}
}

// TestRefuseProbeSizeAligned: a request refused outside the pool (an
// allocation in a created context, the program's managed memory) reports
// the bytes the ledger would have taken, in 512-byte units, as a refusal
// in the pool does: the probe point's sizes are the bytes accounted, and a
// tracer's refused bytes add up alike wherever the quota refused.
func TestRefuseProbeSizeAligned(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=1MiB")
	c := &Core{mem: m.memory}
	const odd = 1<<20 + 1
	if rc := c.Take(0, odd, TakeContext); rc != interpose.ErrorMemoryAllocation || m.probes.refusedSize != charge(odd) {
		t.Errorf("an allocation of %d bytes in a created context over a 1 MiB quota: %v, refuse probe size %d, want %d",
			uint64(odd), rc, m.probes.refusedSize, charge(odd))
	}
	m.probes.refusedSize = 0
	if _, rc := m.malloc(request{size: odd, kind: kindManaged}); rc != interpose.ErrorMemoryAllocation || m.probes.refusedSize != charge(odd) {
		t.Errorf("managed memory of %d bytes over a 1 MiB quota: %v, refuse probe size %d, want %d",
			uint64(odd), rc, m.probes.refusedSize, charge(odd))
	}
	m.probes.refusedSize = 0
	if _, rc := m.malloc(request{size: odd}); rc != interpose.ErrorMemoryAllocation || m.probes.refusedSize != charge(odd) {
		t.Errorf("a pooled allocation of %d bytes over a 1 MiB quota: %v, refuse probe size %d, want %d",
			uint64(odd), rc, m.probes.refusedSize, charge(odd))
	}
}

// TestVMMUnmapRange: one cuMemUnmap over several mappings forgets them all,
// those of handles the ledger does not know too, and also past a gap (a
// mapping made while the core was not listening).
func TestVMMUnmapRange(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=8MiB")
	c := &Core{mem: m.memory}
	const granule = 2 << 20
	for h := uint64(1); h <= 2; h++ {
		if rc := c.Take(0, granule, TakeVMM); rc != interpose.Success {
			t.Fatalf("handle %d: %v", h, rc)
		}
		c.VMMCreated(h, 0, granule, TakeVMM)
	}
	const at = interpose.DevicePtr(0x100000000)
	c.VMMMapped(at, granule, 1)
	c.VMMMapped(at+2*granule, granule, 2)  // after a gap
	c.VMMMapped(at+3*granule, granule, 77) // a handle the ledger does not know
	c.VMMMapped(at+4*granule, granule, 1)  // past the range: stays
	c.VMMReleased(1)
	c.VMMReleased(2)
	c.VMMUnmapped(at, 4*granule)
	used := func() uint64 { return m.existing(0).ledger.used() }
	if got, n := used(), len(c.vmm.mappings); got != 2<<20 || n != 1 {
		t.Errorf("after unmapping the range: used %d, want 2 MiB (handle 1 still mapped past it); %d mappings left, want 1", got, n)
	}
	c.VMMUnmapped(at+4*granule, granule)
	if got, n := used(), len(c.vmm.mappings); got != 0 || n != 0 {
		t.Errorf("after the last unmap: used %d, %d mappings left; want none", got, n)
	}
}

// TestVMMHostPlacement: under oversubscription, a cuMemCreate the quota
// refuses (quietly) is admitted within the host limit instead, counted
// there until CUDA frees it; beyond the host limit it is refused and
// reported once. Without oversubscription the host admits nothing.
func TestVMMHostPlacement(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=4MiB", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=4MiB")
	c := &Core{mem: m.memory}
	const granule = 2 << 20
	for h := uint64(1); h <= 2; h++ {
		if rc := c.Take(0, granule, TakeVMM|TakeQuiet); rc != interpose.Success {
			t.Fatalf("device handle %d: %v", h, rc)
		}
		c.VMMCreated(h, 0, granule, TakeVMM)
	}
	if rc := c.Take(0, granule, TakeVMM|TakeQuiet); rc != interpose.ErrorMemoryAllocation || m.probes.refs != 0 {
		t.Fatalf("a quiet refusal: %v, %d refuse probes", rc, m.probes.refs)
	}
	for h := uint64(3); h <= 4; h++ {
		if rc := c.Take(0, granule, TakeVMMHost); rc != interpose.Success {
			t.Fatalf("host handle %d: %v", h, rc)
		}
		c.VMMCreated(h, 0, granule, TakeVMMHost)
	}
	hostHeld := func() uint64 { return m.existing(0).pool.Stats().HostOutside }
	if rc := c.Take(0, granule, TakeVMMHost); rc != interpose.ErrorMemoryAllocation || m.probes.refs != 1 || hostHeld() != 2*granule {
		t.Fatalf("beyond the host limit: %v, %d refuse probes, %d bytes on the host", rc, m.probes.refs, hostHeld())
	}
	if figs := m.figures(); len(figs) != 1 || figs[0].HostOutside != 2*granule || figs[0].Used != 2*granule {
		t.Errorf("published figures %+v, want the two host handles' bytes on the host and the device ones' used", figs)
	}
	c.VMMMapped(0x100000000, granule, 3)
	c.VMMMapped(0x100200000, granule, 1) // a device handle: not spilled
	if m.probes.spills != 1 {
		t.Errorf("%d spill probes for one mapping of a host handle, want 1", m.probes.spills)
	}
	c.VMMReleased(3)
	c.VMMReleased(4)
	if got := hostHeld(); got != granule {
		t.Errorf("one host handle freed, one still mapped: %d bytes on the host, want %d", got, granule)
	}
	c.VMMUnmapped(0x100000000, 2*granule)
	if m.probes.frees != 1 {
		t.Errorf("%d free probes after unmapping a host handle and a device one, want 1", m.probes.frees)
	}
	if got, used := hostHeld(), m.existing(0).ledger.used(); got != 0 || used != 2*granule {
		t.Errorf("host handles freed: %d bytes on the host, %d used on the device; want 0 and the device handles' %d", got, used, 2*granule)
	}

	off := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=4MiB")
	if rc := (&Core{mem: off.memory}).Take(0, granule, TakeVMMHost); rc != interpose.ErrorMemoryAllocation {
		t.Fatalf("host placement without oversubscription: %v", rc)
	}
}

// TestVMMAccessGrantsCPU: the application's cuMemSetAccess over a run of
// mappings grants the CPU each mapping of a handle placed on the host, one
// call per mapping, and nothing else: not device memory in the same run,
// not another mapping of the same handle outside it. A driver that refuses
// is said once and not asked again.
func TestVMMAccessGrantsCPU(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=4MiB", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=4MiB")
	c := &Core{mem: m.memory}
	const granule = 2 << 20
	for h, kind := range map[uint64]TakeKind{1: TakeVMM, 2: TakeVMM, 3: TakeVMMHost, 4: TakeVMMHost} {
		if rc := c.Take(0, granule, kind|TakeQuiet); rc != interpose.Success {
			t.Fatalf("handle %d: %v", h, rc)
		}
		c.VMMCreated(h, 0, granule, kind)
	}
	const at = interpose.DevicePtr(0x100000000)
	for i, h := range []uint64{1, 3, 2, 4, 3} {
		c.VMMMapped(at+interpose.DevicePtr(i*granule), granule, h)
	}
	type grant struct {
		at   interpose.DevicePtr
		size uint64
	}
	var grants []grant
	answer := interpose.Success
	c.vmm.grantCPU = func(p interpose.DevicePtr, size uint64) interpose.Error {
		grants = append(grants, grant{p, size})
		return answer
	}
	c.VMMAccessed(at, 4*granule)
	if want := []grant{{at + granule, granule}, {at + 3*granule, granule}}; !slices.Equal(grants, want) {
		t.Errorf("a run of device and host mappings granted the CPU %v, want the host ones alone %v", grants, want)
	}
	if m.logged.Len() != 0 {
		t.Errorf("granted, yet logged: %s", m.logged)
	}

	grants, answer = nil, interpose.ErrorInvalidValue
	c.VMMAccessed(at+3*granule, 2*granule)
	c.VMMAccessed(at+granule, granule)
	if want := []grant{{at + 3*granule, granule}}; !slices.Equal(grants, want) {
		t.Errorf("refused: the CPU was asked %v, want once %v and never again", grants, want)
	}
	if n := strings.Count(m.logged.String(), "the CPU cannot reach the program's cuMemCreate memory placed on the host"); n != 1 {
		t.Errorf("the refusal was said %d times, want once:\n%s", n, m.logged)
	}
}

// TestContextLedger: allocations recorded in a created context are given
// back when the context is destroyed; another context's stay.
func TestContextLedger(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=8MiB")
	c := &Core{mem: m.memory}
	for i, ctx := range []uint64{1, 1, 2} {
		if rc := c.Take(0, 2<<20, TakeContext); rc != interpose.Success {
			t.Fatal(rc)
		}
		c.CtxRecord(ctx, 0, interpose.DevicePtr(0x1000*(i+1)), 2<<20, false)
	}
	if b, ok := c.CtxForget(0x1000); !ok || b.Ctx != 1 || b.Size != 2<<20 {
		t.Fatalf("forget: %+v %v", b, ok)
	}
	c.Give(0, 2<<20, TakeContext)
	if n := c.CtxDestroyed(1); n != 1 {
		t.Errorf("destroying context 1 gave back %d allocations, want 1", n)
	}
	if got := m.existing(0).ledger.used(); got != 2<<20 {
		t.Errorf("used %d after context 1 went, want context 2's 2 MiB", got)
	}
	if _, ok := c.CtxForget(0x2000); ok {
		t.Error("an allocation of a destroyed context is still recorded")
	}
}

// TestContextLedgerSetAsideWhileDestroyed: while a context is being
// destroyed its allocations' addresses are no longer taken for its own,
// their bytes stay taken, and they are given back once it is gone, or
// recorded again if it lives on.
func TestContextLedgerSetAsideWhileDestroyed(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=8MiB")
	c := &Core{mem: m.memory}
	for i, ctx := range []uint64{1, 1, 2} {
		if rc := c.Take(0, 2<<20, TakeContext); rc != interpose.Success {
			t.Fatal(rc)
		}
		c.CtxRecord(ctx, 0, interpose.DevicePtr(0x1000*(i+1)), 2<<20, false)
	}
	c.CtxDestroying(1)
	if _, ok := c.CtxForget(0x1000); ok {
		t.Fatal("an address of a context being destroyed is still taken for its allocation")
	}
	if got := m.existing(0).ledger.used(); got != 6<<20 {
		t.Errorf("used %d while context 1 is destroyed, want all 6 MiB", got)
	}
	c.CtxKept(1)
	if b, ok := c.CtxForget(0x1000); !ok || b.Ctx != 1 {
		t.Fatalf("context 1 lived on, but its allocation was not recorded again: %+v %v", b, ok)
	}
	c.CtxRecord(1, 0, 0x1000, 2<<20, false)
	c.CtxDestroying(1)
	if n := c.CtxDestroyed(1); n != 2 {
		t.Errorf("destroying context 1 gave back %d allocations, want 2", n)
	}
	if got := m.existing(0).ledger.used(); got != 2<<20 {
		t.Errorf("used %d after context 1 went, want context 2's 2 MiB", got)
	}
}

// TestContextLedgerDestroyedByTwoThreads: two threads destroying one
// context at once, with an allocation recorded between the two, set aside
// both allocations, and the destroy gives both back.
func TestContextLedgerDestroyedByTwoThreads(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=8MiB")
	c := &Core{mem: m.memory}
	for _, p := range []interpose.DevicePtr{0x1000, 0x2000} {
		if rc := c.Take(0, 2<<20, TakeContext); rc != interpose.Success {
			t.Fatal(rc)
		}
		c.CtxRecord(1, 0, p, 2<<20, false)
		c.CtxDestroying(1)
	}
	if n := c.CtxDestroyed(1); n != 2 {
		t.Errorf("destroying context 1 gave back %d allocations, want 2", n)
	}
	if got := m.existing(0).ledger.used(); got != 0 {
		t.Errorf("used %d after context 1 went, want nothing", got)
	}
}

// TestContextLedgerKeptContextFreedThenDestroyed: a context that lived on
// through a failed destroy, whose allocation was then freed, gives back
// nothing more when it is destroyed: the bytes freed are not given back a
// second time, which would leave other memory uncounted.
func TestContextLedgerKeptContextFreedThenDestroyed(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=8MiB")
	c := &Core{mem: m.memory}
	for i, ctx := range []uint64{1, 2} {
		if rc := c.Take(0, 2<<20, TakeContext); rc != interpose.Success {
			t.Fatal(rc)
		}
		c.CtxRecord(ctx, 0, interpose.DevicePtr(0x1000*(i+1)), 2<<20, false)
	}
	c.CtxDestroying(1)
	c.CtxKept(1)
	if _, ok := c.CtxForget(0x1000); !ok {
		t.Fatal("context 1 lived on, but its allocation was not recorded again")
	}
	c.Give(0, 2<<20, TakeContext)
	c.CtxDestroying(1)
	if n := c.CtxDestroyed(1); n != 0 {
		t.Errorf("destroying context 1, which held nothing, gave back %d allocations, want 0", n)
	}
	if got := m.existing(0).ledger.used(); got != 2<<20 {
		t.Errorf("used %d after context 1 went, want context 2's 2 MiB", got)
	}
}

// TestContextLedgerPoolMemoryOutlivesContext: pool memory recorded in a
// created context stays found and taken while the context is destroyed
// and after, now the primary context's: a reset of that gives it back.
func TestContextLedgerPoolMemoryOutlivesContext(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=8MiB")
	c := &Core{mem: m.memory}
	for i, fromPool := range []bool{false, true, true} {
		if rc := c.Take(0, 2<<20, TakeContext); rc != interpose.Success {
			t.Fatal(rc)
		}
		c.CtxRecord(1, 0, interpose.DevicePtr(0x1000*(i+1)), 2<<20, fromPool)
	}
	c.CtxDestroying(1)
	if b, ok := c.CtxForget(0x2000); !ok || b.Ctx != 1 || !b.FromPool {
		t.Fatalf("pool memory of a context being destroyed is not found: %+v %v", b, ok)
	}
	c.CtxRecord(1, 0, 0x2000, 2<<20, true) // its free failed
	if n := c.CtxDestroyed(1); n != 1 {
		t.Errorf("destroying context 1 gave back %d allocations, want 1 (not its pool memory)", n)
	}
	if got := m.existing(0).ledger.used(); got != 4<<20 {
		t.Errorf("used %d after context 1 went, want its 4 MiB of pool memory", got)
	}
	if b, ok := c.CtxForget(0x2000); !ok || b.Ctx != 0 || !b.FromPool {
		t.Fatalf("pool memory of a destroyed context is not the primary context's: %+v %v", b, ok)
	}
	c.Give(0, 2<<20, TakeContext)
	if n := c.blocksGone(0, 0); n != 1 {
		t.Errorf("a primary context reset gave back %d allocations, want the 1 left", n)
	}
	if got := m.existing(0).ledger.used(); got != 0 {
		t.Errorf("used %d after the reset, want 0", got)
	}
}

// TestLedgerOutlivesReset: a cuMemCreate handle outlives a reset of the
// primary context, and stays counted against the pool built after it.
func TestLedgerOutlivesReset(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=16MiB")
	c := &Core{mem: m.memory}
	if rc := c.Take(0, 8<<20, TakeVMM); rc != interpose.Success {
		t.Fatal(rc)
	}
	c.VMMCreated(1, 0, 8<<20, TakeVMM)
	if _, rc := m.malloc(request{size: 4 << 20, kind: kindManaged}); rc != interpose.Success {
		t.Fatal(rc)
	}
	if rc := m.deviceReset(0, m.rt.DeviceReset); rc != interpose.Success {
		t.Fatal(rc)
	}
	// The reset freed the managed block, not the handle.
	if _, rc := m.malloc(request{size: 12 << 20}); rc != interpose.ErrorMemoryAllocation {
		t.Fatalf("12 MiB beside an 8 MiB handle under 16 MiB after a reset: %v", rc)
	}
	if p, rc := m.malloc(request{size: 8 << 20}); rc != interpose.Success || m.existing(0).ledger.used() != 16<<20 {
		t.Fatalf("8 MiB beside the handle: %#x %v, used %d", p, rc, m.existing(0).ledger.used())
	}
	c.VMMReleased(1)
	if used := m.existing(0).ledger.used(); used != 8<<20 {
		t.Fatalf("after the handle was released: used %d, want the pool's %d", used, 8<<20)
	}
}

// TestHostHandlesOutliveReset: handles placed on the host outlive a reset
// and stay counted against the host limit of the pool built after it,
// which gets their bytes back when they are freed, also when that happens
// while the reset has left the device without a pool.
func TestHostHandlesOutliveReset(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=4MiB", "SPILLWAY_OVERSUBSCRIBE=1", "SPILLWAY_HOST_LIMIT=6MiB")
	c := &Core{mem: m.memory}
	const granule = 2 << 20
	if rc := c.Take(0, 2*granule, TakeVMM); rc != interpose.Success {
		t.Fatal(rc)
	}
	c.VMMCreated(1, 0, 2*granule, TakeVMM)
	for h := uint64(2); h <= 4; h++ {
		if rc := c.Take(0, granule, TakeVMMHost); rc != interpose.Success {
			t.Fatalf("host handle %d: %v", h, rc)
		}
		c.VMMCreated(h, 0, granule, TakeVMMHost)
	}
	if rc := m.deviceReset(0, m.rt.DeviceReset); rc != interpose.Success {
		t.Fatal(rc)
	}
	c.VMMReleased(2) // freed while the device has no pool
	hostHeld := func() uint64 { return m.existing(0).pool.Stats().HostOutside }
	// The next take builds the device again: two handles' bytes are on its
	// host limit, so only one more granule fits.
	if rc := c.Take(0, granule, TakeVMMHost); rc != interpose.Success || hostHeld() != 3*granule {
		t.Fatalf("a host granule beside the two that outlived the reset: %v, %d bytes on the host", rc, hostHeld())
	}
	c.VMMCreated(5, 0, granule, TakeVMMHost)
	if rc := c.Take(0, granule, TakeVMMHost|TakeQuiet); rc != interpose.ErrorMemoryAllocation {
		t.Fatalf("beyond the host limit after the reset: %v", rc)
	}
	for _, h := range []uint64{3, 4, 5} {
		c.VMMReleased(h)
	}
	if got := hostHeld(); got != 0 {
		t.Errorf("every host handle released: %d bytes on the host", got)
	}
	if rc := c.Take(0, 3*granule, TakeVMMHost); rc != interpose.Success {
		t.Errorf("the whole host limit after the handles went: %v", rc)
	}
}

// TestGiveWhileResetDropsTheDevice: bytes taken outside the pool and given
// back between a reset and the device's next use reach its ledger.
func TestGiveWhileResetDropsTheDevice(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=16MiB")
	c := &Core{mem: m.memory}
	if rc := c.Take(0, 8<<20, TakeContext); rc != interpose.Success {
		t.Fatal(rc)
	}
	if rc := m.deviceReset(0, m.rt.DeviceReset); rc != interpose.Success || m.existing(0) != nil {
		t.Fatalf("reset: %v", rc)
	}
	c.Give(0, 8<<20, TakeContext) // a created context's block, freed now
	if _, rc := m.malloc(request{size: 16 << 20}); rc != interpose.Success {
		t.Fatalf("the whole quota after the context's memory was given back: %v, used %d", rc, m.existing(0).ledger.used())
	}
}

// TestTakeKindNames: a refusal's warning names what was refused, and only
// the runtime's kinds answer with the runtime's codes.
func TestTakeKindNames(t *testing.T) {
	cases := []struct {
		kind    TakeKind
		name    string
		runtime bool
	}{
		{TakeContext, "an allocation in a created context", false},
		{TakeVMM, "cuMemCreate", false},
		{TakeVMMHost, "cuMemCreate (nor could the host limit hold it)", false},
		{TakeRuntime, "an allocation in a created context", true},
		{TakePool, "an allocation from an explicit memory pool", false},
		{TakeRuntimePool, "an allocation from an explicit memory pool", true},
		{TakeArray, "a CUDA array", false},
		{TakeRuntimeArray, "a CUDA array", true},
		{TakeMipmappedArray, "a CUDA mipmapped array", false},
		{TakeRuntimeMipmappedArray, "a CUDA mipmapped array", true},
	}
	for _, c := range cases {
		if got := c.kind.String(); got != c.name {
			t.Errorf("TakeKind(%d).String() = %q, want %q", c.kind, got, c.name)
		}
		if got := c.kind.Runtime(); got != c.runtime {
			t.Errorf("TakeKind(%d).Runtime() = %v, want %v", c.kind, got, c.runtime)
		}
	}
}

// TestArrayHandleReused: CUDA may hand an array's handle to a new array as
// soon as the old one is destroyed with its context, before the core hears
// of the destruction (another thread creates an array between cuCtxDestroy
// and the shim's account of it). The old array's bytes are given back then,
// and the new array's stay until it is destroyed.
func TestArrayHandleReused(t *testing.T) {
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=8MiB")
	c := &Core{mem: m.memory}
	used := func() uint64 { return m.existing(0).ledger.used() }
	const handle = 0xa11a
	for _, ctx := range []uint64{1, 2} {
		if rc := c.Take(0, 2<<20, TakeArray); rc != interpose.Success {
			t.Fatal(rc)
		}
		c.ArrayCreated(handle, ctx, 0, 2<<20)
	}
	c.CtxDestroyed(1)
	if got := used(); got != 2<<20 {
		t.Errorf("used %d once context 1 went, want the 2 MiB of the array now holding its handle", got)
	}
	c.ArrayDestroyed(handle)
	if got := used(); got != 0 {
		t.Errorf("used %d once every array is destroyed, want 0", got)
	}
}

// A setting invalid for a device's size leaves it without a pool, and every
// allocation on it fails with cudaErrorInitializationError: those counted
// outside the pool (cuMemCreate, a created context's, an explicit pool's, a
// CUDA array) as well as cudaMalloc's, never admitted by the quota nor
// refused as if the quota were full.
func TestTakeOnDeviceWithInvalidSetting(t *testing.T) {
	for _, env := range [][]string{
		{"SPILLWAY_MEMORY_LIMIT=10%", "SPILLWAY_POOL_RESERVE=512MiB"}, // a reserve above the quota
		{"SPILLWAY_MEMORY_LIMIT=0.0000000001%"},                       // a quota of no byte
		{"SPILLWAY_MEMORY_LIMIT=0.00001%"},                            // 107 bytes: less than any allocation
	} {
		m := newTestMemory(t, newFake(1<<30), env...)
		c := &Core{mem: m.memory}
		if _, rc := m.malloc(request{device: 0, size: 4096}); rc != interpose.ErrorInitialization {
			t.Fatalf("%v: cudaMalloc: %v, want cudaErrorInitializationError", env, rc)
		}
		for _, kind := range []TakeKind{TakeVMM, TakeContext, TakeRuntimePool, TakeArray, TakeVMM | TakeInPrimary} {
			if rc := c.Take(0, 2<<20, kind); rc != interpose.ErrorInitialization {
				t.Errorf("%v: taking 2 MiB for %v: %v, want cudaErrorInitializationError", env, kind, rc)
			}
		}
		if used := m.existing(0).ledger.used(); used != 0 {
			t.Errorf("%v: the ledger holds %d bytes, want none", env, used)
		}
	}
}
