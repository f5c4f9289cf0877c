package devmem

import (
	"strconv"
	"strings"
	"testing"
)

func TestCheckABI(t *testing.T) {
	const version = 7
	if err := checkABI(version, version); err != nil {
		t.Errorf("a front with this core's version %d refused: %v", version, err)
	}
	err := checkABI(version+1, version)
	if err == nil {
		t.Fatalf("a front with version %d accepted by a core with %d", version+1, version)
	}
	for _, want := range []string{strconv.Itoa(version), strconv.Itoa(version + 1), "same build"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
