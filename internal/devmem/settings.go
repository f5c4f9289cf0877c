package devmem

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/spillway-gpu/spillway/shim/config"
)

// describeSettings says at start, once, which quota applies to each device
// (at info level), and warns about settings that have no effect: unknown
// variables, a limit for a device this process does not see, oversubscription
// settings without oversubscription.
func (c *Core) describeSettings() {
	cfg := c.cfg
	if len(cfg.Unknown) > 0 {
		c.log.Warnf("ignoring unknown variables %s (misspelled?)", strings.Join(cfg.Unknown, ", "))
	}
	for _, w := range cfg.Warnings() {
		c.log.Warn(w)
	}
	info := c.log.IsLevelEnabled(logrus.InfoLevel)
	if !info && len(cfg.DeviceLimits) == 0 {
		return // nothing to say that needs the device count
	}
	count, rc := c.rt.GetDeviceCount()
	if rc != 0 {
		c.log.Infof("cannot count the devices (CUDA error %d): quotas are applied as each device is first used", int(rc))
		return
	}
	for _, n := range cfg.Ordinals() {
		if n >= count {
			// As written: the setting to look for where it was set.
			name := config.EnvMemoryLimitDevicePrefix + strconv.Itoa(n)
			c.log.Warnf("%s=%s has no effect: this process sees %s", name, cfg.Written[name], devicesText(count))
		}
	}
	if !info {
		return
	}
	for n := range count {
		entry := c.log.WithField("device", n)
		if l := cfg.LimitFor(n); l.IsSet() && l.Percent == 0 {
			entry = entry.WithField("quota_bytes", l.Bytes) // exact, beside the human size
		}
		entry.Infof("device %d: %s", n, quotaText(cfg, n))
	}
}

// quotaText says which quota applies to device n and where it comes from.
func quotaText(cfg config.Config, n int) string {
	if l := cfg.LimitFor(n); l.IsSet() {
		return "quota " + limitText(l) + " (" + limitVariable(cfg, n) + ")"
	}
	return "no quota"
}

// limitVariable names the variable the quota of device n comes from.
func limitVariable(cfg config.Config, n int) string {
	if _, ok := cfg.DeviceLimits[n]; ok {
		return config.EnvMemoryLimitDevicePrefix + strconv.Itoa(n)
	}
	return config.EnvMemoryLimit
}

// limitText writes a limit for people: 8GiB, or 50% of the device's memory.
func limitText(l config.Limit) string {
	if l.Percent > 0 {
		return l.String() + " of the device's memory"
	}
	return config.FormatBytes(l.Bytes)
}

func devicesText(count int) string {
	switch count {
	case 0:
		return "no device"
	case 1:
		return "1 device (ordinal 0)"
	}
	return fmt.Sprintf("%d devices (ordinals 0 to %d)", count, count-1)
}
