package main

import "github.com/spillway-gpu/spillway/interpose"

// totalMem is what cuDeviceTotalMem reports for a device whose real total
// is real: its quota when one is set, as cudaMemGetInfo's total is.
func (c *core) totalMem(ordinal int, real uint64) (uint64, interpose.Error) {
	if c.broken != nil {
		return 0, interpose.ErrorInitialization
	}
	if d := c.mem.existing(ordinal); d != nil {
		if d.limited {
			return d.quota, interpose.Success
		}
		return real, interpose.Success
	}
	if limit := c.cfg.LimitFor(ordinal); limit.IsSet() {
		return min(limit.Resolve(real), real), interpose.Success
	}
	return real, interpose.Success
}
