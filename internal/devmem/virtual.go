package devmem

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/shim/config"
)

// realVMM is the driver's virtual memory management the core's pool uses
// for its granules; *interpose.VMM implements it (the real functions, in
// the device's primary context), and tests substitute a fake.
type realVMM interface {
	Supported() (bool, interpose.Error)
	Granularity(host bool) (uint64, interpose.Error)
	AddressReserve(size, alignment uint64) (interpose.DevicePtr, interpose.Error)
	AddressFree(va interpose.DevicePtr, size uint64) interpose.Error
	Create(size uint64, host bool) (uint64, interpose.Error)
	Release(handle uint64) interpose.Error
	Map(va interpose.DevicePtr, size, handle uint64) interpose.Error
	Unmap(va interpose.DevicePtr, size uint64) interpose.Error
	SetAccess(va interpose.DevicePtr, size uint64, cpu bool) interpose.Error
	Copy(dst, src interpose.DevicePtr, size uint64) interpose.Error
}

// openVMM returns the driver's virtual memory management for a device, or
// why there is none.
type openVMM func(ordinal int) (realVMM, error)

// driverVMM opens the real functions of the front's table.
func driverVMM(table unsafe.Pointer) openVMM {
	return func(ordinal int) (realVMM, error) { return interpose.NewVMM(table, ordinal) }
}

// virtualBacking is a device's backing with virtual memory management
// (pool.VirtualBacking): the pool reserves address ranges and maps
// physical granules under them. The pool takes each device granule from
// the device's ledger (pool.Ledger) once, however often it is remapped,
// as it takes segments; host-located granules (page-granular spill) count against the
// host limit, which the pool keeps, and not against the quota. Like the
// rest of the backing, it is called with the pool's lock held.
type virtualBacking struct {
	*backing
	vmm  realVMM
	gran uint64
	// host are the host-located handles it created: mapped, they are
	// granted to the CPU too, as CUDA calls them host memory and programs
	// that ask then read them with the CPU. Device memory the CPU never
	// reaches.
	host map[uint64]bool
	// noCPU is set once the driver refused the CPU a host granule; the
	// granules are then mapped for the devices only. cpuRefused says so.
	noCPU      bool
	cpuRefused func(rc interpose.Error)
}

// minGranules is the fewest granules a quota must hold for the pool to use
// virtual memory: a granule partly used strands at most 1/32 of the quota,
// as a fixed shared segment does, and the part of the quota that is not a
// whole granule (less than 1/32) goes unused. Smaller quotas get fixed
// segments, which shrink with the quota.
const minGranules = 32

// virtualBacking returns d's backing with virtual memory management when
// SPILLWAY_VMM allows it and the device supports it, or nil (the pool then
// uses fixed segments), saying why in the debug log.
func (m *memory) virtualBacking(d *device) *virtualBacking {
	if !m.cfg.VMM || !m.cfg.Pool || m.vmm == nil {
		return nil
	}
	off := func(why string, args ...any) *virtualBacking {
		m.log.Debugf("device %d: fixed segments, not virtual memory: %s", d.ordinal, fmt.Sprintf(why, args...))
		return nil
	}
	vmm, err := m.vmm(d.ordinal)
	if err != nil {
		return off("%v", err)
	}
	switch ok, rc := vmm.Supported(); {
	case rc != interpose.Success:
		return off("cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED): %v", rc)
	case !ok:
		return off("the device does not support virtual memory management")
	}
	gran, rc := vmm.Granularity(false)
	if rc != interpose.Success {
		return off("cuMemGetAllocationGranularity: %v", rc)
	}
	if m.cfg.Oversubscribe {
		// Host granules are mapped at the same addresses: the larger
		// granularity (both are powers of two) suits both. Without
		// host-located memory, spills are whole blocks.
		if host, rc := vmm.Granularity(true); rc == interpose.Success {
			gran = max(gran, host)
		}
	}
	if gran < pool.Alignment || gran&(gran-1) != 0 {
		return off("granularity of %d bytes", gran)
	}
	if d.quota/gran < minGranules {
		return off("the quota of %s holds fewer than %d granules of %s", config.FormatBytes(d.quota), minGranules, config.FormatBytes(gran))
	}
	m.log.Debugf("device %d: virtual memory, %s granules (%s=0 for fixed segments)", d.ordinal, config.FormatBytes(gran), config.EnvVMM)
	return &virtualBacking{backing: d.back, vmm: vmm, gran: gran, host: map[uint64]bool{},
		cpuRefused: func(rc interpose.Error) { m.cpuAccessRefused(d.ordinal, rc) }}
}

// Granularity is the size of every granule.
func (v *virtualBacking) Granularity() uint64 { return v.gran }

// ReserveAddress calls cuMemAddressReserve; the range is indexed as the
// device's, so that frees of the blocks in it find their pool.
func (v *virtualBacking) ReserveAddress(size uint64) (uint64, error) {
	va, rc := v.vmm.AddressReserve(size, v.gran)
	if rc != interpose.Success {
		return 0, cudaErr(fmt.Sprintf("cuMemAddressReserve of %d bytes on device %d", size, v.ordinal), rc)
	}
	v.index.add(uint64(va), size, v.dev)
	return uint64(va), nil
}

// FreeAddress calls cuMemAddressFree.
func (v *virtualBacking) FreeAddress(va, size uint64) error {
	if rc := v.vmm.AddressFree(interpose.DevicePtr(va), size); rc != interpose.Success {
		return cudaErr(fmt.Sprintf("cuMemAddressFree(%#x) on device %d", va, v.ordinal), rc)
	}
	v.index.remove(va, v.dev)
	return nil
}

// CreatePhysical calls cuMemCreate: on the device for TierDevice, on the
// host for TierPinned. The pool has taken a device granule's bytes from the
// device's ledger already (pool.Ledger), and gives them back with it.
func (v *virtualBacking) CreatePhysical(size uint64, tier pool.Tier) (uint64, error) {
	host := tier != pool.TierDevice
	h, rc := v.vmm.Create(size, host)
	if rc != interpose.Success {
		return 0, cudaErr(fmt.Sprintf("cuMemCreate of %d bytes (%v) for device %d", size, tier, v.ordinal), rc)
	}
	if host {
		v.host[h] = true
	}
	return h, nil
}

// ReleasePhysical calls cuMemRelease.
func (v *virtualBacking) ReleasePhysical(handle, size uint64) error {
	if rc := v.vmm.Release(handle); rc != interpose.Success {
		return cudaErr(fmt.Sprintf("cuMemRelease(%#x) on device %d", handle, v.ordinal), rc)
	}
	delete(v.host, handle)
	return nil
}

// Map calls cuMemMap and grants the device (and its peers) read and write
// access with cuMemSetAccess, and the CPU too for a host handle; a grant
// that fails unmaps again.
func (v *virtualBacking) Map(va, size, handle uint64) error {
	p := interpose.DevicePtr(va)
	if rc := v.vmm.Map(p, size, handle); rc != interpose.Success {
		return cudaErr(fmt.Sprintf("cuMemMap at %#x on device %d", va, v.ordinal), rc)
	}
	if rc := v.grant(p, size, v.host[handle]); rc != interpose.Success {
		if urc := v.vmm.Unmap(p, size); urc != interpose.Success {
			return fmt.Errorf("cuMemSetAccess at %#x on device %d: %w, and cuMemUnmap: %w", va, v.ordinal, rc, urc)
		}
		return cudaErr(fmt.Sprintf("cuMemSetAccess at %#x on device %d", va, v.ordinal), rc)
	}
	return nil
}

// grant calls cuMemSetAccess for the devices, and the CPU (cpu) unless the
// driver refused it before. A driver that refuses the CPU (one older than
// host-located access) gets the devices alone, so spilling goes on.
func (v *virtualBacking) grant(p interpose.DevicePtr, size uint64, cpu bool) interpose.Error {
	if !cpu || v.noCPU {
		return v.vmm.SetAccess(p, size, false)
	}
	rc := v.vmm.SetAccess(p, size, true)
	if rc == interpose.Success {
		return rc
	}
	if devices := v.vmm.SetAccess(p, size, false); devices != interpose.Success {
		return devices
	}
	v.noCPU = true
	v.cpuRefused(rc)
	return interpose.Success
}

// Unmap calls cuMemUnmap.
func (v *virtualBacking) Unmap(va, size uint64) error {
	if rc := v.vmm.Unmap(interpose.DevicePtr(va), size); rc != interpose.Success {
		return cudaErr(fmt.Sprintf("cuMemUnmap at %#x on device %d", va, v.ordinal), rc)
	}
	return nil
}

// MoveGranule implements pool.GranuleMover: from, mapped at va, is copied
// into to through an address range of its own, then va is remapped to to.
// The pool calls it only when no queued work uses va. A failure before the
// remap changes nothing; a failed remap maps from again, whose contents are
// intact.
func (v *virtualBacking) MoveGranule(va, size, from, to uint64) error {
	where := fmt.Sprintf("moving the granule at %#x on device %d", va, v.ordinal)
	staging, rc := v.vmm.AddressReserve(size, v.gran)
	if rc != interpose.Success {
		return cudaErr(where+": cuMemAddressReserve", rc)
	}
	err := v.Map(uint64(staging), size, to)
	if err == nil {
		if rc := v.vmm.Copy(staging, interpose.DevicePtr(va), size); rc != interpose.Success {
			err = cudaErr("cuMemcpyDtoD", rc)
		}
		if uerr := v.Unmap(uint64(staging), size); uerr != nil {
			// to may still be mapped there: it cannot be mapped at va.
			err = errors.Join(err, uerr)
		}
	}
	if rc := v.vmm.AddressFree(staging, size); rc != interpose.Success && err == nil {
		err = cudaErr("cuMemAddressFree of the staging range", rc)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if err := v.Unmap(va, size); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if err := v.Map(va, size, to); err != nil {
		if rerr := v.Map(va, size, from); rerr != nil {
			return fmt.Errorf("%s: %w; mapping the old memory back: %w", where, err, rerr)
		}
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}
