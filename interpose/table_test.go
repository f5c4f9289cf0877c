package interpose

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"
)

// Every constructor over the front's table of real functions refuses a
// missing table, and one shorter than this build's (a front from another
// build), naming the sizes; a table of this build's size or longer (a
// newer front's) is read, and here refused only for the functions it lacks.
// NewHostAccess is the exception: the core starts on drivers without
// virtual memory management, so a missing cuMemSetAccess is answered at the
// grant (CUDA_ERROR_NOT_FOUND, ErrorSymbolNotFound), not at the start.
func TestRealTableRefused(t *testing.T) {
	short := []uint64{8} // the table's leading size field says 8 bytes
	constructors := map[string]func(unsafe.Pointer) error{
		"NewRuntime":       func(p unsafe.Pointer) error { _, err := NewRuntime(p); return err },
		"NewDriverRuntime": func(p unsafe.Pointer) error { _, err := NewDriverRuntime(p); return err },
		"NewVMM":           func(p unsafe.Pointer) error { _, err := NewVMM(p, 0); return err },
		"NewHostAccess":    func(p unsafe.Pointer) error { _, err := NewHostAccess(p); return err },
	}
	for name, construct := range constructors {
		if err := construct(nil); err == nil || err.Error() != "no real-function table" {
			t.Errorf("%s(nil): %v, want no real-function table", name, err)
		}
		err := construct(unsafe.Pointer(&short[0]))
		if err == nil || !strings.HasPrefix(err.Error(), "real-function table of 8 bytes, want at least ") {
			t.Errorf("%s of an 8-byte table: %v, want it refused for its size", name, err)
			continue
		}
		var size uint64
		if _, scanErr := fmt.Sscanf(err.Error(), "real-function table of 8 bytes, want at least %d", &size); scanErr != nil || size%8 != 0 {
			t.Fatalf("%s: no size of whole words in %q: %v", name, err, scanErr)
		}
		for _, words := range []uint64{size / 8, size/8 + 8} {
			empty := make([]uint64, words) // every function absent
			empty[0] = words * 8
			if name == "NewHostAccess" {
				h, err := NewHostAccess(unsafe.Pointer(&empty[0]))
				if err != nil {
					t.Errorf("NewHostAccess of a table of %d bytes without functions: %v, want it read", words*8, err)
				} else if rc := h.Grant(0, 0); rc != ErrorSymbolNotFound {
					t.Errorf("a grant without cuMemSetAccess: %v, want %v (CUDA_ERROR_NOT_FOUND)", rc, ErrorSymbolNotFound)
				}
				continue
			}
			err := construct(unsafe.Pointer(&empty[0]))
			if err == nil || !strings.HasPrefix(err.Error(), "the real ") || !strings.HasSuffix(err.Error(), " was not found") {
				t.Errorf("%s of a table of %d bytes without functions: %v, want the first function it lacks named", name, words*8, err)
			}
		}
	}
}
