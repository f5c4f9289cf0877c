// Package devmem is the shim core's logic: the per-device memory of one
// process that the C front's interposed CUDA calls reach through package
// main's spillway_core_* entry points. A Core holds the configuration (read
// through shim/config at Start), the log, and per device a pool.Pool over
// a backing that calls the real CUDA through interpose (memory.go,
// backing.go, virtual.go), the one ledger every path takes its bytes from
// (ledger.go), the memory counted outside the pools: created contexts and
// the application's virtual-memory calls (outside.go, vmm.go), the address
// index that finds a pointer's device (addrindex.go), the stream-capture
// handling of its own calls (capture.go), the blocks freed into CUDA graphs
// (graphs.go), what CUDA's memory-pool attributes and cuMemPoolTrimTo
// report and do of a device's default pool, answered from the device's
// pool (mempool.go), and the figures file for spillway stat (stat.go).
//
// It must never use cgo (the C boundary, its types and its ABI checks are
// package main's; pointers from the front are passed on to interpose
// untouched), never install signal handlers, never do work in init, never
// read the environment but at Start (the configuration only through
// shim/config), and never call an interposed CUDA symbol by name: calls go
// through interpose.
package devmem
