package simcudatest

import (
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// TestVisibleDevices: CUDA_VISIBLE_DEVICES selects and orders the devices
// by index or UUID prefix, as CUDA documents, the first entry naming no
// device ending the list; a device keeps its capacity, PCI bus and UUID
// whatever ordinal it gets.
func TestVisibleDevices(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/visible_devices.c"},
		Cudart:         true,
		ProjectHeaders: true,
	})
	run := func(t *testing.T, visible *string) string {
		t.Helper()
		cmd := harness.Command(t, bin)
		harness.SetEnv(cmd, "SIMCUDA_DEVICES=1GiB,2GiB,3GiB")
		if visible != nil {
			harness.SetEnv(cmd, "CUDA_VISIBLE_DEVICES="+*visible)
		}
		res := harness.Run(t, cmd)
		if res.ExitCode != 0 {
			t.Fatalf("CUDA_VISIBLE_DEVICES=%v: exit %d\n%s", visible, res.ExitCode, res.Stderr)
		}
		return strings.TrimSpace(res.Stdout)
	}
	all := strings.Fields(run(t, nil))
	if len(all) != 4 || all[0] != "3:" {
		t.Fatalf("unset: %q, want 3 devices", all)
	}
	dev := all[1:] // "<capacity>@<bus>=<uuid>" of devices 0, 1, 2
	for i, want := range []string{"1073741824@18=GPU-", "2147483648@19=GPU-", "3221225472@1a=GPU-"} {
		if !strings.HasPrefix(dev[i], want) {
			t.Fatalf("device %d is %q, want %s...", i, dev[i], want)
		}
	}
	uuid := func(i int) string { return dev[i][strings.Index(dev[i], "=")+1:] }
	// The shortest prefix of device 2's UUID that no other device shares.
	prefix := "GPU-"
	for n := len("GPU-") + 1; n <= len(uuid(2)); n++ {
		prefix = uuid(2)[:n]
		if !strings.HasPrefix(uuid(0), prefix) && !strings.HasPrefix(uuid(1), prefix) {
			break
		}
	}
	list := func(ds ...int) string {
		s := []string{}
		for _, d := range ds {
			s = append(s, dev[d])
		}
		return strings.TrimSpace(strings.Join(append([]string{string(rune('0'+len(ds))) + ":"}, s...), " "))
	}
	for _, c := range []struct{ visible, want, why string }{
		{"2,0", list(2, 0), "enumerated in the list's order"},
		{"1", list(1), "one device, ordinal 0"},
		{"0,2,-1,1", list(0, 2), "an invalid entry ends the list"},
		{"1,1,0", list(1), "a device listed again ends the list"},
		{"0,7", list(0), "an index out of range ends the list"},
		{prefix + ",0", list(2, 0), "a unique UUID prefix names a device"},
		{uuid(1), list(1), "a whole UUID names a device"},
		{"GPU-,0", "error 100", "an ambiguous UUID prefix names none"},
		{"", "error 100", "set but empty: no device (cudaErrorNoDevice)"},
		{"-1", "error 100", "no valid entry: no device"},
	} {
		t.Run(c.visible, func(t *testing.T) {
			if got := run(t, &c.visible); got != c.want {
				t.Errorf("CUDA_VISIBLE_DEVICES=%q: %q, want %q (%s)", c.visible, got, c.want, c.why)
			}
		})
	}
}
