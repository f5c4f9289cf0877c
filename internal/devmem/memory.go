package devmem

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/spillway-gpu/spillway/internal/stat"
	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/shim/config"
)

// allocKind says which CUDA call asked for memory.
type allocKind int

const (
	kindDevice allocKind = iota
	kindManaged
	kindAsync
	kindPitch
	numAllocKinds
)

// API says which CUDA API the application called, so that the log names
// its own function: a driver program never called cudaMalloc.
type API uint8

const (
	RuntimeAPI API = iota
	DriverAPI
)

// apiCalls names CUDA's functions in one API, so that a line names the
// call it is about: those the application calls (its refusals), and those
// the core's own calls make (their failures), which over the driver (a
// process without the runtime, see openRuntime) are the driver's too.
type apiCalls struct {
	malloc                               [numAllocKinds]string // by the kind of allocation
	free, freeAsync, freeHost            string
	synchronize, streamQuery, eventQuery string
	managedSpill, pinnedSpill            string // the memory a spill makes, and its calls
	notInitialized                       string // what every allocation answers under an invalid setting
}

var apiCallNames = [...]apiCalls{
	RuntimeAPI: {
		malloc: [...]string{kindDevice: "cudaMalloc", kindManaged: "cudaMallocManaged", kindAsync: "cudaMallocAsync", kindPitch: "cudaMallocPitch"},
		free:   "cudaFree", freeAsync: "cudaFreeAsync", freeHost: "cudaFreeHost",
		synchronize: "cudaDeviceSynchronize", streamQuery: "cudaStreamQuery", eventQuery: "cudaEventQuery",
		managedSpill: "managed memory (cudaMallocManaged, cudaMemAdvise)",
		pinnedSpill:  "pinned memory (cudaHostAlloc, cudaHostGetDevicePointer)",
		// The driver's entry points answer the driver's code, also here.
		notInitialized: "cudaErrorInitializationError (CUDA_ERROR_NOT_INITIALIZED from the driver's functions)",
	},
	DriverAPI: {
		malloc: [...]string{kindDevice: "cuMemAlloc_v2", kindManaged: "cuMemAllocManaged", kindAsync: "cuMemAllocAsync", kindPitch: "cuMemAllocPitch_v2"},
		free:   "cuMemFree_v2", freeAsync: "cuMemFreeAsync", freeHost: "cuMemFreeHost",
		synchronize: "cuCtxSynchronize", streamQuery: "cuStreamQuery", eventQuery: "cuEventQuery",
		managedSpill:   "managed memory (cuMemAllocManaged, cuMemAdvise)",
		pinnedSpill:    "pinned memory (cuMemHostAlloc, cuMemHostGetDevicePointer_v2)",
		notInitialized: "CUDA_ERROR_NOT_INITIALIZED",
	},
}

// freeCall names the free the application called in api.
func freeCall(api API, async bool) string {
	if async {
		return apiCallNames[api].freeAsync
	}
	return apiCallNames[api].free
}

// request is one allocation call.
type request struct {
	device int
	size   uint64
	kind   allocKind
	api    API
	flags  uint32           // cudaMallocManaged
	stream interpose.Stream // cudaMallocAsync
}

// realRuntime is the part of the real CUDA runtime the core calls;
// *interpose.Runtime implements it, and tests substitute a fake.
type realRuntime interface {
	Malloc(size uint64) (interpose.DevicePtr, interpose.Error)
	MallocManaged(size uint64, flags uint32) (interpose.DevicePtr, interpose.Error)
	MallocAsync(size uint64, s interpose.Stream) (interpose.DevicePtr, interpose.Error)
	Free(p interpose.DevicePtr) interpose.Error
	FreeAsync(p interpose.DevicePtr, s interpose.Stream) interpose.Error
	MemGetInfo() (free, total uint64, rc interpose.Error)
	DeviceReset() interpose.Error
	DeviceSynchronize() interpose.Error
	StreamSynchronize(s interpose.Stream) interpose.Error
	StreamDestroy(s interpose.Stream) interpose.Error
	StreamQuery(s interpose.Stream) interpose.Error
	// StreamCapture: the stream's capture status and the graph it builds.
	StreamCapture(s interpose.Stream) (status interpose.CaptureStatus, graph uint64, rc interpose.Error)
	EventCreate(flags uint32) (interpose.Event, interpose.Error)
	EventRecord(e interpose.Event, s interpose.Stream) interpose.Error
	EventQuery(e interpose.Event) interpose.Error
	EventSynchronize(e interpose.Event) interpose.Error
	EventDestroy(e interpose.Event) interpose.Error
	DeviceGetAttribute(attr interpose.DeviceAttr, device int) (int, interpose.Error)
	HostAlloc(size uint64, flags uint32) (uint64, interpose.Error)
	FreeHost(host uint64) interpose.Error
	HostGetDevicePointer(host uint64) (interpose.DevicePtr, interpose.Error)
	MemAdvise(p interpose.DevicePtr, size uint64, advice interpose.Advice, device int) interpose.Error
	MemPrefetchAsync(p interpose.DevicePtr, size uint64, device int, s interpose.Stream) interpose.Error
}

// probeSink fires the probe points; *interpose.Probes implements it, firing
// only while a tracer is attached (Enabled).
type probeSink interface {
	Enabled() bool
	Alloc(ptr interpose.DevicePtr, size uint64, device int, tier interpose.Tier, source interpose.Source)
	Free(ptr interpose.DevicePtr, size uint64, device int, tier interpose.Tier)
	Sync(device int, freedBytes uint64)
	Spill(ptr interpose.DevicePtr, size uint64, device int, tier interpose.Tier)
	Promote(ptr interpose.DevicePtr, size uint64, device int, tier interpose.Tier)
	Refuse(size uint64, device int, used, quota uint64)
}

// onDevice returns the runtime for the core's own calls on a device
// (interpose.Runtime.On): they run on that device and leave the thread's
// last error as the application left it.
type onDevice func(ordinal int) realRuntime

// refusalFunc reports a request refused for the quota (or the host limit).
type refusalFunc func(call string, size uint64, device int, used, quota uint64)

// memory serves the interposed calls once the configuration is valid. Each
// device gets a pool.Pool at its first allocation, over a backing that calls
// the real runtime (backing.go); with SPILLWAY_POOL=0 the pool passes every
// request through and keeps only the quota's accounting. Memory the pool
// does not serve (the application's own managed memory, allocations the
// front passed through while the core was starting) is taken from the same
// ledger (ledger.go), against the same quota.
type memory struct {
	rt      realRuntime // the application's calls, passed through
	on      onDevice    // the core's own calls
	calls   *apiCalls   // the names of the functions rt and on call
	vmm     openVMM     // the pool's virtual memory management; nil: none
	cfg     config.Config
	probes  probeSink
	log     *logrus.Logger
	refused refusalFunc

	// mu serializes creating and dropping devices: a cudaDeviceReset holds
	// it from closing the device's pool to the real reset, so no thread
	// builds a new pool whose memory the reset would destroy.
	mu      sync.Mutex
	devices [maxDevices]atomic.Pointer[device]
	live    atomic.Pointer[[]*device] // the devices in use, by ordinal
	index   *addrIndex                // the device of every address the core holds: the free path's lookup
	streams streamSet                 // the application's streams known valid
	graphs  graphHolds                // blocks freed into CUDA graphs
	ledgers map[int]*deviceLedger     // by ordinal, for the life of the process; m.mu guards it
	// One limiter per kind of warning, so that one kind never hides another.
	spillWarn, hostLimitWarn, deviceFullWarn, releaseWarn, backingWarn, earlyWarn limiter
	earlyDropped                                                                  atomic.Uint64 // allocations passed through while the core started and not counted
	warned                                                                        atomic.Bool   // the managed-to-pinned fallback was logged
	cpuAccessSaid                                                                 atomic.Bool   // the driver's refusal to map host granules for the CPU was logged
	// settingSaid marks the devices whose invalid setting was logged, by a
	// memory query before their first use or when their pool was made.
	settingSaid [maxDevices]atomic.Bool
}

// maxDevices bounds device ordinals, as config does for SPILLWAY_MEMORY_LIMIT_<n>.
const maxDevices = 1024

// granule is the unit in which memory is accounted: the pool's alignment,
// which is also what CUDA charges small allocations in.
const granule = pool.Alignment

// charge is what an allocation of size bytes holds on the device.
func charge(size uint64) uint64 {
	if size > ^uint64(0)-granule {
		return size
	}
	return (size + granule - 1) / granule * granule
}

// newMemory serves the application over rt and on, which call CUDA's api.
func newMemory(rt realRuntime, on onDevice, api API, cfg config.Config, probes probeSink, log *logrus.Logger, refused refusalFunc) *memory {
	m := &memory{rt: rt, on: on, calls: &apiCallNames[api], cfg: cfg, probes: probes, log: log, refused: refused, index: newAddrIndex()}
	m.live.Store(&[]*device{})
	return m
}

// device is one device in use: its pool and the ledger it shares with the
// memory outside the pool.
type device struct {
	ordinal int
	quota   uint64 // the device's quota, or its real total without one
	limited bool   // a quota is configured
	pool    *pool.Pool
	back    *backing
	err     error // why there is no pool (an invalid pool setting for this device)
	ledger  *deviceLedger
	pci     *stat.PCILocation // where it sits, for spillway stat; nil when unknown
	// outside orders the memory held outside the pool against a reset:
	// its calls hold it for reading, cudaDeviceReset for writing, after
	// which reset is true and the device is no longer used.
	outside sync.RWMutex
	reset   bool
	// deferredReleaseErrors counts the stream-ordered releases the runtime
	// refused once the device reached them, which the pool cannot see (it
	// counts the releases it asked for in its own stats): the memory stays
	// allocated (and counted), and is reported.
	deferredReleaseErrors atomic.Uint64
	// refusedOutside counts the requests refused for the quota outside
	// the pool (refuseOutside), which the report and spillway stat add to
	// the pool's own refusals.
	refusedOutside atomic.Uint64
}

// refuseOutside records a request of size bytes refused for the quota (or
// the host limit) outside the pool, used bytes being in use: the refuse
// probe fires with the bytes the ledger would have taken (in whole
// granules, as the pool's refusals report them), and it counts with the
// pool's own refusals.
func (m *memory) refuseOutside(d *device, size, used uint64) {
	d.refusedOutside.Add(1)
	m.probes.Refuse(charge(size), d.ordinal, used, d.quota)
}

// stats are the pool's statistics with the refusals outside it counted.
func (d *device) stats() pool.Stats {
	st := d.pool.Stats()
	st.Refused += d.refusedOutside.Load()
	return st
}

// existing returns the device if it is in use.
func (m *memory) existing(ordinal int) *device {
	if ordinal < 0 || ordinal >= maxDevices {
		return nil
	}
	return m.devices[ordinal].Load()
}

// device returns the device, creating its pool at its first use. It is
// small enough to be inlined into every call.
func (m *memory) device(ordinal int) (*device, interpose.Error) {
	if uint(ordinal) < maxDevices {
		if d := m.devices[ordinal].Load(); d != nil {
			return d, interpose.Success
		}
	}
	return m.firstUse(ordinal)
}

func (m *memory) firstUse(ordinal int) (*device, interpose.Error) {
	if ordinal < 0 || ordinal >= maxDevices {
		return nil, interpose.ErrorInvalidDevice
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if d := m.devices[ordinal].Load(); d != nil {
		return d, interpose.Success
	}
	d, rc := m.newDevice(ordinal)
	if rc != interpose.Success {
		return nil, rc
	}
	m.devices[ordinal].Store(d)
	m.refreshLive()
	return d, interpose.Success
}

// refreshLive rebuilds the list of devices in use; m.mu is held.
func (m *memory) refreshLive() {
	var live []*device
	for i := range m.devices {
		if d := m.devices[i].Load(); d != nil {
			live = append(live, d)
		}
	}
	m.live.Store(&live)
}

// newDevice resolves the device's quota and creates its pool. An invalid
// pool setting for this device (a reserve above the quota) leaves it
// without a pool: its allocations fail, as for any invalid configuration.
func (m *memory) newDevice(ordinal int) (*device, interpose.Error) {
	rt := m.on(ordinal)
	_, total, rc := rt.MemGetInfo()
	if rc != interpose.Success {
		return nil, rc
	}
	limit := m.cfg.LimitFor(ordinal)
	d := &device{ordinal: ordinal, quota: total, limited: limit.IsSet()}
	if d.limited {
		d.quota = limit.Resolve(total)
	}
	d.ledger = m.ledgerOf(ordinal, d.quota, d.limited)
	d.pci = pciLocation(rt, ordinal)
	opt := pool.DefaultOptions(d.quota)
	opt.Pooling = m.cfg.Pool
	opt.StrictFree = m.cfg.FreeSync
	if t := m.cfg.ReleaseThreshold; t != nil {
		opt.ReleaseThreshold = t.Resolve(d.quota)
	}
	opt.Reserve = m.cfg.PoolReserve
	opt.Oversubscribe = m.cfg.Oversubscribe
	if m.cfg.HostLimit > 0 {
		opt.HostLimit = m.cfg.HostLimit
	}
	if m.cfg.Spill == config.SpillPinned {
		opt.SpillTier = pool.TierPinned
	} else if m.cfg.Oversubscribe && !m.managedSupported(rt, ordinal) {
		opt.SpillTier = pool.TierPinned
	}
	opt.Observer = &observer{d: d, probes: m.probes, failed: m.backingFailed(d)}
	opt.Ledger = d.ledger
	d.back = newBacking(relaxedCalls{rt}, d, m.index, m.calls)
	if sc, ok := rt.(streamContexts); ok {
		d.back.contexts, d.back.ctx = sc, sc.Context()
	}
	d.back.streams = &m.streams
	d.back.releaseFailed = m.releaseFailed(d)
	var back pool.Backing = d.back
	vb := m.virtualBacking(d)
	if vb != nil {
		back = vb
	}
	opt.VirtualMemory = vb != nil
	migrate := m.cfg.Migrate && m.cfg.Oversubscribe
	opt.Migrate = migrate && vb != nil
	if migrate && m.cfg.VMM && m.cfg.Pool && vb == nil {
		m.log.Warnf("device %d: %s has no effect: the pool uses fixed segments (%s=debug says why)", ordinal, config.EnvMigrate, config.EnvLogLevel)
	}
	// A setting invalid for this device's total (which pool.New may accept)
	// leaves it without a pool.
	var p *pool.Pool
	err := deviceSettingError(m.cfg, ordinal, total)
	if err == nil {
		if p, err = pool.New(back, opt); err != nil {
			err = fmt.Errorf("invalid pool settings for device %d (quota %d bytes): %w", ordinal, d.quota, err)
		}
	}
	if herr := d.ledger.usePool(d.back, p); herr != nil {
		m.log.Warnf("device %d: host memory of the program's cuMemCreate made before a reset: %v", ordinal, herr)
	}
	if err != nil {
		d.err = err
		m.sayInvalid(ordinal, d.err)
	}
	d.pool = p
	if limit.Percent > 0 && d.err == nil {
		// The start message could not give a percentage in bytes: it is
		// known only now, from the device's total.
		m.log.WithFields(logrus.Fields{"device": ordinal, "quota_bytes": d.quota}).Infof("device %d: quota %s of its %s is %s",
			ordinal, limit.String(), config.FormatBytes(total), config.FormatBytes(d.quota))
	}
	m.log.Debugf("device %d: quota %d bytes (configured: %v), pool %v", ordinal, d.quota, d.limited, m.cfg.Pool)
	return d, interpose.Success
}

// deviceSettingError is the setting found invalid once a device's total is
// known, which leaves the device without a pool: a percentage quota that is
// less of it than the smallest allocation, or a reserve above its quota
// (its memory without one). Nil when none is.
func deviceSettingError(cfg config.Config, ordinal int, total uint64) error {
	limit := cfg.LimitFor(ordinal)
	quota := total
	if limit.IsSet() {
		quota = limit.Resolve(total)
	}
	if limit.IsSet() && quota < config.AllocationUnit {
		name := limitVariable(cfg, ordinal)
		return &config.Error{Name: name, Value: cfg.Written[name],
			Reason: fmt.Sprintf("that is %d bytes of device %d's %s, less than the smallest allocation (%d bytes), which would refuse every allocation",
				quota, ordinal, config.FormatBytes(total), config.AllocationUnit),
			Example: name + "=8GiB"}
	}
	if cfg.PoolReserve > quota {
		// Without a quota the reserve must fit in the device's memory: the
		// message names what the user can see, not a quota never set.
		bound := fmt.Sprintf("the quota of device %d", ordinal)
		if !limit.IsSet() {
			bound = fmt.Sprintf("the memory of device %d", ordinal)
		}
		return &config.Error{Name: config.EnvPoolReserve, Value: cfg.Written[config.EnvPoolReserve],
			Reason:  config.LargerThan(cfg.PoolReserve, quota, bound),
			Example: config.EnvPoolReserve + "=" + config.FormatBytes(quota/2)}
	}
	return nil
}

// unusable says whether every allocation on a device of this total fails
// for a setting invalid for it: found when its pool was made, or, before
// it is first used, by deviceSettingError.
func (m *memory) unusable(ordinal int, total uint64) bool {
	if d := m.existing(ordinal); d != nil {
		return d.pool == nil
	}
	err := deviceSettingError(m.cfg, ordinal, total)
	if err != nil {
		// A program that sizes its work from the query may never allocate:
		// it is told why none of the device is free now.
		m.sayInvalid(ordinal, err)
	}
	return err != nil
}

// sayInvalid logs err, a setting that leaves device ordinal without a pool,
// once.
func (m *memory) sayInvalid(ordinal int, err error) {
	if ordinal >= 0 && ordinal < maxDevices && m.settingSaid[ordinal].Swap(true) {
		return
	}
	m.log.Errorf("%v; every CUDA allocation on device %d will fail with %s until it is fixed", err, ordinal, m.calls.notInitialized)
}

// releaseFailed returns what d's backing calls when the runtime refuses to
// free memory: warned about at most once a second, and counted here when
// the pool did not ask for the release (deferred is set) and so cannot.
func (m *memory) releaseFailed(d *device) func(err error, deferred bool) {
	return func(err error, deferred bool) {
		if deferred {
			d.deferredReleaseErrors.Add(1)
		}
		if suppressed, ok := m.releaseWarn.allow(); ok {
			m.log.WithField("suppressed", suppressed).Warnf("device %d: %v; the memory stays allocated and counted against the quota", d.ordinal, err)
		}
	}
}

// backingFailed returns what d's pool observer calls for a backing failure
// that did not fail the call that met it (the pool counts it in its stats).
func (m *memory) backingFailed(d *device) func(error) {
	return func(err error) {
		if suppressed, ok := m.backingWarn.allow(); ok {
			m.log.WithField("suppressed", suppressed).Warnf("device %d: %v", d.ordinal, err)
		}
	}
}

// managedMemory asks rt whether the device supports managed memory, without
// which CUDA refuses every cudaMallocManaged with cudaErrorNotSupported;
// known is false where the device does not answer.
func managedMemory(rt realRuntime, ordinal int) (has, known bool) {
	v, rc := rt.DeviceGetAttribute(interpose.DevAttrManagedMemory, ordinal)
	return v != 0, rc == interpose.Success
}

// managedSupported asks the device; a device without managed memory, or
// that does not say, gets pinned spilling, said once in the log.
func (m *memory) managedSupported(rt realRuntime, ordinal int) bool {
	if has, known := managedMemory(rt, ordinal); has && known {
		return true
	}
	if !m.warned.Swap(true) {
		m.log.Warnf("device %d does not support managed memory (%s=managed): spilling to mapped pinned host memory instead", ordinal, config.EnvSpill)
	}
	return false
}

// stream turns the stream handle the front passes into the pool's stream:
// cudaStreamLegacy is the legacy stream 0; per-thread identities (see
// perThreadBit) pass as they are.
func stream(s interpose.Stream) pool.Stream {
	if s == interpose.StreamLegacy {
		return 0
	}
	return pool.Stream(s)
}

// cudaError maps an error of the pool to the CUDA error the call returns.
func cudaError(err error) interpose.Error {
	var rc interpose.Error
	switch {
	case err == nil:
		return interpose.Success
	case errors.Is(err, pool.ErrOutOfMemory), errors.Is(err, pool.ErrTooLarge):
		return interpose.ErrorMemoryAllocation
	case errors.Is(err, pool.ErrInvalidFree), errors.Is(err, pool.ErrClosed):
		return interpose.ErrorInvalidValue
	case errors.As(err, &rc):
		return rc
	}
	return interpose.ErrorUnknown
}

// malloc serves an allocation; the pool's observer fires the probe points.
// A pool closed under it by a cudaDeviceReset on another thread is
// replaced: the call waits for the reset and uses the new pool.
func (m *memory) malloc(r request) (interpose.DevicePtr, interpose.Error) {
	for {
		d, rc := m.device(r.device)
		if rc != interpose.Success {
			return 0, rc
		}
		if d.pool == nil {
			return 0, interpose.ErrorInitialization
		}
		if r.kind == kindManaged {
			return m.mallocManaged(d, r)
		}
		var p uint64
		var err error
		if r.kind == kindAsync {
			if _, rc := m.checkStream(d, r.stream); rc != interpose.Success {
				return 0, rc
			}
			p, err = d.pool.AllocAsync(r.size, stream(r.stream))
		} else {
			p, err = d.pool.Alloc(r.size)
		}
		if errors.Is(err, pool.ErrClosed) {
			m.awaitReset()
			continue
		}
		if err != nil {
			return 0, m.failed(d, r.call(), r.size, err)
		}
		return interpose.DevicePtr(p), interpose.Success
	}
}

// awaitReset returns once a cudaDeviceReset in progress is over: the
// reset holds m.mu throughout.
func (m *memory) awaitReset() {
	m.mu.Lock()
	m.mu.Unlock()
}

// call names the function the application called for r.
func (r request) call() string { return apiCallNames[r.api].malloc[r.kind] }

// failed logs a refusal of call (the probe point fired in the pool's
// observer) and returns the CUDA error.
func (m *memory) failed(d *device, call string, size uint64, err error) interpose.Error {
	rc := cudaError(err)
	var spill *spillError
	if errors.As(err, &spill) {
		m.spillFailed(d, call, size, errors.Is(err, pool.ErrDeviceFull), spill)
	} else if errors.Is(err, pool.ErrHostLimit) {
		m.hostLimitRefused(d, call, size, errors.Is(err, pool.ErrDeviceFull))
	} else if errors.Is(err, pool.ErrOutOfMemory) && !errors.Is(err, pool.ErrQuota) {
		m.deviceFullRefused(d, call, size)
	} else if rc == interpose.ErrorMemoryAllocation {
		m.refused(call, size, d.ordinal, d.ledger.used(), d.quota)
	}
	m.log.Debugf("%s of %d bytes on device %d: %v", call, size, d.ordinal, err)
	return rc
}

// mallocManaged passes the application's own managed memory through,
// counted against the quota like device memory: when it does not fit, the
// pool returns its cache first (deviceLedger.takeOutside).
func (m *memory) mallocManaged(d *device, r request) (interpose.DevicePtr, interpose.Error) {
	d.outside.RLock()
	if d.reset {
		d.outside.RUnlock()
		m.awaitReset()
		return m.malloc(r)
	}
	defer d.outside.RUnlock()
	size := charge(r.size)
	if !d.ledger.takeOutside(size, true) {
		if has, known := managedMemory(m.rt, d.ordinal); known && !has {
			// CUDA refuses it whatever its size, with an error (and last
			// error) the shim cannot make itself: its own call answers.
			p, rc := m.rt.MallocManaged(r.size, r.flags)
			if rc != interpose.Success {
				return 0, rc
			}
			// The device said it has no managed memory, and made some: the
			// quota's refusal stands.
			if rc := m.rt.Free(p); rc != interpose.Success {
				m.log.Errorf("%s of managed memory made beyond the quota of device %d: %v", m.calls.free, d.ordinal, rc)
			}
		}
		used := d.ledger.used()
		m.refuseOutside(d, r.size, used)
		m.refused(r.call(), r.size, d.ordinal, used, d.quota)
		return 0, interpose.ErrorMemoryAllocation
	}
	p, rc := m.rt.MallocManaged(r.size, r.flags)
	if rc != interpose.Success || p == 0 {
		d.ledger.giveOutside(size)
		return 0, rc
	}
	d.ledger.addBlock(p, extBlock{size, interpose.TierHostManaged}, true)
	m.index.add(uint64(p), size, d)
	// No other thread can free p before this call returns it: the event
	// cannot be overtaken by p's free.
	m.probes.Alloc(p, size, d.ordinal, interpose.TierHostManaged, interpose.SourcePassThrough)
	return p, interpose.Success
}

// mallocPitch pads rows to the pool's alignment, as CUDA pads them to its
// pitch alignment, and serves the whole as one allocation.
func (m *memory) mallocPitch(api API, device int, width, height uint64) (interpose.DevicePtr, uint64, interpose.Error) {
	if width == 0 || height == 0 {
		return 0, 0, interpose.ErrorInvalidValue
	}
	pitch := charge(width)
	if pitch < width || height > ^uint64(0)/pitch {
		return 0, 0, interpose.ErrorMemoryAllocation // as CUDA answers a size it cannot represent
	}
	p, rc := m.malloc(request{device: device, size: pitch * height, kind: kindPitch, api: api})
	if rc != interpose.Success {
		return 0, 0, rc
	}
	return p, pitch, interpose.Success
}

// free releases p. The address index names the device holding p: its pool
// frees it, or else the memory held outside the pool; a pointer the core
// does not hold goes to the real runtime as is, which gives CUDA's own
// answer (memory from a path the shim does not see, an invalid pointer).
// The pool's observer fires the free probe point, under the pool's lock and
// before the memory is released.
func (m *memory) free(p interpose.DevicePtr, s interpose.Stream, async bool) interpose.Error {
	return m.freeIn(p, s, async, 0)
}

// freeIn is free, made while context current is current (0: unknown). CUDA
// orders a free on a default stream on the current context's stream of that
// name: where that context is not the primary context of p's device, the
// pool orders it on that context's default streams, as on a stream of
// another device.
func (m *memory) freeIn(p interpose.DevicePtr, s interpose.Stream, async bool, current uint64) interpose.Error {
	if p == 0 {
		return interpose.Success
	}
	d := m.index.find(uint64(p))
	if d == nil {
		return m.realFreeUnknown(p, s, async)
	}
	foreign := false
	ordered := s // the stream the pool orders the free on
	if async {
		ctx, rc := m.checkStream(d, s)
		if rc != interpose.Success {
			return rc
		}
		if isDefaultStream(s) && d.back.foreign(current) {
			ctx, ordered = current, contextDefaultStream(current)
		}
		foreign = d.back.foreign(ctx)
	}
	if d.pool != nil {
		if async && m.heldByGraph(d, p, s) {
			return interpose.Success
		}
		var err error
		switch {
		case foreign:
			err = d.pool.FreeAsyncForeign(uint64(p), stream(ordered))
		case async:
			err = d.pool.FreeAsync(uint64(p), stream(s))
		default:
			err = d.pool.Free(uint64(p))
		}
		switch {
		case err == nil:
			return interpose.Success
		case errors.Is(err, pool.ErrNotOwned):
		case errors.Is(err, pool.ErrInvalidFree), errors.Is(err, pool.ErrClosed):
			return interpose.ErrorInvalidValue
		default:
			return cudaError(err) // freed by the pool, released with an error
		}
	}
	return m.freeOutside(d, p, s, async)
}

// realFreeUnknown passes the free of a pointer the core does not hold to
// the runtime.
func (m *memory) realFreeUnknown(p interpose.DevicePtr, s interpose.Stream, async bool) interpose.Error {
	if async {
		return m.rt.FreeAsync(p, asyncStream(pool.Stream(s)))
	}
	return m.rt.Free(p)
}

// freeOutside frees memory of d held outside its pool. Its free probe fires
// before the real free, for the same reason as the pool's; a real free that
// fails leaves the block allocated, and an alloc probe says so again.
func (m *memory) freeOutside(d *device, p interpose.DevicePtr, s interpose.Stream, async bool) interpose.Error {
	d.outside.RLock()
	defer d.outside.RUnlock()
	e, ok := d.ledger.removeBlock(p)
	if !ok || d.reset {
		return m.realFreeUnknown(p, s, async)
	}
	m.probes.Free(p, e.size, d.ordinal, e.tier)
	m.index.remove(uint64(p), d)
	rc := m.realFree(d, p, s, async)
	if rc != interpose.Success {
		d.ledger.addBlock(p, e, true) // still allocated as far as CUDA is concerned
		m.index.add(uint64(p), e.size, d)
		m.probes.Alloc(p, e.size, d.ordinal, e.tier, interpose.SourcePassThrough)
		return rc
	}
	d.ledger.giveOutside(e.size)
	return interpose.Success
}

// realFree frees memory of d outside its pool. cudaFree synchronizes the
// device, which the pool is told about.
func (m *memory) realFree(d *device, p interpose.DevicePtr, s interpose.Stream, async bool) interpose.Error {
	if async {
		return m.rt.FreeAsync(p, asyncStream(pool.Stream(s)))
	}
	if d.pool == nil {
		return m.rt.Free(p)
	}
	t := d.pool.SyncBegin()
	rc := m.rt.Free(p)
	if rc == interpose.Success {
		_ = d.pool.SyncEnd(t) // fails only once the pool is closed
	}
	return rc
}

// memGetInfo describes the device as the quota makes it: total = the quota,
// free = what is left of it (never more than the device really has free)
// plus what the pool holds cached, which is the application's to use.
// Spilled host memory is not counted. Without a quota, the real values plus
// the cache. With a setting invalid for this device, free 0 and the real
// total, as for an invalid configuration.
func (m *memory) memGetInfo(ordinal int) (free, total uint64, rc interpose.Error) {
	free, total, rc = m.rt.MemGetInfo()
	if rc != interpose.Success {
		return 0, 0, rc
	}
	if m.unusable(ordinal, total) {
		return 0, total, interpose.Success // none of it is the process's
	}
	d := m.existing(ordinal)
	if d == nil {
		limit := m.cfg.LimitFor(ordinal)
		if !limit.IsSet() {
			return free, total, interpose.Success
		}
		quota := limit.Resolve(total)
		// After a reset, the ledger still holds what outlives the pool
		// (the application's cuMemCreate handles).
		if l := m.ledgerAt(ordinal); l != nil {
			return min(l.left(), free), quota, interpose.Success
		}
		return min(quota, free), quota, interpose.Success
	}
	var cached uint64
	if d.pool != nil {
		cached = d.pool.Stats().CachedBytes
	}
	if !d.limited {
		return min(free+cached, total), total, interpose.Success
	}
	return min(min(d.ledger.left(), free)+cached, d.quota), d.quota, interpose.Success
}

// deviceReset drops the device's pool (closing it releases its memory) and
// resets the device with reset, holding m.mu from before the close to after
// the real reset: a thread allocating meanwhile waits and then builds a new
// pool on the reset device, so no pool holds memory the reset destroyed,
// and nothing of the old device stays charged.
func (m *memory) deviceReset(ordinal int, reset func() interpose.Error) interpose.Error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d := m.existing(ordinal); d != nil {
		m.devices[ordinal].Store(nil)
		m.refreshLive()
		m.forgetDevice(d)
		if d.pool != nil {
			if err := d.pool.Close(); err != nil {
				m.log.Debugf("closing the pool of device %d before cudaDeviceReset: %v", ordinal, err)
			}
		}
		// The pool synchronized the device as it closed, and the reset
		// frees what streams of other devices or contexts have yet to.
		d.back.settleAll(true)
		d.outside.Lock()
		d.reset = true
		d.ledger.primaryReset()
		d.outside.Unlock()
		m.index.removeDevice(d)
	}
	rc := reset()
	if sc, ok := m.on(ordinal).(streamContexts); ok && rc == interpose.Success {
		m.forgetContextStreams(sc.Context())
	}
	return rc
}

// deviceSynchronize tells the pool about the application's synchronization,
// so that what it freed before becomes reusable without another one.
func (m *memory) deviceSynchronize(ordinal int) interpose.Error {
	d := m.existing(ordinal)
	if d == nil || d.pool == nil {
		return m.rt.DeviceSynchronize()
	}
	t := d.pool.SyncBegin()
	rc := m.rt.DeviceSynchronize()
	if rc == interpose.Success {
		d.back.settleAll(false)
		_ = d.pool.SyncEnd(t) // fails only once the pool is closed
	}
	return rc
}

// streamDestroy makes the pools forget the stream before it goes away. A
// per-thread identity (perThreadBit) is retired by the front when its
// thread exits: the pools forget it, and there is no real stream to destroy.
func (m *memory) streamDestroy(s interpose.Stream) interpose.Error {
	m.forgetStream(s)
	if s&perThreadBit != 0 {
		return interpose.Success
	}
	return m.rt.StreamDestroy(s)
}

// forgetStream drops what the core knows of stream s, about to be
// destroyed: the pools' caches of it (a foreign stream's blocks then wait
// for a marker recorded now, filed under the stream's context), then its
// check and context. A new stream given the same handle is checked afresh.
func (m *memory) forgetStream(s interpose.Stream) {
	for _, d := range *m.live.Load() {
		if d.pool != nil {
			d.pool.ForgetStream(stream(s))
		}
	}
	m.streams.forget(s)
}

// forgetContextStreams drops what the core knows of context ctx, gone
// (its device reset, or the context destroyed): no work of it can touch
// memory any more, and its events are gone. The frees in flight waiting
// on its events are settled without them. The pools make free at once
// what was freed on its streams, its default streams included, and what
// waits on a marker recorded in it (a destroyed stream's too), without
// querying or destroying those markers.
func (m *memory) forgetContextStreams(ctx uint64) {
	if ctx == 0 {
		return
	}
	gone := map[pool.Stream]bool{stream(contextDefaultStream(ctx)): true}
	for _, s := range m.streams.forgetContext(ctx) {
		gone[stream(s)] = true
	}
	for _, d := range *m.live.Load() {
		d.back.contextGone(ctx)
		if d.pool == nil {
			continue
		}
		markers := d.back.markersOf(ctx)
		d.pool.ForgetFinishedContext(func(s pool.Stream) bool { return gone[s] },
			func(mk pool.Marker) bool { return markers[mk] })
	}
}

// adopt accounts an allocation the front passed through while the core was
// starting; it counts against the quota even if that exceeds it.
func (m *memory) adopt(p interpose.DevicePtr, size uint64, ordinal int) {
	d, rc := m.device(ordinal)
	if rc != interpose.Success {
		n := m.earlyDropped.Add(1)
		if suppressed, ok := m.earlyWarn.allow(); ok {
			m.log.WithField("suppressed", suppressed).Warnf("an allocation of %d bytes at %#x made while the core started on device %d cannot be counted against the quota (%v); %d such so far", size, uint64(p), ordinal, rc, n)
		}
		return
	}
	size = charge(size)
	d.ledger.addBlock(p, extBlock{size, interpose.TierDevice}, false)
	m.index.add(uint64(p), size, d)
}

// report writes one line of pool statistics per device in use.
func (m *memory) report(w io.Writer, format config.Format) {
	// The list is replaced, never modified, when devices come and go.
	for _, d := range *m.live.Load() {
		if d.pool == nil {
			continue
		}
		line := fmt.Sprintf("device %d: %s deferred_release_errors=%d", d.ordinal, d.stats(), d.deferredReleaseErrors.Load())
		if format == config.FormatJSON {
			w.Write(reportJSON(d.ordinal, line))
		} else {
			fmt.Fprintf(w, "spillway: %s\n", line)
		}
	}
}

// streamSet holds the application's streams found valid, each checked once
// with a real call and remembered until it is destroyed, with the context
// it was made in (0: unknown).
type streamSet struct {
	mu    sync.RWMutex
	valid map[interpose.Stream]uint64
}

func (ss *streamSet) context(s interpose.Stream) (uint64, bool) {
	ss.mu.RLock()
	ctx, ok := ss.valid[s]
	ss.mu.RUnlock()
	return ctx, ok
}

func (ss *streamSet) add(s interpose.Stream, ctx uint64) {
	ss.mu.Lock()
	if ss.valid == nil {
		ss.valid = map[interpose.Stream]uint64{}
	}
	ss.valid[s] = ctx
	ss.mu.Unlock()
}

// forgetContext forgets the streams made in context ctx and returns them.
func (ss *streamSet) forgetContext(ctx uint64) []interpose.Stream {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var gone []interpose.Stream
	for s, c := range ss.valid {
		if c == ctx {
			gone = append(gone, s)
			delete(ss.valid, s)
		}
	}
	return gone
}

func (ss *streamSet) forget(s interpose.Stream) {
	ss.mu.Lock()
	delete(ss.valid, s)
	ss.mu.Unlock()
}

// isDefaultStream reports whether s is a default stream: 0, the legacy or
// the per-thread handle, or a per-thread identity.
func isDefaultStream(s interpose.Stream) bool {
	return s == 0 || s == interpose.StreamLegacy || s == interpose.StreamPerThread || s&perThreadBit != 0
}

// checkStream answers cudaErrorInvalidResourceHandle for a stream that is
// not valid (never created, or destroyed), as cudaMallocAsync and
// cudaFreeAsync do, and otherwise the context the stream was made in (0 for
// the default streams, or where it is unknown). The default streams are
// always valid. The check asks cudaStreamGetCaptureInfo, which a capturing
// stream allows, or else cudaStreamQuery; a runtime with neither is
// trusted. Its answer and the stream's context (cuStreamGetCtx) are kept
// until the stream is destroyed, so a stream costs these calls once.
func (m *memory) checkStream(d *device, s interpose.Stream) (uint64, interpose.Error) {
	if isDefaultStream(s) {
		return 0, interpose.Success
	}
	if ctx, ok := m.streams.context(s); ok {
		return ctx, interpose.Success
	}
	_, _, rc := d.back.rt.StreamCapture(s)
	if rc == interpose.ErrorSymbolNotFound {
		rc = d.back.rt.StreamQuery(s)
	}
	if rc == interpose.ErrorInvalidResourceHandle {
		return 0, rc
	}
	var ctx uint64
	if d.back.contexts != nil {
		if c, crc := d.back.contexts.StreamContext(s); crc == interpose.Success {
			ctx = c
		}
	}
	if rc == interpose.Success || rc == interpose.ErrorNotReady {
		m.streams.add(s, ctx)
	}
	return ctx, interpose.Success
}
