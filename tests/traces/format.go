// Package traces reads, writes and generates the reference allocation traces
// the pool is benchmarked with, and replays them against an allocator. The
// trace format and the models are described in README.md. It is test
// infrastructure and must never be imported outside tests, benchmarks and
// the generator.
package traces

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Kind is the kind of a trace operation.
type Kind byte

// The operations, with the letter that starts their line.
const (
	Alloc      Kind = 'a' // a ID SIZE: cudaMalloc
	AllocAsync Kind = 'A' // A ID SIZE STREAM: cudaMallocAsync
	Free       Kind = 'f' // f ID: cudaFree
	FreeAsync  Kind = 'F' // F ID STREAM: cudaFreeAsync
	Sync       Kind = 's' // s: the application synchronizes the device
)

// Op is one trace operation. IDs name live allocations; an ID is reused once
// its allocation is freed, so IDs stay below the peak live count.
type Op struct {
	Kind   Kind
	ID     uint32
	Size   uint64
	Stream uint64
}

const header = "# spillway allocation trace v1"

// Write writes a trace in the text format (uncompressed) with a header line
// and a comment naming the model.
func Write(w io.Writer, model string, ops []Op) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "%s\n# %s\n", header, model)
	var buf []byte
	for _, op := range ops {
		buf = append(buf[:0], byte(op.Kind))
		switch op.Kind {
		case Alloc, AllocAsync:
			buf = append(buf, ' ')
			buf = strconv.AppendUint(buf, uint64(op.ID), 10)
			buf = append(buf, ' ')
			buf = strconv.AppendUint(buf, op.Size, 10)
		case Free, FreeAsync:
			buf = append(buf, ' ')
			buf = strconv.AppendUint(buf, uint64(op.ID), 10)
		}
		if op.Kind == AllocAsync || op.Kind == FreeAsync {
			buf = append(buf, ' ')
			buf = strconv.AppendUint(buf, op.Stream, 10)
		}
		buf = append(buf, '\n')
		if _, err := bw.Write(buf); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// Read parses a trace in the text format.
func Read(r io.Reader) ([]Op, error) {
	sc := bufio.NewScanner(r)
	var ops []Op
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if line == 1 && text != header {
			return nil, fmt.Errorf("trace line 1: %q is not the header %q", text, header)
		}
		if text == "" || text[0] == '#' {
			continue
		}
		op, err := parse(text)
		if err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		ops = append(ops, op)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if line == 0 {
		return nil, fmt.Errorf("trace is empty; want the header %q", header)
	}
	return ops, nil
}

func parse(text string) (Op, error) {
	f := strings.Fields(text)
	op := Op{Kind: Kind(f[0][0])}
	want := map[Kind]int{Alloc: 3, AllocAsync: 4, Free: 2, FreeAsync: 3, Sync: 1}[op.Kind]
	if want == 0 || len(f[0]) != 1 {
		return op, fmt.Errorf("unknown operation %q; want one of a, A, f, F, s", f[0])
	}
	if len(f) != want {
		return op, fmt.Errorf("%q has %d fields; %q takes %d", text, len(f), f[0], want)
	}
	num := func(i, bits int) (uint64, error) {
		v, err := strconv.ParseUint(f[i], 10, bits)
		if err != nil {
			return 0, fmt.Errorf("field %d of %q: %w", i+1, text, err)
		}
		return v, nil
	}
	if want > 1 {
		id, err := num(1, 32)
		if err != nil {
			return op, err
		}
		op.ID = uint32(id)
	}
	var err error
	switch op.Kind {
	case Alloc, AllocAsync:
		if op.Size, err = num(2, 64); err != nil {
			return op, err
		}
		if op.Kind == AllocAsync {
			op.Stream, err = num(3, 64)
		}
	case FreeAsync:
		op.Stream, err = num(2, 64)
	}
	return op, err
}

// Load reads a gzip-compressed trace file.
func Load(path string) ([]Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	ops, err := Read(zr)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return ops, nil
}

// Store writes a gzip-compressed trace file. The gzip header carries no name
// or time, so the same trace always gives the same bytes.
func Store(path, model string, ops []Op) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	zw, err := gzip.NewWriterLevel(f, gzip.BestCompression)
	if err != nil {
		f.Close()
		return err
	}
	if err := Write(zw, model, ops); err != nil {
		f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Target is what a trace is replayed against.
type Target interface {
	Alloc(size uint64) (uint64, error)
	AllocAsync(size, stream uint64) (uint64, error)
	Free(ptr uint64) error
	FreeAsync(ptr, stream uint64) error
	Sync() error
}

// Replay runs ops against t. live holds the address of each ID and is grown
// as needed; pass the slice back in to replay again without allocating.
func Replay(t Target, ops []Op, live []uint64) ([]uint64, error) {
	for i, op := range ops {
		var err error
		switch op.Kind {
		case Alloc, AllocAsync:
			for int(op.ID) >= len(live) {
				live = append(live, 0)
			}
			if op.Kind == Alloc {
				live[op.ID], err = t.Alloc(op.Size)
			} else {
				live[op.ID], err = t.AllocAsync(op.Size, op.Stream)
			}
		case Free:
			err = t.Free(live[op.ID])
		case FreeAsync:
			err = t.FreeAsync(live[op.ID], op.Stream)
		case Sync:
			err = t.Sync()
		}
		if err != nil {
			return live, fmt.Errorf("trace operation %d (%c %d): %w", i, op.Kind, op.ID, err)
		}
	}
	return live, nil
}

// Stats summarizes a trace.
type Stats struct {
	Ops, Allocs, Syncs int
	PeakLive           uint64 // peak of the sum of live sizes, each rounded up to 512 bytes
	PeakBlocks         int
}

// Summarize computes a trace's stats and checks it is well formed: every
// free names a live ID, every allocation a free one.
func Summarize(ops []Op) (Stats, error) {
	var st Stats
	var live, blocks uint64
	sizes := map[uint32]uint64{}
	for i, op := range ops {
		st.Ops++
		switch op.Kind {
		case Alloc, AllocAsync:
			if _, busy := sizes[op.ID]; busy {
				return st, fmt.Errorf("operation %d allocates ID %d, already live", i, op.ID)
			}
			n := (op.Size + 511) &^ 511
			sizes[op.ID] = n
			live += n
			blocks++
			st.Allocs++
			st.PeakLive = max(st.PeakLive, live)
			st.PeakBlocks = max(st.PeakBlocks, int(blocks))
		case Free, FreeAsync:
			n, ok := sizes[op.ID]
			if !ok {
				return st, fmt.Errorf("operation %d frees ID %d, not live", i, op.ID)
			}
			delete(sizes, op.ID)
			live -= n
			blocks--
		case Sync:
			st.Syncs++
		}
	}
	return st, nil
}
