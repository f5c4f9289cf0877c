package devmem

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/shim/config"
)

// refusalMessage words a refusal for the quota with human sizes; the
// log entry's fields carry the exact bytes.
func refusalMessage(kind allocKind, size uint64, device int, used, quota uint64) string {
	return fmt.Sprintf("%s of %s refused on device %d: %s in use of a quota of %s", kind,
		config.FormatBytes(size), device, config.FormatBytes(used), config.FormatBytes(quota))
}

// hostLimitRefused logs a request refused because spilling it would pass
// the host limit: the limit reached is SPILLWAY_HOST_LIMIT, not the quota.
func (m *memory) hostLimitRefused(d *device, kind allocKind, size uint64) {
	suppressed, ok := m.hostLimitWarn.allow()
	if !ok {
		return
	}
	st := d.pool.Stats()
	m.log.WithFields(logrus.Fields{
		"device": d.ordinal, "requested": size, "spilled": st.SpilledBytes, "host_limit": st.HostLimit,
		"suppressed": suppressed,
	}).Warnf("%s of %s refused on device %d: the quota is full and spilling it would pass the host limit (%s=%s; %s spilled)",
		kind, config.FormatBytes(size), d.ordinal, config.EnvHostLimit, config.FormatBytes(st.HostLimit),
		config.FormatBytes(st.SpilledBytes))
}

// deviceFullRefused logs a request refused because the device itself had
// no room, below the quota: the GPU's other processes (or memory Spillway
// does not count) hold the rest, which the quota's figures cannot show.
func (m *memory) deviceFullRefused(d *device, kind allocKind, size uint64) {
	suppressed, ok := m.deviceFullWarn.allow()
	if !ok {
		return
	}
	used := d.ledger.used()
	fields := logrus.Fields{"device": d.ordinal, "requested": size, "used": used, "quota": d.quota, "suppressed": suppressed}
	free := "unknown"
	if f, _, rc := m.on(d.ordinal).MemGetInfo(); rc == interpose.Success {
		fields["device_free"] = f
		free = config.FormatBytes(f)
	}
	m.log.WithFields(fields).Warnf("%s of %s refused on device %d: the device is out of memory (%s free on it) though the quota is not (%s in use of %s)",
		kind, config.FormatBytes(size), d.ordinal, free, config.FormatBytes(used), config.FormatBytes(d.quota))
}

// reportJSON is a SPILLWAY_REPORT line in the JSON log format: the line as
// msg, and each of its figures (name=value) as a field of its own.
func reportJSON(device int, line string) []byte {
	obj := map[string]any{"level": "info", "device": device, "msg": line}
	for _, kv := range strings.Fields(line) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if n, err := strconv.ParseUint(v, 10, 64); err == nil {
				obj[k] = n
			}
		}
	}
	data, _ := json.Marshal(obj) // numbers and strings: cannot fail
	return append(data, '\n')
}
