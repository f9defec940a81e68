package emu

import (
	"fmt"
	"math"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/mxfp"
)

// checks2 are the sequence ops: short conv, router, KDA, MLA.
func checks2() []check {
	return []check{
		{"short_conv_silu", checkShortConv},
		{"router_topk/renorm", func(e *env) error { return checkRouter(e, 21, 64, 6, true) }},
		{"router_topk/k3-plain", func(e *env) error { return checkRouter(e, 5, 896, 16, false) }}, // K3: 896 experts, top-16
		{"kda/chunk16", func(e *env) error { return checkKDA(e, 3, 32, 16, 16, 16, 45, 2, 40) }},
		{"kda/chunk7", func(e *env) error { return checkKDA(e, 2, 16, 24, 7, 7, 30, 0, 30) }},
		// K3's head shape, and the model's prefill chunk (64) on the CPU
		// against the device's 16 across a 64-row boundary: the same function.
		{"kda/k3-head-vs-chunk64", func(e *env) error { return checkKDA(e, 1, 128, 128, 16, 64, 70, 0, 70) }},
		{"mla/bf16-cache", func(e *env) error { return checkMLA(e, 2, 16, 8, 16, 32, 140, 27, 3, 24, true, 0, false) }},
		{"mla/key-blocks", func(e *env) error { return checkMLA(e, 1, 16, 8, 16, 32, 150, 20, 0, 20, true, 64, false) }},
		{"mla/f32-cache", func(e *env) error { return checkMLA(e, 2, 16, 8, 8, 32, 30, 30, 0, 30, false, 0, false) }},
		{"mla/k3-head", func(e *env) error { return checkMLA(e, 1, 128, 64, 128, 512, 24, 24, 0, 24, true, 0, false) }},
		// The tensor-core kernel: small heads (zero-padded to 192/128), two
		// query tiles and a ragged last key tile; key blocks; K3's head.
		{"mla_mma/bf16-cache", func(e *env) error { return checkMLA(e, 2, 16, 8, 16, 32, 150, 80, 2, 75, true, 0, true) }},
		{"mla_mma/key-blocks", func(e *env) error { return checkMLA(e, 1, 16, 8, 16, 32, 150, 20, 0, 20, true, 64, true) }},
		{"mla_mma/k3-head", func(e *env) error { return checkMLA(e, 1, 128, 64, 128, 512, 70, 70, 0, 70, true, 0, true) }},
	}
}

func checkShortConv(e *env) error {
	bin, rng := e.bin, e.rng
	rows, P, K, lo, n := 12, 200, 4, 3, 7
	x, w, tail := randF32(rng, rows*P, 1), randF32(rng, P*K, 0.5), randF32(rng, P*(K-1), 1)
	out, err := run(bin, call{"short_conv_silu", p("rows", rows, "P", P, "K", K, "lo", lo, "n", n),
		map[string][]byte{"x": f32Bytes(x), "w": f32Bytes(w), "tail": f32Bytes(tail)}})
	if err != nil {
		return err
	}
	got, err := output(out, "x", rows*P)
	if err != nil {
		return err
	}
	gotTail, err := output(out, "tail", P*(K-1))
	if err != nil {
		return err
	}
	want, wantTail := tensor(rows, P, x), append([]float32(nil), tail...)
	ref.ShortConvSiLU(want, want, kernels.Span{Lo: lo, Hi: lo + n}, tensor(P, K, w), &kernels.Tensor{Rows: P, Cols: K - 1, Data: wantTail})
	// Four fp32 products summed (the reference rounds each product, the
	// device may fuse) and SiLU through ex2.approx: a few ulps of |y|.
	if err := e.within(got, want.Data, func(i int) float64 { return 2e-6 * (1 + math.Abs(float64(want.Data[i]))) }); err != nil {
		return fmt.Errorf("output: %w", err)
	}
	if err := e.within(gotTail, wantTail, exact); err != nil { // copies of inputs
		return fmt.Errorf("tail: %w", err)
	}
	return nil
}

func sigmoid64(x float32) float64 { return 1 / (1 + math.Exp(-float64(x))) }

func checkRouter(e *env, rows, E, k int, renorm bool) error {
	bin, rng := e.bin, e.rng
	logits, bias := randF32(rng, rows*E, 2), randF32(rng, E, 0.1)
	// Row 0: equal logits and biases equal in pairs (2m, 2m+1), so the
	// selection ties exactly and the lower id must come first.
	for e := 0; e < E; e++ {
		logits[e] = 0.25
		if e%2 == 1 {
			bias[e] = bias[e-1]
		}
	}
	scale := float32(2.5)
	out, err := run(bin, call{"router_topk", p("rows", rows, "E", E, "k", k, "renorm", renorm, "scale", scale),
		map[string][]byte{"logits": f32Bytes(logits), "bias": f32Bytes(bias)}})
	if err != nil {
		return err
	}
	ob, ok := out["ids"]
	if !ok || len(ob) != 4*rows*k {
		return fmt.Errorf("driver returned no ids of %d", rows*k)
	}
	gotIDs := bytesI32(ob)
	gotW, err := output(out, "weights", rows*k)
	if err != nil {
		return err
	}
	wantIDs, wantW := make([]int32, rows*k), make([]float32, rows*k)
	ref.RouterTopK(tensor(rows, E, logits), bias, k, renorm, scale, wantIDs, wantW)
	for r := 0; r < rows; r++ {
		swapped := false
		for j := 0; j < k; j++ {
			g, w := gotIDs[r*k+j], wantIDs[r*k+j]
			if g == w {
				continue
			}
			if g < 0 || int(g) >= E {
				return fmt.Errorf("row %d slot %d: expert id %d outside [0, %d)", r, j, g, E)
			}
			// σ through ex2.approx may reorder experts whose selection scores
			// are within a few fp32 ulps; anything wider is a wrong pick, and
			// so is a swap of an exact tie, which goes to the lower id.
			sg := float32(sigmoid64(logits[r*E+int(g)])) + bias[g]
			sw := float32(sigmoid64(logits[r*E+int(w)])) + bias[w]
			if sg == sw || math.Abs(float64(sg)-float64(sw)) > 1e-6 {
				return fmt.Errorf("row %d slot %d: expert %d (score %.9g), want %d (score %.9g)", r, j, g, sg, w, sw)
			}
			swapped = true
		}
		if swapped {
			continue
		}
		// Weights: σ in fp32 and an fp32 sum of k terms: a few ulps.
		if err := e.within(gotW[r*k:(r+1)*k], wantW[r*k:(r+1)*k], func(i int) float64 { return 1e-6 * math.Abs(float64(wantW[r*k+i])) }); err != nil {
			return fmt.Errorf("row %d weights: %w", r, err)
		}
	}
	return nil
}

// unitRows normalises each group of d values of x to norm s.
func unitRows(x []float32, d int, s float64) {
	for i := 0; i < len(x); i += d {
		var ss float64
		for _, v := range x[i : i+d] {
			ss += float64(v) * float64(v)
		}
		f := s / math.Sqrt(ss)
		for j := range x[i : i+d] {
			x[i+j] = float32(float64(x[i+j]) * f)
		}
	}
}

// checkKDA runs the device kernel with chunk and the CPU's chunked form
// with refChunk.
func checkKDA(e *env, H, dk, dv, chunk, refChunk, rows, lo, n int) error {
	bin, rng := e.bin, e.rng
	q, k := randF32(rng, rows*H*dk, 1), randF32(rng, rows*H*dk, 1)
	unitRows(q, dk, 1/math.Sqrt(float64(dk))) // the model L2-normalises q and k and scales q
	unitRows(k, dk, 1)
	g := make([]float32, rows*H*dk)
	for i := range g { // log decays in (−5, 0), mostly mild, as KDAGate makes them
		g[i] = float32(-5 * sigmoid64(float32(rng.NormFloat64()*1.5-2)))
	}
	v := randF32(rng, rows*H*dv, 1)
	beta := make([]float32, rows*H)
	for i := range beta {
		beta[i] = float32(sigmoid64(float32(rng.NormFloat64())))
	}
	S := randF32(rng, H*dk*dv, 0.3)
	out, err := run(bin, call{"kda", p("rows", rows, "lo", lo, "n", n, "heads", H, "dk", dk, "dv", dv, "chunk", chunk),
		map[string][]byte{"q": f32Bytes(q), "k": f32Bytes(k), "g": f32Bytes(g), "v": f32Bytes(v), "beta": f32Bytes(beta), "S": f32Bytes(S)}})
	if err != nil {
		return err
	}
	got, err := output(out, "o", rows*H*dv)
	if err != nil {
		return err
	}
	gotS, err := output(out, "S", H*dk*dv)
	if err != nil {
		return err
	}
	want, wantS := ref.NewTensor(rows, H*dv), append([]float32(nil), S...)
	ref.KDA(want, tensor(rows, H*dk, q), tensor(rows, H*dk, k), tensor(rows, H*dv, v), tensor(rows, H*dk, g), tensor(rows, H, beta),
		kernels.Span{Lo: lo, Hi: lo + n}, &kernels.Tensor{Rows: H * dk, Cols: dv, Data: wantS}, H, dk, dv, refChunk)
	// fp32 against fp64 through dk-term dot products, a 16-step forward
	// substitution and the state carried across chunks: 1e-4 of the
	// largest magnitude (observed errors are ~1e-6 of it).
	ot, st := 1e-4*maxAbs(want.Data), 1e-4*maxAbs(wantS)
	if err := e.within(got, want.Data, func(int) float64 { return ot }); err != nil {
		return fmt.Errorf("output: %w", err)
	}
	if err := e.within(gotS, wantS, func(int) float64 { return st }); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	return nil
}

// checkMLA runs the expanded form over the whole cache (keyBlock 0) or a
// block of keys at a time with the softmax state carried between launches,
// with the simple kernels or the tensor-core one (mma).
func checkMLA(e *env, H, nope, rope, vdim, lora, Tc, rows, lo, n int, bf16 bool, keyBlock int, mma bool) error {
	bin, rng := e.bin, e.rng
	cols := lora + rope
	latent := randF32(rng, Tc*cols, 1)
	unitRows(latent, cols, math.Sqrt(float64(cols))) // the cache holds normalised c_kv (rms 1)
	cache := kernels.LatentCache{Rows: Tc, Cols: cols}
	var cacheBytes []byte
	if bf16 {
		cache.BF16 = make([]uint16, len(latent))
		cacheBytes = make([]byte, 2*len(latent))
		for i, x := range latent {
			h := mxfp.F32ToBF16(x)
			cache.BF16[i] = h
			cacheBytes[2*i], cacheBytes[2*i+1] = byte(h), byte(h>>8)
		}
	} else {
		cache.F32 = latent
		cacheBytes = f32Bytes(latent)
	}
	kvb := randMatrix(rng, kernels.BF16, H*(nope+vdim), lora, 1/math.Sqrt(float64(lora)))
	q := randF32(rng, rows*H*(nope+rope), 1)
	scale := float32(1 / math.Sqrt(float64(nope+rope)))
	out, err := run(bin, call{"mla", p("rows", rows, "lo", lo, "n", n, "Tc", Tc, "heads", H, "nope", nope, "rope", rope, "vdim", vdim,
		"cols", cols, "bf16", bf16, "fmt", int(kernels.BF16), "scale", scale, "key_block", keyBlock, "mma", mma),
		map[string][]byte{"q": f32Bytes(q), "cache": cacheBytes, "kvb": kvb.Data, "kvb_s": kvb.Scales}})
	if err != nil {
		return err
	}
	got, err := output(out, "o", rows*H*vdim)
	if err != nil {
		return err
	}
	want := ref.NewTensor(rows, H*vdim)
	ref.MLAAttention(want, tensor(rows, H*(nope+rope), q), kernels.Span{Lo: lo, Hi: lo + n}, &cache, kvb, H, nope, rope, vdim, scale, false)
	// The expansion rounds c_kv to bf16 (exact for a BF16 cache, 2⁻⁹
	// relative for F32) with fp32 accumulation; scores, softmax and the V
	// sum are fp32. The output is a convex mix of V rows: 4e-3 of the
	// largest output for an F32 cache, 2e-4 for BF16 (observed ~10x lower).
	tol := 2e-4 * maxAbs(want.Data)
	if !bf16 {
		tol = 4e-3 * maxAbs(want.Data)
	}
	if mma {
		// Tensor cores: q and k rounded to bf16 move each score by up to
		// ~2⁻⁸·|q||k|·scale (≈0.1 for these unit-rms rows), P and V are
		// rounded too: 2% of the largest output (observed ~5x lower).
		tol = 0.02 * maxAbs(want.Data)
	}
	return e.within(got, want.Data, func(int) float64 { return tol })
}

// checks3 are the data movement kernels of the device-memory contract.
func checks3() []check {
	return []check{
		{"copy_block/disjoint", func(e *env) error { return checkCopyBlock(e, false, 2, 5, 30, 3, 7, 40, 0) }},
		{"copy_block/squeeze-up", func(e *env) error { return checkCopyBlock(e, true, 2, 0, 5, 0, 9, 150, 1) }},
		{"copy_block/move-down", func(e *env) error { return checkCopyBlock(e, true, 6, 3, 4, 3, 9, 147, -1) }},
		{"write_latent/bf16", func(e *env) error { return checkWriteLatent(e, true) }},
		{"write_latent/f32", func(e *env) error { return checkWriteLatent(e, false) }},
		{"dequant_bf16/MXFP4", func(e *env) error { return checkDequant(e, kernels.MXFP4) }},
		{"dequant_bf16/MXFP8(E4M3)", func(e *env) error { return checkDequant(e, kernels.MXFP8E4M3) }},
		{"dequant_bf16/MXFP8(E5M2)", func(e *env) error { return checkDequant(e, kernels.MXFP8E5M2) }},
	}
}

// checkCopyBlock moves a rows×cols block within one [R, C] tensor (same)
// or between two, against the CPU backend's CopyBlock.
func checkCopyBlock(e *env, same bool, dr, dc, sr, sc, rows, cols, ordered int) error {
	bin, rng := e.bin, e.rng
	R, C := 40, 160
	dst, src := randF32(rng, R*C, 1), randF32(rng, R*C, 1)
	arrays := map[string][]byte{"dst": f32Bytes(dst)}
	if !same {
		arrays["src"] = f32Bytes(src)
	}
	out, err := run(bin, call{"copy_block", p("R", R, "C", C, "dr", dr, "dc", dc, "sr", sr, "sc", sc, "rows", rows, "cols", cols,
		"ordered", ordered, "same", same), arrays})
	if err != nil {
		return err
	}
	got, err := output(out, "dst", R*C)
	if err != nil {
		return err
	}
	want := tensor(R, C, dst)
	from := tensor(R, C, src)
	if same {
		from = want
	}
	ref.CopyBlock(want, dr, dc, from, sr, sc, rows, cols)
	return e.within(got, want.Data, exact)
}

func checkWriteLatent(e *env, bf16 bool) error {
	bin, rng := e.bin, e.rng
	rows, cols, row, srcRow, n := 20, 72, 11, 3, 6
	src := randF32(rng, rows*cols, 3)
	var cache []byte
	if bf16 {
		cache = make([]byte, 2*rows*cols)
	} else {
		cache = make([]byte, 4*rows*cols)
	}
	for i := range cache {
		cache[i] = byte(rng.Uint32())
	}
	out, err := run(bin, call{"write_latent", p("rows", rows, "cols", cols, "row", row, "src_row", srcRow, "n", n, "bf16", bf16),
		map[string][]byte{"cache": cache, "src": f32Bytes(src)}})
	if err != nil {
		return err
	}
	got, ok := out["cache"]
	if !ok || len(got) != len(cache) {
		return fmt.Errorf("driver returned no cache of %d bytes", len(cache))
	}
	// The CPU backend's WriteLatent on the same cache bytes.
	lc := &kernels.LatentCache{Rows: rows, Cols: cols}
	if bf16 {
		lc.BF16 = make([]uint16, rows*cols)
		for i := range lc.BF16 {
			lc.BF16[i] = uint16(cache[2*i]) | uint16(cache[2*i+1])<<8
		}
	} else {
		lc.F32 = bytesF32(cache)
	}
	ref.WriteLatent(lc, row, tensor(rows, cols, src), srcRow, n)
	var want []byte
	if bf16 {
		want = make([]byte, 2*rows*cols)
		for i, h := range lc.BF16 {
			want[2*i], want[2*i+1] = byte(h), byte(h>>8)
		}
	} else {
		want = f32Bytes(lc.F32)
	}
	for i := range want {
		if got[i] != want[i] {
			return fmt.Errorf("cache byte %d (row %d): got %#x, want %#x", i, i/(cols*len(want)/(rows*cols)), got[i], want[i])
		}
	}
	return nil
}

// checkDequant: MX values are exact in bf16, so the device's bf16 must be
// the CPU's exact decoding, bit for bit.
func checkDequant(e *env, f kernels.Format) error {
	bin, rng := e.bin, e.rng
	rows, cols := 9, 96
	w := randMatrix(rng, f, rows, cols, 2)
	out, err := run(bin, call{"dequant_bf16", p("rows", rows, "cols", cols, "fmt", int(f)), map[string][]byte{"w": w.Data, "ws": w.Scales}})
	if err != nil {
		return err
	}
	b, ok := out["dst"]
	if !ok || len(b) != 2*rows*cols {
		return fmt.Errorf("driver returned no dst of %d bf16 values", rows*cols)
	}
	got := make([]float32, rows*cols)
	for i := range got {
		got[i] = mxfp.BF16ToF32(uint16(b[2*i]) | uint16(b[2*i+1])<<8)
	}
	return e.within(got, decoded(w), exact)
}
