package devmem

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"

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
