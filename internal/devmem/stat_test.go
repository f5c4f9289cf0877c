package devmem

import (
	"reflect"
	"testing"

	"github.com/spillway-gpu/spillway/internal/stat"
	"github.com/spillway-gpu/spillway/interpose"
)

// pciRuntime answers the PCI attributes of its devices; others as the fake does.
type pciRuntime struct {
	*fakeRuntime
	attrs map[interpose.DeviceAttr][]int // by ordinal; absent: cudaErrorInvalidValue
}

func (r pciRuntime) DeviceGetAttribute(attr interpose.DeviceAttr, device int) (int, interpose.Error) {
	if v, ok := r.attrs[attr]; ok && device < len(v) {
		return v[device], interpose.Success
	}
	if attr == interpose.DevAttrManagedMemory {
		return r.fakeRuntime.DeviceGetAttribute(attr, device)
	}
	return 0, interpose.ErrorInvalidValue
}

// A device's figures carry the PCI location the runtime gave at its first
// use; none when the runtime cannot say, or says something out of range.
func TestFiguresCarryPCILocation(t *testing.T) {
	rt := pciRuntime{newFake(1 << 30), map[interpose.DeviceAttr][]int{
		interpose.DevAttrPCIDomainID: {0x10002, 0, 0},
		interpose.DevAttrPCIBusID:    {0xc1, 0x300, 0x19},
		interpose.DevAttrPCIDeviceID: {0x1f, 0},
	}}
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB")
	for dev := range 3 {
		if _, rc := m.malloc(request{device: dev, size: 1 << 20}); rc != interpose.Success {
			t.Fatalf("malloc on device %d: %v", dev, rc)
		}
	}
	figs := m.figures()
	want := []*stat.PCILocation{{Domain: 0x10002, Bus: 0xc1, Device: 0x1f}, nil, nil}
	if len(figs) != 3 {
		t.Fatalf("figures of %d devices, want 3", len(figs))
	}
	for i, f := range figs {
		if f.Ordinal != i || !reflect.DeepEqual(f.PCI, want[i]) {
			t.Errorf("device %d: ordinal %d, PCI %+v; want %+v", i, f.Ordinal, f.PCI, want[i])
		}
	}
}
