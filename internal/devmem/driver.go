package devmem

import (
	"fmt"
	"unsafe"

	"github.com/spillway-gpu/spillway/interpose"
)

// appRuntime is the real CUDA the core calls for the application: the
// runtime (*interpose.Runtime), or where the process has none, the driver
// (*interpose.Driver).
type appRuntime interface {
	realRuntime
	SetLastError(interpose.Error)
	GetDeviceCount() (int, interpose.Error)
}

// openRuntime returns the real CUDA over the front's table, its form for
// the core's own calls on a device, and the API both call: the runtime when
// the process has one, else the driver in each device's primary context.
func openRuntime(table unsafe.Pointer) (appRuntime, onDevice, API, error) {
	rt, err := interpose.NewRuntime(table)
	if err == nil {
		return rt, func(ordinal int) realRuntime { return rt.On(ordinal) }, RuntimeAPI, nil
	}
	drv, derr := interpose.NewDriverRuntime(table)
	if derr != nil {
		return nil, nil, 0, fmt.Errorf("%w, and the driver cannot serve instead: %w", err, derr)
	}
	return drv, func(ordinal int) realRuntime { return drv.On(ordinal) }, DriverAPI, nil
}

// TotalMem is what cuDeviceTotalMem reports for a device whose real total
// is real: its quota when one is set, as cudaMemGetInfo's total is (the
// real total with an invalid configuration, or a setting invalid for this
// device, which have no quota to report).
func (c *Core) TotalMem(ordinal int, real uint64) (uint64, interpose.Error) {
	if c.broken != nil {
		return real, interpose.Success
	}
	if c.mem.unusable(ordinal, real) {
		return real, interpose.Success
	}
	if d := c.mem.existing(ordinal); d != nil {
		if d.limited {
			return d.quota, interpose.Success
		}
		return real, interpose.Success
	}
	if limit := c.cfg.LimitFor(ordinal); limit.IsSet() {
		return limit.Resolve(real), interpose.Success
	}
	return real, interpose.Success
}

// NVMLMemory is NVML's view of a device whose total CUDA reports as
// cudaTotal, for a process with a quota there: the quota, which NVML shows
// as the device's total, and what the process holds against it. A
// percentage quota is a share of CUDA's total, as when the device is first
// used, never of NVML's, which also counts the memory the driver reserves:
// NVML shows the quota that is enforced, before the first use as after.
// Quota 0: the device has no quota, and NVML's own figures stand. With an
// invalid configuration it fails with cudaErrorInitializationError, as
// allocations do: the front then reports none of the device's memory free
// (see MemGetInfo). So does a setting invalid for this device.
func (c *Core) NVMLMemory(ordinal int, cudaTotal uint64) (quota, used uint64, rc interpose.Error) {
	if c.broken != nil {
		return 0, 0, interpose.ErrorInitialization
	}
	if c.mem.unusable(ordinal, cudaTotal) {
		return 0, 0, interpose.ErrorInitialization
	}
	if d := c.mem.existing(ordinal); d != nil {
		if d.limited {
			return d.quota, d.ledger.used(), interpose.Success
		}
		return 0, 0, interpose.Success
	}
	if limit := c.cfg.LimitFor(ordinal); limit.IsSet() {
		held := uint64(0) // after a reset, what outlives the pool
		if l := c.mem.ledgerAt(ordinal); l != nil {
			held = l.used()
		}
		return limit.Resolve(cudaTotal), held, interpose.Success
	}
	return 0, 0, interpose.Success
}
