package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/spillway-gpu/spillway/bpf"
)

// serveMetrics serves the session's totals at http://addr/metrics in the
// Prometheus text exposition format, until stop is called.
func (s *session) serveMetrics(addr string) (bound string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		sum := s.sum.Clone()
		s.mu.Unlock()
		if drops, err := s.tr.Drops(); err == nil {
			sum.Drops = drops
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		writeMetrics(w, sum)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return ln.Addr().String(), func() { srv.Close() }, nil
}

// writeMetrics writes a summary as Prometheus counters.
func writeMetrics(w io.Writer, sum *bpf.Summary) {
	counter := func(name, help string) {
		fmt.Fprintf(w, "# HELP spillway_trace_%s %s\n# TYPE spillway_trace_%s counter\n", name, help, name)
	}
	labelled := func(name, label string, values map[string]uint64) {
		keys := make([]string, 0, len(values))
		for k := range values {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "spillway_trace_%s{%s=\"%s\"} %d\n", name, label, promLabel(k), values[k])
		}
	}
	single := func(name, help string, v uint64) {
		counter(name, help)
		fmt.Fprintf(w, "spillway_trace_%s %d\n", name, v)
	}

	counter("calls_total", "CUDA API calls made by the application, counted at the outermost layer.")
	labelled("calls_total", "function", sum.Calls)
	counter("call_errors_total", "CUDA API calls that returned an error.")
	labelled("call_errors_total", "function", sum.Errors)
	counter("memcpy_bytes_total", "Bytes copied by successful copies, by direction.")
	labelled("memcpy_bytes_total", "direction", sum.MemcpyBytes)
	single("alloc_bytes_total", "Bytes requested by successful allocation calls.", sum.AllocBytes)
	single("page_faults_total", "CPU page faults in the traced processes.", sum.PageFaults.Total)
	single("spilled_page_faults_total", "CPU page faults on memory spilled to the host.", sum.PageFaults.Spilled)
	single("spill_bytes_total", "Bytes the shim spilled to the host.", sum.SpillBytes)
	single("promote_bytes_total", "Bytes the shim promoted back to the device.", sum.PromoteBytes)
	counter("pool_allocations_total", "Allocations the shim served, by source.")
	labelled("pool_allocations_total", "source", map[string]uint64{
		"cache": sum.Pool.CacheHits, "device": sum.Pool.DeviceReservations, "spilled": sum.Pool.SpilledAllocs,
		"pass_through": sum.Pool.PassThrough, "managed": sum.Pool.ManagedAllocs,
	})
	single("steps_total", "Device synchronizations the application made (cudaDeviceSynchronize, cuCtxSynchronize).", sum.Steps)
	single("moved_bytes_total", "Bytes the shim moved between device and host (spilled and promoted).", sum.MovedBytes)
	single("accesses_total", "Copies and memsets of device memory.", sum.Accesses.Total)
	single("spilled_accesses_total", "Copies and memsets that touched memory spilled to the host.", sum.Accesses.Spilled)
	single("access_bytes_total", "Bytes of copies and memsets of device memory.", sum.Accesses.Bytes)
	single("spilled_access_bytes_total", "Bytes of copies and memsets that touched memory spilled to the host.", sum.Accesses.SpilledBytes)
	single("pool_frees_total", "Frees the shim handled.", sum.Pool.Frees)
	single("quota_refusals_total", "Allocations the shim refused for quota.", sum.Pool.Refusals)
	single("dropped_records_total", "Records the kernel could not fit in the ring buffer.", sum.Drops)
}
