// Package stattest tests `spillway stat` end to end: processes running
// under the shim on simcuda publish their figures, and the command joins
// them with simcuda's NVML. Each figure it prints is checked against what
// the process itself reports at exit (SPILLWAY_REPORT) and against
// simcuda's ground truth.
//
// The tests must never share simcuda's state or the figures' folder with
// another test (each has its own SIMCUDA_STATE_DIR and SPILLWAY_RUNTIME_DIR),
// and never pass on a figure they did not compare.
package stattest
