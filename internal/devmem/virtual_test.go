package devmem

import (
	"strings"
	"sync"
	"testing"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/pool"
)

// fakeVMM is the driver's virtual memory management on a device of
// capacity bytes: device handles take capacity, host ones do not.
type fakeVMM struct {
	mu          sync.Mutex
	unsupported bool
	capacity    uint64
	device      uint64          // device bytes created and not released
	host        uint64          // host-located bytes likewise
	handles     map[uint64]bool // handle -> host-located
	lastHandle  uint64
	next        uint64 // the next address range's start
	mapped      map[interpose.DevicePtr]uint64
	ranges      map[interpose.DevicePtr]uint64
	// cpu are the mappings granted to the CPU, which the driver allows
	// for host-located memory only, and not at all with refuseCPU (a
	// driver without host-located access).
	cpu        map[interpose.DevicePtr]bool
	refuseCPU  bool
	cpuRefusal int // grants refused for naming the CPU
	// failMapAt fails the next Map at that address; failCopy every Copy.
	failMapAt interpose.DevicePtr
	failCopy  bool
}

func newFakeVMM(capacity uint64) *fakeVMM {
	return &fakeVMM{capacity: capacity, handles: map[uint64]bool{}, next: 1 << 40,
		mapped: map[interpose.DevicePtr]uint64{}, ranges: map[interpose.DevicePtr]uint64{}, cpu: map[interpose.DevicePtr]bool{}}
}

func (f *fakeVMM) Supported() (bool, interpose.Error) { return !f.unsupported, interpose.Success }
func (f *fakeVMM) Granularity(bool) (uint64, interpose.Error) {
	return 2 << 20, interpose.Success
}

func (f *fakeVMM) AddressReserve(size, alignment uint64) (interpose.DevicePtr, interpose.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next = (f.next + alignment - 1) / alignment * alignment
	va := interpose.DevicePtr(f.next)
	f.next += size
	f.ranges[va] = size
	return va, interpose.Success
}

func (f *fakeVMM) AddressFree(va interpose.DevicePtr, size uint64) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ranges[va] != size {
		return interpose.ErrorInvalidValue
	}
	delete(f.ranges, va)
	return interpose.Success
}

func (f *fakeVMM) Create(size uint64, host bool) (uint64, interpose.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if host {
		f.host += size
	} else if f.device+size > f.capacity {
		return 0, interpose.ErrorMemoryAllocation
	} else {
		f.device += size
	}
	f.lastHandle++
	f.handles[f.lastHandle] = host
	return f.lastHandle, interpose.Success
}

func (f *fakeVMM) Release(h uint64) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	host, ok := f.handles[h]
	if !ok {
		return interpose.ErrorInvalidValue
	}
	delete(f.handles, h)
	if host {
		f.host -= 2 << 20
	} else {
		f.device -= 2 << 20
	}
	return interpose.Success
}

func (f *fakeVMM) Map(va interpose.DevicePtr, size, h uint64) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mapped[va]; ok {
		return interpose.ErrorInvalidValue
	}
	if va == f.failMapAt {
		f.failMapAt = 0
		return interpose.ErrorMemoryAllocation
	}
	f.mapped[va] = h
	return interpose.Success
}

func (f *fakeVMM) Unmap(va interpose.DevicePtr, size uint64) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mapped[va]; !ok {
		return interpose.ErrorInvalidValue
	}
	delete(f.mapped, va)
	delete(f.cpu, va)
	return interpose.Success
}

func (f *fakeVMM) SetAccess(va interpose.DevicePtr, size uint64, cpu bool) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.mapped[va]
	if !ok {
		return interpose.ErrorInvalidValue
	}
	if cpu && (f.refuseCPU || !f.handles[h]) {
		f.cpuRefusal++
		return interpose.ErrorInvalidValue
	}
	if cpu {
		f.cpu[va] = true
	}
	return interpose.Success
}

func (f *fakeVMM) bytes() (device, host uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.device, f.host
}

// The account holds exactly the device granules the pool has created, once
// each however often they are remapped; host granules count against the
// host limit only; freeing everything and closing gives every byte back.
func TestVirtualBackingAccounting(t *testing.T) {
	vmm := newFakeVMM(1 << 30)
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_OVERSUBSCRIBE=1",
		"SPILLWAY_HOST_LIMIT=64MiB", "SPILLWAY_POOL_RELEASE_THRESHOLD=0")
	m.vmm = func(int) (realVMM, error) { return vmm, nil }
	var live []interpose.DevicePtr
	for range 40 { // 80 MiB: 64 on the device, 16 in host granules
		p, rc := m.malloc(request{device: 0, size: 2 << 20})
		if rc != interpose.Success {
			t.Fatalf("allocation %d: %v\n%s", len(live), rc, m.logged)
		}
		live = append(live, p)
	}
	d := m.existing(0)
	if d.ledger.used() != 64<<20 {
		t.Fatalf("the ledger holds %d bytes, want the quota", d.ledger.used())
	}
	if dev, host := vmm.bytes(); dev != 64<<20 || host != 16<<20 {
		t.Fatalf("the driver holds %d device and %d host bytes, want 64 MiB and 16 MiB", dev, host)
	}
	if m.index.find(uint64(live[0])) != d || m.index.find(uint64(live[39])) != d {
		t.Fatal("the address ranges are not indexed as the device's")
	}
	for _, p := range live {
		if rc := m.free(p, 0, false); rc != interpose.Success {
			t.Fatalf("free %#x: %v", uint64(p), rc)
		}
	}
	if rc := m.deviceSynchronize(0); rc != interpose.Success {
		t.Fatal(rc)
	}
	if dev, host := vmm.bytes(); host != 0 || dev != d.ledger.used() {
		t.Fatalf("after the frees: the driver holds %d device and %d host bytes, the ledger %d", dev, host, d.ledger.used())
	}
	if err := d.pool.Close(); err != nil {
		t.Fatal(err)
	}
	if dev, host := vmm.bytes(); dev != 0 || host != 0 || d.ledger.used() != 0 || len(vmm.ranges) != 0 {
		t.Fatalf("after Close: %d device, %d host bytes, ledger %d, %d ranges", dev, host, d.ledger.used(), len(vmm.ranges))
	}
}

// Without VMM on the device, with SPILLWAY_VMM=0 or with the pool off, the
// backing has fixed segments.
func TestVirtualBackingChosen(t *testing.T) {
	for _, tc := range []struct {
		env         []string
		unsupported bool
		want        bool
	}{
		{[]string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, false, true},
		{nil, false, true},
		{[]string{"SPILLWAY_MEMORY_LIMIT=64MiB"}, true, false},
		{[]string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_VMM=0"}, false, false},
		{[]string{"SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_POOL=0"}, false, false},
		{[]string{"SPILLWAY_MEMORY_LIMIT=62MiB"}, false, false}, // fewer than 32 granules
	} {
		vmm := newFakeVMM(1 << 30)
		vmm.unsupported = tc.unsupported
		m := newTestMemory(t, newFake(1<<30), tc.env...)
		m.vmm = func(int) (realVMM, error) { return vmm, nil }
		if _, rc := m.malloc(request{device: 0, size: 1 << 20}); rc != interpose.Success {
			t.Fatalf("%v: %v", tc.env, rc)
		}
		if dev, _ := vmm.bytes(); (dev > 0) != tc.want {
			t.Errorf("%v, VMM unsupported %v: %d bytes of granules, want virtual memory %v", tc.env, tc.unsupported, dev, tc.want)
		}
	}
}

func (f *fakeVMM) Copy(dst, src interpose.DevicePtr, size uint64) interpose.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failCopy {
		return interpose.ErrorInvalidValue
	}
	if _, ok := f.mapped[dst]; !ok {
		return interpose.ErrorInvalidValue
	}
	if _, ok := f.mapped[src]; !ok {
		return interpose.ErrorInvalidValue
	}
	return interpose.Success
}

// MoveGranule leaves the address mapped to the new memory and nothing else
// behind; a failed copy or a failed remap leaves it mapped to the old memory,
// the new memory mapped nowhere and the staging range freed.
func TestMoveGranule(t *testing.T) {
	const gran = 2 << 20
	for _, tc := range []struct {
		name      string
		failCopy  bool
		failRemap bool
	}{{"moved", false, false}, {"copy fails", true, false}, {"remap fails", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeVMM(1 << 30)
			v := &virtualBacking{backing: &backing{}, vmm: f, gran: gran, host: map[uint64]bool{}}
			va, _ := f.AddressReserve(4*gran, gran)
			from, err := v.CreatePhysical(gran, pool.TierDevice)
			if err != nil {
				t.Fatal(err)
			}
			to, err := v.CreatePhysical(gran, pool.TierPinned)
			if err != nil {
				t.Fatal(err)
			}
			if err := v.Map(uint64(va), gran, from); err != nil {
				t.Fatal(err)
			}
			f.failCopy = tc.failCopy
			if tc.failRemap {
				f.failMapAt = va
			}
			err = v.MoveGranule(uint64(va), gran, from, to)
			want := from
			if !tc.failCopy && !tc.failRemap {
				want = to
				if err != nil {
					t.Fatalf("MoveGranule: %v", err)
				}
			} else if err == nil {
				t.Fatal("MoveGranule succeeded with a failure injected")
			}
			if got := f.mapped[va]; got != want || len(f.mapped) != 1 {
				t.Errorf("mappings %v after the move, want only %#x -> %d", f.mapped, uint64(va), want)
			}
			if len(f.ranges) != 1 {
				t.Errorf("address ranges %v: the staging range is left", f.ranges)
			}
			// The CPU reaches the address when it is host memory, and
			// never device memory (which the driver refuses).
			if f.cpu[va] != (want == to) || f.cpuRefusal != 0 {
				t.Errorf("CPU access at the address %v with %d grants refused; want it granted iff the host granule is mapped there", f.cpu[va], f.cpuRefusal)
			}
			if !tc.failCopy && !tc.failRemap {
				// And back: the device granule is mapped for the devices only.
				if err := v.MoveGranule(uint64(va), gran, to, from); err != nil {
					t.Fatalf("moving back: %v", err)
				}
				if f.mapped[va] != from || f.cpu[va] || f.cpuRefusal != 0 {
					t.Errorf("moved back to the device: mapped %d, CPU access %v, %d grants refused; want %d for the devices only",
						f.mapped[va], f.cpu[va], f.cpuRefusal, from)
				}
			}
		})
	}
}

// Host granules are mapped for the CPU too, so the address of memory CUDA
// calls host is one the CPU can use; device granules for the devices only.
// A driver that refuses the CPU still gets host granules, mapped for the
// devices, is asked once, and the log says once what that means.
func TestVirtualBackingCPUAccess(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		vmm := newFakeVMM(1 << 30)
		vmm.refuseCPU = refuse
		m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_OVERSUBSCRIBE=1",
			"SPILLWAY_HOST_LIMIT=64MiB")
		m.vmm = func(int) (realVMM, error) { return vmm, nil }
		for i := range 40 { // 80 MiB: 64 on the device, 16 in host granules
			if _, rc := m.malloc(request{device: 0, size: 2 << 20}); rc != interpose.Success {
				t.Fatalf("refused CPU %v: allocation %d: %v\n%s", refuse, i, rc, m.logged)
			}
		}
		if _, host := vmm.bytes(); host != 16<<20 {
			t.Fatalf("refused CPU %v: %d host bytes, want 16 MiB of host granules", refuse, host)
		}
		hostMapped, granted := 0, 0
		for va, h := range vmm.mapped {
			if vmm.handles[h] {
				hostMapped++
			}
			if vmm.cpu[va] {
				granted++
			}
		}
		said := strings.Count(m.logged.String(), "the CPU cannot reach host granules at their addresses")
		if refuse {
			if granted != 0 || vmm.cpuRefusal != 1 || said != 1 {
				t.Errorf("refused CPU: %d mappings granted to the CPU, %d refusals, said %d times; want 0, 1, once\n%s",
					granted, vmm.cpuRefusal, said, m.logged)
			}
			continue
		}
		if hostMapped != 8 || granted != 8 || vmm.cpuRefusal != 0 || said != 0 {
			t.Errorf("%d host granules mapped, %d mappings granted to the CPU, %d refusals, said %d times; want 8, 8, 0, never\n%s",
				hostMapped, granted, vmm.cpuRefusal, said, m.logged)
		}
	}
}

// cudaMemGetInfo's free never includes host memory: the unused tail of a
// spilled block's last host granule, and a spilled block freed and not yet
// known complete, are cached by the pool but are no device memory the
// program can have, so a full quota still reports none free.
func TestMemGetInfoLeavesOutHostGranules(t *testing.T) {
	vmm := newFakeVMM(1 << 30)
	m := newTestMemory(t, newFake(1<<30), "SPILLWAY_MEMORY_LIMIT=64MiB", "SPILLWAY_OVERSUBSCRIBE=1",
		"SPILLWAY_HOST_LIMIT=64MiB")
	m.vmm = func(int) (realVMM, error) { return vmm, nil }
	for range 32 { // the quota, in whole granules
		if _, rc := m.malloc(request{device: 0, size: 2 << 20}); rc != interpose.Success {
			t.Fatalf("filling the quota: %v\n%s", rc, m.logged)
		}
	}
	spilled, rc := m.malloc(request{device: 0, size: 1 << 20}) // half of a host granule
	if rc != interpose.Success {
		t.Fatalf("spilling: %v\n%s", rc, m.logged)
	}
	if _, host := vmm.bytes(); host != 2<<20 {
		t.Fatalf("the driver holds %d host bytes, want one granule", host)
	}
	if free, total, rc := m.memGetInfo(0); rc != interpose.Success || free != 0 || total != 64<<20 {
		t.Fatalf("with the quota full and half a host granule unused: free %d, total %d (%v); want 0 free of 64 MiB", free, total, rc)
	}
	if rc := m.free(spilled, 0, false); rc != interpose.Success {
		t.Fatal(rc)
	}
	if free, _, _ := m.memGetInfo(0); free != 0 {
		t.Fatalf("with the spilled block freed and its host granule not yet given back: free %d, want 0", free)
	}
}
