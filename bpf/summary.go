package bpf

import (
	"encoding/json"
	"maps"
	"strconv"
)

// Summary accumulates records into the totals a session reports. Its JSON
// form is the schema of `spillway trace --summary-json` (see README).
type Summary struct {
	// Calls counts the application's calls per function name, at the
	// outermost probed layer (see the package comment); Errors counts those
	// that returned an error.
	Calls  map[string]uint64 `json:"calls"`
	Errors map[string]uint64 `json:"errors"`
	// MemcpyBytes sums the bytes of successful copies by direction: h2d, d2h,
	// d2d, default (cudaMemcpyDefault and the driver's cuMemcpy, whose
	// direction the driver infers) and h2h.
	MemcpyBytes   map[string]uint64 `json:"memcpy_bytes"`
	PrefetchBytes uint64            `json:"prefetch_bytes"`
	// AllocBytes sums the sizes of successful allocation calls.
	AllocBytes   uint64      `json:"alloc_bytes"`
	PageFaults   FaultCounts `json:"page_faults"`
	SpillBytes   uint64      `json:"spill_bytes"`
	PromoteBytes uint64      `json:"promote_bytes"`
	Pool         PoolCounts  `json:"pool"`
	UVM          UVMCounts   `json:"uvm"`
	// Processes holds per-process figures by pid.
	Processes map[string]*ProcessCounts `json:"processes"`
	// Drops counts records the kernel could not fit in the ring buffer; the
	// other figures are short by as many records.
	Drops uint64 `json:"drops"`
	// Unpaired counts calls whose return matched another function's entry.
	Unpaired uint64 `json:"unpaired"`
	// Steps counts the application's successful device synchronizations
	// (cudaDeviceSynchronize, cuCtxSynchronize at the outermost layer): the
	// steps of a job that reads a result back each step.
	Steps uint64 `json:"steps"`
	// MovedBytes sums the bytes the shim moved between device and host:
	// spilled and promoted.
	MovedBytes uint64 `json:"moved_bytes"`
	// Accesses counts the application's copies and memsets of device memory.
	Accesses AccessCounts `json:"accesses"`
}

// AccessCounts counts successful copies and memsets that name device
// memory (every copy but host to host), and those that touched memory the
// shim had spilled to the host: a range whose first or last byte lay in a
// spilled allocation when the call returned. Its JSON form adds the
// spilled fractions, by count and by bytes (null when there was none).
type AccessCounts struct {
	Total        uint64 `json:"total"`
	Spilled      uint64 `json:"spilled"`
	Bytes        uint64 `json:"bytes"`
	SpilledBytes uint64 `json:"spilled_bytes"`
}

// Fractions returns the shares of accesses, by count and by bytes, that
// touched spilled memory; ok is false when there were no accesses.
func (a AccessCounts) Fractions() (count, bytes float64, ok bool) {
	if a.Total == 0 {
		return 0, 0, false
	}
	count = float64(a.Spilled) / float64(a.Total)
	if a.Bytes > 0 {
		bytes = float64(a.SpilledBytes) / float64(a.Bytes)
	}
	return count, bytes, true
}

// Since returns the accesses counted after prev.
func (a AccessCounts) Since(prev AccessCounts) AccessCounts {
	return AccessCounts{
		Total:        a.Total - prev.Total,
		Spilled:      a.Spilled - prev.Spilled,
		Bytes:        a.Bytes - prev.Bytes,
		SpilledBytes: a.SpilledBytes - prev.SpilledBytes,
	}
}

// MarshalJSON writes the counts and the fractions spilled_fraction and
// spilled_bytes_fraction.
func (a AccessCounts) MarshalJSON() ([]byte, error) {
	type counts AccessCounts
	out := struct {
		counts
		SpilledFraction      *float64 `json:"spilled_fraction"`
		SpilledBytesFraction *float64 `json:"spilled_bytes_fraction"`
	}{counts: counts(a)}
	if n, b, ok := a.Fractions(); ok {
		out.SpilledFraction, out.SpilledBytesFraction = &n, &b
	}
	return json.Marshal(out)
}

// PerStep returns bytes divided by the steps; ok is false without steps.
func PerStep(bytes, steps uint64) (float64, bool) {
	if steps == 0 {
		return 0, false
	}
	return float64(bytes) / float64(steps), true
}

// FaultCounts counts CPU page faults, and those on spilled memory.
type FaultCounts struct {
	Total   uint64 `json:"total"`
	Spilled uint64 `json:"spilled"`
}

// PoolCounts is the shim's view, from its probe points. Each allocation the
// shim serves is counted once in Allocs and in exactly one of CacheHits,
// DeviceReservations, SpilledAllocs, PassThrough and ManagedAllocs.
type PoolCounts struct {
	Allocs uint64 `json:"allocs"`
	// CacheHits were served from memory the pool held; DeviceReservations
	// needed a new device segment (SPILLWAY_REPORT's cache_hits and
	// device_reservations).
	CacheHits          uint64 `json:"cache_hits"`
	DeviceReservations uint64 `json:"device_reservations"`
	// SpilledAllocs were served from host memory (oversubscription): one per
	// spill.
	SpilledAllocs uint64 `json:"spilled_allocs"`
	// PassThrough went to CUDA with the pool off (the report's pass_through).
	PassThrough uint64 `json:"pass_through"`
	// ManagedAllocs are the application's own cudaMallocManaged
	// allocations, counted against the quota but never pooled.
	ManagedAllocs uint64 `json:"managed_allocs"`
	Frees         uint64 `json:"frees"`
	// Syncs are the synchronizations after which freed memory became
	// reusable: those the pool forced and those the application made (the
	// report's syncs plus external_syncs), and the bytes they made reusable.
	Syncs             uint64 `json:"syncs"`
	SyncReusableBytes uint64 `json:"sync_reusable_bytes"`
	Spills            uint64 `json:"spills"`
	Promotes          uint64 `json:"promotes"`
	Refusals          uint64 `json:"refusals"`
	RefusedBytes      uint64 `json:"refused_bytes"`
}

// HitRate is the share of the pool's allocations served from its cache (a
// spilled allocation is a miss), and false when the pool served none.
func (p PoolCounts) HitRate() (float64, bool) {
	served := p.CacheHits + p.DeviceReservations + p.SpilledAllocs
	if served == 0 {
		return 0, false
	}
	return float64(p.CacheHits) / float64(served), true
}

// UVMCounts is nvidia-uvm's view, where it is traced.
type UVMCounts struct {
	Faults         uint64 `json:"faults"`
	Migrations     uint64 `json:"migrations"`
	MigrationBytes uint64 `json:"migration_bytes"`
}

// ProcessCounts are one process's figures.
type ProcessCounts struct {
	Calls      uint64      `json:"calls"`
	PageFaults FaultCounts `json:"page_faults"`
	Exited     bool        `json:"exited"`
}

// NewSummary returns an empty summary whose maps hold every key the schema
// promises, at zero.
func NewSummary() *Summary {
	s := &Summary{
		Calls:       map[string]uint64{},
		Errors:      map[string]uint64{},
		MemcpyBytes: map[string]uint64{},
		Processes:   map[string]*ProcessCounts{},
	}
	for _, d := range []Direction{HostToDevice, DeviceToHost, DeviceToDevice, DirectionDefault, HostToHost} {
		s.MemcpyBytes[d.String()] = 0
	}
	return s
}

func (s *Summary) process(pid uint32) *ProcessCounts {
	key := strconv.FormatUint(uint64(pid), 10)
	p := s.Processes[key]
	if p == nil {
		p = &ProcessCounts{}
		s.Processes[key] = p
	}
	return p
}

// Add accounts for one record.
func (s *Summary) Add(e *Event) {
	switch e.Kind {
	case KindAPI:
		s.addCall(e)
	case KindProbe:
		s.addProbe(e)
	case KindFault:
		p := s.process(e.PID)
		s.PageFaults.Total++
		p.PageFaults.Total++
		if e.Spilled() {
			s.PageFaults.Spilled++
			p.PageFaults.Spilled++
		}
	case KindExit:
		s.process(e.PID).Exited = true
	case KindUVMFault:
		s.UVM.Faults++
	case KindUVMMigration:
		s.UVM.Migrations++
		s.UVM.MigrationBytes += e.Size()
	}
}

func (s *Summary) addCall(e *Event) {
	name := e.Func.String()
	s.Calls[name]++
	s.process(e.PID).Calls++
	if e.Unpaired() {
		s.Unpaired++
	}
	if !e.OK() {
		s.Errors[name]++
		return
	}
	switch e.Func.Op() {
	case OpAlloc:
		s.AllocBytes += e.Size()
	case OpMemcpy:
		if d := e.Direction(); d != DirectionInvalid {
			s.MemcpyBytes[d.String()] += e.Size()
		}
	case OpPrefetch:
		s.PrefetchBytes += e.Size()
	case OpSync:
		s.Steps++
	}
	s.addAccess(e)
}

// addAccess counts a successful copy or memset of device memory.
func (s *Summary) addAccess(e *Event) {
	op, dir := e.Func.Op(), e.Direction()
	if op != OpMemset && (op != OpMemcpy || dir == HostToHost || dir == DirectionInvalid) {
		return
	}
	size := e.Size()
	s.Accesses.Total++
	s.Accesses.Bytes += size
	if e.Spilled() {
		s.Accesses.Spilled++
		s.Accesses.SpilledBytes += size
	}
}

func (s *Summary) addProbe(e *Event) {
	switch e.Probe {
	case ProbeAlloc:
		s.Pool.Allocs++
		host := e.Tier() != TierDevice
		switch src := e.Source(); {
		case src == SourcePassThrough && host:
			s.Pool.ManagedAllocs++
		case src == SourcePassThrough:
			s.Pool.PassThrough++
		case host:
			s.Pool.SpilledAllocs++
		case src == SourceCache:
			s.Pool.CacheHits++
		default:
			s.Pool.DeviceReservations++
		}
	case ProbeFree:
		s.Pool.Frees++
	case ProbeSync:
		s.Pool.Syncs++
		s.Pool.SyncReusableBytes += e.Size()
	case ProbeSpill:
		s.Pool.Spills++
		s.SpillBytes += e.Size()
		s.MovedBytes += e.Size()
	case ProbePromote:
		s.Pool.Promotes++
		s.PromoteBytes += e.Size()
		s.MovedBytes += e.Size()
	case ProbeRefuse:
		s.Pool.Refusals++
		s.Pool.RefusedBytes += e.Size()
	}
}

// Clone returns a deep copy, for computing what changed in an interval.
func (s *Summary) Clone() *Summary {
	c := *s
	c.Calls = maps.Clone(s.Calls)
	c.Errors = maps.Clone(s.Errors)
	c.MemcpyBytes = maps.Clone(s.MemcpyBytes)
	c.Processes = make(map[string]*ProcessCounts, len(s.Processes))
	for k, v := range s.Processes {
		p := *v
		c.Processes[k] = &p
	}
	return &c
}

// CallsOf sums the calls of every function doing op.
func (s *Summary) CallsOf(op Op) uint64 {
	var n uint64
	for _, f := range Funcs() {
		if f.Op() == op {
			n += s.Calls[f.String()]
		}
	}
	return n
}
