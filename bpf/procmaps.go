package bpf

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// mapping is one file-backed executable line of /proc/PID/maps.
type mapping struct {
	start, end uint64
	dev        string // "major:minor", in hex as the kernel prints it
	inode      uint64
	path       string
}

// processMaps returns the executable mappings of files in process pid.
func processMaps(pid int) ([]mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, fmt.Errorf("pid %d: %w", pid, err)
	}
	defer f.Close()
	maps, err := parseMaps(f)
	if err != nil {
		return nil, fmt.Errorf("pid %d: %w", pid, err)
	}
	return maps, nil
}

// parseMaps returns the executable mappings of files in a /proc/PID/maps
// listing; anonymous and special ([vdso], ...) mappings are left out.
func parseMaps(r io.Reader) ([]mapping, error) {
	var out []mapping
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for s.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(s.Text())
		if len(fields) < 6 || !strings.Contains(fields[1], "x") || !strings.HasPrefix(fields[5], "/") {
			continue
		}
		addrs := strings.SplitN(fields[0], "-", 2)
		if len(addrs) != 2 {
			return nil, fmt.Errorf("maps line %q: bad address range", s.Text())
		}
		start, err1 := strconv.ParseUint(addrs[0], 16, 64)
		end, err2 := strconv.ParseUint(addrs[1], 16, 64)
		inode, err3 := strconv.ParseUint(fields[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("maps line %q: bad number", s.Text())
		}
		out = append(out, mapping{
			start: start,
			end:   end,
			dev:   fields[3],
			inode: inode,
			// Paths may contain spaces; " (deleted)" marks a replaced file.
			path: strings.Join(fields[5:], " "),
		})
	}
	return out, s.Err()
}
