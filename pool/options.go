package pool

import "fmt"

// Options configure a Pool. Start from DefaultOptions and change fields; the
// zero value of a field means zero, never "default".
type Options struct {
	// Quota is the device's quota in bytes. It sizes shared segments, arenas
	// and the default release threshold, and bounds the device memory the
	// pool may hold reserved (segments, granules, pass-through allocations
	// and promoted blocks together) when Ledger is nil.
	Quota uint64
	// Ledger admits every device byte the pool reserves and is given back
	// every byte it releases; nil means a QuotaLedger of Quota bytes, the
	// pool's alone. A ledger shared with other users of the device makes
	// the quota hold for all of them.
	Ledger Ledger
	// Pooling serves requests from pooled segments. When false the pool
	// passes every request to the Backing and only keeps the quota's
	// accounting (SPILLWAY_POOL=0).
	Pooling bool
	// StrictFree synchronizes the device on every Free, as cudaFree does,
	// instead of batching synchronizations (SPILLWAY_FREE_SYNC=1).
	StrictFree bool
	// ReleaseThreshold is how many bytes of cached (reserved but not live)
	// memory the pool keeps before it returns empty segments to the device
	// (SPILLWAY_POOL_RELEASE_THRESHOLD).
	ReleaseThreshold uint64
	// Reserve is reserved as one segment at the first allocation and never
	// released before Close (SPILLWAY_POOL_RESERVE). Zero reserves nothing.
	Reserve uint64
	// Oversubscribe serves requests the quota cannot hold from host memory
	// (SPILLWAY_OVERSUBSCRIBE=1). The Backing must implement HostBacking.
	Oversubscribe bool
	// SpillTier is TierManaged or TierPinned (SPILLWAY_SPILL).
	SpillTier Tier
	// HostLimit caps the host memory used for spilling, in bytes
	// (SPILLWAY_HOST_LIMIT).
	HostLimit uint64
	// VirtualMemory maps physical granules into reserved address ranges
	// instead of reserving fixed segments, when the Backing implements
	// VirtualBacking and Pooling is on. Off, the fixed-segment design is used
	// even over such a Backing.
	VirtualMemory bool
	// Migrate moves the granules of live blocks between the device and the
	// host at each synchronization announced with SyncEnd: the oldest
	// blocks' device granules go to the host when the device lacks room
	// for the blocks a synchronization interval allocates and frees, and
	// spilled granules come back, oldest spilled first, when it has more
	// (SPILLWAY_MIGRATE=1). It needs VirtualMemory, Oversubscribe and a
	// Backing that implements GranuleMover, and the application's promise
	// that no work is queued while its synchronization returns: see
	// "Migration" in the package documentation.
	Migrate bool
	// Observer, if not nil, receives the pool's events.
	Observer Observer
}

// DefaultOptions returns the options for a device quota of quota bytes:
// pooling on, batched synchronization, a release threshold of one eighth of
// the quota, no reserve, no oversubscription; when oversubscription is turned
// on, spilled memory is managed and the host may hold as much as the quota.
func DefaultOptions(quota uint64) Options {
	return Options{
		Quota:            quota,
		Pooling:          true,
		VirtualMemory:    true,
		ReleaseThreshold: quota / 8,
		SpillTier:        TierManaged,
		HostLimit:        quota,
	}
}

func (o *Options) validate() error {
	if o.Quota == 0 {
		return fmt.Errorf("pool: quota is 0 bytes; it must be at least %d", Alignment)
	}
	if o.Reserve > o.Quota {
		return fmt.Errorf("pool: reserve of %d bytes exceeds the quota of %d bytes", o.Reserve, o.Quota)
	}
	if o.Reserve > 0 && !o.Pooling {
		return fmt.Errorf("pool: a reserve of %d bytes needs pooling on", o.Reserve)
	}
	if o.Oversubscribe {
		if o.SpillTier != TierManaged && o.SpillTier != TierPinned {
			return fmt.Errorf("pool: spill tier %v is not valid; want %v or %v", o.SpillTier, TierManaged, TierPinned)
		}
		if o.HostLimit == 0 {
			return fmt.Errorf("pool: oversubscription with a host limit of 0 bytes; it must be positive")
		}
	}
	if o.Migrate && !(o.Oversubscribe && o.VirtualMemory && o.Pooling) {
		return fmt.Errorf("pool: migration needs oversubscription, pooling and virtual memory on")
	}
	return nil
}
