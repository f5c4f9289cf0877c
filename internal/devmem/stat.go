package devmem

import (
	"os"
	"time"

	"github.com/spillway-gpu/spillway/internal/stat"
	"github.com/spillway-gpu/spillway/interpose"
)

// statRefresh is how often the figures file is rewritten: often enough for
// `spillway stat --watch`, rarely enough to cost nothing measurable.
const statRefresh = 500 * time.Millisecond

// publisher keeps this process's figures file (internal/stat) current from
// a goroutine of its own, so that the allocation path makes no system call
// for it. Its file is removed at exit.
type publisher struct {
	w    *stat.Writer
	stop chan struct{}
	done chan struct{}
}

// publish creates the figures file and starts refreshing it; nil when it
// cannot be created (said once: the job runs on, unlisted).
func (c *Core) publish() *publisher {
	if c.broken != nil {
		return nil
	}
	dir, explicit := c.cfg.RuntimeDir, c.cfg.RuntimeDir != ""
	if !explicit {
		var err error
		if dir, err = stat.DefaultDir(os.Geteuid(), os.Getenv("XDG_RUNTIME_DIR")); err != nil {
			c.log.Infof("spillway stat will not list this process: %v", err)
			return nil
		}
	}
	w, err := stat.Create(dir, os.Getpid())
	if err != nil {
		if explicit {
			c.log.Warnf("spillway stat will not list this process: %v", err)
		} else {
			c.log.Infof("spillway stat will not list this process: %v", err)
		}
		return nil
	}
	p := &publisher{w: w, stop: make(chan struct{}), done: make(chan struct{})}
	go p.run(c)
	return p
}

func (p *publisher) run(c *Core) {
	defer close(p.done)
	tick := time.NewTicker(statRefresh)
	defer tick.Stop()
	warned := false
	for {
		// Stamped before the figures are read, which takes no lock over
		// them all: a reader that waits for a stamp later than an event
		// then sees figures read after it, never one read while the event
		// was still under way (a pool's allocation blocks its Stats, not
		// its ledger).
		now := time.Now()
		devs := c.mem.figures()
		if n := p.w.Publish(devs, now); n < len(devs) && !warned {
			warned = true
			c.log.Warnf("spillway stat lists the first %d of the %d devices in use", n, len(devs))
		}
		select {
		case <-tick.C:
		case <-p.stop:
			return
		}
	}
}

// close stops the refreshes and removes the file; at exit.
func (p *publisher) close() {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
	_ = p.w.Close() // at exit there is nobody left to tell
}

// pciLocation asks where the device sits, once, at its first use: the
// figures file names the device by it, since the ordinal is the process's
// own (CUDA_VISIBLE_DEVICES renumbers devices). Nil when the runtime does
// not say: spillway stat then matches the device by its ordinal.
func pciLocation(rt realRuntime, ordinal int) *stat.PCILocation {
	var v [3]int
	for i, attr := range []interpose.DeviceAttr{interpose.DevAttrPCIDomainID, interpose.DevAttrPCIBusID, interpose.DevAttrPCIDeviceID} {
		var rc interpose.Error
		if v[i], rc = rt.DeviceGetAttribute(attr, ordinal); rc != interpose.Success || v[i] < 0 {
			return nil
		}
	}
	if v[1] > 0xff || v[2] > 0xff {
		return nil
	}
	return &stat.PCILocation{Domain: uint32(v[0]), Bus: uint8(v[1]), Device: uint8(v[2])}
}

// figures are the devices in use, as the figures file describes them.
func (m *memory) figures() []stat.Device {
	live := *m.live.Load() // replaced, never modified
	devs := make([]stat.Device, 0, len(live))
	for _, d := range live {
		f := stat.Device{Ordinal: d.ordinal, Limited: d.limited, Quota: d.quota, Used: d.ledger.used(), PCI: d.pci}
		if d.pool != nil {
			s := d.stats()
			f.Reserved, f.Cached, f.Live, f.PeakReserved = s.ReservedBytes, s.CachedBytes, s.LiveBytes, s.PeakReservedBytes
			f.Spilled, f.SpilledTotal, f.Promoted, f.PromotedTotal = s.SpilledBytes, s.SpilledTotal, s.PromotedBytes, s.PromotedTotal
			f.Refused, f.BackingErrors, f.HostLimit, f.HostOutside = s.Refused, s.BackingErrors, s.HostLimit, s.HostOutside
		}
		devs = append(devs, f)
	}
	return devs
}
