package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-gpu/spillway/bpf"
)

// intervalView shows what changed since the last draw.
type intervalView interface {
	draw(cur *bpf.Summary)
	final(total *bpf.Summary) // after the last records are read
}

// interval is one interval's figures, the --json line format.
type interval struct {
	ElapsedS        float64            `json:"elapsed_s"`
	Final           bool               `json:"final,omitempty"` // the last interval, cut short: rates over a whole one
	IntervalS       float64            `json:"interval_s"`
	AllocsPerS      float64            `json:"allocs_per_s"`
	FreesPerS       float64            `json:"frees_per_s"`
	PoolHitRate     *float64           `json:"pool_hit_rate"` // null when the pool served no allocation
	MemcpyBytesPerS map[string]float64 `json:"memcpy_bytes_per_s"`
	SpillBytes      uint64             `json:"spill_bytes"`
	PromoteBytes    uint64             `json:"promote_bytes"`
	PageFaults      bpf.FaultCounts    `json:"page_faults"`
	Refusals        uint64             `json:"refusals"`
	Drops           uint64             `json:"drops"` // since the start
	Calls           map[string]uint64  `json:"calls"`
	// Steps, the bytes the shim moved and the accesses in the interval.
	Steps             uint64           `json:"steps"`
	MovedBytes        uint64           `json:"moved_bytes"`
	MovedBytesPerStep *float64         `json:"moved_bytes_per_step"` // null without steps
	Accesses          bpf.AccessCounts `json:"accesses"`
	totalPoolHitRate  *float64
	rateSecs          float64 // what counts are divided by for rates
}

// intervalOf computes the figures between two summaries. Rates are counts
// over rateSecs: the time between the two, or a whole interval for the last,
// partial one, whose counts are not extrapolated to a full second.
func intervalOf(prev, cur *bpf.Summary, elapsed, rateSecs float64) interval {
	iv := interval{
		rateSecs:        rateSecs,
		ElapsedS:        elapsed,
		IntervalS:       rateSecs, // rates times interval_s are the counts
		MemcpyBytesPerS: map[string]float64{},
		SpillBytes:      cur.SpillBytes - prev.SpillBytes,
		PromoteBytes:    cur.PromoteBytes - prev.PromoteBytes,
		PageFaults: bpf.FaultCounts{
			Total:   cur.PageFaults.Total - prev.PageFaults.Total,
			Spilled: cur.PageFaults.Spilled - prev.PageFaults.Spilled,
		},
		Refusals:   cur.Pool.Refusals - prev.Pool.Refusals,
		Drops:      cur.Drops,
		Calls:      map[string]uint64{},
		Steps:      cur.Steps - prev.Steps,
		MovedBytes: cur.MovedBytes - prev.MovedBytes,
		Accesses:   cur.Accesses.Since(prev.Accesses),
	}
	if v, ok := bpf.PerStep(iv.MovedBytes, iv.Steps); ok {
		iv.MovedBytesPerStep = &v
	}
	rate := func(n uint64) float64 {
		if rateSecs <= 0 {
			return 0
		}
		return float64(n) / rateSecs
	}
	iv.AllocsPerS = rate(cur.CallsOf(bpf.OpAlloc) - prev.CallsOf(bpf.OpAlloc))
	iv.FreesPerS = rate(cur.CallsOf(bpf.OpFree) - prev.CallsOf(bpf.OpFree))
	for k, v := range cur.MemcpyBytes {
		iv.MemcpyBytesPerS[k] = rate(v - prev.MemcpyBytes[k])
	}
	for k, v := range cur.Calls {
		if d := v - prev.Calls[k]; d > 0 {
			iv.Calls[k] = d
		}
	}
	iv.PoolHitRate = hitRate(bpf.PoolCounts{
		CacheHits:          cur.Pool.CacheHits - prev.Pool.CacheHits,
		DeviceReservations: cur.Pool.DeviceReservations - prev.Pool.DeviceReservations,
		SpilledAllocs:      cur.Pool.SpilledAllocs - prev.Pool.SpilledAllocs,
	})
	iv.totalPoolHitRate = hitRate(cur.Pool)
	return iv
}

// hitRate is the share of the pool's allocations served from its cache; nil
// when the pool served none (it is off, or idle).
func hitRate(p bpf.PoolCounts) *float64 {
	r, ok := p.HitRate()
	if !ok {
		return nil
	}
	return &r
}

// newIntervalView picks the table (f is a terminal; redrawn in place when
// nothing else writes there), JSON lines or plain lines.
func newIntervalView(f *os.File, asJSON bool, every time.Duration, inPlace bool) intervalView {
	base := viewClock{start: time.Now(), last: time.Now(), prev: bpf.NewSummary(), every: every}
	switch {
	case asJSON:
		return &jsonView{viewClock: base, enc: json.NewEncoder(f)}
	case isTTY(f):
		return &tableView{viewClock: base, w: f, inPlace: inPlace}
	default:
		return &lineView{viewClock: base, w: f}
	}
}

func isTTY(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// viewClock turns successive summaries into intervals.
type viewClock struct {
	start, last time.Time
	prev        *bpf.Summary
	every       time.Duration // the interval
}

// next is the interval since the last draw; final says it is the last,
// shorter one, whose rates are taken over a whole interval.
func (c *viewClock) next(cur *bpf.Summary, final bool) interval {
	now := time.Now()
	secs := now.Sub(c.last).Seconds()
	rateSecs := secs
	if final {
		rateSecs = max(secs, c.every.Seconds())
	}
	iv := intervalOf(c.prev, cur, now.Sub(c.start).Seconds(), rateSecs)
	// The last interval is marked even when it ran a whole interval or
	// more (the session ended as a tick was due).
	iv.Final = final
	c.last, c.prev = now, cur
	return iv
}

type jsonView struct {
	viewClock
	enc *json.Encoder
}

func (v *jsonView) draw(cur *bpf.Summary)    { _ = v.enc.Encode(v.next(cur, false)) }
func (v *jsonView) final(total *bpf.Summary) { _ = v.enc.Encode(v.next(total, true)) }

type lineView struct {
	viewClock
	w io.Writer
}

func (v *lineView) draw(cur *bpf.Summary)    { fmt.Fprintln(v.w, formatLine(v.next(cur, false))) }
func (v *lineView) final(total *bpf.Summary) { fmt.Fprintln(v.w, formatLine(v.next(total, true))) }

func formatLine(iv interval) string {
	hit := "-"
	if iv.PoolHitRate != nil {
		hit = fmt.Sprintf("%.1f%%", *iv.PoolHitRate*100)
	}
	return fmt.Sprintf("t=%.1fs allocs/s=%.0f frees/s=%.0f pool_hit=%s h2d=%s/s d2h=%s/s d2d=%s/s default=%s/s spilled=%s promoted=%s steps=%d moved/step=%s spilled_accesses=%s faults=%d spilled_faults=%d refusals=%d drops=%d",
		iv.ElapsedS, iv.AllocsPerS, iv.FreesPerS, hit,
		bytesText(iv.MemcpyBytesPerS["h2d"]), bytesText(iv.MemcpyBytesPerS["d2h"]),
		bytesText(iv.MemcpyBytesPerS["d2d"]), bytesText(iv.MemcpyBytesPerS["default"]),
		bytesText(float64(iv.SpillBytes)), bytesText(float64(iv.PromoteBytes)),
		iv.Steps, perStepText(iv.MovedBytesPerStep), spilledAccessText(iv.Accesses),
		iv.PageFaults.Total, iv.PageFaults.Spilled, iv.Refusals, iv.Drops)
}

// perStepText is bytes per step, or "-" without steps.
func perStepText(v *float64) string {
	if v == nil {
		return "-"
	}
	return bytesText(*v)
}

// spilledAccessText is the share of accesses that touched spilled memory,
// by count, or "-" without accesses.
func spilledAccessText(a bpf.AccessCounts) string {
	n, _, ok := a.Fractions()
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", n*100)
}

// tableView draws a table, redrawn in place when nothing else writes to
// the terminal, else printed below the last one.
type tableView struct {
	viewClock
	w       io.Writer
	inPlace bool
	lines   int // lines drawn last time, to move back over
}

func (v *tableView) draw(cur *bpf.Summary)    { v.render(v.next(cur, false), cur) }
func (v *tableView) final(total *bpf.Summary) { v.render(v.next(total, true), total) }

func (v *tableView) render(iv interval, total *bpf.Summary) {
	var b strings.Builder
	if v.lines > 0 && v.inPlace {
		fmt.Fprintf(&b, "\x1b[%dA", v.lines)
	} else if v.lines > 0 {
		b.WriteString("\n")
	}
	row := func(name, rate, sum string) {
		fmt.Fprintf(&b, "\x1b[2K%-22s %14s %14s\n", name, rate, sum)
	}
	fmt.Fprintf(&b, "\x1b[2Kspillway trace   %.0fs elapsed\n", iv.ElapsedS)
	row("", "per second", "total")
	row("allocations", fmt.Sprintf("%.0f", iv.AllocsPerS), fmt.Sprint(total.CallsOf(bpf.OpAlloc)))
	row("frees", fmt.Sprintf("%.0f", iv.FreesPerS), fmt.Sprint(total.CallsOf(bpf.OpFree)))
	row("pool hit rate", percentText(iv.PoolHitRate), percentText(iv.totalPoolHitRate))
	for _, d := range []string{"h2d", "d2h", "d2d", "default"} {
		row("copies "+d, bytesText(iv.MemcpyBytesPerS[d])+"/s", bytesText(float64(total.MemcpyBytes[d])))
	}
	row("spilled", bytesText(float64(iv.SpillBytes)/iv.rateSecs)+"/s", bytesText(float64(total.SpillBytes)))
	row("promoted", bytesText(float64(iv.PromoteBytes)/iv.rateSecs)+"/s", bytesText(float64(total.PromoteBytes)))
	row("page faults", fmt.Sprintf("%.0f", float64(iv.PageFaults.Total)/iv.rateSecs), fmt.Sprint(total.PageFaults.Total))
	row("  on spilled memory", fmt.Sprintf("%.0f", float64(iv.PageFaults.Spilled)/iv.rateSecs), fmt.Sprint(total.PageFaults.Spilled))
	totalPerStep, ok := bpf.PerStep(total.MovedBytes, total.Steps)
	row("steps", fmt.Sprintf("%.0f", float64(iv.Steps)/iv.rateSecs), fmt.Sprint(total.Steps))
	row("moved per step", perStepText(iv.MovedBytesPerStep), perStepText(optional(totalPerStep, ok)))
	row("spilled accesses", spilledAccessText(iv.Accesses), spilledAccessText(total.Accesses))
	row("quota refusals", fmt.Sprintf("%.0f", float64(iv.Refusals)/iv.rateSecs), fmt.Sprint(total.Pool.Refusals))
	row("dropped records", "", fmt.Sprint(total.Drops))
	v.lines = strings.Count(b.String(), "\n")
	io.WriteString(v.w, b.String())
}

func percentText(r *float64) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", *r*100)
}

// bytesText prints a byte count with a binary unit.
func bytesText(n float64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%.0fB", n)
	}
	i := -1
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	return fmt.Sprintf("%.1f%ciB", n, units[i])
}

// eventPrinter writes one line per record (--events). Records are
// gathered whole and written in batches; with shared set (the job writes
// to the same file), a batch is at most pipeAtomic bytes, which a pipe
// writes in one piece, so the job's output never cuts a record.
type eventPrinter struct {
	mu     sync.Mutex
	w      io.Writer
	buf    []byte
	limit  int
	asJSON bool
}

// pipeAtomic is PIPE_BUF on Linux.
const pipeAtomic = 4096

func newEventPrinter(w io.Writer, asJSON, shared bool) *eventPrinter {
	limit := 64 << 10
	if shared {
		limit = pipeAtomic
	}
	return &eventPrinter{w: w, limit: limit, asJSON: asJSON}
}

// eventJSON is the --events --json line format.
type eventJSON struct {
	Kind      string `json:"kind"`
	TimeNs    uint64 `json:"time_ns"`
	PID       uint32 `json:"pid"`
	TID       uint32 `json:"tid"`
	Func      string `json:"func,omitempty"`
	Probe     string `json:"probe,omitempty"`
	LatencyNs int64  `json:"latency_ns,omitempty"`
	Ret       *int64 `json:"ret,omitempty"`
	Ptr       string `json:"ptr,omitempty"`
	Size      uint64 `json:"size,omitempty"`
	Direction string `json:"direction,omitempty"`
	Device    *int32 `json:"device,omitempty"`
	Tier      *int32 `json:"tier,omitempty"`
	Source    string `json:"source,omitempty"`
	Address   string `json:"address,omitempty"`
	Spilled   bool   `json:"spilled,omitempty"`
}

var kindNames = map[bpf.Kind]string{
	bpf.KindAPI: "call", bpf.KindProbe: "probe", bpf.KindFault: "fault", bpf.KindExit: "exit",
	bpf.KindUVMFault: "uvm_fault", bpf.KindUVMMigration: "uvm_migration",
}

// sourceNames spell an alloc probe's source as the summary's keys and the
// Prometheus labels do.
var sourceNames = map[int32]string{
	bpf.SourceCache: "cache", bpf.SourceDevice: "device", bpf.SourcePassThrough: "pass_through",
}

func describe(e *bpf.Event) eventJSON {
	j := eventJSON{Kind: kindNames[e.Kind], TimeNs: e.TimeNs, PID: e.PID, TID: e.TID}
	hex := func(v uint64) string { return fmt.Sprintf("0x%x", v) }
	switch e.Kind {
	case bpf.KindAPI:
		j.Func, j.LatencyNs, j.Size = e.Func.String(), int64(e.Latency), e.Size()
		ret := e.Ret
		j.Ret = &ret
		if p := e.Pointer(); p != 0 {
			j.Ptr = hex(p)
		}
		if e.Func.Op() == bpf.OpMemcpy {
			j.Direction = e.Direction().String()
		}
		j.Spilled = e.Spilled() // a copy or memset that touched spilled memory
	case bpf.KindProbe:
		j.Probe, j.Size = e.Probe.String(), e.Size()
		dev := e.Device()
		j.Device = &dev
		if p := e.Pointer(); p != 0 {
			j.Ptr = hex(p)
			tier := e.Tier()
			j.Tier = &tier
		}
		if e.Probe == bpf.ProbeAlloc {
			j.Source = sourceNames[e.Source()]
		}
	case bpf.KindFault:
		j.Address, j.Spilled = hex(e.Address()), e.Spilled()
	case bpf.KindUVMMigration:
		j.Size = e.Size()
	}
	return j
}

func (p *eventPrinter) print(e *bpf.Event) {
	rec := p.format(e)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf)+len(rec) > p.limit {
		p.flushLocked()
	}
	p.buf = append(p.buf, rec...)
}

func (p *eventPrinter) format(e *bpf.Event) []byte {
	j := describe(e)
	if p.asJSON {
		data, _ := json.Marshal(j)
		return append(data, '\n')
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%d.%09d %d/%d %s", j.TimeNs/1e9, j.TimeNs%1e9, j.PID, j.TID, j.Kind)
	for _, kv := range [][2]string{{"", j.Func}, {"", j.Probe}, {"ptr=", j.Ptr}, {"dir=", j.Direction},
		{"source=", j.Source}, {"addr=", j.Address}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, " %s%s", kv[0], kv[1])
		}
	}
	if j.Size != 0 {
		fmt.Fprintf(&b, " size=%d", j.Size)
	}
	if j.Ret != nil {
		fmt.Fprintf(&b, " ret=%d latency=%v", *j.Ret, time.Duration(j.LatencyNs))
	}
	if j.Spilled {
		b.WriteString(" spilled")
	}
	b.WriteByte('\n')
	return b.Bytes()
}

// flush writes the records gathered so far, in one write.
func (p *eventPrinter) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flushLocked()
}

func (p *eventPrinter) flushLocked() {
	if len(p.buf) > 0 {
		_, _ = p.w.Write(p.buf)
		p.buf = p.buf[:0]
	}
}

// optional is v when ok, else nil.
func optional(v float64, ok bool) *float64 {
	if !ok {
		return nil
	}
	return &v
}
