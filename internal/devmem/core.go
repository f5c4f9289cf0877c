package devmem

import (
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/sirupsen/logrus"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/shim/config"
)

// Core is the state of the shim in one process: its configuration, log,
// per-device memory and the accounts of memory outside the pools. The
// entry points of shim/core reach it through one process-wide pointer.
type Core struct {
	rt     appRuntime
	probes *interpose.Probes
	log    *logrus.Logger
	cfg    config.Config
	// broken is set when the configuration is invalid: every interposed
	// allocation then fails with cudaErrorInitializationError.
	broken error
	mem    *memory
	// debug: each call is logged (SPILLWAY_LOG_LEVEL=debug, fixed at start).
	debug    bool
	refusals limiter    // the quota's refusal warnings
	stat     *publisher // the figures file for spillway stat; nil without one
	// Memory counted outside the pools (outside.go, vmm.go, arrays.go).
	contexts contextLedger
	vmm      vmmLedger
	arrays   arrayLedger
}

// Start starts the core over the front's tables of real functions and
// probe points; the front calls it exactly once, before any other entry
// point. Configuration is read here, never in init. frontABI is the
// front's ABI version and coreABI this core's: a front from another build
// passes tables and arguments this core would misread. On failure it
// returns the CUDA error every call then answers, and no core.
func Start(frontABI, coreABI int32, real, probes unsafe.Pointer) (*Core, interpose.Error) {
	c := &Core{log: newLogger(os.Stderr, config.FormatText, config.LevelWarn)}
	if err := checkABI(frontABI, coreABI); err != nil {
		c.log.Errorf("cannot start: %v", err)
		return nil, interpose.ErrorInitialization
	}
	rt, on, api, err := openRuntime(real)
	if err != nil {
		c.log.Errorf("cannot start: %v", err)
		return nil, interpose.ErrorInitialization
	}
	c.rt = rt
	hostAccess, err := interpose.NewHostAccess(real)
	if err != nil {
		c.log.Errorf("cannot start: %v", err)
		return nil, interpose.ErrorInitialization
	}
	c.vmm.grantCPU = hostAccess.Grant
	if c.probes, err = interpose.NewProbes(probes); err != nil {
		c.log.Errorf("cannot start: %v", err)
		return nil, interpose.ErrorInitialization
	}
	cfg, err := config.Parse(os.Environ())
	if err == nil {
		c.log, err = openLog(cfg)
	}
	if err != nil {
		c.broken = err
		logInvalidSettings(c.log, err, api)
	}
	c.cfg = cfg
	c.debug = c.log.IsLevelEnabled(logrus.DebugLevel)
	c.mem = newMemory(rt, on, api, cfg, c.probes, c.log, c.refused)
	c.mem.vmm = driverVMM(real)
	if c.broken == nil {
		c.describeSettings()
	}
	c.stat = c.publish()
	return c, interpose.Success
}

// checkABI refuses a front whose ABI version is not this core's.
func checkABI(frontABI, coreABI int32) error {
	if frontABI != coreABI {
		return fmt.Errorf("the front (libspillway.so) has ABI version %d and this core has %d: libspillway.so and libspillway-core.so must come from the same build", frontABI, coreABI)
	}
	return nil
}

// LogError logs an error the entry points met outside the core's calls
// (a panic they recovered from).
func (c *Core) LogError(msg string) { c.log.Error(msg) }

// SetLastError sets e as the thread's last runtime error, as the real call
// would, in the relaxed capture mode: the failing call that sets it (a
// cudaMallocPitch for cudaErrorMemoryAllocation) would otherwise invalidate
// a capture the thread's mode protects.
func (c *Core) SetLastError(e interpose.Error) {
	defer relaxedCalls{c.rt}.relaxed()()
	c.rt.SetLastError(e)
}

// Malloc serves cudaMalloc and cuMemAlloc; api is the one the application
// called, which the log names.
func (c *Core) Malloc(api API, device int, size uint64) (interpose.DevicePtr, interpose.Error) {
	return c.malloc(request{device: device, size: size, kind: kindDevice, api: api})
}

// MallocManaged serves cudaMallocManaged and cuMemAllocManaged.
func (c *Core) MallocManaged(api API, device int, size uint64, flags uint32) (interpose.DevicePtr, interpose.Error) {
	return c.malloc(request{device: device, size: size, kind: kindManaged, flags: flags, api: api})
}

// MallocAsync serves cudaMallocAsync and cuMemAllocAsync.
func (c *Core) MallocAsync(api API, device int, size uint64, s interpose.Stream) (interpose.DevicePtr, interpose.Error) {
	return c.malloc(request{device: device, size: size, kind: kindAsync, stream: s, api: api})
}

func (c *Core) malloc(r request) (interpose.DevicePtr, interpose.Error) {
	if c.broken != nil {
		return 0, interpose.ErrorInitialization
	}
	if c.debug {
		c.logMalloc(r)
	}
	return c.mem.malloc(r)
}

func (c *Core) logMalloc(r request) {
	c.log.Debugf("%s of %d bytes on device %d", r.call(), r.size, r.device)
}

// MallocPitch serves cudaMallocPitch and cuMemAllocPitch: a pointer and its pitch.
func (c *Core) MallocPitch(api API, device int, width, height uint64) (interpose.DevicePtr, uint64, interpose.Error) {
	if c.broken != nil {
		return 0, 0, interpose.ErrorInitialization
	}
	return c.mem.mallocPitch(api, device, width, height)
}

// Free serves cudaFree and cuMemFree.
func (c *Core) Free(api API, p interpose.DevicePtr) interpose.Error {
	if c.debug {
		c.logFree(api, p, false)
	}
	return c.mem.free(p, 0, false)
}

// FreeAsync serves cudaFreeAsync and cuMemFreeAsync on stream s, made while
// context current was current (0: unknown), which orders a free on a
// default stream.
func (c *Core) FreeAsync(api API, p interpose.DevicePtr, s interpose.Stream, current uint64) interpose.Error {
	if c.debug {
		c.logFree(api, p, true)
	}
	return c.mem.freeIn(p, s, true, current)
}

func (c *Core) logFree(api API, p interpose.DevicePtr, async bool) {
	c.log.Debugf("%s of %#x", freeCall(api, async), uint64(p))
}

// MemGetInfo serves cudaMemGetInfo and cuMemGetInfo. With an invalid
// configuration, which refuses every allocation, none of the device's
// memory is free to the process: free 0 and the device's real total, as
// NVML then reports.
func (c *Core) MemGetInfo(device int) (free, total uint64, rc interpose.Error) {
	if c.broken != nil {
		if _, total, rc = c.mem.rt.MemGetInfo(); rc != interpose.Success {
			return 0, 0, rc
		}
		return 0, total, interpose.Success
	}
	return c.mem.memGetInfo(device)
}

// DeviceReset serves cudaDeviceReset of the current device, device.
func (c *Core) DeviceReset(device int) interpose.Error {
	return c.primaryReset(device, c.mem.rt.DeviceReset)
}

// PrimaryCtxReset serves cuDevicePrimaryCtxReset of device, which need not
// be current: through the runtime where the process has one, else the
// driver.
func (c *Core) PrimaryCtxReset(device int) interpose.Error {
	return c.primaryReset(device, c.mem.on(device).DeviceReset)
}

// primaryReset resets device's primary context with reset, which destroys
// the memory and arrays made in it, its allocations from the application's
// own pools included, and the pool memory destroyed created contexts left.
// (The front's count of recorded allocations stays as it was: it only
// spares a look-up on frees while it is 0.)
func (c *Core) primaryReset(device int, reset func() interpose.Error) interpose.Error {
	rc := c.mem.deviceReset(device, reset)
	if rc == interpose.Success {
		c.arraysGone(0, device)
		c.blocksGone(0, device)
	}
	return rc
}

// DeviceSynchronize serves cudaDeviceSynchronize and cuCtxSynchronize.
func (c *Core) DeviceSynchronize(device int) interpose.Error { return c.mem.deviceSynchronize(device) }

// StreamDestroy serves cudaStreamDestroy.
func (c *Core) StreamDestroy(s interpose.Stream) interpose.Error { return c.mem.streamDestroy(s) }

// StreamForget makes the pools forget stream s, which the caller destroys
// next itself (cuStreamDestroy).
func (c *Core) StreamForget(s interpose.Stream) { c.mem.forgetStream(s) }

// Report prints the pools' statistics at exit when SPILLWAY_REPORT=1, on
// the log's output whatever the log level.
func (c *Core) Report() {
	c.stat.close()
	if c.broken == nil && c.cfg.Report {
		c.mem.report(c.log.Out, c.cfg.LogFormat)
	}
}

// Adopt counts an allocation the front passed through while the core was
// starting.
func (c *Core) Adopt(p interpose.DevicePtr, size uint64, device int) {
	c.mem.adopt(p, size, device)
}

// warnInterval is the least time between two warnings of one kind; the
// probe points and counters see every event.
const warnInterval = time.Second

// limiter rate-limits one kind of warning: one per warnInterval, counting
// those it holds back.
type limiter struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// allow reports whether a warning may be logged now, and how many were
// held back since the last one.
func (l *limiter) allow() (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < warnInterval {
		l.suppressed++
		return 0, false
	}
	suppressed := l.suppressed
	l.last, l.suppressed = now, 0
	return suppressed, true
}

// refused logs a refusal; the probe point fires where it is decided.
func (c *Core) refused(call string, size uint64, device int, used, quota uint64) {
	suppressed, ok := c.refusals.allow()
	if !ok {
		return
	}
	c.log.WithFields(logrus.Fields{
		"device": device, "requested": size, "used": used, "quota": quota,
		"suppressed": suppressed,
	}).Warn(refusalMessage(call, size, device, used, quota))
}

// AddressRange describes p as CUDA's address-range queries would if each
// block the pools serve were an allocation of its own: live, p lies in the
// live block of size bytes (the request rounded up to the pool's alignment)
// at base; held, p lies in memory a pool holds, so that, not live, p is in
// no allocation at all. A pointer no pool holds is CUDA's to describe.
func (c *Core) AddressRange(p interpose.DevicePtr) (base, size uint64, live, held bool) {
	d := c.mem.index.find(uint64(p))
	if d == nil || d.pool == nil {
		return 0, 0, false, false
	}
	a, live, held := d.pool.Containing(uint64(p))
	return a.Base, a.Size, live, held
}

// CaptureBegun says a stream capture has begun: from now on a block freed
// with cudaFreeAsync during a capture is kept for the graph.
func (c *Core) CaptureBegun() { c.mem.graphs.begun.Store(true) }

// GraphInstantiated records an executable graph instantiated from graph.
func (c *Core) GraphInstantiated(exec, graph uint64) { c.mem.graphInstantiated(exec, graph) }

// GraphExecDestroyed forgets a destroyed executable graph.
func (c *Core) GraphExecDestroyed(exec uint64) { c.mem.graphGone(exec, true) }

// GraphDestroyed forgets a destroyed graph.
func (c *Core) GraphDestroyed(graph uint64) { c.mem.graphGone(graph, false) }

// GraphKeeps keeps size bytes taken outside the pool on device ordinal
// (an explicit pool's or a created context's allocation) that were freed
// during the capture of graph: CUDA keeps such memory for the graph, so
// they are given back once the graph and every executable graph
// instantiated from it are destroyed, not at the free.
func (c *Core) GraphKeeps(graph uint64, ordinal int, size uint64) {
	if l := c.mem.ledgerAt(ordinal); l != nil {
		c.mem.keepForGraph(graph, l, size)
	}
}
