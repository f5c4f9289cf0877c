package main

import (
	"strings"
	"testing"
)

const sample = `goos: linux
goarch: amd64
pkg: github.com/spillway-gpu/spillway/pool
cpu: Some CPU
BenchmarkPair/random/live=1000-2         	 9999	       116.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkPair/random/sync/live=1000-2    	 9999	       172.5 ns/op	         0.01088 syncs/pair
BenchmarkTrace/qwen-inference-2          	   10	  5000000 ns/op	       107.0 ns/pair	         1.004 reserved/live
PASS
ok  	github.com/spillway-gpu/spillway/pool	12.3s
pkg: github.com/spillway-gpu/spillway/tests/shimtest
BenchmarkStartup-2    	      10	  99999 ns/op	 46.00 added-µs	 812.0 plain-µs	 858.0 shim-µs
BenchmarkNew-2    	      10	  42 ns/op
--- FAIL: BenchmarkBroken
`

func TestSummary(t *testing.T) {
	results, err := parse(strings.NewReader(sample))
	if err != nil || len(results) != 5 {
		t.Fatalf("%d results, %v", len(results), err)
	}
	var b strings.Builder
	write(&b, results, "this machine: test")
	for _, want := range []string{
		"Performance, measured on this machine: test (figures are this machine's, not a reference)",
		"| the pool alone, alloc+free pair (random/live=1000) | 116.0 ns/op | `BenchmarkPair` in `pool` |",
		"| the pool alone, alloc+free pair (random/sync/live=1000) | 172.5 ns/op, 0.01088 syncs/pair | `BenchmarkPair` in `pool` |",
		"| replayed trace: ns per pair, peak reserved / peak live (qwen-inference) | 107.0 ns/pair, 1.004 reserved/live | `BenchmarkTrace` in `pool` |",
		"| a process start with the shim preloaded | 46.00 added-µs, 812.0 plain-µs, 858.0 shim-µs | `BenchmarkStartup` in `tests/shimtest` |",
		"| New | 42 ns/op | `BenchmarkNew` in `tests/shimtest` |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, b.String())
		}
	}
}
