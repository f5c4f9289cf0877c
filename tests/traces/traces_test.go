package traces

import (
	"bytes"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCommittedTracesMatchTheGenerator fails when a model changes without
// its trace being regenerated (go run ./tests/traces/gen -o tests/traces).
func TestCommittedTracesMatchTheGenerator(t *testing.T) {
	for _, ref := range References {
		got, err := Load(ref.File)
		if err != nil {
			t.Fatal(err)
		}
		if want := ref.Generate(); !slices.Equal(got, want) {
			t.Errorf("%s differs from its generator; regenerate it", ref.File)
		}
		if _, err := Summarize(got); err != nil {
			t.Errorf("%s: %v", ref.File, err)
		}
	}
}

func TestQwenWeightsHaveTheModelsParameterCount(t *testing.T) {
	ops := Qwen(16, 0)
	var weights uint64
	for _, op := range ops[:1+qwenLayers*12+2] {
		weights += op.Size
	}
	// The shapes give 32.76 billion parameters (the model card rounds to
	// "32.5B"), two bytes each in bf16: 65.5 GB.
	if params := weights / bf16; params != 32_763_876_352 {
		t.Fatalf("%d parameters, want 32,763,876,352", params)
	}
}

func TestQwenKVCacheGrowsInChunks(t *testing.T) {
	// 250 prompt tokens then 10 decode steps cross one 256-token boundary:
	// every layer reallocates its two cache blocks once after the prefill.
	ops := Qwen(250, 10)
	grown := 0
	for _, op := range ops {
		if op.Kind == AllocAsync && op.Size == 512*qwenKV*bf16 {
			grown++
		}
	}
	if grown != 2*qwenLayers {
		t.Fatalf("%d cache blocks of 512 tokens, want %d", grown, 2*qwenLayers)
	}
}

func TestTrainingFreesActivationsInReverseOrder(t *testing.T) {
	ops := Training(1)
	const tokensSize, logitsSize = 4 * 2048 * 8, 4 * 2048 * 50304 * bf16
	born := map[uint32]int{}
	size := map[uint32]uint64{}
	forwardStart, backwardStart := -1, -1
	lastBirth := len(ops)
	checked := 0
	for i, op := range ops {
		switch op.Kind {
		case Alloc:
			born[op.ID], size[op.ID] = i, op.Size
			if op.Size == tokensSize && forwardStart < 0 {
				forwardStart = i
			}
		case Free:
			if backwardStart < 0 && size[op.ID] == logitsSize {
				backwardStart = i
				continue
			}
			b := born[op.ID]
			if backwardStart < 0 || b < forwardStart || b >= backwardStart || size[op.ID] == 4 {
				continue // not an activation of the forward pass (4 bytes: the loss, read after the step)
			}
			if b >= lastBirth {
				t.Fatalf("operation %d frees an activation born at %d after one born at %d", i, b, lastBirth)
			}
			lastBirth = b
			checked++
		}
	}
	if checked < 24*9 {
		t.Fatalf("only %d forward activations freed in the backward pass", checked)
	}
	st, err := Summarize(ops)
	if err != nil {
		t.Fatal(err)
	}
	if st.Syncs != 1 {
		t.Fatalf("%d synchronizations in one step, want 1", st.Syncs)
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	ops := []Op{{Kind: Alloc, ID: 0, Size: 100}, {Kind: AllocAsync, ID: 1, Size: 1 << 40, Stream: 7},
		{Kind: Sync}, {Kind: FreeAsync, ID: 1, Stream: 7}, {Kind: Free, ID: 0}}
	var buf bytes.Buffer
	if err := Write(&buf, "test", ops); err != nil {
		t.Fatal(err)
	}
	got, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, ops) {
		t.Fatalf("round trip: %v, want %v", got, ops)
	}
}

func TestReadRejectsBadInput(t *testing.T) {
	for name, text := range map[string]string{
		"no header":     "a 0 512\n",
		"unknown op":    header + "\nx 0\n",
		"missing field": header + "\na 0\n",
		"bad number":    header + "\na 0 -5\n",
		"empty":         "",
	} {
		if _, err := Read(strings.NewReader(text)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Summarize([]Op{{Kind: Free, ID: 3}}); err == nil {
		t.Error("free of an ID never allocated accepted")
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.trace.gz")); err == nil {
		t.Error("missing file accepted")
	}
}
