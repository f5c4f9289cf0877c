package bpf

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// nvidia-uvm has no tracepoints; its one notification point for faults and
// migrations is this function, probed with a kprobe where the kernel has them.
const uvmNotifySymbol = "uvm_perf_event_notify"

// UVMStatus says whether GPU faults and migrations are traced.
type UVMStatus struct {
	Available bool
	Version   string // nvidia-uvm module version, when loaded
	Reason    string // why it is unavailable
}

func (s UVMStatus) String() string {
	if s.Available {
		return "nvidia-uvm " + s.Version + ": tracing GPU faults and migrations"
	}
	return "nvidia-uvm tracing unavailable: " + s.Reason
}

// uvmLayout is where uvm_perf_event_notify's payloads keep their fields in
// one range of driver versions (x86-64): the event ids of faults and
// migrations, and byte offsets inside the event data union.
type uvmLayout struct {
	minMajor, maxMajor int
	eventFault         uint32
	eventMigration     uint32
	faultProc          uint32
	migDst, migSrc     uint32
	migAddress         uint32
	migBytes, migCause uint32
}

// uvmLayouts were derived from the uvm_perf_events.h struct definitions of the
// open driver (515 to 595) with natural alignment. A driver outside them is
// reported unavailable rather than decoded with a guess.
var uvmLayouts = []uvmLayout{
	{515, 525, 5, 6, 16, 16, 20, 24, 32, 44},
	{530, 545, 6, 7, 16, 16, 20, 24, 32, 44},
	{550, 575, 6, 7, 16, 16, 20, 32, 40, 52},
	{580, 595, 6, 7, 8, 16, 20, 32, 40, 56},
}

// uvmLayoutFor returns the layout of a module version ("595.45.04").
func uvmLayoutFor(version string) (uvmLayout, error) {
	majorText, _, _ := strings.Cut(strings.TrimSpace(version), ".")
	major, err := strconv.Atoi(majorText)
	if err != nil {
		return uvmLayout{}, fmt.Errorf("nvidia-uvm version %q: not a driver version", version)
	}
	for _, l := range uvmLayouts {
		if major >= l.minMajor && major <= l.maxMajor {
			return l, nil
		}
	}
	return uvmLayout{}, fmt.Errorf("nvidia-uvm version %s: payload layout known only for drivers %d to %d",
		version, uvmLayouts[0].minMajor, uvmLayouts[len(uvmLayouts)-1].maxMajor)
}

// detectUVM looks for the module and for kprobe support. It returns the
// layout to load the program with (the newest when unavailable: the program is
// loaded, so verified, either way) and the status to report.
func detectUVM() (uvmLayout, UVMStatus) {
	newest := uvmLayouts[len(uvmLayouts)-1]
	raw, err := os.ReadFile("/sys/module/nvidia_uvm/version")
	if err != nil {
		return newest, UVMStatus{Reason: "the nvidia_uvm module is not loaded"}
	}
	version := strings.TrimSpace(string(raw))
	if !kprobesAvailable() {
		return newest, UVMStatus{Version: version, Reason: "the kernel has no kprobes (CONFIG_KPROBES)"}
	}
	layout, err := uvmLayoutFor(version)
	if err != nil {
		return newest, UVMStatus{Version: version, Reason: err.Error()}
	}
	return layout, UVMStatus{Available: true, Version: version}
}

func kprobesAvailable() bool {
	for _, p := range []string{"/sys/bus/event_source/devices/kprobe/type", tracefsRoot + "/kprobe_events"} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// apply writes the layout into the program's constants before loading.
func (l uvmLayout) apply(spec *ebpf.CollectionSpec) error {
	for name, v := range map[string]uint32{
		spillwayVarUvmEventFault:             l.eventFault,
		spillwayVarUvmEventMigration:         l.eventMigration,
		spillwayVarUvmFaultProcOffset:        l.faultProc,
		spillwayVarUvmMigrationDstOffset:     l.migDst,
		spillwayVarUvmMigrationSrcOffset:     l.migSrc,
		spillwayVarUvmMigrationAddressOffset: l.migAddress,
		spillwayVarUvmMigrationBytesOffset:   l.migBytes,
		spillwayVarUvmMigrationCauseOffset:   l.migCause,
	} {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("probe object has no variable %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}
