package bpf

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/spillway-gpu/spillway/tests/harness"
)

func TestUVMLayoutFor(t *testing.T) {
	for _, tc := range []struct {
		version   string
		fault     uint32
		migBytes  uint32
		wantError string
	}{
		{"515.43.04", 5, 32, ""},
		{"535.104.05", 6, 32, ""},
		{"560.28.03", 6, 40, ""},
		{"595.45.04\n", 6, 40, ""},
		{"470.82.01", 0, 0, "known only for drivers 515 to 595"},
		{"600.1", 0, 0, "known only for drivers 515 to 595"},
		{"beta", 0, 0, "not a driver version"},
	} {
		l, err := uvmLayoutFor(tc.version)
		if tc.wantError != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Errorf("%q: error %v, want one containing %q", tc.version, err, tc.wantError)
			}
			continue
		}
		if err != nil || l.eventFault != tc.fault || l.migBytes != tc.migBytes {
			t.Errorf("%q: layout %+v, %v; want fault event %d, bytes at %d", tc.version, l, err, tc.fault, tc.migBytes)
		}
	}
}

// The nvidia-uvm kprobe program cannot be attached where the kernel has no
// kprobes or no nvidia-uvm, but it must pass the verifier with every layout.
func TestUVMProgramPassesVerifier(t *testing.T) {
	harness.RequireBPF(t)
	for _, l := range uvmLayouts {
		spec, err := loadSpillway()
		if err != nil {
			t.Fatal(err)
		}
		if err := l.apply(spec); err != nil {
			t.Fatal(err)
		}
		var objs struct {
			Prog *ebpf.Program `ebpf:"uvm_event"`
			Maps spillwayMaps
		}
		if err := spec.LoadAndAssign(&objs, nil); err != nil {
			var verr *ebpf.VerifierError
			if errors.As(err, &verr) {
				t.Fatalf("drivers %d-%d: %+v", l.minMajor, l.maxMajor, verr)
			}
			t.Fatalf("drivers %d-%d: %v", l.minMajor, l.maxMajor, err)
		}
		if info, err := objs.Prog.Info(); err != nil || info.Type != ebpf.Kprobe {
			t.Errorf("drivers %d-%d: loaded program info %+v, %v; want a kprobe", l.minMajor, l.maxMajor, info, err)
		}
		objs.Prog.Close()
		objs.Maps.Close()
	}
	_, status := detectUVM()
	if !status.Available && status.Reason == "" {
		t.Error("nvidia-uvm unavailable without a reason")
	}
	t.Logf("this machine: %s", status)
}
