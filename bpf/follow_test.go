package bpf

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// processTree is a fake /proc: each process's children, and the calls made
// in order.
type processTree struct {
	children map[int][]int
	calls    []string
	failOn   int
}

func (tr *processTree) list(pid int) map[int]bool {
	tr.calls = append(tr.calls, fmt.Sprintf("list %d", pid))
	out := map[int]bool{}
	for _, c := range tr.children[pid] {
		out[c] = true
	}
	return out
}

func (tr *processTree) follow(pid int) error {
	tr.calls = append(tr.calls, fmt.Sprintf("follow %d", pid))
	if pid == tr.failOn {
		return errors.New("map full")
	}
	return nil
}

func (tr *processTree) followed() []int {
	var out []int
	for _, c := range tr.calls {
		var pid int
		if _, err := fmt.Sscanf(c, "follow %d", &pid); err == nil {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// TestFollowForkedDescendants: the children a process forked during the
// attach are followed with all their descendants (a launcher's worker and
// the worker's own children), each before its children are listed (so none
// it forks in between is missed), and a child running before the trace
// began is followed neither with nor through its children.
func TestFollowForkedDescendants(t *testing.T) {
	tr := &processTree{children: map[int][]int{
		100: {101, 102}, // 101 ran before the trace
		101: {103},
		102: {104, 105},
		104: {106},
	}}
	if err := followForked(100, map[int]bool{101: true}, tr.list, tr.follow); err != nil {
		t.Fatal(err)
	}
	if got, want := tr.followed(), []int{102, 104, 105, 106}; !slices.Equal(got, want) {
		t.Errorf("followed %v, want %v (calls %v)", got, want, tr.calls)
	}
	for _, pid := range []int{102, 104, 105, 106} {
		f, l := slices.Index(tr.calls, fmt.Sprintf("follow %d", pid)), slices.Index(tr.calls, fmt.Sprintf("list %d", pid))
		if l < f {
			t.Errorf("pid %d's children listed before it was followed: %v", pid, tr.calls)
		}
	}
}

// TestFollowForkedFails: a process that cannot be followed ends the walk
// with its error.
func TestFollowForkedFails(t *testing.T) {
	tr := &processTree{children: map[int][]int{100: {102}, 102: {104}}, failOn: 102}
	if err := followForked(100, nil, tr.list, tr.follow); err == nil || err.Error() != "map full" {
		t.Fatalf("err = %v, want the follow's error", err)
	}
	if got := tr.followed(); !slices.Equal(got, []int{102}) {
		t.Errorf("followed %v after the failure, want only 102", got)
	}
}
