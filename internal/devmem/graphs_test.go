package devmem

import (
	"testing"

	"github.com/spillway-gpu/spillway/interpose"
)

// A block freed with cudaFreeAsync while its stream captures stays live for
// the graph until the graph and each executable graph made from it are
// destroyed, in either order; before any capture began, frees do not ask
// whether their stream captures.
func TestGraphHolds(t *testing.T) {
	for _, graphFirst := range []bool{true, false} {
		rt := newFake(1 << 30)
		m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB")
		const s = interpose.Stream(0x7000)
		const graph = 0x9000 + uint64(s) // the fake's graph for s
		live := func() uint64 { return m.existing(0).pool.Stats().LiveBytes }

		a, _ := m.malloc(request{size: 4096, kind: kindAsync, stream: s})
		rt.capturing[s] = true
		if rc := m.free(a, s, true); rc != interpose.Success || live() != 0 {
			t.Fatalf("a free before any capture began: %v, %d bytes live; want it freed", rc, live())
		}
		m.graphs.begun.Store(true)
		b, _ := m.malloc(request{size: 4096, kind: kindAsync, stream: s})
		if rc := m.free(b, s, true); rc != interpose.Success || live() != 4096 {
			t.Fatalf("a free during a capture: %v, %d bytes live; want the block kept", rc, live())
		}
		delete(rt.capturing, s)
		m.graphInstantiated(0xe1, graph)
		m.graphInstantiated(0xe2, graph)
		m.graphInstantiated(0xe3, 0x1234) // another graph: nothing held
		gone := []struct {
			handle uint64
			exec   bool
		}{{0xe1, true}, {graph, false}, {0xe2, true}}
		if !graphFirst {
			gone[0], gone[1] = gone[1], gone[0]
		}
		for i, g := range gone {
			m.graphGone(g.handle, g.exec)
			if want := map[bool]uint64{true: 0, false: 4096}[i == len(gone)-1]; live() != want {
				t.Fatalf("graph first %v, after destroying %#x: %d bytes live, want %d", graphFirst, g.handle, live(), want)
			}
		}
		m.graphGone(0xe3, true)
		m.graphGone(graph, false) // destroyed twice: nothing happens
		if len(m.graphs.graphs) != 0 || len(m.graphs.execs) != 0 {
			t.Fatalf("graph holds left: %v %v", m.graphs.graphs, m.graphs.execs)
		}
	}
}

// TestGraphHoldsEndAtReset: a reset frees what a graph held with the pool
// it closes; destroying the graph afterwards frees nothing of the next pool.
func TestGraphHoldsEndAtReset(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB")
	const s = interpose.Stream(0x7000)
	const graph = 0x9000 + uint64(s) // the fake's graph for s
	m.graphs.begun.Store(true)
	b, _ := m.malloc(request{size: 4096, kind: kindAsync, stream: s})
	rt.capturing[s] = true
	if rc := m.free(b, s, true); rc != interpose.Success || len(m.graphs.graphs) != 1 {
		t.Fatalf("a free during a capture: %v, holds %v", rc, m.graphs.graphs)
	}
	delete(rt.capturing, s)
	if rc := m.deviceReset(0, m.rt.DeviceReset); rc != interpose.Success {
		t.Fatal(rc)
	}
	if len(m.graphs.graphs) != 0 {
		t.Fatalf("holds left after the reset: %v", m.graphs.graphs)
	}
	p, rc := m.malloc(request{size: 4096})
	if rc != interpose.Success {
		t.Fatal(rc)
	}
	m.graphGone(graph, false)
	if live := m.existing(0).pool.Stats().LiveBytes; live != 4096 {
		t.Fatalf("after destroying the graph held before the reset: %d bytes live, want %#x's 4096", live, uint64(p))
	}
}

// TestGraphKeepsTakenBytes: bytes taken outside the pool and freed into a
// graph beside a pool block stay counted through a reset, which drops the
// block, and are given back once the graph and its executable graph are gone.
func TestGraphKeepsTakenBytes(t *testing.T) {
	rt := newFake(1 << 30)
	m := newTestMemory(t, rt, "SPILLWAY_MEMORY_LIMIT=64MiB")
	const s = interpose.Stream(0x7000)
	const graph = 0x9000 + uint64(s) // the fake's graph for s
	m.graphs.begun.Store(true)
	b, _ := m.malloc(request{size: 4096, kind: kindAsync, stream: s})
	rt.capturing[s] = true
	if rc := m.free(b, s, true); rc != interpose.Success {
		t.Fatal(rc)
	}
	delete(rt.capturing, s)
	l := m.ledgerAt(0)
	if !l.takeOutside(charge(8<<20), false) {
		t.Fatal("8 MiB outside the pool refused under a 64 MiB quota")
	}
	m.keepForGraph(graph, l, 8<<20)
	m.graphInstantiated(0xe1, graph)
	if rc := m.deviceReset(0, m.rt.DeviceReset); rc != interpose.Success {
		t.Fatal(rc)
	}
	m.graphGone(graph, false)
	if used := l.used(); used != 8<<20 {
		t.Fatalf("after the reset and the graph's destruction, its executable graph alive: %d bytes used, want the 8 MiB kept", used)
	}
	m.graphGone(0xe1, true)
	if used := l.used(); used != 0 {
		t.Fatalf("after the last executable graph's destruction: %d bytes used, want 0", used)
	}
	if len(m.graphs.graphs) != 0 || len(m.graphs.execs) != 0 {
		t.Fatalf("graph holds left: %v %v", m.graphs.graphs, m.graphs.execs)
	}
}
