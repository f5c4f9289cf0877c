package main

import (
	"strconv"
	"strings"
	"testing"
)

func TestCheckABI(t *testing.T) {
	if err := checkABI(abiVersion); err != nil {
		t.Errorf("a front with this core's version %d refused: %v", abiVersion, err)
	}
	err := checkABI(abiVersion + 1)
	if err == nil {
		t.Fatalf("a front with version %d accepted by a core with %d", abiVersion+1, abiVersion)
	}
	for _, want := range []string{strconv.Itoa(abiVersion), strconv.Itoa(abiVersion + 1), "same build"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
