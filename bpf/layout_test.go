package bpf

import (
	"bufio"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/cilium/ebpf/btf"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// goFields lists the Go record's fields as C names (snake_case) with their
// offsets and sizes, skipping the layout marker.
func goFields(t *testing.T) map[string][2]uint64 {
	t.Helper()
	out := map[string][2]uint64{}
	typ := reflect.TypeOf(spillwayEvent{})
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		if f.Name == "_" {
			continue
		}
		out[snake(f.Name)] = [2]uint64{uint64(f.Offset), uint64(f.Type.Size())}
	}
	return out
}

func snake(name string) string {
	var b strings.Builder
	for i, r := range name {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// The record the committed object writes (its BTF) has the layout the Go
// decoder reads.
func TestEventLayoutMatchesObject(t *testing.T) {
	spec, err := loadSpillway()
	if err != nil {
		t.Fatal(err)
	}
	var ev *btf.Struct
	if err := spec.Types.TypeByName("event", &ev); err != nil {
		t.Fatalf("struct event in the object's BTF: %v", err)
	}
	want := goFields(t)
	if len(ev.Members) != len(want) {
		t.Fatalf("object's struct event has %d fields, the Go record %d", len(ev.Members), len(want))
	}
	for _, m := range ev.Members {
		size, err := btf.Sizeof(m.Type)
		if err != nil {
			t.Fatal(err)
		}
		got := [2]uint64{uint64(m.Offset.Bytes()), uint64(size)}
		if got != want[m.Name] {
			t.Errorf("field %s: object has offset/size %v, Go %v", m.Name, got, want[m.Name])
		}
	}
	if ev.Size != uint32(EventSize) {
		t.Errorf("object's struct event is %d bytes, Go's %d", ev.Size, EventSize)
	}
}

// events.h compiled for the host agrees with the Go record and constants, so
// an edited header that was not regenerated is caught.
func TestEventLayoutMatchesHeader(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{Sources: []string{"testdata/layout.c"}})
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	c := map[string]uint64{}
	s := bufio.NewScanner(strings.NewReader(string(out)))
	for s.Scan() {
		name, value, _ := strings.Cut(s.Text(), " ")
		n, err := strconv.ParseUint(value, 10, 64)
		if err != nil {
			t.Fatalf("line %q: %v", s.Text(), err)
		}
		c[name] = n
	}
	if c["size.event"] != uint64(EventSize) {
		t.Errorf("sizeof(struct event) = %d in C, %d in Go", c["size.event"], EventSize)
	}
	for name, got := range goFields(t) {
		want := [2]uint64{c["offset."+name], c["size."+name]}
		if got != want {
			t.Errorf("field %s: Go offset/size %v, C %v", name, got, want)
		}
	}
	consts := map[string]uint64{
		"EVENT_API": uint64(KindAPI), "EVENT_PROBE": uint64(KindProbe), "EVENT_FAULT": uint64(KindFault),
		"EVENT_EXIT": uint64(KindExit), "EVENT_UVM_FAULT": uint64(KindUVMFault),
		"EVENT_UVM_MIGRATION": uint64(KindUVMMigration),
		"PROBE_ALLOC":         uint64(ProbeAlloc), "PROBE_FREE": uint64(ProbeFree), "PROBE_SYNC": uint64(ProbeSync),
		"PROBE_SPILL": uint64(ProbeSpill), "PROBE_PROMOTE": uint64(ProbePromote), "PROBE_REFUSE": uint64(ProbeRefuse),
		"EVENT_FLAG_SPILLED": flagSpilled, "EVENT_FLAG_UNPAIRED": flagUnpaired,
		"COOKIE_OUTARG_SHIFT": 16, "EVENT_ARGS": uint64(len(Event{}.Args)),
		"COOKIE_ADDR_SHIFT": 20, "COOKIE_COUNT_SHIFT": 26, "COOKIE_UNIT_SHIFT": 30,
	}
	for name, want := range consts {
		got, ok := c["const."+name]
		if !ok || got != want {
			t.Errorf("%s = %d in C (present %v), %d in Go", name, got, ok, want)
		}
	}
}

// MaxTraced, which the error for a full session names, is the size the
// object gives the traced set.
func TestMaxTracedMatchesObject(t *testing.T) {
	spec, err := loadSpillway()
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Maps[spillwayMapTraced].MaxEntries; got != MaxTraced {
		t.Errorf("traced map holds %d entries, MaxTraced says %d", got, MaxTraced)
	}
}
