package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrPrivilege is returned (wrapped) when the process may not load and attach
// the probes.
var ErrPrivilege = errors.New("tracing needs root, or CAP_BPF with CAP_PERFMON")

// Capability bit numbers (linux/capability.h).
const (
	capSysAdmin = 21
	capPerfmon  = 38
	capBPF      = 39
)

// CheckPrivileges reports, before anything is loaded, whether this process
// holds what tracing needs: CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN (which
// root has). The error names the capabilities that are missing.
func CheckPrivileges() error {
	eff, err := effectiveCaps()
	if err != nil {
		return err
	}
	has := func(c uint) bool { return eff&(1<<c) != 0 }
	if has(capSysAdmin) || (has(capBPF) && has(capPerfmon)) {
		return nil
	}
	var missing []string
	if !has(capBPF) {
		missing = append(missing, "CAP_BPF")
	}
	if !has(capPerfmon) {
		missing = append(missing, "CAP_PERFMON")
	}
	return fmt.Errorf("%w: running as uid %d without %s", ErrPrivilege, os.Geteuid(), strings.Join(missing, " and "))
}

func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read capabilities: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("parse CapEff %q in /proc/self/status: %w", v, err)
			}
			return caps, nil
		}
	}
	if err := s.Err(); err != nil {
		return 0, fmt.Errorf("read /proc/self/status: %w", err)
	}
	return 0, errors.New("no CapEff line in /proc/self/status")
}
