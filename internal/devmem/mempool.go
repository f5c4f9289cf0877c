package devmem

// A device's default memory pool: cudaMallocAsync and the other interposed
// allocations are served by Spillway's pool, not by CUDA's default pool, so
// what CUDA's memory-pool attributes and cuMemPoolTrimTo say of that pool
// (PyTorch's cudaMallocAsync backend reads its memory statistics there, and
// empties its cache with cudaMemPoolTrimTo) is answered from Spillway's pool.
// The front has already made the real call, which checked the arguments, and
// asks here only for the default pool of a device; the application's own
// pools, and the settings CUDA stores (the release threshold, the reuse
// policies), stay CUDA's.

// PoolUsage is what CUDA's memory-pool attributes report of a device's
// default pool: cudaMemPoolAttrReservedMemCurrent, ...ReservedMemHigh,
// ...UsedMemCurrent and ...UsedMemHigh.
type PoolUsage struct {
	Reserved, ReservedHigh, Used, UsedHigh uint64
}

// servedDevice returns the device whose allocations Spillway's pool serves,
// nil when it has served none yet; ok is false when the pool serves none of
// them (SPILLWAY_POOL=0 passes them to CUDA's own pool, and an invalid
// configuration refuses them): CUDA's answer then stands.
func (c *Core) servedDevice(ordinal int) (d *device, ok bool) {
	if c.broken != nil || !c.cfg.Pool || ordinal < 0 || ordinal >= maxDevices {
		return nil, false
	}
	d = c.mem.existing(ordinal)
	if d != nil && d.pool == nil {
		return nil, false
	}
	return d, true
}

// DefaultPoolUsage answers the usage attributes of device's default pool:
// the device bytes Spillway's pool holds and the bytes live in it (spilled
// bytes included, under oversubscription), with their high-water marks
// since the last reset. ok is false where CUDA's answer stands.
func (c *Core) DefaultPoolUsage(ordinal int) (u PoolUsage, ok bool) {
	d, ok := c.servedDevice(ordinal)
	if !ok || d == nil {
		return PoolUsage{}, ok
	}
	st := d.pool.Stats()
	return PoolUsage{Reserved: st.ReservedBytes, ReservedHigh: st.HighReservedBytes,
		Used: st.LiveBytes, UsedHigh: st.HighLiveBytes}, true
}

// ResetDefaultPoolHigh resets the high-water mark of the reserved bytes
// (reserved) or of the used bytes of device's default pool to the current
// figure, as setting CUDA's attribute to 0 does. It returns false where
// CUDA's pool is the one that counts.
func (c *Core) ResetDefaultPoolHigh(ordinal int, reserved bool) bool {
	d, ok := c.servedDevice(ordinal)
	if d != nil {
		if reserved {
			d.pool.ResetHighReserved()
		} else {
			d.pool.ResetHighLive()
		}
	}
	return ok
}

// TrimDefaultPool serves cuMemPoolTrimTo of device's default pool: Spillway's
// pool returns what it holds cached and can release without waiting for the
// device until it holds at most keep bytes (pool.Pool.TrimTo); blocks freed
// since the application's last synchronization stay cached, as CUDA keeps
// memory whose frees it has not seen complete. It returns false where
// CUDA's pool is the one trimmed.
func (c *Core) TrimDefaultPool(ordinal int, keep uint64) bool {
	d, ok := c.servedDevice(ordinal)
	if d != nil {
		n := d.pool.TrimTo(keep)
		c.log.Debugf("device %d: cuMemPoolTrimTo(default pool, %d) returned %d bytes to the device", ordinal, keep, n)
	}
	return ok
}
