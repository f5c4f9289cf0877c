package interpose

import (
	"strings"
	"testing"
	"unsafe"
)

// Every constructor over the front's table of real functions refuses a
// missing table, and one shorter than this build's (a front from another
// build), naming the sizes.
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
		}
	}
}
