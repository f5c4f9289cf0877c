package bpf

import (
	"encoding/json"
	"strings"
	"testing"
	"unsafe"
)

// record encodes e as the probes would write it.
func record(e spillwayEvent) []byte {
	raw := make([]byte, EventSize)
	copy(raw, unsafe.Slice((*byte)(unsafe.Pointer(&e)), EventSize))
	return raw
}

func decode(t *testing.T, e spillwayEvent) *Event {
	t.Helper()
	var out Event
	if err := DecodeEvent(record(e), &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

func TestMemcpyKindDecoded(t *testing.T) {
	for _, tc := range []struct {
		kind uint64
		want string
	}{
		{0, "h2h"}, {1, "h2d"}, {2, "d2h"}, {3, "d2d"}, {4, "default"},
		{5, "invalid"},
		// An enum occupies the low 32 bits of its register; the rest is noise.
		{0xdead_beef_0000_0002, "d2h"},
	} {
		e := decode(t, spillwayEvent{Type: uint16(KindAPI), Func: uint16(funcID(t, "cudaMemcpyAsync")),
			Args: [6]uint64{0x1000, 0x2000, 4096, tc.kind}})
		if got := e.Direction().String(); got != tc.want {
			t.Errorf("kind %#x: direction %s, want %s", tc.kind, got, tc.want)
		}
		if e.Size() != 4096 {
			t.Errorf("kind %#x: size %d, want 4096", tc.kind, e.Size())
		}
	}
	// The driver's functions carry their direction in their names.
	for name, want := range map[string]string{
		"cuMemcpyHtoD_v2": "h2d", "cuMemcpyDtoHAsync_v2": "d2h", "cuMemcpyDtoD_v2": "d2d", "cuMemcpy": "default",
	} {
		e := decode(t, spillwayEvent{Type: uint16(KindAPI), Func: uint16(funcID(t, name)), Args: [6]uint64{1, 2, 77}})
		if got := e.Direction().String(); got != want || e.Size() != 77 {
			t.Errorf("%s: %s of %d bytes, want %s of 77", name, got, e.Size(), want)
		}
	}
}

func funcID(t *testing.T, name string) Func {
	t.Helper()
	for _, f := range Funcs() {
		if f.String() == name {
			return f
		}
	}
	t.Fatalf("no probed function %s", name)
	return 0
}

func TestSummaryAdd(t *testing.T) {
	s := NewSummary()
	add := func(e spillwayEvent) { s.Add(decode(t, e)) }
	malloc, free := funcID(t, "cudaMalloc"), funcID(t, "cudaFree")
	add(spillwayEvent{Type: uint16(KindAPI), Func: uint16(malloc), Pid: 7, Args: [6]uint64{0x10, 1 << 20}, Out: 0xd000})
	add(spillwayEvent{Type: uint16(KindAPI), Func: uint16(malloc), Pid: 7, Args: [6]uint64{0x10, 1 << 30}, Ret: 2})
	add(spillwayEvent{Type: uint16(KindAPI), Func: uint16(free), Pid: 7, Args: [6]uint64{0xd000}})
	add(spillwayEvent{Type: uint16(KindProbe), Func: uint16(ProbeAlloc), Pid: 7, Args: [6]uint64{0xd000, 4096, 0, 0, SourceCache}})
	add(spillwayEvent{Type: uint16(KindProbe), Func: uint16(ProbeAlloc), Pid: 7, Args: [6]uint64{0xe000, 4096, 0, 0, SourceDevice}})
	add(spillwayEvent{Type: uint16(KindProbe), Func: uint16(ProbeSpill), Pid: 7, Args: [6]uint64{0xd000, 4096, 0, 1}})
	add(spillwayEvent{Type: uint16(KindProbe), Func: uint16(ProbePromote), Pid: 7, Args: [6]uint64{0xd000, 4096, 0, 0}})
	add(spillwayEvent{Type: uint16(KindProbe), Func: uint16(ProbeRefuse), Pid: 7, Args: [6]uint64{1 << 20, 0, 5, 6}})
	add(spillwayEvent{Type: uint16(KindFault), Pid: 7, Flags: flagSpilled})
	add(spillwayEvent{Type: uint16(KindFault), Pid: 8})

	if s.Calls["cudaMalloc"] != 2 || s.Errors["cudaMalloc"] != 1 || s.Calls["cudaFree"] != 1 {
		t.Errorf("calls %v errors %v", s.Calls, s.Errors)
	}
	if s.AllocBytes != 1<<20 {
		t.Errorf("alloc_bytes %d: the failed call must not count", s.AllocBytes)
	}
	if s.Pool.Allocs != 2 || s.Pool.CacheHits != 1 || s.Pool.DeviceReservations != 1 ||
		s.SpillBytes != 4096 || s.PromoteBytes != 4096 || s.Pool.Refusals != 1 || s.Pool.RefusedBytes != 1<<20 {
		t.Errorf("pool %+v spill %d promote %d", s.Pool, s.SpillBytes, s.PromoteBytes)
	}
	if s.PageFaults != (FaultCounts{Total: 2, Spilled: 1}) ||
		s.Processes["7"].PageFaults != (FaultCounts{Total: 1, Spilled: 1}) ||
		s.Processes["8"].PageFaults != (FaultCounts{Total: 1}) {
		t.Errorf("faults %+v, by process 7 %+v, 8 %+v", s.PageFaults, s.Processes["7"], s.Processes["8"])
	}
	c := s.Clone()
	c.Calls["cudaMalloc"]++
	c.Processes["7"].Calls++
	if s.Calls["cudaMalloc"] != 2 || s.Processes["7"].Calls != 3 {
		t.Error("Clone shares state with the original")
	}
}

// Every allocation the shim reports lands in exactly one class, as the
// report line counts them: a spilled allocation (a host tier served by the
// pool) is not a device reservation, and the application's own managed
// memory is not the pool-off pass-through.
func TestSummaryPoolClasses(t *testing.T) {
	s := NewSummary()
	alloc := func(tier, source uint64) {
		s.Add(decode(t, spillwayEvent{Type: uint16(KindProbe), Func: uint16(ProbeAlloc), Pid: 7,
			Args: [6]uint64{0xd000, 4096, 0, tier, source}}))
	}
	alloc(TierDevice, SourceCache)
	alloc(TierDevice, SourceCache)
	alloc(TierDevice, SourceDevice)
	alloc(TierHostManaged, SourceDevice)
	alloc(TierHostPinned, SourceDevice)
	alloc(TierDevice, SourcePassThrough)
	alloc(TierHostManaged, SourcePassThrough)
	want := PoolCounts{Allocs: 7, CacheHits: 2, DeviceReservations: 1, SpilledAllocs: 2, PassThrough: 1, ManagedAllocs: 1}
	if s.Pool != want {
		t.Errorf("pool %+v, want %+v", s.Pool, want)
	}
	if r, ok := s.Pool.HitRate(); !ok || r != 0.4 {
		t.Errorf("hit rate %v %v, want 2 hits in 5 pooled allocations", r, ok)
	}
	if _, ok := (PoolCounts{PassThrough: 3}).HitRate(); ok {
		t.Error("a hit rate without pooled allocations")
	}
}

// cudaMallocPitch's size is width times height.
func TestPitchSize(t *testing.T) {
	e := decode(t, spillwayEvent{Type: uint16(KindAPI), Func: uint16(funcID(t, "cudaMallocPitch")), Args: [6]uint64{0x10, 0x18, 1000, 30}, Out: 0xd000})
	if e.Size() != 30000 || e.Pointer() != 0xd000 || e.Func.Op() != OpAlloc {
		t.Errorf("cudaMallocPitch: size %d, pointer %#x, op %v", e.Size(), e.Pointer(), e.Func.Op())
	}
}

func TestDecodeShortRecord(t *testing.T) {
	var e Event
	err := DecodeEvent(make([]byte, EventSize-1), &e)
	if err == nil || !strings.Contains(err.Error(), "want") {
		t.Errorf("short record: %v", err)
	}
}

func TestParseMaps(t *testing.T) {
	const maps = `55d0c0a00000-55d0c0a02000 r--p 00000000 fd:01 1234 /usr/bin/prog
55d0c0a02000-55d0c0a05000 r-xp 00002000 fd:01 1234 /usr/bin/prog
7f00aa000000-7f00aa100000 r-xp 00010000 103:02 98765 /opt/my libs/libcudart.so.12
7f00ab000000-7f00ab001000 rw-p 00000000 00:00 0 
7fff00000000-7fff00002000 r-xp 00000000 00:00 0 [vdso]
7f00ac000000-7f00ac100000 r-xp 00000000 fd:01 555 /tmp/libgone.so (deleted)
`
	got, err := parseMaps(strings.NewReader(maps))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("mappings %+v, want the 3 executable file mappings", got)
	}
	if got[1].path != "/opt/my libs/libcudart.so.12" || got[1].inode != 98765 || got[1].start != 0x7f00aa000000 {
		t.Errorf("mapping %+v", got[1])
	}
	id, err := mappingID(got[1])
	if err != nil || id != (fileID{0x103, 2, 98765}) {
		t.Errorf("id %+v, %v", id, err)
	}
	if _, err := parseMaps(strings.NewReader("zz-yy r-xp 0 fd:01 1 /x\n")); err == nil {
		t.Error("bad address range accepted")
	}
}

// Steps are the application's successful synchronizations; bytes moved are
// spills and promotions; accesses are successful copies and memsets of
// device memory (host-to-host copies name none), spilled when the kernel
// flagged them, with the driver's memsets counted in bytes.
func TestSummaryStepsMovesAndAccesses(t *testing.T) {
	s := NewSummary()
	call := func(name string, ret int64, flags uint32, args ...uint64) {
		e := spillwayEvent{Type: uint16(KindAPI), Func: uint16(funcID(t, name)), Pid: 7, Ret: ret, Flags: flags}
		copy(e.Args[:], args)
		s.Add(decode(t, e))
	}
	call("cudaDeviceSynchronize", 0, 0)
	call("cuCtxSynchronize", 0, 0)
	call("cudaDeviceSynchronize", 700, 0) // failed: no step
	call("cudaMemset", 0, flagSpilled, 0xd000, 0, 100)
	call("cudaMemsetAsync", 0, 0, 0xe000, 0, 50, 0)
	call("cuMemsetD32_v2", 0, flagSpilled, 0xd000, 0, 10)              // 40 bytes
	call("cudaMemcpy", 0, 0, 0x1000, 0x2000, 1000, uint64(HostToHost)) // no device memory
	call("cudaMemcpy", 0, 0, 0xe000, 0x2000, 300, uint64(HostToDevice))
	call("cuMemcpyDtoH_v2", 0, flagSpilled, 0x2000, 0xd000, 8)
	call("cudaMemset", 1, flagSpilled, 0xd000, 0, 100) // failed: not counted
	s.Add(decode(t, spillwayEvent{Type: uint16(KindProbe), Func: uint16(ProbeSpill), Args: [6]uint64{0xd000, 4096, 0, 1}}))
	s.Add(decode(t, spillwayEvent{Type: uint16(KindProbe), Func: uint16(ProbePromote), Args: [6]uint64{0xd000, 4096, 0, 0}}))
	s.Add(decode(t, spillwayEvent{Type: uint16(KindProbe), Func: uint16(ProbeSpill), Args: [6]uint64{0xf000, 1024, 0, 2}}))

	if s.Steps != 2 {
		t.Errorf("steps = %d, want 2", s.Steps)
	}
	if s.MovedBytes != 4096+4096+1024 {
		t.Errorf("moved_bytes = %d, want spills and promotions, %d", s.MovedBytes, 4096+4096+1024)
	}
	want := AccessCounts{Total: 5, Spilled: 3, Bytes: 100 + 50 + 40 + 300 + 8, SpilledBytes: 100 + 40 + 8}
	if s.Accesses != want {
		t.Fatalf("accesses %+v, want %+v", s.Accesses, want)
	}
	n, b, ok := s.Accesses.Fractions()
	if !ok || n != 0.6 || b != 148.0/498 {
		t.Errorf("fractions %v %v %v, want 0.6 and 148/498", n, b, ok)
	}
	if v, ok := PerStep(s.MovedBytes, s.Steps); !ok || v != 4608 {
		t.Errorf("per step %v %v, want 4608", v, ok)
	}
	if _, ok := PerStep(10, 0); ok {
		t.Error("bytes per step without steps")
	}
	if d := s.Accesses.Since(AccessCounts{Total: 1, Spilled: 1, Bytes: 100, SpilledBytes: 100}); d != (AccessCounts{Total: 4, Spilled: 2, Bytes: 398, SpilledBytes: 48}) {
		t.Errorf("since: %+v", d)
	}

	data, err := json.Marshal(s.Accesses)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["total"] != 5.0 || doc["spilled"] != 3.0 || doc["bytes"] != 498.0 || doc["spilled_bytes"] != 148.0 ||
		doc["spilled_fraction"] != 0.6 || doc["spilled_bytes_fraction"] != 148.0/498 {
		t.Errorf("accesses JSON %s", data)
	}
	var back AccessCounts
	if err := json.Unmarshal(data, &back); err != nil || back != s.Accesses {
		t.Errorf("accesses JSON read back as %+v, %v", back, err)
	}
	if data, _ := json.Marshal(AccessCounts{}); !strings.Contains(string(data), `"spilled_fraction":null`) {
		t.Errorf("no accesses: %s, want null fractions", data)
	}
}

// The cookie tells the kernel which arguments of a copy or memset are
// addresses, where the count is and its unit.
func TestAccessCookies(t *testing.T) {
	for name, want := range map[string]uint64{
		"cudaMemcpy":       0b11<<20 | 3<<26,
		"cudaMemcpyPeer":   0b101<<20 | 5<<26,
		"cudaMemsetAsync":  0b1<<20 | 3<<26,
		"cuMemsetD16_v2":   0b1<<20 | 3<<26 | 1<<30,
		"cuMemsetD32Async": 0b1<<20 | 3<<26 | 2<<30,
		"cudaMalloc":       0,
	} {
		f := funcID(t, name)
		if got := f.cookie() &^ (1<<20 - 1); got != want {
			t.Errorf("%s: cookie bits above 20 %#x, want %#x", name, got, want)
		}
	}
}
