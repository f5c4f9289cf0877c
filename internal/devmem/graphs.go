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
type graphHolds struct {
	// begun is set once a capture has begun in the process: only then are
	// frees checked for one (a query of the stream per cudaFreeAsync).
	begun  atomic.Bool
	mu     sync.Mutex
	graphs map[uint64]*graphHold // by graph, until it is destroyed
	execs  map[uint64]*graphHold // by executable graph
}

type graphHold struct {
	d      *device // whose pool the blocks are of
	blocks []interpose.DevicePtr
	refs   int // the graph while it exists, and each executable graph
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
	if g.graphs == nil {
		g.graphs, g.execs = map[uint64]*graphHold{}, map[uint64]*graphHold{}
	}
	h := g.graphs[graph]
	if h == nil {
		h = &graphHold{d: d, refs: 1}
		g.graphs[graph] = h
	}
	h.blocks = append(h.blocks, p)
	return true
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
	blocks := h.blocks
	if h.refs > 0 {
		blocks = nil
	}
	g.mu.Unlock()
	for _, p := range blocks {
		if rc := m.free(p, 0, false); rc != interpose.Success {
			m.log.Warnf("freeing %#x, held for a CUDA graph until it was destroyed: %v", uint64(p), rc)
		}
	}
}

// forgetDevice drops the holds for d's pool, which a reset closes: its
// blocks are gone with it, and a graph handle the driver gives again later
// must not free addresses a new pool hands out.
func (m *memory) forgetDevice(d *device) {
	g := &m.graphs
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, table := range []map[uint64]*graphHold{g.graphs, g.execs} {
		for handle, h := range table {
			if h.d == d {
				delete(table, handle)
			}
		}
	}
}
