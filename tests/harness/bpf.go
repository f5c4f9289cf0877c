package harness

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
)

// RequireBPF skips t when this machine cannot run the eBPF tests: not root,
// no bpf(2), no uprobe events or no tracefs. With SPILLWAY_REQUIRE_BPF=1 (as
// CI sets it) the same condition fails the test instead, so a machine that
// lost BPF can never pass by skipping.
func RequireBPF(t testing.TB) {
	t.Helper()
	err := bpfAvailable()
	if err == nil {
		return
	}
	if os.Getenv("SPILLWAY_REQUIRE_BPF") == "1" {
		t.Fatalf("eBPF is required (SPILLWAY_REQUIRE_BPF=1) but unavailable: %v", err)
	}
	t.Skipf("eBPF unavailable: %v (set SPILLWAY_REQUIRE_BPF=1 to make this a failure)", err)
}

func bpfAvailable() error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root")
	}
	if err := features.HaveProgramType(ebpf.Kprobe); err != nil {
		return fmt.Errorf("uprobe programs cannot be loaded: %w", err)
	}
	if err := features.HaveMapType(ebpf.RingBuf); err != nil {
		return fmt.Errorf("ring buffers unsupported: %w", err)
	}
	if _, err := os.Stat("/sys/bus/event_source/devices/uprobe/type"); err != nil {
		return fmt.Errorf("no uprobe event source: %w", err)
	}
	for _, dir := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		if _, err := os.Stat(dir + "/events/exceptions/page_fault_user/id"); err == nil {
			return nil
		}
	}
	return errors.New("tracepoint exceptions:page_fault_user not found (is tracefs mounted at /sys/kernel/tracing?)")
}
