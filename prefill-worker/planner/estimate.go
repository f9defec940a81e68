package planner

import (
	"github.com/tandem-inference/tandem/model"
)

// Costs is the planner's memory model of one model on one backend. Every
// figure is in bytes.
type Costs struct {
	Layers int
	// SlotBytes is one ring slot: the largest layer's aligned read size.
	SlotBytes int64
	// ActPerToken is the activation memory of one token of a pass: its
	// AttnRes partial sum and completed block stack (fp32 [d] each, at the
	// deepest stack) and its embedding row.
	ActPerToken int64
	// StateFixed is a sequence's state that does not grow with its length
	// (KDA recurrent states and conv tails); StatePerToken is what each
	// prompt token adds (MLA cache rows, all MLA layers).
	StateFixed, StatePerToken int64
	// KDALayerState is one KDA layer's state, LatentRowBytes one MLA layer's
	// cache bytes per token: the largest single layer state bounds what a
	// sink queue holds.
	KDALayerState, LatentRowBytes int64
	// Temporaries of one layer call over a tile of rows holding seqs
	// sequences: TempFixed + rows*TempPerRow + seqs*TempPerSeq, the maximum
	// over the layers of each term (estimate.go).
	TempFixed, TempPerRow, TempPerSeq int64
}

// Temps is the temporaries bound of one layer call.
func (c Costs) Temps(rows, seqs int) int64 {
	return c.TempFixed + int64(rows)*c.TempPerRow + int64(seqs)*c.TempPerSeq
}

// State is the whole decode state of a sequence of tokens tokens.
func (c Costs) State(tokens int) int64 { return c.StateFixed + int64(tokens)*c.StatePerToken }

// LayerState is the largest single layer's state of a sequence of tokens
// tokens.
func (c Costs) LayerState(tokens int) int64 {
	return max(c.KDALayerState, int64(tokens)*c.LatentRowBytes)
}

// ModelCosts derives the memory model from the configuration. slotBytes is
// the ring slot size (the streamer's layout knows it), embedRowBytes the
// stored size of one embedding row, threads the backend's parallelism
// (per-worker scratch grows with it).
func ModelCosts(c *model.Config, latent model.DType, slotBytes, embedRowBytes int64, threads int) Costs {
	co := Costs{Layers: c.NumLayers, SlotBytes: slotBytes}
	d := int64(c.HiddenSize)
	stackMax := int64(c.StackLenAfter(c.NumLayers - 1))
	co.ActPerToken = (stackMax+1)*d*4 + embedRowBytes + 4
	H, D, P, K1 := int64(c.KDAHeads), int64(c.KDAHeadDim), int64(c.KDAProjDim()), int64(c.ConvKernel-1)
	lat := int64(c.LatentWidth())
	for L := 0; L < c.NumLayers; L++ {
		switch c.LayerKind(L) {
		case model.KDA:
			co.KDALayerState = (H*D*D + 3*P*K1) * 4
			co.StateFixed += co.KDALayerState
		case model.MLA:
			co.LatentRowBytes = lat * int64(latent.Size())
			co.StatePerToken += co.LatentRowBytes
		}
		t := LayerTemps(c, L, threads)
		co.TempFixed = max(co.TempFixed, t.Fixed)
		co.TempPerRow = max(co.TempPerRow, t.PerRow)
		co.TempPerSeq = max(co.TempPerSeq, t.PerSeq)
	}
	return co
}

// Temps is the linear estimate of what one layer call allocates:
// Fixed + rows*PerRow + seqs*PerSeq bytes.
type Temps struct{ Fixed, PerRow, PerSeq int64 }

// Bytes evaluates the estimate.
func (t Temps) Bytes(rows, seqs int) int64 {
	return t.Fixed + int64(rows)*t.PerRow + int64(seqs)*t.PerSeq
}

func (t *Temps) add(o Temps) { t.Fixed += o.Fixed; t.PerRow += o.PerRow; t.PerSeq += o.PerSeq }

// The CPU backend's GEMM (kernels/cpu/matmul.go) converts up to 64
// activation rows at a time to fp64 and gives every parallel chunk of each
// 64-row block its own decode scratch (one fp32 row and four fp64 rows).
const gemmBlock = 64

// chunks is how many pieces the CPU backend's parallel loop cuts n items
// into with its default grain (n/(4·threads), at least 1); each piece gets
// its own scratch.
func chunks(n, threads int) int64 {
	return chunksGrain(n, max(1, n/(4*threads)), threads)
}

func chunksGrain(n, grain, threads int) int64 {
	if n <= 0 {
		return 0
	}
	c := (n + grain - 1) / grain
	if min(threads, c) <= 1 {
		return 1
	}
	return int64(c)
}

// gemm is one MatMul of T rows through a weight [O, I] into a new [T, O]
// fp32 tensor (out false: the caller owns the output elsewhere).
func gemm(I, O int, threads int, out bool) Temps {
	// Per 64-row block: each chunk's scratch, plus the goroutines, closures
	// and size-class rounding of one parallel loop (measured: about 4 KiB).
	sc := chunks((O+3)/4, threads)*36*int64(I) + 4096
	t := Temps{Fixed: gemmBlock*int64(I)*8 + sc, PerRow: (sc + gemmBlock - 1) / gemmBlock}
	if out {
		t.PerRow += int64(O) * 4
	}
	return t
}

// LayerTemps estimates what one RunLayer call of layer L allocates on the
// CPU backend, term by term after model/*.go and kernels/cpu. Everything is
// counted as if no garbage were collected during the call, except the MLA
// attention's per-key-block scratch (short-lived, counted for one block).
// The calibration test checks the estimate against the allocator.
func LayerTemps(c *model.Config, L int, threads int) Temps {
	d, th := c.HiddenSize, threads
	d8 := int64(d)
	var t Temps
	// AttnRes mixes into the attention (after layer 0) and into the FFN,
	// and the attention's normed input.
	mixes := int64(2)
	if L == 0 {
		mixes = 1
	}
	t.PerRow += (mixes + 1) * d8 * 4
	t.Fixed += 2 * 8 * int64(th) * int64(c.StackLenAfter(L)+1) * 8 // per-chunk score buffers

	switch c.LayerKind(L) {
	case model.KDA:
		P, D, H := c.KDAProjDim(), c.KDAHeadDim, c.KDAHeads
		P8, D8, H8 := int64(P), int64(D), int64(H)
		for range 4 { // q, k, v, g projections
			t.add(gemm(d, P, th, true))
		}
		t.add(gemm(d, D, th, true)) // f_a
		t.add(gemm(D, P, th, true)) // f_b
		t.add(gemm(d, H, th, true)) // b
		t.add(gemm(P, d, th, true)) // o_proj
		t.PerRow += 4 * P8 * 4      // conv outputs q, k, v and the KDA output
		// Short-conv history per channel chunk, per conv, per sequence.
		cc := chunksGrain(P, max(64, P/(4*th)), th)
		t.PerRow += 3 * cc * 4
		t.PerSeq += 3 * cc * int64(c.ConvKernel-1) * 4
		t.Fixed += H8 * 8 // gate exponents
		// KDA chunked-form scratch: the head loop runs with grain 1, so every
		// head gets its own, per sequence call.
		C := int64(model.KDAChunk)
		work := (D8*D8 + 2*D8 + 7*C*D8 + 2*C*C) * 8
		t.PerSeq += chunksGrain(H, 1, th) * work
	case model.MLA:
		H := c.MLAHeads
		qw := H * c.QHeadDim()
		kvw := H * (c.QKNopeDim + c.VHeadDim)
		ow := H * c.VHeadDim
		t.add(gemm(d, c.QLoraRank, th, true))
		t.add(gemm(c.QLoraRank, qw, th, true))
		t.add(gemm(d, c.LatentWidth(), th, true))
		t.add(gemm(d, ow, th, true))                    // g_proj
		t.add(gemm(ow, d, th, true))                    // o_proj
		t.PerRow += int64(c.KVLoraRank)*4 + int64(ow)*4 // normed c_kv copy, attention output
		// Online-softmax state per (row, head): max, sum, fp64 accumulator.
		t.PerRow += int64(H) * (16 + 8*int64(c.VHeadDim))
		// Per sequence: one 256-row key block expanded (c_kv, K|V, k_pe,
		// a row) and its GEMM and score scratch.
		const kb = 256
		blk := int64(kb) * (int64(c.KVLoraRank) + int64(kvw) + int64(c.QKRopeDim)) * 4
		g := gemm(c.KVLoraRank, kvw, th, false)
		t.PerSeq += blk + int64(c.LatentWidth())*4 + g.Fixed + kb*g.PerRow + chunks(kb*H, th)*kb*8
	}

	if c.IsDense(L) {
		t.add(situ(d, c.IntermediateSize, th))
		return t
	}
	E, k, lat, mi := c.NumExperts, c.TopK, c.LatentDim, c.MoEIntermediate
	k8, lat8, mi8 := int64(k), int64(lat), int64(mi)
	t.add(gemm(d, E, th, true))             // router logits
	t.PerRow += k8 * 8                      // expert ids and weights
	t.Fixed += 8 * int64(th) * int64(E) * 8 // per-chunk scores and order
	t.PerRow += 160                         // sort.Slice's per-row closure and swapper
	t.add(gemm(d, lat, th, true))           // latent down projection
	t.PerRow += lat8 * 4                    // expert mixture u
	// Routed experts: slot lists (appended), per-slot fp64 outputs, and per
	// expert its gathered input, fp64 output, SiTU's fp64 gate and up.
	t.PerRow += k8*8 + k8*lat8*8 + k8*(12*lat8+16*mi8)
	// Per active expert: decode scratch and the fp64 block of its rows.
	mx := int64(max(lat, mi))
	t.Fixed += int64(E)*(36*mx+64) + 8*int64(th)*lat8*8
	t.PerRow += k8 * 8 * (lat8 + mi8)
	t.add(gemm(lat, d, th, true)) // latent up projection
	if c.NumShared > 0 {
		t.add(situ(d, c.SharedWidth(), th))
	}
	return t
}

// situ is a fused SiTU-GLU MLP of width inter over rows of width d: fp64
// gate and up activations, three GEMMs and the output.
func situ(d, inter, th int) Temps {
	var t Temps
	t.PerRow += int64(inter)*16 + int64(d)*4
	t.add(gemm(d, inter, th, false))
	t.add(gemm(d, inter, th, false))
	t.add(gemm(inter, d, th, false))
	return t
}
