// Package pool is Spillway's allocator of device memory: one Pool per device
// serves cudaMalloc, cudaFree, cudaMallocAsync and cudaFreeAsync from segments
// it reserves through a Backing, keeps CUDA's ordering guarantees, takes
// every device byte it holds from a Ledger that enforces the device quota
// and, when asked, spills what the quota cannot hold to host
// memory and promotes it back later.
//
// Where the device has virtual memory management (VirtualBacking), segments
// give way to address ranges under which physical granules are mapped on
// demand and moved between addresses; see "Virtual memory".
//
// It is pure Go and must stay so: no cgo, no CUDA types, no knowledge of
// symbols or environment variables. Everything it needs from the device goes
// through the Backing interface (reserve, release, synchronize, stream
// markers, and HostBacking for spilling), so it is tested on a simulated
// device (package pooltest) and the shim supplies the real one. It never calls
// back into the application and never blocks except inside Backing calls, or
// waiting for a synchronization or promotion another thread has in flight.
//
// # Wiring
//
// The shim keeps one Pool per device (created with New at the device's first
// allocation, from DefaultOptions(quota) plus the environment, with
// Options.Ledger the device's ledger, which also counts the memory the shim
// serves outside the pool) and maps:
//
//	cudaMalloc(&p, n)            p, err = Alloc(n)  (n == 0 gives 0, nil)
//	cudaMallocPitch              Alloc(pitch*height), pitch chosen by the shim
//	cudaFree(p)                  err = Free(p); ErrNotOwned: call the real cudaFree,
//	                             bracketed by SyncBegin/SyncEnd as it synchronizes
//	cudaMallocAsync(&p, n, s)    AllocAsync(n, Stream(s))
//	cudaFreeAsync(p, s)          FreeAsync(p, Stream(s)); ErrNotOwned as for Free
//	cudaDeviceSynchronize        t := SyncBegin(); real call; if it succeeded SyncEnd(t)
//	                             (SyncEnd then promotes spilled blocks; Promote
//	                             may be called at other points where the thread waits)
//	cudaStreamDestroy(s)         ForgetStream(Stream(s)) before the real call
//	thread exit                  ForgetStream of the thread's per-thread identity
//	cudaDeviceReset              Close() before the real call; New afterwards
//	cudaMemGetInfo               total = Quota, free = the ledger's headroom
//	                             + Stats().CachedBytes (cached memory is the application's to use)
//	a request outside the pool   ReleaseCached(true) when the ledger cannot hold it
//	                             (false from another context than the pool's),
//	                             then the request once more
//	the default memory pool's    Stats(): ReservedBytes, HighReservedBytes,
//	attributes (cudaMemPool...)  LiveBytes, HighLiveBytes; ResetHighReserved
//	                             and ResetHighLive when a High is set to 0
//	cudaMemPoolTrimTo(pool, n)   TrimTo(n)
//	SPILLWAY_REPORT=1            Stats().String() at exit
//
// Errors map to CUDA's: ErrOutOfMemory (wrapped by every refusal, with
// ErrQuota or ErrHostLimit; a failed spill of what the device, not the
// quota, could not hold also wraps ErrDeviceFull) and ErrTooLarge to
// cudaErrorMemoryAllocation, ErrInvalidFree (double free, interior pointer)
// to cudaErrorInvalidValue.
// A Stream value must name one stream for the pool's lifetime: the per-thread
// default stream (handle 2) is a different stream in every thread, so the
// shim passes a per-thread identity for it. The probe points are fired by an
// Observer the shim implements (Options.Observer); the pool calls it under its
// lock, at no cost when it is nil.
//
// # Size classes and segments
//
// Every size is rounded up to Alignment (512 bytes, as PyTorch does) and
// falls into one of three classes, each with its own segments and free index
// so that small blocks never pin large segments:
//
//	small   ≤ 1 MiB          2 MiB segments, shared
//	medium  1 MiB – 10 MiB   20 MiB segments, shared
//	huge    ≥ 10 MiB         a segment of its own, rounded up to 2 MiB
//
// (PyTorch's caching allocator uses the same 2 MiB / 20 MiB / 2 MiB-rounding
// scheme.) A shared segment is never larger than 1/32 of the quota; below
// that a request gets a segment of exactly its size, so a small quota is
// never eaten by a few half-used segments. A shared segment is cut to a
// whole number of blocks of the request that made it: no tail is left that
// the quota charges and cudaMemGetInfo reports free but that requests of
// that size cannot use.
//
// Device memory cannot hold allocator metadata, so every block has an
// out-of-band descriptor: address, size, neighbours in its segment (for
// coalescing) and list links. Descriptors are allocated in slabs of 256 and
// recycled through a spare list, never returned to the Go heap. Live blocks
// are found by address in open-addressing hash tables (liveMap): one for the
// 256 blocks handed out last, small enough to stay in the processor's
// caches, and one for the blocks that outlived them, so that a block dying
// young (most of a framework's) never writes a slot of the large table, a
// cache miss that was a third of a pair's cost among 100,000 live blocks.
// Segments are kept sorted by address only to tell a double free (inside a
// segment) from a foreign pointer.
//
// # Finding a free block
//
// Each class indexes its free blocks with a two-level segregated fit (TLSF,
// Masmano et al., 2004): the first level is the power of two of the size, the
// second splits it in 32 linear classes, and two bitmaps find the smallest
// non-empty class above a size with two find-first-set instructions. A
// request first examines up to 8 blocks of its own class, taking the smallest
// that fits (so requests of a size seen before reuse exactly that size), then
// takes the first block of the smallest class whose every block fits. The
// block is split, the rest goes back to the index (with virtual memory a
// request may also be carved from inside the block, its head staying free:
// see "Virtual memory"); a freed block is merged at once with free
// neighbours. A huge block is not split: it is reused whole for
// a request it exceeds by at most max(1/8, 2 MiB), otherwise left alone.
//
// # cudaFree semantics
//
// cudaFree waits for the device, so a program may free memory that queued
// work still uses. Free therefore puts the block on a pending queue stamped
// with a sequence number; a pending block becomes free only when a
// device synchronization that began after the free has completed: one the pool
// makes (Backing.Synchronize) or one the application makes and announces with
// SyncBegin/SyncEnd. The pool synchronizes when a request misses the cache
// and the pending bytes of its class could serve it (with virtual memory,
// when any bytes are pending: see "Virtual memory"), before growing, and
// when the quota is reached; one synchronization frees the whole batch. With
// Options.StrictFree every Free synchronizes, as the driver does.
//
// A synchronization the pool forces takes the cut (the sequence number of the
// next free), releases the lock, waits for the device, takes the lock again
// and completes what the cut covers; other threads allocate and free
// meanwhile. Only one is in flight: a thread that needs one while another
// runs waits for it if it covers the thread's frees, and otherwise waits for
// it to end and starts the next, which covers every thread waiting by then.
//
// # Stream capture
//
// While the calling thread or the stream captures a CUDA graph, CUDA forbids
// synchronizing and recording events; the Backing then fails with
// ErrStreamCapture. The pool takes that as "not now": it tries once per
// request, never in a loop, and grows or refuses as if nothing were pending;
// a free succeeds and its block waits for a later synchronization or marker;
// a promotion leaves the block on the host. Nothing of it reaches the
// caller; it is counted in Stats.CaptureSkips.
//
// # Stream order
//
// FreeAsync puts the block in the cache of its stream, where AllocAsync on the
// same stream reuses it at once (stream order protects it) and merges it with
// neighbours freed on that stream. A stream's cache exists only while it
// holds blocks or a marker, and its free index is allocated class by class
// as blocks arrive (about 500 bytes, plus 256 per power of two of sizes it
// held): a drained cache is dropped, as is a forgotten stream's, so streams
// used once and gone (per-thread default streams of exited threads) leave
// nothing behind, and a miss visits only the streams holding blocks. For the other streams the pool records one
// marker per stream (Backing.RecordMarker) when the stream's cache has blocks
// and no marker (at a free, FreeMarkerBacking.RecordMarkerAtFree where the
// Backing has it); when a request misses, completed markers move the blocks they
// cover to the shared index, and new markers are recorded for what remains
// (where one cannot be, the stream is asked whether it is idle instead).
// A device synchronization covers every stream of the device's context. A
// foreign stream (another device's or context's: FreeAsyncForeign) is
// marked through ForeignStreamBacking, and only its marker or its idleness
// completes its frees, even once the stream is forgotten, until its context
// is gone (ForgetFinishedContext). The markers of forgotten foreign streams
// are also polled as they accumulate (once twice as many are waiting as
// were left at the last poll, and 64 more), so that a program whose requests never
// miss leaves no cache or marker per stream it destroyed. Blocks freed on
// another stream are never waited for while the quota has room: the pool
// grows instead, so stream-ordered code never blocks on the host.
//
// # The ledger
//
// The pool admits nothing by itself: before it reserves a segment, creates
// a granule, passes a request through or promotes a block, it takes the
// bytes from its Ledger (Take), and it gives them back (Give) once the
// Backing has released them, or at once if the Backing refused; Close gives
// back everything it held. Headroom, what Take would admit now, decides
// how many granules a placement may create and whether a promotion can
// fit. Options.Quota still sizes shared segments and arenas and sets the
// default release threshold, but "the quota holds" below means "the ledger
// admits". A pool alone under its quota uses a QuotaLedger of Options.Quota
// bytes; the shim gives every device's pool a ledger it shares with the
// memory it counts outside the pool, so that one limit holds for both, and
// a user of the ledger whose request does not fit calls ReleaseCached,
// which returns every empty segment and every free and idle granule (after
// a synchronization, if the caller allows one and freed blocks wait for
// it, and what completed markers of foreign streams free), and tries once
// more. The ledger
// is called with the pool's lock held and must never call back into the
// pool; ReleaseCached takes the lock, so it is called from outside.
// Host memory (spilling) is not the ledger's: Options.HostLimit bounds it.
//
// # Growth, release and the quota
//
// A miss, after the steps above, reserves a segment if the quota holds it.
// Otherwise the pool, in order: synchronizes if a synchronization would
// complete any free (blocks of foreign streams alone never force one) and
// moves the blocks of completed markers to the shared index; searches
// every class for any block that fits (scanning the request's class in full);
// releases every empty segment and reserves a segment, or exactly the
// request; spills to the host (Options.Oversubscribe); refuses, with an error
// wrapping ErrQuota and ErrOutOfMemory. A Backing failure with ErrOutOfMemory
// (the device itself is full) takes the same path, granules included, and
// its refusal wraps the Backing's error instead of ErrQuota; with virtual
// memory it first returns every free and idle granule to the device, as
// does a spill of such a request that fails.
//
// Empty segments are also released, oldest emptied first, while the cached
// memory (reserved in segments but not live) exceeds Options.ReleaseThreshold,
// by default 1/8 of the quota: enough to keep a training step's or a decode
// step's working set cached, small enough that an idle process returns most
// of what it no longer uses. Options.Reserve reserves one segment at the
// first allocation that every class may use and that is never released before
// Close. With Options.Pooling off, every request is a reservation of its own
// and only the quota's accounting remains.
//
// # Host tier
//
// With Options.Oversubscribe a request the quota cannot hold is served by
// HostBacking.ReserveHost in the tier of Options.SpillTier (managed memory
// preferred on the host, or mapped pinned memory), up to Options.HostLimit
// (by default as much as the quota), and lives in the same pointer table with
// its tier. Promotion moves spilled managed blocks back to the device
// (HostBacking.Promote: prefetch and advice, same address and contents) while
// the quota holds them: oldest spilled first, stopping at the first block
// that does not fit even after releasing every empty segment, so a large old
// block is never overtaken by young small ones. A promotion waits for the
// device, so it runs only where the calling thread has just waited for the
// device or asked to: at SyncEnd (an announced synchronization) and on
// demand with Promote. It never runs inside Free or FreeAsync, which would
// then wait for the device, nor inside an allocation, where it would take
// the room the request needs. One pass runs at a time (SyncEnd leaves the
// work to a pass in flight; Promote waits for it, then runs its own). Each
// move runs with the lock released, its device bytes counted beforehand so
// the quota holds while it runs; a block freed during its own move is
// released when the move returns.
// Promoted bytes count against the quota; a pinned block is never promoted
// (host granules of virtual memory move under Migration, below).
// A failed promotion ends the pass. One that failed with ErrNotMoved,
// ErrOutOfMemory or ErrStreamCapture moved nothing: the block stays first in line. After any
// other failure (a failed wait for the move, typically) the block may be on
// the device: it is counted there, as promoted, until it is freed, so the
// quota holds against what the device holds whatever happened. A failure
// does not fail SyncEnd, which has done its job: it is counted in
// Stats.BackingErrors and reported to the Observer if it implements
// FailureObserver; Promote, called on demand, returns it. A spilled block
// freed by FreeAsync is released with its stream (HostBacking.ReleaseHost
// gets the stream), so the Backing can free it once the work queued on that
// stream completes instead of waiting for the device. Host memory held
// outside the pool on its device's behalf (the application's own physical
// memory placed on the host because the quota could not hold it) shares
// Options.HostLimit through TakeHost and GiveHost.
//
// # Virtual memory
//
// When the Backing implements VirtualBacking and Options.VirtualMemory is set
// (the default), pooled memory is not reserved as fixed segments. Each class
// reserves an arena of address space (twice the quota, at least 1 GiB, at
// most 64 GiB, or the request rounded up to the granularity if larger) and
// the pool maps physical granules (VirtualBacking.Granularity: 2 MiB on CUDA
// devices) under it only where blocks that are not free lie. Blocks,
// splitting, merging, the indexes, the stream caches and the pending queue
// work on addresses as they do on segments; a huge block is split like any
// other, since a split arena strands no physical memory. A granule holds
// used bytes (of live, pending and stream-owned blocks) exactly when no free
// block covers it whole, since free neighbours always merge; so the pool
// keeps no count per granule, and a block placed or freed on the granules a
// free block shares with its neighbours, the common case, reads none:
//
//   - A block handed out gets the unmapped granules under it mapped, each
//     with physical memory taken, in order, from the free granules (mapped
//     nowhere), from the oldest idle granule (mapped, no byte used), which is
//     unmapped from where it lies, or created if the quota holds it. So the
//     granules of blocks freed anywhere make up any later block, whatever its
//     address and size: a large block is stitched from non-contiguous
//     physical memory behind one range (GMLake's virtual memory stitching),
//     and the pointer handed out never moves.
//   - A block that becomes free (a Free after a synchronization, a FreeAsync
//     after its marker or a synchronization) merges with its free
//     neighbours; a granule of it the merged block covers whole becomes
//     idle, still mapped, so a block placed there again costs no mapping.
//
// CUDA's rules hold for remapped memory as for segments: only an idle
// granule is ever unmapped, and a granule is idle only when every block on it
// is free in the pool's sense, known complete for every stream. Pending and
// stream-owned bytes keep their granules mapped where they are, so work still
// queued never sees its memory move, and reuse on the freeing stream happens
// at the same address, in stream order.
//
// A request is placed in a cached block when the granules it lacks can come
// from free and idle ones. Otherwise (what counts as a miss in this design)
// completed markers are polled and, when any bytes are pending, the pool
// synchronizes, as it does before growing (not only when they could serve
// the request: a pending block, once free, merges with its free neighbours
// and may leave a granule idle, either of which can spare the new granule);
// then the best cached block, the static reserve, or a new arena. Near the
// quota a placement is also a miss, while a Free is pending, when it would
// leave fewer than 16 granules within reach (free, idle, or within the
// ledger's headroom): on random churn under 1.10 × its peak live bytes this
// refuses 120 requests where 545 over eight seeds of the trace, for three
// times the synchronizations; a refusal fails the application, a wait for
// the device does not. A cached
// block chosen by its class's index that lies on unmapped granules gives way
// to the free block of any class needing fewer, the fewest among 4 per class,
// smallest first: the free bytes of partly used granules serve any class, and
// each granule not mapped is memory not held, or not taken from under another
// free range, and a driver call not made. A host granule (below) counts as an unmapped one, so a
// block on device granules alone is preferred to one on either. Within the
// block chosen (when it lies on a granule no used byte is on yet), the
// request takes the best of six places: either end of the block, or a start
// or an end on the granule boundary nearest either end. The best puts used
// bytes on the fewest granules holding none; then, for a request of a
// granule or more, covers the most granules whole (once freed, it leaves them
// unused but for its remainder, where a block straddling a boundary keeps a
// granule shared with its neighbour); then leaves the fewest free bytes
// beside it in its own first and last granules (held memory only a block
// fitting there can use); then lies lowest. It never maps more granules than
// the block's first bytes would. The bytes before it stay a free block of
// their own. A request whose block lies on granules in use already takes the
// block's first bytes, at no cost beyond that check. On random churn the
// places take peak reserved ÷ peak live from 1.137 to 1.131 (1.144 to 1.129
// on average over eight seeds of the trace), for twice the granules mapped
// per allocation (0.058 to 0.115) and 18% more synchronizations forced
// (1,625 to 1,918 in 100,000 operations): the idle granules a block at a
// granule boundary takes run out sooner. Ranking the places costs the
// random-size pair nothing among 10,000 live blocks (1,138 instructions
// against 1,145, BenchmarkPairVirtual in cudaFree order: the placements
// change the paths later pairs take) and 201 among 1,000 (1,255 against
// 1,054), where a quarter of the requests land on fresh granules.
// Looking further, at other free blocks by the fresh granules the request
// needs anywhere in them, reached
// 1.121 on the trace but only 1.125 over the eight seeds, for 3 times the
// maps and 100 more instructions a pair; a search of every free block by
// these ranks did no better. If the quota
// cannot give the granules the pool synchronizes for everything freed (if a
// synchronization would complete any of it), then
// places the block in the free block of any class where it needs the fewest
// granules (a scan of every free block: the free parts of partly used granules
// serve requests of any class), else in an arena of its own, rounded up to the
// granularity, where it needs ceil(size/granule) granules, then spills or
// refuses: a request is refused only when no free block can be given its
// granules and the quota minus the granules holding used bytes cannot hold
// ceil(size/granule) granules. Free granules, then idle ones oldest first, go
// back to the device while the cached memory (physical memory not live)
// exceeds Options.ReleaseThreshold, and when promotion needs room.
// Options.Reserve remains a fixed segment, which every class uses first.
// Arenas hold only address space: one emptied while its class has another is
// freed, the rest by Close, with every granule. Stats.Segments counts arenas,
// and Stats.LargestFreeBlock free address space, which is not a bound on what
// can be served; Stats.Granules counts the physical granules held.
//
// With Options.Oversubscribe, spilling is page-granular: when the quota
// cannot give a block all its granules, after the steps above, the granules
// it still lacks are host-located physical memory
// (VirtualBacking.CreatePhysical with TierPinned) mapped behind the same range
// as its device granules, up to Options.HostLimit; only if that fails is the
// whole block spilled to the host tier. The Observer hears of it as the host
// granules' own ranges: one Spill per granule, and a Free of the same range
// (tier pinned) when the granule goes back to the host, or a Promote when
// migration moves it to the device (the block's own Free, tier device, ends
// no range). Device memory is always preferred: free, then idle, then new
// device granules come before host ones. A host granule goes back to the
// host the moment no used byte is left on it, and the next block placed on
// its address gets device memory, so spilled memory moves back to the device
// by reuse, at no copy. Without Options.Migrate, granules of live blocks
// never move between device and host; stream-ordered and pending blocks
// keep their granules, device or host, until their frees complete.
//
// # Migration
//
// With Options.Migrate, granules of live blocks move between the device and
// the host (GranuleMover: a copy, then a remap of the same address, so
// pointers never change) at announced synchronizations (SyncEnd), and only
// there. The pool cannot see when queued work reads or writes a block, and
// a remap under running work would fault or lose its writes; SyncEnd comes
// right after the application waited for all of its work, on the thread
// that waited, which queues nothing until SyncEnd returns. Other threads
// could: a block freed while the synchronization ran (pending or
// stream-owned at SyncEnd) shows one is at work, and then nothing moves;
// beyond that, Options.Migrate is the application's promise that no other
// thread queues work while it synchronizes (one thread driving the device,
// as a training or inference loop does). The moves, with the pool's lock
// held, are at each SyncEnd:
//
//  1. Hot host granules move to the device, oldest spilled first. The pool
//     sees where blocks are handed out, not where work reads, so a granule
//     a block was handed out on since the previous synchronization is hot,
//     and the others are the colder the longer ago that was.
//  2. The device keeps room (free and idle granules, the ledger's headroom)
//     for the interval's short-lived blocks: the granules the interval held
//     at its peak and gave back by its end. Where the room falls short of
//     that reserve plus the hot host granules, the coldest device granules
//     holding live blocks move to the host first (never a hot one; ties by
//     address), up to Options.HostLimit.
//  3. While the room exceeds the reserve, the other host granules move
//     back, oldest spilled first.
//
// So a working set that repeats from one synchronization to the next (a
// training step, a decode step) settles with its hot blocks on the device
// after one or two steps and moves nothing more, and what spills is what
// no step hands out on: weights allocated once, for example. A move costs
// a granule's copy (2 MiB) and three mapping calls; Stats.DemotedTotal and
// PromotedTotal count the bytes. Measured on the Qwen2.5-32B inference trace
// at 60% of its peak live bytes (BenchmarkSpillVirtual, moved-B/sync): 3.5 MB
// moved per synchronization on average over 513 (the weights that do not fit
// spill when allocated, as without migration: 41% of the peak live bytes at
// the peak, BenchmarkSpillVirtual's peak-spilled/live); replayed under the shim
// at 1/64 scale (tests/tracetest), touches of spilled memory fall from 16.2%
// to 9.4% (by bytes, from 46.1% to 26.9%), for 65,408 bytes moved per step
// (granules stay 2 MiB at that scale, so this is not 1/64 of the figure
// above).
// Where nothing repeats it costs: on the random-churn trace it moves
// 343 MB per synchronization, and on the training trace, whose three steps
// each need tens of GB of activations, 4.4 GB.
//
// Cost: handing out or freeing a block visits the ceil(size/granule)+1
// granules it touches, O(1) for a block up to a granule, plus, when the block
// its index finds lies on unmapped granules, up to 12 more free blocks (4 per
// class) and their granules, and one VirtualBacking.Map per granule mapped and
// one Unmap per idle granule taken from elsewhere (a driver call each,
// microseconds on a device: BenchmarkTraceVirtual reports maps per allocation:
// 0.06 on the inference trace, 0.12 on random churn, 5.1 on the training
// trace, whose allocations touch 11.7 granules on average; without the look at
// other free blocks 0.06, 0.10 and 6.6). On the inference trace that look
// costs 100 to 200 ns per allocation in the simulator and saves nothing: its
// small requests find their class's arena unmapped and take free bytes of the
// medium class's granules, each time. Fragmentation: the only physical memory
// not live is idle and free granules (within the release threshold), pending
// and stream-owned blocks, and the free parts of granules that also hold used
// bytes: less than two granules per free range between used blocks, and less
// than the range itself. Measured (peak reserved ÷ peak live, unbounded quota,
// BenchmarkTraceVirtual, fixed segments in brackets): Qwen2.5-32B inference
// 1.001 (1.004), training steps 1.000 (1.033), random churn 1.131 (1.240;
// 1.137 with every request at the start of its free block, 1.144 against
// 1.129 on average over eight seeds of the trace, for twice the maps per
// allocation, 0.058 to 0.115, and 18% more synchronizations; 1.158 without
// the look at other classes' free blocks; 1.146 synchronizing only for
// pending bytes that could serve the request). At random churn's
// peak with every request at the start of its free block (1,164 MiB held
// for 1,022 MiB live) 137 MiB are the free parts of
// granules that also hold used bytes and 5 MiB stream-owned blocks: its
// free ranges average about a granule, so removing whole free
// granules from under them reclaims little. BenchmarkStitchFloor replays the
// traces on two models of placement freer than the pool (frees complete at
// once; each request searches every granule or free range for the fewest
// granules with no used byte, then the least left free beside used bytes).
// With each granule mapped at one address, as in the pool, random churn peaks
// at 1.105 (1.076 placing with the partly used granules' fragments in view).
// The pool itself, replayed with every free complete at once (a
// synchronization after each), peaks at 1.099 (1.113 with every request at
// the start of its free block): most of the distance from its 1.131 is not
// its bounded search but frees waiting for the device (pending blocks for a
// synchronization, stream-owned ones for their stream's marker), whose
// bytes serve no other request meanwhile and keep free ranges apart. Neither
// kind alone makes the distance: with only the cudaFrees complete at once
// the pool peaks at 1.107, with a synchronization after each cudaFreeAsync
// (which completes the cudaFrees before it too) at 1.103 (eight-seed means
// 1.113 and 1.108, against 1.129 and 1.106). The stream-owned blocks are
// the pool's to wait for only when the quota is reached: stream-ordered
// code never blocks on the host while the quota has room.
// Searching every free block of every class by the start-of-range model's
// rule did barely better, with every request at the start of its free
// block: 1.135 against 1.137 (1.140 against 1.142 on average over six seeds
// of the trace, whose figures spread over ±0.005), with twice the maps per
// allocation; placing a block at whichever end of its free range needs
// fewer granules did no better (1.148; 1.142).
// Mapped at any number of addresses, any granule's free tail and any other's
// free head beginning and ending a block (GMLake's stitching taken to its
// limit), the model peaks at 1.058, and at 1.045 (1.046 over four other
// seeds) when a block under a granule lies against its granule's boundary
// where its free range has one: with every free complete at once, a granule
// mapped at several addresses, with the fragments in view, is what getting
// under 1.05 takes, since no rule for one address per granule the models
// tried got under 1.076. With frees that wait for the device as the pool's
// do (a free's bytes reusable once the work queued before it retires, and a
// synchronization before a placement that needs more memory than the peak
// so far, as the pool's miss makes: about 1,800 per 100,000 operations,
// the pool's count), the same model peaks at 1.056 (1.059 over eight seeds);
// at 1.055 (1.052) with each cudaFree complete at once, as a
// synchronization in every cudaFree would make it, and at 1.053 (1.053)
// with each cudaFreeAsync's bytes reusable at once by every stream, sooner
// than CUDA allows; the one-address model, the pool's freest counterpart,
// at 1.090, 1.082 and 1.084 (1.087 each), against the pool's 1.131
// (1.129). So none of the placements modelled (greedy, so no proven bound)
// gets random churn under 1.05 unless every free completes at once. Moving live
// bytes does not get lower: an address fixes where in its granule each byte
// lies, so moving can only gather onto one granule, mapped at each of their
// addresses, bytes of partly used granules that lie at disjoint offsets; the
// stitching model gathering them into the fewest granules possible at every
// synchronization of the trace (where moving is safe) peaks at 1.064: the
// 1,000 operations between two synchronizations turn the live set over. The
// pool does not move live bytes to save memory. Under a quota the pressure
// path scans every free block for the placement needing the fewest new
// granules: random churn under 1.10 × its peak live bytes refuses 0.012% of
// its requests (fixed segments 0.78%), and under 1.05 × 1.78% (2.33%).
//
// # Failures
//
// A release that fails (Release, ReleaseAsync, ReleaseHost) frees nothing:
// a pass-through or spilled block stays live and counted, the free returns
// the error, and a retry releases it; a segment stays held and is not tried
// again before Close. With virtual memory, a failed mapping fails the
// allocation: the device granule it was given stays free, a host one goes
// back. A granule that fails to unmap, a host granule that fails to be
// freed and an emptied arena whose range fails to be freed stay held and
// counted until Close; a free device granule that fails to be released is
// tried again by the next release. Every Backing failure is counted in Stats
// (ReleaseErrors for releases, BackingErrors for the rest, refusals for lack
// of memory excepted) and printed by Stats.String; those that fail no call
// are also told to a FailureObserver.
//
// # Bounds
//
// With n free blocks, s segments and k streams:
//
//   - Alloc served from the cache, Free, FreeAsync: O(1): at most 8 + 1 index
//     probes per searched index (at most 2), with virtual memory at most 12
//     more free blocks visited when the block found would map granules,
//     constant-time splitting and
//     merging, and an expected O(1) hash table operation. They allocate on the
//     Go heap only as the pool's metadata grows (a slab of 256 descriptors, the
//     hash table doubling, a stream's cache), never in a steady state, so a run
//     of pairs never starts a garbage collection, which would scan every
//     descriptor. No operation depends on the number of live blocks, but the
//     memory they touch does. A block that outlives the 256 handed out after
//     it moves to the large hash table, writing a cold slot, and freeing a
//     block none of whose metadata is in the processor's caches reads about
//     five cold lines (its hash table slot, its descriptor, its two
//     neighbours', the head of a free list): with 100,000 live blocks (tens
//     of MB of metadata) that worst case costs about five times what it
//     costs with 1,000 (BenchmarkPairRandomVictim, where every block
//     outlives the young table and so also pays 6 to 13% for passing
//     through it), while a pair of young blocks costs 0.9 to 1.1 times as
//     much with 100,000 as with 1,000 (BenchmarkPair, random sizes).
//   - A miss adds O(k) marker queries, k counting only the streams that hold
//     blocks or a marker now, and, when it synchronizes, O(1) per
//     block made reusable: each freed block migrates once, so it is O(1)
//     amortized per free.
//   - Reserving or releasing a segment adds O(log s) to find its place and
//     O(s) word moves to keep the sorted slice: far less than the device
//     reservation it accompanies.
//   - Only the quota-pressure path, which precedes a spill or a refusal, may
//     scan whole free lists: O(n).
//   - Migration runs at SyncEnd only: O(h) in the host granules, plus, when
//     it demotes, O(g log g) in the granules of the arenas (a sort of the
//     candidates), and a copy and three mapping calls per granule moved.
//
// Internal fragmentation: less than Alignment per block, plus at most
// max(size/8, 2 MiB) for a huge block reused whole. External fragmentation:
// free memory is stranded only inside segments that still hold a live block,
// never more than the segment size (2 MiB, 20 MiB or 1/32 of the quota) per
// such segment; a huge segment strands nothing unless quota pressure split it.
// A request is refused only when after synchronizing and releasing every empty
// segment the quota cannot hold it and no free block of any class fits it. No
// allocator that never moves live blocks can do better than the fifty-percent
// rule (Knuth): under random churn in equilibrium there are about half as many
// holes as live blocks, so random churn of uniform sizes costs about 25% when
// nothing limits growth (peak reserved ÷ peak live 1.24 on the random-churn
// reference trace), while the model traces, whose sizes repeat, stay within 4%.
// Under a quota the pool searches harder before growing: the random-churn trace
// runs under a quota of 1.10 × its peak live bytes with 0.78% of its requests
// refused; the model traces run under 1.02 × without a refusal
// (BenchmarkTrace reports both figures). Address-ordered best fit over whole classes, medium segments of 8
// or 64 MiB instead of 20, and small segments of 8 MiB were measured on that
// trace and did not lower either figure by more than 0.01 (larger segments
// raise the first: growth overshoots more). Visiting streams in creation order
// keeps the pool deterministic: the same calls give the same addresses and the
// same figures.
//
// # Concurrency
//
// A Pool is safe for concurrent use. One mutex per pool serializes every
// method. It is held across Observer calls and the Backing calls that do not
// wait for the device, which must therefore never call back into the Pool,
// and released across those that do: Backing.Synchronize and
// HostBacking.Promote, one of each in flight at a time. Close waits for
// those in flight, then holds the lock to the end. Pools of different
// devices share nothing.
package pool
