package main

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sirupsen/logrus"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/shim/config"
)

// core is the state of the shim in this process. The entry points reach it
// through the one process-wide pointer below: C calls carry no context.
type core struct {
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
	// Memory counted outside the pools (outside.go, vmm.go).
	contexts contextLedger
	vmm      vmmLedger
}

var theCore atomic.Pointer[core]

// start is the first call into the core; the front makes it exactly once,
// before any other entry point. Configuration is read here, never in init.
// frontABI is the front's ABI version: a front from another build passes
// tables and arguments this core would misread.
func start(frontABI int32, real, probes unsafe.Pointer) interpose.Error {
	c := &core{log: newLogger(os.Stderr, config.FormatText, config.LevelWarn)}
	if err := checkABI(frontABI); err != nil {
		c.log.Errorf("cannot start: %v", err)
		return interpose.ErrorInitialization
	}
	rt, on, err := openRuntime(real)
	if err != nil {
		c.log.Errorf("cannot start: %v", err)
		return interpose.ErrorInitialization
	}
	c.rt = rt
	if c.probes, err = interpose.NewProbes(probes); err != nil {
		c.log.Errorf("cannot start: %v", err)
		return interpose.ErrorInitialization
	}
	cfg, err := config.Parse(os.Environ())
	if err == nil {
		c.log, err = openLog(cfg)
	}
	if err != nil {
		c.broken = err
		c.log.Errorf("%v; every CUDA allocation in this process will fail with cudaErrorInitializationError until it is fixed", err)
	}
	c.cfg = cfg
	c.debug = c.log.IsLevelEnabled(logrus.DebugLevel)
	c.mem = newMemory(rt, on, cfg, c.probes, c.log, c.refused)
	c.mem.vmm = driverVMM(real)
	if c.broken == nil {
		c.describeSettings()
	}
	c.stat = c.publish()
	theCore.Store(c)
	return interpose.Success
}

// checkABI refuses a front whose ABI version is not this core's.
func checkABI(frontABI int32) error {
	if frontABI != abiVersion {
		return fmt.Errorf("the front (libspillway.so) has ABI version %d and this core has %d: libspillway.so and libspillway-core.so must come from the same build", frontABI, abiVersion)
	}
	return nil
}

// running returns the started core. The front calls no other entry point
// before start has returned, so a nil here is a broken front.
func running() *core {
	c := theCore.Load()
	if c == nil {
		panic("spillway core called before spillway_core_init")
	}
	return c
}

// recoverTo turns a panic at an entry point into cudaErrorUnknown and a log line.
func recoverTo[T ~int32](rc *T, call string) {
	r := recover()
	if r == nil {
		return
	}
	*rc = T(interpose.ErrorUnknown)
	msg := fmt.Sprintf("internal error in %s: %v; the call fails with cudaErrorUnknown", call, r)
	if c := theCore.Load(); c != nil {
		c.log.Error(msg)
	} else {
		fmt.Fprintln(os.Stderr, "spillway: "+msg)
	}
}

func (c *core) malloc(r request) (interpose.DevicePtr, interpose.Error) {
	if c.broken != nil {
		return 0, interpose.ErrorInitialization
	}
	if c.debug {
		c.logMalloc(r)
	}
	return c.mem.malloc(r)
}

func (c *core) logMalloc(r request) {
	c.log.Debugf("%s of %d bytes on device %d", r.kind, r.size, r.device)
}

func (c *core) mallocPitch(device int, width, height uint64) (interpose.DevicePtr, uint64, interpose.Error) {
	if c.broken != nil {
		return 0, 0, interpose.ErrorInitialization
	}
	return c.mem.mallocPitch(device, width, height)
}

func (c *core) free(p interpose.DevicePtr, s interpose.Stream, async bool) interpose.Error {
	if c.debug {
		c.logFree(p, async)
	}
	return c.mem.free(p, s, async)
}

func (c *core) logFree(p interpose.DevicePtr, async bool) {
	name := "cudaFree"
	if async {
		name = "cudaFreeAsync"
	}
	c.log.Debugf("%s of %#x", name, uint64(p))
}

func (c *core) memGetInfo(device int) (free, total uint64, rc interpose.Error) {
	return c.mem.memGetInfo(device)
}

func (c *core) deviceReset(device int) interpose.Error { return c.mem.deviceReset(device) }

func (c *core) deviceSynchronize(device int) interpose.Error { return c.mem.deviceSynchronize(device) }

func (c *core) streamDestroy(s interpose.Stream) interpose.Error { return c.mem.streamDestroy(s) }

// report prints the pools' statistics at exit when SPILLWAY_REPORT=1, on
// the log's output whatever the log level.
func (c *core) report() {
	c.stat.close()
	if c.broken == nil && c.cfg.Report {
		c.mem.report(c.log.Out, c.cfg.LogFormat)
	}
}

func (c *core) adopt(p interpose.DevicePtr, size uint64, device int) {
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
func (c *core) refused(kind allocKind, size uint64, device int, used, quota uint64) {
	suppressed, ok := c.refusals.allow()
	if !ok {
		return
	}
	c.log.WithFields(logrus.Fields{
		"device": device, "requested": size, "used": used, "quota": quota,
		"suppressed": suppressed,
	}).Warn(refusalMessage(kind, size, device, used, quota))
}
