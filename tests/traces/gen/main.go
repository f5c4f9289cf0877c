// Command gen writes the reference traces of package traces into a
// directory (by default the current one):
//
//	go run ./tests/traces/gen -o tests/traces
//
// Its output must never depend on when or where it runs (the models use
// seeded generators, and Store writes no name or time): regenerating must
// reproduce the committed traces, which traces_test checks.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spillway-gpu/spillway/tests/traces"
)

func main() {
	out := flag.String("o", ".", "directory to write the traces into")
	flag.Parse()
	for _, ref := range traces.References {
		ops := ref.Generate()
		path := filepath.Join(*out, ref.File)
		if err := traces.Store(path, ref.Model, ops); err != nil {
			fmt.Fprintf(os.Stderr, "gen: %v\n", err)
			os.Exit(1)
		}
		st, err := traces.Summarize(ops)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gen: %s: %v\n", ref.File, err)
			os.Exit(1)
		}
		fmt.Printf("%s: %d operations, %d allocations, %d syncs, peak live %d bytes in at most %d blocks\n",
			path, st.Ops, st.Allocs, st.Syncs, st.PeakLive, st.PeakBlocks)
	}
}
