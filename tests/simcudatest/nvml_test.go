package simcudatest

// Tests of simcuda's NVML through github.com/NVIDIA/go-nvml, unchanged, as
// monitoring tools use it: the test process loads build/simcuda's
// libnvidia-ml.so.1 and queries processes that hold simulated device memory.

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/spillway-gpu/spillway/tests/harness"
)

const nvmlMiB = 1 << 20

// nvmlWatchdog bounds waits on child processes; a hang, not a speed goal.
const nvmlWatchdog = 2 * time.Minute

var nvmlUUIDPattern = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// nvmlHolder is a running testdata/nvml_hold.c that holds device memory until
// its stdin closes.
type nvmlHolder struct {
	cmd    *exec.Cmd
	pid    int
	stdin  io.WriteCloser
	lines  chan string
	stderr *strings.Builder
	reaped bool
	used   uint64 // bytes used on its device (all processes) by its own cudaMemGetInfo
}

// nvmlHolderSpec says what a holder allocates and where.
type nvmlHolderSpec struct {
	devices string   // SIMCUDA_DEVICES
	device  int      // ordinal to allocate on
	sizes   []uint64 // one cudaMalloc each
	env     []string // extra "K=V" entries
}

// startNVMLHolder runs nvml_hold as spec says, publishing in stateDir (""
// for the default folder), and waits until it holds its memory.
func startNVMLHolder(t testing.TB, bin, stateDir string, spec nvmlHolderSpec) *nvmlHolder {
	t.Helper()
	args := []string{strconv.Itoa(spec.device)}
	for _, s := range spec.sizes {
		args = append(args, strconv.FormatUint(s, 10))
	}
	cmd := harness.Command(t, bin, args...)
	harness.SetEnv(cmd, "SIMCUDA_STATE_DIR="+stateDir, "SIMCUDA_DEVICES="+spec.devices)
	harness.SetEnv(cmd, spec.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h := &nvmlHolder{cmd: cmd, stdin: stdin, lines: make(chan string, 16), stderr: &strings.Builder{}}
	cmd.Stderr = h.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	h.pid = cmd.Process.Pid
	// Only reads: the holder is reaped explicitly, so a test can observe it as a zombie.
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	// End of input lets the holder exit normally, which removes its state file.
	t.Cleanup(func() {
		if !h.reaped {
			h.reap(t)
		}
	})
	h.used = h.expect(t, "ready")
	return h
}

// expect waits for the holder's next output line, fails unless it is
// "<word> <bytes>", and returns the bytes.
func (h *nvmlHolder) expect(t testing.TB, word string) uint64 {
	t.Helper()
	var line string
	var ok bool
	select {
	case line, ok = <-h.lines:
	case <-time.After(nvmlWatchdog):
		t.Fatalf("holder %d printed nothing within %v", h.pid, nvmlWatchdog)
	}
	if !ok {
		t.Fatalf("holder %d exited before printing %q; stderr:\n%s", h.pid, word, h.stderr.String())
	}
	got, bytes, _ := strings.Cut(line, " ")
	n, err := strconv.ParseUint(bytes, 10, 64)
	if got != word || err != nil {
		t.Fatalf("holder %d printed %q, want %q and a byte count; stderr:\n%s", h.pid, line, word, h.stderr.String())
	}
	return n
}

// kill ends the holder with SIGKILL, so it leaves its state file behind. It
// is not reaped: until reap, it may linger as a zombie.
func (h *nvmlHolder) kill(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(h.pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill holder %d: %v", h.pid, err)
	}
}

// reap closes the holder's input and waits for it to exit; a holder that
// outlives the watchdog is killed with its group and fails the test.
func (h *nvmlHolder) reap(t testing.TB) {
	t.Helper()
	h.stdin.Close()
	done := make(chan struct{})
	go func() {
		for range h.lines {
		}
		_ = h.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(nvmlWatchdog):
		_ = syscall.Kill(-h.pid, syscall.SIGKILL)
		<-done
		t.Errorf("holder %d did not exit within %v of the end of its input", h.pid, nvmlWatchdog)
	}
	h.reaped = true
}

// buildNVMLHolder compiles testdata/nvml_hold.c against the simcuda runtime.
func buildNVMLHolder(t testing.TB) string {
	t.Helper()
	return harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/nvml_hold.c"},
		Cudart:         true,
		ProjectHeaders: true,
	})
}

// openNVML loads build/simcuda's NVML into the test process with the given
// configuration (stateDir "" for the default folder) and initialises it;
// Shutdown runs at cleanup.
func openNVML(t testing.TB, stateDir, devices string) nvml.Interface {
	t.Helper()
	t.Setenv("SIMCUDA_STATE_DIR", stateDir)
	t.Setenv("SIMCUDA_DEVICES", devices)
	lib := nvml.New(nvml.WithLibraryPath(filepath.Join(harness.SimcudaDir(t), "libnvidia-ml.so.1")))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("nvml.Init: %v", ret)
	}
	t.Cleanup(func() {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS {
			t.Errorf("nvml.Shutdown: %v", ret)
		}
	})
	return lib
}

func nvmlDevice(t testing.TB, lib nvml.Interface, index int) nvml.Device {
	t.Helper()
	dev, ret := lib.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(%d): %v", index, ret)
	}
	return dev
}

// nvmlProcessUsage returns pid -> used bytes as NVML lists them for dev.
func nvmlProcessUsage(t testing.TB, dev nvml.Device) map[int]uint64 {
	t.Helper()
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetComputeRunningProcesses: %v", ret)
	}
	usage := make(map[int]uint64, len(procs))
	for _, p := range procs {
		if _, dup := usage[int(p.Pid)]; dup {
			t.Errorf("pid %d listed twice", p.Pid)
		}
		if p.GpuInstanceId != 0xFFFFFFFF || p.ComputeInstanceId != 0xFFFFFFFF {
			t.Errorf("pid %d: instance ids %#x/%#x, want 0xffffffff without MIG", p.Pid, p.GpuInstanceId, p.ComputeInstanceId)
		}
		usage[int(p.Pid)] = p.UsedGpuMemory
	}
	return usage
}

// checkNVMLMemory asserts both memory-info versions describe a device
// whose CUDA total is capacity, used bytes of it allocated: NVML's total
// adds the driver's reserve, which v2 reports apart and v1 counts as used.
func checkNVMLMemory(t testing.TB, dev nvml.Device, capacity, used uint64) {
	t.Helper()
	total, free := capacity+harness.NVMLReserved, capacity-used
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetMemoryInfo: %v", ret)
	}
	if mem.Total != total || mem.Used != harness.NVMLReserved+used || mem.Free != free {
		t.Errorf("GetMemoryInfo = total %d used %d free %d, want total %d used %d (reserved %d + allocated %d) free %d",
			mem.Total, mem.Used, mem.Free, total, harness.NVMLReserved+used, harness.NVMLReserved, used, free)
	}
	mem2, ret := dev.GetMemoryInfo_v2()
	if ret != nvml.SUCCESS {
		t.Fatalf("GetMemoryInfo_v2: %v", ret)
	}
	if mem2.Total != total || mem2.Used != used || mem2.Free != free || mem2.Reserved != harness.NVMLReserved {
		t.Errorf("GetMemoryInfo_v2 = total %d reserved %d used %d free %d, want total %d reserved %d used %d free %d",
			mem2.Total, mem2.Reserved, mem2.Used, mem2.Free, total, harness.NVMLReserved, used, free)
	}
}

func checkNVMLUsage(t testing.TB, got, want map[int]uint64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("NVML lists %v, want %v", got, want)
		return
	}
	for pid, bytes := range want {
		if got[pid] != bytes {
			t.Errorf("NVML lists %v, want %v", got, want)
			return
		}
	}
}

func TestNVMLSeesTwoProcesses(t *testing.T) {
	bin := buildNVMLHolder(t)
	state := t.TempDir()
	// a's context takes memory of its own, as a real context does: NVML counts it.
	a := startNVMLHolder(t, bin, state, nvmlHolderSpec{devices: "16GiB", sizes: []uint64{64 * nvmlMiB, 32 * nvmlMiB},
		env: []string{"SIMCUDA_CONTEXT_BYTES=2MiB"}})
	b := startNVMLHolder(t, bin, state, nvmlHolderSpec{devices: "16GiB", sizes: []uint64{256 * nvmlMiB}})
	// The device's capacity is shared: b's cudaMemGetInfo counts a's memory too.
	if a.used != 98*nvmlMiB || b.used != 354*nvmlMiB {
		t.Fatalf("holders see %d and %d bytes used by cudaMemGetInfo, want %d and %d", a.used, b.used, 98*nvmlMiB, 354*nvmlMiB)
	}

	lib := openNVML(t, state, "16GiB")
	dev := nvmlDevice(t, lib, 0)
	checkNVMLUsage(t, nvmlProcessUsage(t, dev), map[int]uint64{a.pid: 98 * nvmlMiB, b.pid: 256 * nvmlMiB})
	checkNVMLMemory(t, dev, 16<<30, 354*nvmlMiB)

	// Usage follows frees; a's context keeps it listed, as on a GPU.
	fmt.Fprintln(a.stdin, "free")
	if used := a.expect(t, "freed"); used != 258*nvmlMiB {
		t.Fatalf("after cudaFree of everything, holder sees %d bytes used by cudaMemGetInfo, want its 2 MiB context plus b's 256 MiB", used)
	}
	checkNVMLUsage(t, nvmlProcessUsage(t, dev), map[int]uint64{a.pid: 2 * nvmlMiB, b.pid: 256 * nvmlMiB})
	checkNVMLMemory(t, dev, 16<<30, 258*nvmlMiB)

	// A process that holds nothing is not listed.
	fmt.Fprintln(b.stdin, "free")
	b.expect(t, "freed")
	checkNVMLUsage(t, nvmlProcessUsage(t, dev), map[int]uint64{a.pid: 2 * nvmlMiB})
	checkNVMLMemory(t, dev, 16<<30, 2*nvmlMiB)
}

func TestNVMLIgnoresDeadProcesses(t *testing.T) {
	bin := buildNVMLHolder(t)
	state := t.TempDir()
	live := startNVMLHolder(t, bin, state, nvmlHolderSpec{devices: "16GiB", sizes: []uint64{128 * nvmlMiB}})
	killed := startNVMLHolder(t, bin, state, nvmlHolderSpec{devices: "16GiB", sizes: []uint64{64 * nvmlMiB}})
	zombie := startNVMLHolder(t, bin, state, nvmlHolderSpec{devices: "16GiB", sizes: []uint64{32 * nvmlMiB}})

	killed.kill(t)
	killed.reap(t)
	zombie.kill(t)
	nvmlWaitZombie(t, zombie.pid)
	// Both left their files behind, for NVML to ignore and clean up.
	nvmlStateFile(t, state, killed.pid)
	nvmlStateFile(t, state, zombie.pid)

	// A file of a previous process that had the live one's pid (pid reuse):
	// the live process's file with another start time.
	liveFile := nvmlStateFile(t, state, live.pid)
	reused := nvmlReusedPidFile(t, liveFile)

	lib := openNVML(t, state, "16GiB")
	dev := nvmlDevice(t, lib, 0)
	checkNVMLUsage(t, nvmlProcessUsage(t, dev), map[int]uint64{live.pid: 128 * nvmlMiB})
	checkNVMLMemory(t, dev, 16<<30, 128*nvmlMiB)

	// The dead processes' files are cleaned up; the live one's stays.
	names := nvmlStateFiles(t, state)
	for _, pid := range []int{killed.pid, zombie.pid} {
		for _, name := range names {
			if strings.HasPrefix(name, strconv.Itoa(pid)+"-") {
				t.Errorf("state file %s of dead process %d was not removed", name, pid)
			}
		}
	}
	if slices.Contains(names, filepath.Base(reused)) {
		t.Errorf("state file %s of a previous process with pid %d was not removed", filepath.Base(reused), live.pid)
	}
	if !slices.Contains(names, filepath.Base(liveFile)) {
		t.Errorf("state file %s of live process %d was removed; folder holds %v", filepath.Base(liveFile), live.pid, names)
	}
}

// TestNVMLDefaultStateFolder: without SIMCUDA_STATE_DIR, processes publish
// in a private folder under /dev/shm, where NVML finds them. Other simcuda
// processes of this user may be running, so only this holder is checked.
func TestNVMLDefaultStateFolder(t *testing.T) {
	bin := buildNVMLHolder(t)
	h := startNVMLHolder(t, bin, "", nvmlHolderSpec{devices: "16GiB", sizes: []uint64{40 * nvmlMiB}})

	dir := fmt.Sprintf("/dev/shm/simcuda-%d", os.Getuid())
	info, err := os.Stat(dir)
	if err != nil {
		t.Fatalf("default state folder: %v", err)
	}
	if perm := info.Mode().Perm(); !info.IsDir() || perm != 0o700 {
		t.Errorf("default state folder %s: mode %v, want a directory with mode 0700", dir, info.Mode())
	}
	nvmlStateFile(t, dir, h.pid)

	lib := openNVML(t, "", "16GiB")
	dev := nvmlDevice(t, lib, 0)
	if got := nvmlProcessUsage(t, dev)[h.pid]; got != 40*nvmlMiB {
		t.Errorf("NVML lists holder %d with %d bytes, want %d", h.pid, got, 40*nvmlMiB)
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS || mem.Used < harness.NVMLReserved+40*nvmlMiB || mem.Used+mem.Free != mem.Total {
		t.Errorf("GetMemoryInfo = %+v, %v; want at least the driver's reserve and the holder's %d bytes used", mem, ret, 40*nvmlMiB)
	}
}

// nvmlWaitZombie waits until pid has exited but is not yet reaped.
func nvmlWaitZombie(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(nvmlWatchdog)
	for {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("process %d vanished before it was reaped: %v", pid, err)
		}
		if fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:])); len(fields) > 0 && fields[0] == "Z" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d is not a zombie %v after SIGKILL", pid, nvmlWatchdog)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func nvmlStateFiles(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// nvmlStateFile returns the path of the file pid publishes ("<pid>-<start time>").
func nvmlStateFile(t testing.TB, dir string, pid int) string {
	t.Helper()
	var found []string
	for _, name := range nvmlStateFiles(t, dir) {
		if strings.HasPrefix(name, strconv.Itoa(pid)+"-") {
			found = append(found, name)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one state file of process %d in %s, found %v", pid, dir, found)
	}
	return filepath.Join(dir, found[0])
}

// nvmlReusedPidFile copies the state file at path as if an earlier process with
// the same pid had written it: start time one tick earlier, in the name and
// in the header (struct simstate_file: start_time is the u64 at offset 24).
func nvmlReusedPidFile(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, start, ok := strings.Cut(filepath.Base(path), "-")
	startTime, err := strconv.ParseUint(start, 10, 64)
	if !ok || err != nil || startTime == 0 || len(data) < 32 {
		t.Fatalf("unexpected state file %s (%d bytes)", path, len(data))
	}
	startTime--
	for i := range 8 {
		data[24+i] = byte(startTime >> (8 * i))
	}
	out := filepath.Join(filepath.Dir(path), fmt.Sprintf("%s-%d", pid, startTime))
	if err := os.WriteFile(out, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestNVMLTwoDevices(t *testing.T) {
	bin := buildNVMLHolder(t)
	state := t.TempDir()
	onOne := startNVMLHolder(t, bin, state, nvmlHolderSpec{devices: "80GiB,24GiB", device: 1, sizes: []uint64{512 * nvmlMiB}})
	onZero := startNVMLHolder(t, bin, state, nvmlHolderSpec{devices: "80GiB,24GiB", sizes: []uint64{64 * nvmlMiB}})

	lib := openNVML(t, state, "80GiB,24GiB")
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS || count != 2 {
		t.Fatalf("DeviceGetCount = %d, %v; want 2", count, ret)
	}
	dev0, dev1 := nvmlDevice(t, lib, 0), nvmlDevice(t, lib, 1)
	checkNVMLUsage(t, nvmlProcessUsage(t, dev0), map[int]uint64{onZero.pid: 64 * nvmlMiB})
	checkNVMLUsage(t, nvmlProcessUsage(t, dev1), map[int]uint64{onOne.pid: 512 * nvmlMiB})
	checkNVMLMemory(t, dev0, 80<<30, 64*nvmlMiB)
	checkNVMLMemory(t, dev1, 24<<30, 512*nvmlMiB)

	if _, ret := lib.DeviceGetHandleByIndex(2); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("DeviceGetHandleByIndex(2) with 2 devices = %v, want ERROR_INVALID_ARGUMENT", ret)
	}
}

func TestNVMLDeviceIdentity(t *testing.T) {
	state := t.TempDir()
	identity := func() (names, uuids []string) {
		lib := nvml.New(nvml.WithLibraryPath(filepath.Join(harness.SimcudaDir(t), "libnvidia-ml.so.1")))
		if ret := lib.Init(); ret != nvml.SUCCESS {
			t.Fatalf("nvml.Init: %v", ret)
		}
		defer lib.Shutdown()
		count, ret := lib.DeviceGetCount()
		if ret != nvml.SUCCESS {
			t.Fatalf("DeviceGetCount: %v", ret)
		}
		for i := range count {
			dev := nvmlDevice(t, lib, i)
			name, ret := dev.GetName()
			if ret != nvml.SUCCESS || name == "" {
				t.Fatalf("device %d: GetName = %q, %v", i, name, ret)
			}
			uuid, ret := dev.GetUUID()
			if ret != nvml.SUCCESS || !nvmlUUIDPattern.MatchString(uuid) {
				t.Fatalf("device %d: GetUUID = %q, %v; want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", i, uuid, ret)
			}
			index, ret := dev.GetIndex()
			if ret != nvml.SUCCESS || index != i {
				t.Errorf("device %d: GetIndex = %d, %v", i, index, ret)
			}
			names, uuids = append(names, name), append(uuids, uuid)
		}
		return names, uuids
	}

	t.Setenv("SIMCUDA_STATE_DIR", state)
	t.Setenv("SIMCUDA_DEVICES", "2x16GiB")
	names, uuids := identity()
	if len(uuids) != 2 || uuids[0] == uuids[1] {
		t.Fatalf("2x16GiB: UUIDs %v, want two distinct", uuids)
	}
	// Stable: the same configuration gives the same identities after a re-initialisation.
	names2, uuids2 := identity()
	if !slices.Equal(names, names2) || !slices.Equal(uuids, uuids2) {
		t.Errorf("identity changed across nvmlInit: %v %v, then %v %v", names, uuids, names2, uuids2)
	}
	// Unset: one 16 GiB device.
	t.Setenv("SIMCUDA_DEVICES", "")
	os.Unsetenv("SIMCUDA_DEVICES")
	if names, _ := identity(); len(names) != 1 {
		t.Errorf("default configuration has %d devices, want 1", len(names))
	}

	lib := openNVML(t, state, "16GiB")
	version, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS || !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(version) {
		t.Errorf("SystemGetDriverVersion = %q, %v", version, ret)
	}
	if s := nvml.ErrorString(nvml.ERROR_INSUFFICIENT_SIZE); s != "Insufficient Size" {
		t.Errorf("ErrorString(ERROR_INSUFFICIENT_SIZE) = %q", s)
	}
	checkNVMLMemory(t, nvmlDevice(t, lib, 0), 16<<30, 0)
}

// TestNVMLArguments runs the C-level checks of testdata/nvml_api.c: error
// codes for NULL pointers, short buffers, foreign handles, struct versions and
// reference-counted initialisation, every process-list layout in a process
// that both holds memory and queries NVML, and NVML agreeing with the
// runtime on every device's name, UUID and size.
func TestNVMLArguments(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/nvml_api.c"},
		Cudart:         true,
		ProjectHeaders: true,
		Flags:          []string{"-lnvidia-ml"},
	})
	for _, devices := range []string{"16GiB", "80GiB,24GiB"} {
		cmd := harness.Command(t, bin, strconv.Itoa(48*nvmlMiB))
		harness.SetEnv(cmd, "SIMCUDA_DEVICES="+devices)
		res := harness.Run(t, cmd)
		if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "ok" {
			t.Errorf("nvml_api with SIMCUDA_DEVICES=%s exited %d\nstdout:\n%s\nstderr:\n%s",
				devices, res.ExitCode, res.Stdout, res.Stderr)
		}
	}
}

// TestNVMLRejectsBadConfig: an unparsable SIMCUDA_DEVICES fails nvmlInit
// with a message that names the variable, never a silent default.
func TestNVMLRejectsBadConfig(t *testing.T) {
	bin := harness.Compile(t, harness.CBuild{
		Sources:        []string{"testdata/nvml_api.c"},
		Cudart:         true,
		ProjectHeaders: true,
		Flags:          []string{"-lnvidia-ml"},
	})
	cmd := harness.Command(t, bin, "init")
	harness.SetEnv(cmd, "SIMCUDA_DEVICES=16XB")
	res := harness.Run(t, cmd)
	want := fmt.Sprintf("nvmlInit_v2 = %d", int(nvml.ERROR_DRIVER_NOT_LOADED))
	if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != want || !strings.Contains(res.Stderr, "SIMCUDA_DEVICES") {
		t.Fatalf("nvml_api init with SIMCUDA_DEVICES=16XB: exit %d\nstdout:\n%s\nstderr:\n%s\nwant stdout %q and stderr naming SIMCUDA_DEVICES",
			res.ExitCode, res.Stdout, res.Stderr, want)
	}
}

// BenchmarkNVMLMemoryInfo measures one nvmlDeviceGetMemoryInfo while four
// processes publish usage: each call scans the state folder.
func BenchmarkNVMLMemoryInfo(b *testing.B) {
	bin := buildNVMLHolder(b)
	state := b.TempDir()
	for range 4 {
		startNVMLHolder(b, bin, state, nvmlHolderSpec{devices: "16GiB", sizes: []uint64{8 * nvmlMiB}})
	}
	dev := nvmlDevice(b, openNVML(b, state, "16GiB"), 0)
	for b.Loop() {
		if mem, ret := dev.GetMemoryInfo(); ret != nvml.SUCCESS || mem.Used != harness.NVMLReserved+32*nvmlMiB {
			b.Fatalf("GetMemoryInfo = %+v, %v; want the driver's reserve and 32 MiB used", mem, ret)
		}
	}
}
