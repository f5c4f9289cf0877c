package traces

import "math/rand/v2"

// builder emits operations and hands out IDs, reusing freed ones.
type builder struct {
	ops    []Op
	free   []uint32
	next   uint32
	async  bool // emit cudaMallocAsync/cudaFreeAsync on stream
	stream uint64
}

func (b *builder) alloc(size uint64) uint32 {
	var id uint32
	if n := len(b.free); n > 0 {
		id = b.free[n-1]
		b.free = b.free[:n-1]
	} else {
		id = b.next
		b.next++
	}
	op := Op{Kind: Alloc, ID: id, Size: size}
	if b.async {
		op.Kind, op.Stream = AllocAsync, b.stream
	}
	b.ops = append(b.ops, op)
	return id
}

func (b *builder) release(ids ...uint32) {
	for _, id := range ids {
		op := Op{Kind: Free, ID: id}
		if b.async {
			op.Kind, op.Stream = FreeAsync, b.stream
		}
		b.ops = append(b.ops, op)
		b.free = append(b.free, id)
	}
}

func (b *builder) sync() { b.ops = append(b.ops, Op{Kind: Sync}) }

// Qwen2.5-32B in bf16, as described in README.md.
const (
	qwenHidden  = 5120
	qwenLayers  = 64
	qwenKV      = 8 * 128 // key/value heads × head size
	qwenMLP     = 27648
	qwenVocab   = 152064
	qwenKVChunk = 256 // the KV cache grows by this many tokens
	bf16        = 2
)

// Qwen returns the inference trace: weights loaded, a prefill of prompt
// tokens, then decode steps of one token each, through cudaMallocAsync and
// cudaFreeAsync on one stream (PyTorch's cudaMallocAsync backend, caching
// off), with a synchronization per generated token.
func Qwen(prompt, decode int) []Op {
	b := &builder{async: true, stream: 1}
	const h, kv, mlp = qwenHidden, qwenKV, qwenMLP
	b.alloc(qwenVocab * h * bf16) // embedding
	for range qwenLayers {
		b.alloc(h * bf16)       // input norm
		b.alloc(h * h * bf16)   // q
		b.alloc(h * bf16)       // q bias
		b.alloc(kv * h * bf16)  // k
		b.alloc(kv * bf16)      // k bias
		b.alloc(kv * h * bf16)  // v
		b.alloc(kv * bf16)      // v bias
		b.alloc(h * h * bf16)   // o
		b.alloc(h * bf16)       // post-attention norm
		b.alloc(mlp * h * bf16) // gate
		b.alloc(mlp * h * bf16) // up
		b.alloc(h * mlp * bf16) // down
	}
	b.alloc(h * bf16)             // final norm
	b.alloc(qwenVocab * h * bf16) // lm head (not tied)

	type cache struct {
		k, v     uint32
		len, cap int
	}
	caches := make([]cache, qwenLayers)
	step := func(tokens int) {
		t := uint64(tokens)
		x := b.alloc(t * h * bf16) // embeddings
		for l := range caches {
			c := &caches[l]
			n1 := b.alloc(t * h * bf16)
			q, k, v := b.alloc(t*h*bf16), b.alloc(t*kv*bf16), b.alloc(t*kv*bf16)
			qr, kr := b.alloc(t*h*bf16), b.alloc(t*kv*bf16) // rotary embedding
			b.release(q, k)
			if c.len+tokens > c.cap { // grow the cache: new blocks, copy, free the old
				c.cap = (c.len + tokens + qwenKVChunk - 1) / qwenKVChunk * qwenKVChunk
				nk, nv := b.alloc(uint64(c.cap)*kv*bf16), b.alloc(uint64(c.cap)*kv*bf16)
				if c.len > 0 {
					b.release(c.k, c.v)
				}
				c.k, c.v = nk, nv
			}
			c.len += tokens
			b.release(kr, v)
			attn := b.alloc(t * h * bf16)
			b.release(qr, n1)
			o := b.alloc(t * h * bf16)
			b.release(attn)
			x2 := b.alloc(t * h * bf16) // residual
			b.release(o, x)
			n2 := b.alloc(t * h * bf16)
			g, u := b.alloc(t*mlp*bf16), b.alloc(t*mlp*bf16)
			a := b.alloc(t * mlp * bf16)
			b.release(g, u)
			d := b.alloc(t * h * bf16)
			b.release(a, n2)
			x = b.alloc(t * h * bf16) // residual
			b.release(d, x2)
		}
		nf := b.alloc(h * bf16) // final norm of the last token
		b.release(x)
		logits := b.alloc(qwenVocab * 4) // fp32 logits of the last token
		b.release(nf)
		tok := b.alloc(8)
		b.release(logits)
		b.sync() // the token is read on the host
		b.release(tok)
	}
	step(prompt)
	for range decode {
		step(1)
	}
	return b.ops
}

// Training returns the trace of steps of training a 24-layer decoder
// (hidden 2048, MLP 8192, 16 heads, vocabulary 50304) on 4 sequences of 2048
// tokens with mixed precision and Adam, through cudaMalloc and cudaFree:
// weights and optimizer state live throughout; each forward pass keeps its
// activations, the backward pass frees them in reverse order, gradients are
// allocated in the backward pass and freed after the optimizer step.
func Training(steps int) []Op {
	b := &builder{}
	const (
		layers, h, mlp, heads, vocab = 24, 2048, 8192, 16, 50304
		bt                           = 4 * 2048 // tokens per step
	)
	paramSizes := []uint64{vocab * h}
	for range layers {
		paramSizes = append(paramSizes, h, h, 3*h*h, 3*h, h*h, h, h, h, mlp*h, mlp, h*mlp, h)
	}
	paramSizes = append(paramSizes, h, h)
	for _, n := range paramSizes {
		b.alloc(n * bf16) // bf16 weights
		b.alloc(n * 4)    // fp32 master weights
		b.alloc(n * 4)    // Adam first moment
		b.alloc(n * 4)    // Adam second moment
	}
	type saved struct{ ids []uint32 }
	for range steps {
		tokens := b.alloc(bt * 8)
		x := b.alloc(bt * h * bf16)
		acts := make([]saved, layers)
		for l := range layers {
			s := &acts[l]
			ln1 := b.alloc(bt * h * bf16)
			qkv := b.alloc(bt * 3 * h * bf16)
			attn := b.alloc(bt * h * bf16)
			lse := b.alloc(heads * bt * 4) // log-sum-exp kept by flash attention
			o := b.alloc(bt * h * bf16)
			x1 := b.alloc(bt * h * bf16)
			b.release(o)
			ln2 := b.alloc(bt * h * bf16)
			fc1 := b.alloc(bt * mlp * bf16)
			act := b.alloc(bt * mlp * bf16)
			fc2 := b.alloc(bt * h * bf16)
			x2 := b.alloc(bt * h * bf16)
			b.release(fc2)
			s.ids = []uint32{x, ln1, qkv, attn, lse, x1, ln2, fc1, act}
			x = x2
		}
		lnf := b.alloc(bt * h * bf16)
		logits := b.alloc(bt * vocab * bf16)
		loss := b.alloc(4)
		dlogits := b.alloc(bt * vocab * bf16)
		b.release(logits)
		grads := []uint32{b.alloc(vocab * h * bf16)} // output projection (tied) gradient
		dx := b.alloc(bt * h * bf16)
		b.release(dlogits, lnf, x)
		for l := layers - 1; l >= 0; l-- {
			ids := acts[l].ids
			for _, n := range []uint64{h * mlp, mlp, mlp * h, h, h, h, h * h, 3 * h, 3 * h * h, h, h, h} {
				grads = append(grads, b.alloc(n*bf16))
			}
			for i := len(ids) - 1; i >= 0; i-- { // saved activations, last saved first
				tmp := b.alloc(bt * h * bf16) // the gradient flowing through this op
				b.release(ids[i])
				b.release(dx)
				dx = tmp
			}
		}
		b.release(dx, tokens)
		for range grads { // the optimizer step, with a temporary per tensor
			b.release(b.alloc(8 << 20))
		}
		b.release(grads...)
		b.sync() // loss.item()
		b.release(loss)
	}
	return b.ops
}

// Churn returns random allocations in the manner of RMM's
// random_allocations benchmark: n operations, each an allocation with
// probability 0.73 while live bytes stay under liveCap (otherwise a free of a
// random live block), sizes uniform in [1, maxSize], half of them through
// cudaMallocAsync on one of four streams (freed on the same stream), the rest
// through cudaMalloc, with an application synchronization every 1000
// operations.
func Churn(seed uint64, n int, maxSize, liveCap uint64) []Op {
	b := &builder{}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	type alloc struct {
		id     uint32
		size   uint64
		stream uint64
		async  bool
	}
	var live []alloc
	var liveBytes uint64
	for i := range n {
		if i%1000 == 999 {
			b.sync()
			continue
		}
		size := 1 + rng.Uint64N(maxSize)
		if len(live) == 0 || (rng.Float64() < 0.73 && liveBytes+size <= liveCap) {
			a := alloc{size: size, async: rng.IntN(2) == 0, stream: 1 + rng.Uint64N(4)}
			b.async, b.stream = a.async, a.stream
			a.id = b.alloc(size)
			live = append(live, a)
			liveBytes += size
			continue
		}
		j := rng.IntN(len(live))
		a := live[j]
		live[j] = live[len(live)-1]
		live = live[:len(live)-1]
		b.async, b.stream = a.async, a.stream
		b.release(a.id)
		liveBytes -= a.size
	}
	return b.ops
}

// Reference describes one committed trace and how it is generated.
type Reference struct {
	File, Model string
	Generate    func() []Op
}

// References are the committed traces, in the scale README.md states.
var References = []Reference{
	{"qwen2.5-32b-inference.trace.gz", "Qwen2.5-32B bf16 inference: 2048-token prefill, 512 decode steps, KV cache grown by 256 tokens",
		func() []Op { return Qwen(2048, 512) }},
	{"training-step.trace.gz", "training: 24-layer decoder, hidden 2048, 4x2048 tokens, mixed precision Adam, 3 steps",
		func() []Op { return Training(3) }},
	{"random-churn.trace.gz", "random churn: 100000 operations, sizes uniform in [1 B, 4 MiB], live bytes under 1 GiB, seed 1",
		func() []Op { return Churn(1, 100000, 4<<20, 1<<30) }},
}
