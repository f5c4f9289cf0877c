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
func refusalMessage(call string, size uint64, device int, used, quota uint64) string {
	return fmt.Sprintf("%s of %s refused on device %d: %s in use of a quota of %s", call,
		config.FormatBytes(size), device, config.FormatBytes(used), config.FormatBytes(quota))
}

// cpuAccessRefused logs, once, that the driver refused to map host granules
// for the CPU (rc), which pointer queries still call host memory.
func (m *memory) cpuAccessRefused(ordinal int, rc interpose.Error) {
	if m.cpuAccessSaid.Swap(true) {
		return
	}
	m.log.Warnf("device %d: cuMemSetAccess refused the CPU access to host-located memory (%v): the CPU cannot reach host granules at their addresses. "+
		"Blocks spilled to them still serve the device, but cudaPointerGetAttributes calls them host memory, so a program or library "+
		"that reads or writes memory CUDA calls host with the CPU (CUDA-aware MPI does) will fault on them; "+
		"%s=0 with %s=pinned spills to pinned memory, which the CPU reaches", ordinal, rc, config.EnvVMM, config.EnvSpill)
}

// hostPlacedCPURefused logs, once (the caller's), that the driver refused
// to map for the CPU (rc) the application's cuMemCreate memory the front
// placed on the host, which pointer queries still call host memory.
func (m *memory) hostPlacedCPURefused(ordinal int, rc interpose.Error) {
	m.log.Warnf("device %d: cuMemSetAccess refused the CPU access to host-located memory (%v): the CPU cannot reach the program's cuMemCreate memory placed on the host beyond the quota. "+
		"The program's own grant stands and the devices reach that memory, but cudaPointerGetAttributes calls it host memory, so a program or library "+
		"that reads or writes memory CUDA calls host with the CPU (CUDA-aware MPI does) will fault on it; "+
		"without %s such a cuMemCreate is refused at the quota instead", ordinal, rc, config.EnvOversubscribe)
}

// hostLimitRefused logs a request refused because spilling it would pass
// the host limit: the limit reached is SPILLWAY_HOST_LIMIT, not the quota.
// deviceFull: what sent the request to the host was the device being full,
// below the quota.
func (m *memory) hostLimitRefused(d *device, call string, size uint64, deviceFull bool) {
	suppressed, ok := m.hostLimitWarn.allow()
	if !ok {
		return
	}
	st := d.pool.Stats()
	fields := logrus.Fields{
		"device": d.ordinal, "requested": size, "spilled": st.SpilledBytes, "host_limit": st.HostLimit,
		"suppressed": suppressed,
	}
	full := m.whatIsFull(d, deviceFull, fields)
	m.log.WithFields(fields).Warnf("%s of %s refused on device %d: %s and spilling it would pass the host limit (%s=%s; %s spilled)",
		call, config.FormatBytes(size), d.ordinal, full, config.EnvHostLimit, config.FormatBytes(st.HostLimit),
		config.FormatBytes(st.SpilledBytes))
}

// spillFailed logs a request whose spill failed: making host memory for it
// did. deviceFull as for hostLimitRefused.
func (m *memory) spillFailed(d *device, call string, size uint64, deviceFull bool, spill *spillError) {
	suppressed, ok := m.spillWarn.allow()
	if !ok {
		return
	}
	fields := logrus.Fields{"device": d.ordinal, "requested": size, "suppressed": suppressed}
	full := m.whatIsFull(d, deviceFull, fields)
	m.log.WithFields(fields).Warnf("%s of %s on device %d failed: %s and %v", call, config.FormatBytes(size), d.ordinal, full, spill)
}

// deviceFullRefused logs a request refused because the device itself had
// no room, below the quota: the GPU's other processes (or memory Spillway
// does not count) hold the rest, which the quota's figures cannot show.
func (m *memory) deviceFullRefused(d *device, call string, size uint64) {
	suppressed, ok := m.deviceFullWarn.allow()
	if !ok {
		return
	}
	fields := logrus.Fields{"device": d.ordinal, "requested": size, "suppressed": suppressed}
	full := m.whatIsFull(d, true, fields)
	m.log.WithFields(fields).Warnf("%s of %s refused on device %d: %s", call, config.FormatBytes(size), d.ordinal, full)
}

// whatIsFull words what had no room for a request on d: the quota, or with
// deviceFull the device itself, with what is free on it and what the
// quota still allows, whose exact bytes it adds to fields.
func (m *memory) whatIsFull(d *device, deviceFull bool, fields logrus.Fields) string {
	if !deviceFull {
		return "the quota is full"
	}
	used := d.ledger.used()
	fields["used"], fields["quota"] = used, d.quota
	free := "unknown"
	if f, _, rc := m.on(d.ordinal).MemGetInfo(); rc == interpose.Success {
		fields["device_free"] = f
		free = config.FormatBytes(f)
	}
	return fmt.Sprintf("the device is out of memory (%s free on it) though the quota is not (%s in use of %s)",
		free, config.FormatBytes(used), config.FormatBytes(d.quota))
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
