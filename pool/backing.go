package pool

import (
	"errors"
	"strconv"
)

// Stream identifies a stream on the pool's device. The pool never interprets
// it: it is compared for equality and handed back to the Backing.
type Stream uint64

// Marker is a completion marker recorded on a stream by the Backing (a CUDA
// event for a real device). The pool only records, queries and destroys it.
type Marker uint64

// Tier says where the memory behind an allocation lives.
type Tier int32

// The tiers, numbered as the probe points number them.
const (
	TierDevice  Tier = 0 // device memory reserved by the pool
	TierManaged Tier = 1 // managed memory, preferred on the host (spilled)
	TierPinned  Tier = 2 // mapped pinned host memory (spilled)
)

func (t Tier) String() string {
	switch t {
	case TierDevice:
		return "device"
	case TierManaged:
		return "managed"
	case TierPinned:
		return "pinned"
	}
	return "tier(" + strconv.Itoa(int(t)) + ")"
}

// Source says how an allocation was served, numbered as the probe points
// number it.
type Source int32

// The sources of an allocation.
const (
	SourceCache       Source = 0 // from memory the pool already held
	SourceDevice      Source = 1 // from a new reservation (a segment, or host memory when spilled)
	SourcePassThrough Source = 2 // pooling is off: one reservation per allocation
)

// Backing is the device under a Pool: it reserves and releases segments of
// device memory and provides the synchronization the pool needs to keep CUDA's
// semantics. A Pool calls it with the pool's lock held, except Synchronize
// and HostBacking.Promote, which may block on the device: those run with the
// lock released, at most one Synchronize and one Promote at a time, each
// possibly concurrent with the other methods. A Backing must never call back
// into the Pool. Every method concerns the one device of the pool.
type Backing interface {
	// Reserve returns the address of size bytes of device memory, aligned to
	// at least Alignment. A failure caused by lack of device memory must wrap
	// ErrOutOfMemory so the pool can release its cache and retry.
	Reserve(size uint64) (uint64, error)
	// Release returns a segment obtained from Reserve, with the same size.
	// A failure must free nothing: the pool keeps the memory and may try
	// again.
	Release(base, size uint64) error
	// Synchronize returns once all work queued on the device before the call
	// has completed. It fails with ErrStreamCapture where CUDA forbids it.
	Synchronize() error
	// RecordMarker records a marker on stream s that completes once all work
	// queued on s before the call has completed. It fails with
	// ErrStreamCapture where CUDA forbids it.
	RecordMarker(s Stream) (Marker, error)
	// MarkerDone reports whether the marker has completed, without waiting.
	MarkerDone(m Marker) (bool, error)
	// DestroyMarker frees a marker; the pool never uses it again.
	DestroyMarker(m Marker)
}

// ForeignStreamBacking is implemented by a Backing that can mark a foreign
// stream: one its Synchronize does not wait for (a stream of another
// device, or of another context than the one the pool's memory lives in),
// where a marker of its own cannot be recorded. Pool.FreeAsyncForeign needs
// it. MarkerDone queries its markers as any other.
type ForeignStreamBacking interface {
	// RecordForeignMarker records a marker on foreign stream s that
	// completes once all work queued on s before the call has completed.
	// It fails with ErrStreamCapture where CUDA forbids it.
	RecordForeignMarker(s Stream) (Marker, error)
	// DestroyForeignMarker frees a marker of RecordForeignMarker; the pool
	// never uses it again.
	DestroyForeignMarker(m Marker)
}

// FreeMarkerBacking is implemented by a Backing for which a stream may
// name a different stream in each thread (CUDA's per-thread default
// stream): a marker recorded later, from whichever thread needs it, must
// then go on a stream that follows them all, which orders later work of
// every thread behind it. FreeAsync, which runs in the thread that freed on
// the stream, records its marker with RecordMarkerAtFree instead, which can
// put it on that thread's stream alone. DestroyMarker and MarkerDone take
// its markers as any other.
type FreeMarkerBacking interface {
	// RecordMarkerAtFree is RecordMarker, called from the FreeAsync that
	// freed on s.
	RecordMarkerAtFree(s Stream) (Marker, error)
}

// IdleStreamBacking is implemented by a Backing that can say, without
// waiting, whether a stream has run all the work queued on it
// (cudaStreamQuery). ReleaseCached asks it where it may not synchronize: a
// stream the application synchronized itself has completed the frees made
// on it. A stream it cannot query is never idle.
type IdleStreamBacking interface {
	StreamIdle(s Stream) (bool, error)
}

// StreamOrderedBacking is implemented by a Backing that has stream-ordered
// reservation. It is used only in pass-through mode (Options.Pooling false) so
// that AllocAsync and FreeAsync keep their stream order without pooling;
// without it they fall back to Reserve and Release.
type StreamOrderedBacking interface {
	ReserveAsync(size uint64, s Stream) (uint64, error)
	ReleaseAsync(base, size uint64, s Stream) error
}

// HostBacking is implemented by a Backing that can serve allocations from host
// memory the device reads in place. It is required when Options.Oversubscribe
// is set.
type HostBacking interface {
	// ReserveHost returns size bytes of host memory of the given tier
	// (TierManaged or TierPinned), mapped for the device. Managed memory must
	// be advised to stay on the host so it does not count against the device.
	ReserveHost(size uint64, tier Tier) (uint64, error)
	// ReleaseHost frees memory from ReserveHost, with the same size and tier;
	// a promoted block gives its device bytes back. A failure must free
	// nothing: the block stays live and the application's retry calls
	// ReleaseHost again.
	// s is the stream of a stream-ordered free (FreeAsync): the memory may
	// still be in use by work queued on *s before the call, and must be
	// freed only once that work completes, without waiting for it on the
	// host. It is nil for Free and Close, which free at once.
	ReleaseHost(base, size uint64, tier Tier, s *Stream) error
	// Promote moves a managed block to the device and makes the device its
	// preferred location, waiting for the move. The address and contents do
	// not change. It runs without the pool's lock. A failure wrapping
	// ErrNotMoved, ErrOutOfMemory or ErrStreamCapture must have moved
	// nothing and kept nothing: the block stays on the host and a later
	// pass tries again.
	// After any other failure the block may be on the device: the pool
	// counts it there against the quota, as promoted, until it is freed,
	// and the Backing must account it likewise (ReleaseHost gives its device
	// bytes back).
	Promote(base, size uint64) error
}

// Observer receives the pool's events, for the probe points. A nil Observer
// costs one comparison per event. Its methods run with the pool's lock held:
// they must be quick and must not call back into the Pool. Sizes are the
// aligned sizes the pool accounts. A page-granular spill (see "Virtual
// memory") is told as the ranges of the host granules themselves: a Spill
// with TierPinned for each run of them mapped for a block, and a Free of
// the same range and tier when the run goes back to the host, so that the
// ranges told by Spill and not yet by a Free with another tier than
// TierDevice (or a Promote) at the same address are host memory.
type Observer interface {
	Alloc(ptr, size uint64, tier Tier, source Source)
	Free(ptr, size uint64, tier Tier)
	// Sync reports a completed synchronization (forced by the pool or
	// announced with SyncEnd) and how many freed bytes it made reusable.
	Sync(madeReusable uint64)
	Spill(ptr, size uint64, tier Tier)
	Promote(ptr, size uint64, tier Tier)
	// Refuse reports a refused request, with the device bytes reserved and
	// the quota at the time.
	Refuse(size, used, quota uint64)
}

// FailureObserver is implemented by an Observer that also wants the Backing
// failures that did not fail the call that met them: a promotion after
// SyncEnd, a segment that could not be released, a marker that could not be
// recorded or queried, a block freed during its promotion whose release
// failed. Each is counted in Stats (BackingErrors or ReleaseErrors) as
// well; failures a call returns are counted and not told. Stream capture is
// no failure: it is counted in Stats.CaptureSkips only. BackingFailed runs
// with the pool's lock held, like the Observer's other methods.
type FailureObserver interface {
	BackingFailed(err error)
}

// Errors returned by the pool; test for them with errors.Is.
var (
	// ErrOutOfMemory is wrapped by a Backing whose device (or host) has no
	// memory left, and by the pool when it refuses a request.
	ErrOutOfMemory = errors.New("out of memory")
	// ErrStreamCapture is returned by a Backing's Synchronize or RecordMarker
	// while the calling thread or the stream is capturing a CUDA graph, when
	// CUDA forbids both: the pool then neither synchronizes nor records, and
	// grows or refuses instead.
	ErrStreamCapture = errors.New("stream capture in progress")
	// ErrQuota is wrapped (together with ErrOutOfMemory) by a refusal because
	// the device quota cannot hold the request.
	ErrQuota = errors.New("device quota exceeded")
	// ErrHostLimit is wrapped (together with ErrOutOfMemory) by a refusal
	// because spilling the request would pass Options.HostLimit.
	ErrHostLimit = errors.New("host spill limit exceeded")
	// ErrDeviceFull is wrapped by a failed spill when the device itself (a
	// Backing's ErrOutOfMemory), not the quota, had no room for the request:
	// the GPU's other processes hold the rest. (A refusal for that, without
	// oversubscription, wraps the Backing's error instead of ErrQuota.)
	ErrDeviceFull = errors.New("device out of memory below the quota")
	// ErrNotOwned: the pointer was never handed out by this pool, so it
	// belongs to whoever else allocated it.
	ErrNotOwned = errors.New("pointer not allocated by this pool")
	// ErrInvalidFree: the pointer lies in the pool's memory but is not the
	// start of a live allocation (a double free or an interior pointer).
	ErrInvalidFree = errors.New("pointer is not the start of a live allocation")
	// ErrTooLarge: the request is larger than MaxRequest.
	ErrTooLarge = errors.New("request too large")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("pool closed")
	// ErrNotMoved is wrapped by a HostBacking whose Promote failed before
	// anything moved and gave back what it took.
	ErrNotMoved = errors.New("promotion failed before the block moved")
)
