package pool_test

import (
	"fmt"

	"github.com/spillway-gpu/spillway/pool"
	"github.com/spillway-gpu/spillway/pool/pooltest"
)

// A pool over a simulated device with a 1 GiB quota: a freed block is reused
// once the application's synchronization is announced.
func Example() {
	device := pooltest.New(0) // the shim passes its Backing over the real runtime
	p, err := pool.New(device, pool.DefaultOptions(1<<30))
	if err != nil {
		panic(err)
	}
	a, _ := p.Alloc(1000) // cudaMalloc
	_ = p.Free(a)         // cudaFree: pending until a synchronization

	t := p.SyncBegin() // cudaDeviceSynchronize, as seen by the shim
	_ = device.Synchronize()
	_ = p.SyncEnd(t)

	b, _ := p.Alloc(1000)
	st := p.Stats()
	fmt.Println("reused:", a == b)
	fmt.Println("live:", st.LiveBytes, "reserved:", st.ReservedBytes, "segments:", st.Segments)
	fmt.Println("pool synchronizations:", st.Syncs, "announced:", st.ExternalSyncs)
	// Output:
	// reused: true
	// live: 1024 reserved: 2097152 segments: 1
	// pool synchronizations: 0 announced: 1
}
