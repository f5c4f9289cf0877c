package tracetest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/tests/harness"
)

// CMD may be a #! script or a wrapper that starts the program: the session
// follows the exec, and counts what the program does.
func TestTraceScript(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	workload := simWorkload(t)
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "wrapper")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec "+workload+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	viaEnv := filepath.Join(dir, "via-env")
	if err := os.WriteFile(viaEnv, []byte("#!/usr/bin/env sh\n"+wrapper+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, script := range []string{wrapper, viaEnv} {
		summary := filepath.Join(t.TempDir(), "summary.json")
		res := harness.Run(t, harness.Command(t, spillway, "trace", "--summary-json", summary, "--", script, "40"))
		if res.ExitCode != 0 {
			t.Fatalf("%s: exit %d\nstderr:\n%s", filepath.Base(script), res.ExitCode, res.Stderr)
		}
		checkSimSummary(t, readSummary(t, summary))
	}
}

// A --summary-json path that cannot be written is refused before the job
// runs.
func TestTraceSummaryPathCheckedFirst(t *testing.T) {
	spillway := harness.Bin(t, "spillway")
	marker := filepath.Join(t.TempDir(), "ran")
	res := harness.Run(t, harness.Command(t, spillway, "trace", "--summary-json", "/nonexistent/dir/s.json",
		"--", "touch", marker))
	if res.ExitCode != 2 || !strings.Contains(res.Stderr, "--summary-json: open /nonexistent/dir/s.json") {
		t.Errorf("exit %d, stderr %q: want 2 naming the path", res.ExitCode, res.Stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the job ran although the summary could not be written")
	}
}

// --output takes the records away from the job's standard output.
func TestTraceEventsOutput(t *testing.T) {
	harness.RequireBPF(t)
	spillway := harness.Bin(t, "spillway")
	workload := simWorkload(t)
	out := filepath.Join(t.TempDir(), "events.jsonl")
	res := harness.Run(t, harness.Command(t, spillway, "trace", "--events", "--json", "--output", out, "--", workload, "3"))
	if res.ExitCode != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.ExitCode, res.Stderr)
	}
	if strings.Contains(res.Stdout, `"kind"`) {
		t.Errorf("records on standard output: %q", res.Stdout)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var rec struct{ Kind string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if rec.Kind == "call" {
			calls++
		}
	}
	if calls != 3*13 {
		t.Errorf("%d call records, want 39", calls)
	}
}
