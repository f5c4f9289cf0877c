package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"golang.org/x/sys/unix"
)

const tracefsRoot = "/sys/kernel/tracing"

// ensureTracefs makes sure tracepoints can be looked up, mounting tracefs at
// its usual place when it is missing and this process may mount.
func ensureTracefs() error {
	if _, err := os.Stat(filepath.Join(tracefsRoot, "events")); err == nil {
		return nil
	}
	if err := unix.Mount("tracefs", tracefsRoot, "tracefs", 0, ""); err != nil {
		return fmt.Errorf("tracefs is not mounted at %s and mounting it failed (%w); mount it with `mount -t tracefs tracefs %s`",
			tracefsRoot, err, tracefsRoot)
	}
	return nil
}

var fieldOffset = regexp.MustCompile(`field:[^;]*\b(\w+);\s*offset:(\d+);`)

// tracepointFieldOffset reads the offset of field in a tracepoint's record
// from its tracefs format file: some layouts differ between kernels.
func tracepointFieldOffset(group, name, field string) (uint32, error) {
	path := filepath.Join(tracefsRoot, "events", group, name, "format")
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("tracepoint %s:%s: %w", group, name, err)
	}
	for _, m := range fieldOffset.FindAllSubmatch(data, -1) {
		if string(m[1]) == field {
			off, err := strconv.ParseUint(string(m[2]), 10, 8)
			if err != nil {
				return 0, fmt.Errorf("%s: offset of %s: %w", path, field, err)
			}
			return uint32(off), nil
		}
	}
	return 0, errors.New(path + ": no field " + field)
}
