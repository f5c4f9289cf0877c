package devmem

import (
	"sync"
	"sync/atomic"

	"github.com/spillway-gpu/spillway/interpose"
	"github.com/spillway-gpu/spillway/pool"
)

// graphHolds keeps the pool's blocks freed during a stream capture. CUDA
// gives such memory to the graph being captured: every launch of an
// executable graph made from it reuses the block's address, so the block
// must not be handed out again until the graph and every executable graph
// instantiated from it (through the calls the front interposes: README,
// Limits) are destroyed; it is then freed as by cudaFree (it becomes
// reusable at the next synchronization, after launches in flight).
// A capture that fails destroys its graph: the front reports it as such.
// Bytes taken outside the pool (an explicit pool's or a created context's
// allocation) freed during a capture are kept the same way: the memory is
// the graph's until then, so its bytes stay counted.
type graphHolds struct {
	// begun is set once a capture has begun in the process: only then are
	// frees checked for one (a query of the stream per cudaFreeAsync).
	begun  atomic.Bool
	mu     sync.Mutex
	graphs map[uint64]*graphHold // by graph, until it is destroyed
	execs  map[uint64]*graphHold // by executable graph
}

type graphHold struct {
	d      *device // whose pool the blocks are of; nil while there are none
	blocks []interpose.DevicePtr
	taken  []takenBytes
	refs   int // the graph while it exists, and each executable graph
}

// takenBytes are bytes taken outside the pool from a device's ledger.
type takenBytes struct {
	ledger *deviceLedger
	size   uint64
}

// holdLocked returns graph's hold, made at its first use; g.mu is held.
func (g *graphHolds) holdLocked(graph uint64) *graphHold {
	if g.graphs == nil {
		g.graphs, g.execs = map[uint64]*graphHold{}, map[uint64]*graphHold{}
	}
	h := g.graphs[graph]
	if h == nil {
		h = &graphHold{refs: 1}
		g.graphs[graph] = h
	}
	return h
}

// heldByGraph keeps p, a live block of d's pool freed on stream s, for the
// graph s is capturing, and reports whether it did: only while s captures.
func (m *memory) heldByGraph(d *device, p interpose.DevicePtr, s interpose.Stream) bool {
	real := asyncStream(pool.Stream(s))
	if !m.graphs.begun.Load() || real == 0 || real == interpose.StreamLegacy {
		return false // the legacy stream never captures
	}
	status, graph, rc := m.rt.StreamCapture(real)
	if rc != interpose.Success || status != interpose.CaptureActive || graph == 0 {
		return false
	}
	if _, ok := d.pool.Lookup(uint64(p)); !ok {
		return false // the pool answers as for any free
	}
	g := &m.graphs
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.holdLocked(graph)
	if h.d == nil {
		h.d = d
	}
	h.blocks = append(h.blocks, p)
	return true
}

// keepForGraph keeps size bytes taken outside the pool from ledger, whose
// allocation was freed during the capture of graph, until the graph and
// every executable graph instantiated from it are destroyed.
func (m *memory) keepForGraph(graph uint64, ledger *deviceLedger, size uint64) {
	g := &m.graphs
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.holdLocked(graph)
	h.taken = append(h.taken, takenBytes{ledger: ledger, size: size})
}

// graphInstantiated records exec, instantiated from graph.
func (m *memory) graphInstantiated(exec, graph uint64) {
	g := &m.graphs
	g.mu.Lock()
	defer g.mu.Unlock()
	if h := g.graphs[graph]; h != nil {
		h.refs++
		g.execs[exec] = h
	}
}

// graphGone forgets a destroyed graph (exec false) or executable graph, and
// frees the blocks held for the last of them.
func (m *memory) graphGone(handle uint64, exec bool) {
	g := &m.graphs
	g.mu.Lock()
	table := g.graphs
	if exec {
		table = g.execs
	}
	h := table[handle]
	if h == nil {
		g.mu.Unlock()
		return
	}
	delete(table, handle)
	h.refs--
	blocks, taken := h.blocks, h.taken
	if h.refs > 0 {
		blocks, taken = nil, nil
	}
	g.mu.Unlock()
	for _, p := range blocks {
		if rc := m.free(p, 0, false); rc != interpose.Success {
			m.log.Warnf("freeing %#x, held for a CUDA graph until it was destroyed: %v", uint64(p), rc)
		}
	}
	for _, t := range taken {
		t.ledger.giveTaken(t.size, false)
	}
}

// forgetDevice drops the holds' blocks of d's pool, which a reset closes:
// its blocks are gone with it, and a graph handle the driver gives again
// later must not free addresses a new pool hands out. Bytes taken outside
// the pool outlive the reset, as the ledger does, and stay held.
func (m *memory) forgetDevice(d *device) {
	g := &m.graphs
	g.mu.Lock()
	defer g.mu.Unlock()
	tables := []map[uint64]*graphHold{g.graphs, g.execs}
	for _, table := range tables {
		for handle, h := range table {
			if h.d == d && len(h.taken) == 0 {
				delete(table, handle)
			}
		}
	}
	for _, table := range tables {
		for _, h := range table {
			if h.d == d {
				h.d, h.blocks = nil, nil
			}
		}
	}
}
