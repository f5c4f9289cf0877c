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
		d := &fuzzOps{t: t, h: h, fake: fake, data: data, afterOp: h.check}
		d.misc = func(sel byte) {
			switch sel % 4 {
			case 0:
				if len(d.freed) > 0 {
					p := d.freed[len(d.freed)-1]
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
				h.forgetStream(d.stream())
			case 3:
				if _, err := h.p.Promote(); err != nil {
					t.Fatalf("Promote: %v", err)
				}
			}
		}
		d.run()
		d.settle()
		h.close()
	})
}

// fuzzOps decodes the operation sequence the fuzzers run on a harness, one
// byte at a time: allocations (cudaMalloc, cudaMallocAsync) with sizes from
// 1 byte to 64 MiB, frees of a live block (cudaFree, cudaFreeAsync; on
// foreignStream, one of another device, FreeAsyncForeign), an announced
// synchronization, the completion of a stream's work, and misc, whose byte
// each fuzzer reads its own way. The hooks let a fuzzer check
// more; afterOp runs after every operation.
type fuzzOps struct {
	t           *testing.T
	h           *harness
	fake        *pooltest.Fake
	data        []byte
	ptrs, freed []uint64

	allocated, released func(p uint64) // nil: nothing more
	synced              func()         // nil: nothing more
	misc                func(sel byte)
	afterOp             func()
}

func (d *fuzzOps) next() byte {
	if len(d.data) == 0 {
		return 0
	}
	b := d.data[0]
	d.data = d.data[1:]
	return b
}

// size scales the high 12 bits of two bytes by the low 4.
func (d *fuzzOps) size() uint64 {
	v := uint64(d.next())<<8 | uint64(d.next())
	return 1 + (v>>4)<<(v&15)
}

// The streams the operations use are 1 to foreignStream, the last one a
// stream of another device (pooltest.Fake.MakeForeign).
const foreignStream pool.Stream = 4

func (d *fuzzOps) stream() pool.Stream { return pool.Stream(1 + d.next()%byte(foreignStream)) }

func (d *fuzzOps) run() {
	t, h := d.t, d.h
	d.fake.MakeForeign(foreignStream)
	for len(d.data) > 0 {
		switch op := d.next() % 8; {
		case op <= 2:
			var p uint64
			var err error
			if op == 2 {
				p, err = h.allocAsync(d.size(), d.stream())
			} else {
				p, err = h.alloc(d.size())
			}
			if err != nil && !errors.Is(err, pool.ErrOutOfMemory) {
				t.Fatalf("allocation failed with %v", err)
			}
			if p != 0 {
				d.ptrs = append(d.ptrs, p)
				if d.allocated != nil {
					d.allocated(p)
				}
			}
		case op <= 4 && len(d.ptrs) > 0:
			i := int(d.next()) % len(d.ptrs)
			var err error
			switch s := d.stream(); {
			case op == 3:
				err = h.free(d.ptrs[i])
			case s == foreignStream:
				err = h.freeAsyncForeign(d.ptrs[i], s)
			default:
				err = h.freeAsync(d.ptrs[i], s)
			}
			if err != nil {
				t.Fatalf("free of a live block: %v", err)
			}
			if d.released != nil {
				d.released(d.ptrs[i])
			}
			d.freed = append(d.freed, d.ptrs[i])
			d.ptrs[i] = d.ptrs[len(d.ptrs)-1]
			d.ptrs = d.ptrs[:len(d.ptrs)-1]
		case op == 5:
			h.appSync()
			if d.synced != nil {
				d.synced()
			}
		case op == 6:
			d.fake.Complete(d.stream())
		case op == 7:
			d.misc(d.next())
		}
		d.afterOp()
	}
}

// settle lets every stream run its work and the device synchronize, then
// reclaims until the pool has nothing waiting: every block freed, on a
// forgotten foreign stream too, is then free, and no marker is left. No
// marker of the device was ever tried on the foreign stream.
func (d *fuzzOps) settle() {
	t, h := d.t, d.h
	for range 3 {
		for s := pool.Stream(1); s <= foreignStream; s++ {
			d.fake.Complete(s)
		}
		h.appSync()
		h.p.TrimTo(^uint64(0))
		h.check()
	}
	if st := h.p.Stats(); st.PendingBytes != 0 || st.BackingErrors != 0 {
		t.Fatalf("with every stream complete, %d bytes still wait and %d backing errors", st.PendingBytes, st.BackingErrors)
	}
	if n := d.fake.LiveMarkers(); n != 0 {
		t.Fatalf("with every stream complete, %d markers left", n)
	}
}
