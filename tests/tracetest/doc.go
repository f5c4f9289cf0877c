// Package tracetest tests Spillway's eBPF tracing end to end: sessions of
// package bpf and the `spillway trace` command attached to real processes,
// first a stand-in CUDA library (testdata/fakecuda.c) whose calls the tests
// count exactly, then the real shim over simcuda, whose SPILLWAY_REPORT line
// the traced events must agree with. It holds no code that other packages use.
//
// Every test that needs eBPF calls harness.RequireBPF first (directly or
// through tracedFakeCUDA), and every session is closed with its test: a test
// must never pass by skipping where SPILLWAY_REQUIRE_BPF=1 is set, nor leave
// probes attached after it ends.
package tracetest
