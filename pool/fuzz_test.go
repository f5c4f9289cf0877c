package pool_test

import (
	"errors"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// FuzzPool drives a pool with an operation sequence decoded from the input
// against the harness's reference model: no overlap, alignment, no reuse
// before a free is known complete, exact accounting, and nothing left on the
// device after Close.
func FuzzPool(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 2, 1, 3, 0, 0, 1, 4, 5, 6})
	f.Add([]byte{0x13, 2, 0x40, 0x10, 4, 1, 2, 0x80, 0x01, 6, 2, 0x40, 0x10, 5, 3})
	f.Add([]byte{0x2c, 0, 0xff, 0xff, 0, 0xff, 0x7f, 7, 0, 3, 0, 7, 1, 7, 2, 7, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		cfg := data[0]
		data = data[1:]
		quotas := [...]uint64{8 * miB, 64 * miB, 512 * miB, 4 * giB}
		opt := pool.DefaultOptions(quotas[cfg&3])
		opt.StrictFree = cfg&4 != 0
		opt.Oversubscribe = cfg&8 != 0
		opt.SpillTier = pool.TierManaged
		if cfg&0x10 != 0 {
			opt.SpillTier = pool.TierPinned
		}
		if cfg&0x20 != 0 {
			opt.ReleaseThreshold = 0
		}
		switch cfg >> 6 {
		case 1:
			opt.Pooling = false
		case 2:
			opt.Reserve = opt.Quota / 2
		}
		fake := pooltest.New(0)
		h := newHarness(t, fake, opt)
		var ptrs, freed []uint64
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		size := func() uint64 {
			v := uint64(next())<<8 | uint64(next())
			// The low 4 bits scale the rest: sizes from 1 byte to 64 MiB.
			return 1 + (v>>4)<<(v&15)
		}
		stream := func() pool.Stream { return pool.Stream(1 + next()%3) }
		pick := func() int { return int(next()) % len(ptrs) }
		for len(data) > 0 {
			switch op := next() % 8; {
			case op <= 2:
				var p uint64
				var err error
				if op == 2 {
					p, err = h.allocAsync(size(), stream())
				} else {
					p, err = h.alloc(size())
				}
				if err != nil && !errors.Is(err, pool.ErrOutOfMemory) {
					t.Fatalf("allocation failed with %v", err)
				}
				if p != 0 {
					ptrs = append(ptrs, p)
				}
			case op <= 4 && len(ptrs) > 0:
				i := pick()
				var err error
				if op == 3 {
					err = h.free(ptrs[i])
				} else {
					err = h.freeAsync(ptrs[i], stream())
				}
				if err != nil {
					t.Fatalf("free of a live block: %v", err)
				}
				freed = append(freed, ptrs[i])
				ptrs[i] = ptrs[len(ptrs)-1]
				ptrs = ptrs[:len(ptrs)-1]
			case op == 5:
				h.appSync()
			case op == 6:
				fake.Complete(stream())
			case op == 7:
				switch next() % 4 {
				case 0:
					if len(freed) > 0 {
						p := freed[len(freed)-1]
						if _, live := h.live[p]; !live {
							if err := h.p.Free(p); err == nil {
								t.Fatalf("double free of %#x succeeded", p)
							}
						}
					}
				case 1:
					if err := h.p.Free(0x1000); !errors.Is(err, pool.ErrNotOwned) {
						t.Fatalf("foreign free: %v", err)
					}
				case 2:
					h.p.ForgetStream(stream())
				case 3:
					if _, err := h.p.Promote(); err != nil {
						t.Fatalf("Promote: %v", err)
					}
				}
			}
			h.check()
		}
		h.close()
	})
}
