package pool_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// nullReserve is a device whose Reserve answers address 0 without reserving
// anything, and whose Release of address 0 fails with releaseErr.
type nullReserve struct {
	*pooltest.Fake
	releaseErr error
}

func (n *nullReserve) Reserve(uint64) (uint64, error) { return 0, nil }

func (n *nullReserve) Release(base, size uint64) error {
	if base == 0 {
		return n.releaseErr
	}
	return n.Fake.Release(base, size)
}

// A segment the Backing hands out at an address the pool cannot use is a
// Backing failure: it is counted, given back, and its bytes return to the
// ledger; if giving it back fails, it stays counted as held until Close.
func TestUnusableSegmentAddressIsCountedAndGivenBack(t *testing.T) {
	for _, releaseErr := range []error{nil, errors.New("cudaFree failed")} {
		name := "released"
		if releaseErr != nil {
			name = "release fails"
		}
		t.Run(name, func(t *testing.T) {
			ledger := pool.NewQuotaLedger(64 * miB)
			opt := pool.DefaultOptions(64 * miB)
			opt.Ledger = ledger
			p, err := pool.New(&nullReserve{Fake: pooltest.New(0), releaseErr: releaseErr}, opt)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Alloc(miB); err == nil || !strings.Contains(err.Error(), "not aligned") {
				t.Fatalf("Alloc on a segment at address 0: %v, want an error saying the address is unusable", err)
			}
			st := p.Stats()
			held, releaseErrors := uint64(0), uint64(0)
			if releaseErr != nil {
				held, releaseErrors = 2*miB, 1
			}
			if st.BackingErrors != 1 || st.ReleaseErrors != releaseErrors || st.ReservedBytes != held || ledger.Taken() != held {
				t.Fatalf("stats %v, ledger %d taken; want 1 backing error, %d release errors, %d bytes held", st, ledger.Taken(), releaseErrors, held)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			if n := ledger.Taken(); n != 0 {
				t.Fatalf("after Close the ledger has %d bytes taken", n)
			}
		})
	}
}

// A segment whose release failed is kept and never tried again before
// Close, however often it empties again.
func TestFailedSegmentReleaseIsNotRetried(t *testing.T) {
	f := pooltest.New(0)
	opt := pool.DefaultOptions(64 * miB)
	opt.ReleaseThreshold = 0
	h := newHarness(t, f, opt)
	f.FailRelease = func(uint64, uint64) error { return errors.New("cudaFree failed") }
	for range 3 {
		h.mustFree(h.mustAlloc(miB))
		h.appSync() // the segment is empty again, above the threshold
	}
	if st := h.p.Stats(); st.ReleaseErrors != 1 || st.Segments != 1 {
		t.Fatalf("%d failed releases, %d segments held; want one try, the segment kept", st.ReleaseErrors, st.Segments)
	}
	f.FailRelease = nil
	h.close()
}

// Giving more bytes than were taken panics rather than admitting more than
// the quota later.
func TestQuotaLedgerRefusesToGiveMoreThanTaken(t *testing.T) {
	l := pool.NewQuotaLedger(4 * miB)
	if !l.Take(miB) {
		t.Fatal("Take(1 MiB) refused under a 4 MiB quota")
	}
	defer func() {
		if recover() == nil {
			t.Fatalf("Give(2 MiB) after Take(1 MiB) did not panic; headroom now %d", l.Headroom())
		}
	}()
	l.Give(2 * miB)
}
