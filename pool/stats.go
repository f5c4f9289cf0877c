package pool

import "fmt"

// Stats are the pool's counters. Byte counts are aligned sizes.
type Stats struct {
	LiveBytes     uint64 // bytes of live allocations, all tiers
	PeakLiveBytes uint64
	LiveBlocks    uint64
	// ReservedBytes is the device memory held against the quota: segments,
	// pass-through allocations and promoted blocks.
	ReservedBytes     uint64
	PeakReservedBytes uint64
	// HighLiveBytes and HighReservedBytes are the peaks of LiveBytes and
	// ReservedBytes since ResetHighLive and ResetHighReserved last set them
	// to the current values (CUDA's memory-pool high-water marks); the Peak
	// figures above are since the pool began.
	HighLiveBytes     uint64
	HighReservedBytes uint64
	Quota             uint64
	CachedBytes       uint64 // device memory reserved in segments but not live (free, pending or stream-owned)
	PendingBytes      uint64 // freed, waiting for a synchronization or a marker
	LargestFreeBlock  uint64 // largest block reusable by any stream now
	Segments          uint64 // segments held now

	CacheHits          uint64 // requests served from memory the pool held
	DeviceReservations uint64 // requests that needed a new segment
	PassThrough        uint64 // requests served with pooling off
	Frees              uint64
	Refused            uint64
	Syncs              uint64 // synchronizations the pool forced
	ExternalSyncs      uint64 // synchronizations announced with SyncEnd
	Markers            uint64 // markers recorded
	SegmentsReleased   uint64
	BytesReleased      uint64
	// BackingErrors counts the failed Backing calls other than releases,
	// refusals for lack of memory and stream capture excepted.
	BackingErrors uint64
	// ReleaseErrors counts the failed releases (Release, ReleaseAsync,
	// ReleaseHost).
	ReleaseErrors uint64
	// CaptureSkips counts the synchronizations, markers and promotions not
	// made because the caller or the stream was capturing a CUDA graph.
	CaptureSkips uint64

	Granules      uint64 // physical granules held now (virtual memory)
	GranuleMaps   uint64 // granules mapped under an address, ever
	GranuleUnmaps uint64 // granules unmapped to serve another address, or to be released

	SpilledBytes     uint64 // live bytes on the host now
	PeakSpilledBytes uint64
	SpilledTotal     uint64 // bytes ever spilled
	PromotedBytes    uint64 // live bytes of whole blocks promoted back to the device now (not granules migration moved)
	PromotedTotal    uint64 // bytes ever promoted (managed blocks, and granules moved back by migration)
	DemotedTotal     uint64 // bytes of live blocks' granules ever moved to the host by migration
	HostOutside      uint64 // host bytes held outside the pool against the host limit (TakeHost)
	HostLimit        uint64
}

// Stats returns a snapshot of the counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.ReservedBytes = p.devBytes
	s.Quota = p.opt.Quota
	s.CachedBytes = p.cachedBytes()
	s.PendingBytes = p.pending.bytes + p.streamBytes()
	for k := range numClasses {
		s.LargestFreeBlock = max(s.LargestFreeBlock, p.idx[k].largest())
	}
	if p.opt.Oversubscribe {
		s.HostLimit = p.opt.HostLimit
	}
	return s
}

// cachedBytes is the device memory the pool holds in segments that no live
// block uses. The parts of host granules no live block uses are host
// memory: neither the program's to use on the device (cudaMemGetInfo adds
// the cache to free) nor the release threshold's.
func (p *Pool) cachedBytes() uint64 {
	n := p.segBytes - p.segLive
	if v := p.virt; v != nil {
		n -= v.hostGranules*v.gran - v.hostLive
	}
	return n
}

// String formats the stats as the one-line summary printed at exit.
func (s Stats) String() string {
	return fmt.Sprintf("live=%d peak_live=%d reserved=%d peak_reserved=%d quota=%d cached=%d largest_free=%d "+
		"cache_hits=%d device_reservations=%d pass_through=%d syncs=%d external_syncs=%d segments_released=%d "+
		"refused=%d spilled=%d spilled_total=%d promoted=%d promoted_total=%d demoted_total=%d host_outside=%d "+
		"backing_errors=%d release_errors=%d capture_skips=%d",
		s.LiveBytes, s.PeakLiveBytes, s.ReservedBytes, s.PeakReservedBytes, s.Quota, s.CachedBytes, s.LargestFreeBlock,
		s.CacheHits, s.DeviceReservations, s.PassThrough, s.Syncs, s.ExternalSyncs, s.SegmentsReleased,
		s.Refused, s.SpilledBytes, s.SpilledTotal, s.PromotedBytes, s.PromotedTotal, s.DemotedTotal, s.HostOutside,
		s.BackingErrors, s.ReleaseErrors, s.CaptureSkips)
}
