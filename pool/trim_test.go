package pool_test

import (
	"fmt"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// TestTrimToAndHighWaterMarks: TrimTo returns what can be returned without
// waiting for the device, down to the bytes asked to keep, and the
// high-water marks follow their figures from their last reset (CUDA's
// memory-pool attributes), while the Peak figures stay since the start.
func TestTrimToAndHighWaterMarks(t *testing.T) {
	for _, virtual := range []bool{false, true} {
		name := "fixed"
		var back pool.Backing
		var device func() uint64
		var fake *pooltest.Fake
		if virtual {
			f := pooltest.NewVirtual(0)
			name, back, device, fake = "virtual", f, f.DeviceBytes, f.Fake
		} else {
			f := pooltest.New(0)
			back, device, fake = f, f.DeviceBytes, f
		}
		t.Run(name, func(t *testing.T) {
			opt := pool.DefaultOptions(64 * miB)
			opt.ReleaseThreshold = 64 * miB // nothing goes back by the threshold
			p, err := pool.New(back, opt)
			if err != nil {
				t.Fatal(err)
			}
			const s = pool.Stream(7)
			a, err := p.Alloc(4 * miB)
			if err != nil {
				t.Fatal(err)
			}
			b, err := p.AllocAsync(8*miB, s)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Alloc(2 * miB); err != nil {
				t.Fatal(err)
			}
			st := p.Stats()
			if st.HighLiveBytes != 14*miB || st.HighReservedBytes != st.ReservedBytes || st.ReservedBytes != device() {
				t.Fatalf("after 14 MiB: high live %d, high reserved %d, reserved %d, device %d", st.HighLiveBytes, st.HighReservedBytes, st.ReservedBytes, device())
			}
			if err := p.Free(a); err != nil {
				t.Fatal(err)
			}
			if err := p.FreeAsync(b, s); err != nil {
				t.Fatal(err)
			}
			if st := p.Stats(); st.HighLiveBytes != 14*miB || st.LiveBytes != 2*miB {
				t.Fatalf("after the frees: high live %d, live %d", st.HighLiveBytes, st.LiveBytes)
			}
			p.ResetHighLive()
			p.ResetHighReserved()
			st = p.Stats()
			if st.HighLiveBytes != 2*miB || st.HighReservedBytes != st.ReservedBytes || st.PeakLiveBytes != 14*miB {
				t.Fatalf("after the resets: high live %d, high reserved %d (reserved %d), peak live %d", st.HighLiveBytes, st.HighReservedBytes, st.ReservedBytes, st.PeakLiveBytes)
			}
			held := st.ReservedBytes
			if n := p.TrimTo(held); n != 0 {
				t.Fatalf("TrimTo(%d), what the pool holds, released %d bytes", held, n)
			}
			// The free of a waits for a synchronization and b's for its
			// stream: neither is returned before the device says so.
			if n := p.TrimTo(0); n != 0 || device() != held {
				t.Fatalf("TrimTo(0) with every free still pending released %d bytes; the device holds %d of %d", n, device(), held)
			}
			fake.Complete(s)
			if n := p.TrimTo(0); n == 0 || device() >= held {
				t.Fatalf("TrimTo(0) once the stream of an 8 MiB free completed released %d bytes; the device holds %d of %d", n, device(), held)
			}
			ticket := p.SyncBegin()
			if err := fake.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if err := p.SyncEnd(ticket); err != nil {
				t.Fatal(err)
			}
			n := p.TrimTo(0)
			st = p.Stats()
			if n == 0 || st.ReservedBytes != device() || st.ReservedBytes >= held {
				t.Fatalf("TrimTo(0) after a synchronization released %d bytes: the pool holds %d, the device %d, %d before", n, st.ReservedBytes, device(), held)
			}
			if more := p.ReleaseCached(true); more != 0 {
				t.Fatalf("after TrimTo(0), ReleaseCached still found %d bytes to return", more)
			}
			if st.HighReservedBytes != held {
				t.Fatalf("high reserved %d after trimming, want %d, the high-water mark since the reset", st.HighReservedBytes, held)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTrimToKeepsAtLeastKeep: CUDA's cuMemPoolTrimTo leaves at least the
// bytes asked to keep reserved, where the pool held more: with three empty
// 16 MiB segments (or 48 MiB of idle granules), trimming to 20 MiB or
// 21 MiB returns what it can without going below that, and trimming to
// more than the pool holds returns nothing.
func TestTrimToKeepsAtLeastKeep(t *testing.T) {
	for _, virtual := range []bool{false, true} {
		for _, keep := range []uint64{20 * miB, 21 * miB, 64 * miB} {
			var back pool.Backing
			var device func() uint64
			name := "fixed"
			if virtual {
				f := pooltest.NewVirtual(0)
				name, back, device = "virtual", f, f.DeviceBytes
			} else {
				f := pooltest.New(0)
				back, device = f, f.DeviceBytes
			}
			t.Run(fmt.Sprintf("%s/keep=%dMiB", name, keep/miB), func(t *testing.T) {
				opt := pool.DefaultOptions(256 * miB)
				opt.ReleaseThreshold = 256 * miB // nothing goes back by the threshold
				p, err := pool.New(back, opt)
				if err != nil {
					t.Fatal(err)
				}
				var blocks []uint64
				for range 3 {
					b, err := p.Alloc(16 * miB)
					if err != nil {
						t.Fatal(err)
					}
					blocks = append(blocks, b)
				}
				for _, b := range blocks {
					if err := p.Free(b); err != nil {
						t.Fatal(err)
					}
				}
				ticket := p.SyncBegin()
				if err := back.Synchronize(); err != nil {
					t.Fatal(err)
				}
				if err := p.SyncEnd(ticket); err != nil {
					t.Fatal(err)
				}
				held := p.Stats().ReservedBytes
				if held < 48*miB {
					t.Fatalf("the pool holds %d bytes for three 16 MiB blocks", held)
				}
				p.TrimTo(keep)
				after := p.Stats().ReservedBytes
				if after != device() {
					t.Fatalf("the pool counts %d bytes reserved, the device holds %d", after, device())
				}
				if after < min(keep, held) {
					t.Errorf("TrimTo(%d MiB) of %d bytes left %d bytes reserved, below what it was asked to keep", keep/miB, held, after)
				}
				if keep < held && after >= 48*miB {
					t.Errorf("TrimTo(%d MiB) of %d bytes released nothing", keep/miB, held)
				}
			})
		}
	}
}
