package cuda

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/tandem-inference/tandem/kernels"
)

// The launches follow kernels/cuda/src/ABI.md: parameter order and types,
// grids and blocks.

// fn returns a kernel by module and name.
func (b *Backend) fn(mod, name string) cuFunc {
	key := mod + "." + name
	if f, ok := b.funcs[key]; ok {
		return f
	}
	m, ok := b.mods[mod]
	if !ok {
		panic(fmt.Sprintf("cuda: no kernel module %q", mod))
	}
	var f cuFunc
	cname := cBytes(name)
	b.must("cuModuleGetFunction("+key+")", b.d.cuModuleGetFunction(&f, m, &cname[0]))
	b.funcs[key] = f
	return f
}

// i64, i32 and f32 tag launch arguments with their C types; a devPtr is a
// pointer parameter.
type (
	i64 int64
	i32 int32
	f32 float32
)

// launch runs a kernel on the compute stream. Each argument is stored in an
// 8-byte slot and kernelParams points at the slots; both arrays are pinned
// for the call (the driver reads them during cuLaunchKernel only).
func (b *Backend) launch(mod, name string, grid, block [3]uint32, args ...any) {
	if b.onLaunch != nil {
		b.onLaunch(mod, name, args)
	}
	slots := make([]uint64, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case devPtr:
			slots[i] = uint64(v)
		case i64:
			slots[i] = uint64(v)
		case i32:
			slots[i] = uint64(uint32(v))
		case f32:
			slots[i] = uint64(math.Float32bits(float32(v)))
		default:
			panic(fmt.Sprintf("cuda: %s.%s argument %d has type %T", mod, name, i, a))
		}
	}
	params := make([]unsafe.Pointer, len(slots))
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&slots[0])
	for i := range slots {
		params[i] = unsafe.Pointer(&slots[i])
	}
	pin.Pin(&params[0])
	f := b.fn(mod, name)
	for i, g := range grid {
		if g == 0 {
			grid[i] = 1
		}
	}
	b.must("cuLaunchKernel("+mod+"."+name+")", b.d.cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, b.compute,
		unsafe.Pointer(&params[0]), nil))
}

// strided is the ABI's grid for a grid-stride kernel over n values.
func strided(n int) [3]uint32 { return [3]uint32{uint32(min((n+255)/256, 65535)), 1, 1} }

// perGroup is the ABI's grid for a block-per-group kernel.
func perGroup(n int) [3]uint32 { return [3]uint32{uint32(min(n, 65535)), 1, 1} }

var block256 = [3]uint32{256, 1, 1}

func sameShape(op string, a, c *kernels.Tensor) {
	if a.Rows != c.Rows || a.Cols != c.Cols {
		panic(fmt.Sprintf("cuda.%s: %v and %v", op, a, c))
	}
}

// Embed gathers table rows; ids are checked on the host (a bad id is a
// programmer error, as on the CPU).
func (b *Backend) Embed(dst *kernels.Tensor, table *kernels.Matrix, ids []int32) {
	if dst.Rows != len(ids) || dst.Cols != table.Cols {
		panic(fmt.Sprintf("cuda.Embed: %v for %d ids of a [%d, %d] table", dst, len(ids), table.Rows, table.Cols))
	}
	for i, id := range ids {
		if id < 0 || int(id) >= table.Rows {
			panic(fmt.Sprintf("cuda.Embed: id %d at %d outside [0, %d)", id, i, table.Rows))
		}
	}
	if len(ids) == 0 {
		return
	}
	md := b.matrix(table)
	b.enter()
	defer runtime.UnlockOSThread()
	n := len(ids) * table.Cols
	b.launch("elementwise", "tandem_embed", strided(n), block256, b.ptr(dst), md.data, md.scales, i32(table.Format), i32(table.Rows), i32(table.Cols), b.temp(ids), i64(len(ids)))
}

func (b *Backend) matrix(m *kernels.Matrix) *matDev {
	md, ok := m.Dev.(*matDev)
	if !ok {
		panic(fmt.Sprintf("cuda: weight %s is not bound", m.Name))
	}
	return md
}

// MatMul runs the tensor-core GEMM for BF16 and MX weights and the exact
// fp32 GEMM for F32/F16 ones.
func (b *Backend) MatMul(dst, x *kernels.Tensor, w *kernels.Matrix) {
	if x.Cols != w.Cols || dst.Cols != w.Rows || dst.Rows != x.Rows {
		panic(fmt.Sprintf("cuda.MatMul: %v · [%d, %d]ᵀ into %v", x, w.Rows, w.Cols, dst))
	}
	b.enter()
	defer runtime.UnlockOSThread()
	b.gemm(b.ptr(dst), b.ptr(x), x.Rows, w)
}

func (b *Backend) gemm(y, x devPtr, T int, w *kernels.Matrix) {
	if T == 0 {
		return
	}
	md := b.matrix(w)
	O, I := w.Rows, w.Cols
	switch {
	case b.lt != nil && w.Format != kernels.F32 && w.Format != kernels.F16:
		b.ltGemm(y, x, T, w)
	case w.Format == kernels.F32 || w.Format == kernels.F16:
		b.launch("gemm", "tandem_gemm_f32", [3]uint32{uint32((O + 15) / 16), uint32((T + 15) / 16), 1}, block256,
			y, x, i64(T), i32(O), i32(I), md.data, md.scales, i32(w.Format))
	default:
		b.launch("gemm", "tandem_gemm_bf16", [3]uint32{uint32((O + 63) / 64), uint32((T + 63) / 64), 1}, [3]uint32{128, 1, 1},
			y, x, i64(T), i32(O), i32(I), md.data, md.scales, i32(w.Format))
	}
}

// RMSNorm resolves the group as the CPU backend does.
func (b *Backend) RMSNorm(dst, x *kernels.Tensor, w []float32, group int, eps float32) {
	sameShape("RMSNorm", dst, x)
	if group == 0 {
		group = len(w)
		if group == 0 {
			group = x.Cols
		}
	}
	if x.Cols%group != 0 || (w != nil && len(w) != group) {
		panic(fmt.Sprintf("cuda.RMSNorm: %v with group %d and %d weights", x, group, len(w)))
	}
	b.enter()
	defer runtime.UnlockOSThread()
	n := x.Rows * x.Cols / group
	b.launch("norm", "tandem_rmsnorm", perGroup(n), block256, b.ptr(dst), b.ptr(x), b.temp(w), i64(n), i32(group), f32(eps))
}

func (b *Backend) L2NormGroups(x *kernels.Tensor, group int, eps, scale float32) {
	if group <= 0 || x.Cols%group != 0 {
		panic(fmt.Sprintf("cuda.L2NormGroups: %v with group %d", x, group))
	}
	b.enter()
	defer runtime.UnlockOSThread()
	n := x.Rows * x.Cols / group
	b.launch("norm", "tandem_l2norm_groups", perGroup(n), block256, b.ptr(x), i64(n), i32(group), f32(eps), f32(scale))
}

func (b *Backend) Add(dst, a, c *kernels.Tensor) {
	sameShape("Add", dst, a)
	sameShape("Add", a, c)
	b.enter()
	defer runtime.UnlockOSThread()
	n := dst.Rows * dst.Cols
	b.launch("elementwise", "tandem_add", strided(n), block256, b.ptr(dst), b.ptr(a), b.ptr(c), i64(n))
}

func (b *Backend) AddBias(x *kernels.Tensor, bias []float32) {
	if len(bias) != x.Cols {
		panic(fmt.Sprintf("cuda.AddBias: %d biases for %v", len(bias), x))
	}
	b.enter()
	defer runtime.UnlockOSThread()
	b.launch("elementwise", "tandem_add_bias", strided(x.Rows*x.Cols), block256, b.ptr(x), b.temp(bias), i64(x.Rows), i32(x.Cols))
}

func (b *Backend) Sigmoid(x *kernels.Tensor) {
	b.enter()
	defer runtime.UnlockOSThread()
	n := x.Rows * x.Cols
	b.launch("elementwise", "tandem_sigmoid", strided(n), block256, b.ptr(x), i64(n))
}

func (b *Backend) MulSigmoid(x, gate *kernels.Tensor) {
	sameShape("MulSigmoid", x, gate)
	b.enter()
	defer runtime.UnlockOSThread()
	n := x.Rows * x.Cols
	b.launch("elementwise", "tandem_mul_sigmoid", strided(n), block256, b.ptr(x), b.ptr(gate), i64(n))
}

// SiTUMLP is the ABI's composite: two GEMMs into scratch, the activation,
// the down GEMM.
func (b *Backend) SiTUMLP(dst, x *kernels.Tensor, gate, up, down *kernels.Matrix, beta1, beta2 float32) {
	T, inter := x.Rows, gate.Rows
	if up.Rows != inter || down.Cols != inter || dst.Cols != down.Rows || x.Cols != gate.Cols || dst.Rows != T {
		panic(fmt.Sprintf("cuda.SiTUMLP: x %v gate [%d,%d] up [%d,%d] down [%d,%d] dst %v", x, gate.Rows, gate.Cols, up.Rows, up.Cols, down.Rows, down.Cols, dst))
	}
	b.enter()
	defer runtime.UnlockOSThread()
	n := uint64(T * inter * 4)
	g, u := b.alloc(n), b.alloc(n)
	defer b.release(g, n)
	defer b.release(u, n)
	b.gemm(g, b.ptr(x), T, gate)
	b.gemm(u, b.ptr(x), T, up)
	b.launch("elementwise", "tandem_situ", strided(T*inter), block256, g, g, u, i64(T*inter), f32(beta1), f32(beta2))
	b.gemm(b.ptr(dst), g, T, down)
}

func (b *Backend) AttnResMix(dst *kernels.Tensor, sources []*kernels.Tensor, proj []float32, eps float32) {
	if len(sources) == 0 || len(sources) > 64 || len(proj) != dst.Cols {
		panic(fmt.Sprintf("cuda.AttnResMix: %d sources, %d projection weights for %v", len(sources), len(proj), dst))
	}
	tab := make([]uint64, len(sources))
	for i, s := range sources {
		sameShape("AttnResMix", dst, s)
		tab[i] = uint64(b.ptr(s))
	}
	b.enter()
	defer runtime.UnlockOSThread()
	b.launch("norm", "tandem_attnres_mix", perGroup(dst.Rows), block256, b.ptr(dst), b.temp(tab), i32(len(sources)), b.temp(proj), i64(dst.Rows), i32(dst.Cols), f32(eps))
}

func (b *Backend) ShortConvSiLU(dst, x *kernels.Tensor, span kernels.Span, w *kernels.Tensor, tail *kernels.Tensor) {
	P, K := w.Rows, w.Cols
	if x.Cols != P || dst.Cols != P || tail.Rows*tail.Cols != P*(K-1) || K > 8 {
		panic(fmt.Sprintf("cuda.ShortConvSiLU: x %v, w %v, tail %v", x, w, tail))
	}
	b.enter()
	defer runtime.UnlockOSThread()
	b.launch("conv", "tandem_short_conv_silu", [3]uint32{uint32((P + 127) / 128), 1, 1}, [3]uint32{128, 1, 1},
		b.ptr(dst), b.ptr(x), i64(span.Lo), i64(span.Len()), i32(P), b.hostTensor(w), i32(K), b.ptr(tail))
}

func (b *Backend) KDAGate(z *kernels.Tensor, aLog []float32, headDim int, lower float32) {
	heads := z.Cols / headDim
	if heads*headDim != z.Cols || len(aLog) < heads {
		panic(fmt.Sprintf("cuda.KDAGate: %v with head dim %d and %d A_log", z, headDim, len(aLog)))
	}
	b.enter()
	defer runtime.UnlockOSThread()
	b.launch("elementwise", "tandem_kda_gate", strided(z.Rows*z.Cols), block256, b.ptr(z), b.temp(aLog[:heads]), i64(z.Rows), i32(z.Cols), i32(headDim), f32(lower))
}

// kdaChunk is the device's chunk: both of the model's forms (chunk 64 and
// the sequential recurrence) compute the same function, which the device
// computes in chunks of 16 (ABI.md: e^±Γ stays in fp32's range).
const kdaChunk = 16

func (b *Backend) KDA(o, q, k, v, g, beta *kernels.Tensor, span kernels.Span, S *kernels.Tensor, heads, dk, dv, chunk int) {
	if q.Cols != heads*dk || k.Cols != heads*dk || g.Cols != heads*dk || v.Cols != heads*dv || o.Cols != heads*dv ||
		beta.Cols != heads || S.Rows*S.Cols != heads*dk*dv || dk > 128 || dv > 128 {
		panic(fmt.Sprintf("cuda.KDA: q %v k %v v %v g %v beta %v o %v S %v for %d heads %dx%d", q, k, v, g, beta, o, S, heads, dk, dv))
	}
	if span.Len() == 0 {
		return
	}
	b.enter()
	defer runtime.UnlockOSThread()
	b.launch("kda", "tandem_kda_chunked", [3]uint32{uint32(heads), 1, 1}, [3]uint32{128, 1, 1},
		b.ptr(o), b.ptr(q), b.ptr(k), b.ptr(v), b.ptr(g), b.ptr(beta), i64(span.Lo), i64(span.Len()), b.ptr(S), i32(heads), i32(dk), i32(dv), i32(kdaChunk))
}

// WriteLatent stores rows into the attached cache in its dtype (BF16
// rounded to nearest even on the device).
func (b *Backend) WriteLatent(c *kernels.LatentCache, row int, src *kernels.Tensor, srcRow, n int) {
	ld, ok := c.Dev.(*latentDev)
	if !ok || src.Cols != c.Cols || row < 0 || row+n > c.Rows || srcRow < 0 || srcRow+n > src.Rows {
		panic(fmt.Sprintf("cuda.WriteLatent: %d rows from %d of %v into rows %d.. of a [%d, %d] cache (attached %v)", n, srcRow, src, row, c.Rows, c.Cols, ok))
	}
	if n == 0 {
		return
	}
	b.enter()
	defer runtime.UnlockOSThread()
	b.launch("elementwise", "tandem_write_latent", strided(n*c.Cols), block256, ld.p, flag(ld.bf16), i64(row), i32(c.Cols), b.ptr(src), i64(srcRow), i64(n))
}

func flag(v bool) i32 {
	if v {
		return 1
	}
	return 0
}

// mlaScratch bounds the expanded keys and values of one key block.
const mlaScratch = 1 << 30

// MLAAttention runs the expanded (prefill) form per ABI.md over blocks of
// key rows, so that the expanded K_nope and V take at most mlaScratch
// bytes at any cache length: per block, split the cache rows, expand them
// with kv_b_proj, and attend them carrying the online softmax's state; on
// the tensor cores when the head fits (K3's does). The absorbed decode form
// runs on the decode group, not here.
func (b *Backend) MLAAttention(o, q *kernels.Tensor, span kernels.Span, c *kernels.LatentCache, kvb *kernels.Matrix, heads, nope, rope, vdim int, scale float32, absorb bool) {
	ld, ok := c.Dev.(*latentDev)
	lora, n, Tc := c.Cols-rope, span.Len(), c.Rows
	if !ok || absorb || q.Cols != heads*(nope+rope) || o.Cols != heads*vdim || kvb.Rows != heads*(nope+vdim) || kvb.Cols != lora || n > Tc ||
		nope+rope > 256 || vdim > 128 {
		panic(fmt.Sprintf("cuda.MLAAttention: q %v o %v kvb [%d,%d] cache [%d,%d] (attached %v) span %d, heads %d nope %d rope %d v %d absorb %v",
			q, o, kvb.Rows, kvb.Cols, Tc, c.Cols, ok, n, heads, nope, rope, vdim, absorb))
	}
	if n == 0 {
		return
	}
	b.enter()
	defer runtime.UnlockOSThread()
	es := 4
	if ld.bf16 {
		es = 2
	}
	kb := max(64, mlaScratch/(heads*(nope+vdim)*4))
	kb = min(kb, Tc)
	cn, pn, kn := uint64(kb*lora*4), uint64(kb*rope*4), uint64(kb*heads*(nope+vdim)*4)
	ckv, kpe, kv := b.alloc(cn), b.alloc(pn), b.alloc(kn)
	defer b.release(ckv, cn)
	defer b.release(kpe, pn)
	defer b.release(kv, kn)
	var state devPtr
	if kb < Tc {
		sn := uint64(n * heads * (vdim + 2) * 4)
		state = b.alloc(sn)
		defer b.release(state, sn)
	}
	mma := nope+rope <= 192 && vdim <= 128
	for k0 := 0; k0 < Tc; k0 += kb {
		k1 := min(k0+kb, Tc)
		rows := k1 - k0
		fl := i32(0)
		if k0 == 0 {
			fl |= 1
		}
		if k1 == Tc {
			fl |= 2
		}
		b.launch("mla", "tandem_mla_split_cache", strided(rows*c.Cols), block256, ckv, kpe, ld.p+devPtr(k0*c.Cols*es), flag(ld.bf16), i64(rows), i32(c.Cols), i32(rope))
		b.gemm(kv, ckv, rows, kvb)
		args := []any{b.ptr(o), b.ptr(q), kv, kpe, i64(span.Lo), i64(n), i64(Tc), i32(heads), i32(nope), i32(rope), i32(vdim), f32(scale), i64(k0), i64(k1), state, fl}
		if mma {
			b.launch("mla", "tandem_mla_attn_mma", [3]uint32{uint32((n + 63) / 64), uint32(heads), 1}, [3]uint32{128, 1, 1}, args...)
		} else {
			b.launch("mla", "tandem_mla_attn_block", [3]uint32{uint32(n), uint32(heads), 1}, [3]uint32{128, 1, 1}, args...)
		}
	}
}

// RouterTopK selects on the device and brings ids and weights to the host
// (the contract's one routing crossing).
func (b *Backend) RouterTopK(logits *kernels.Tensor, bias []float32, k int, renorm bool, scale float32, ids []int32, weights []float32) {
	E, T := logits.Cols, logits.Rows
	if len(bias) != E || len(ids) != T*k || len(weights) != T*k || k > E || E > 1024 || k > 32 {
		panic(fmt.Sprintf("cuda.RouterTopK: logits %v, %d biases, k %d, %d ids, %d weights", logits, len(bias), k, len(ids), len(weights)))
	}
	if T == 0 {
		return
	}
	b.enter()
	defer runtime.UnlockOSThread()
	n := uint64(T * k * 4)
	di, dw := b.alloc(n), b.alloc(n)
	defer b.release(di, n)
	defer b.release(dw, n)
	b.launch("router", "tandem_router_topk", [3]uint32{uint32((T + 3) / 4), 1, 1}, [3]uint32{128, 1, 1},
		b.ptr(logits), b.temp(bias), i64(T), i32(E), i32(k), flag(renorm), f32(scale), di, dw)
	b.must("cuMemcpyDtoHAsync", b.d.cuMemcpyDtoHAsync(unsafe.Pointer(&ids[0]), di, n, b.compute))
	b.must("cuMemcpyDtoHAsync", b.d.cuMemcpyDtoHAsync(unsafe.Pointer(&weights[0]), dw, n, b.compute))
	b.must("cuStreamSynchronize", b.d.cuStreamSynchronize(b.compute))
}

// RoutedExperts is the ABI's composite: rows grouped by expert on the
// host, gathered, three grouped GEMMs with the activation between, and the
// j-ordered combine.
func (b *Backend) RoutedExperts(u, z *kernels.Tensor, ids []int32, weights []float32, k int, experts []kernels.Expert, beta1, beta2 float32) {
	T := z.Rows
	if len(ids) != T*k || len(weights) != T*k || u.Rows != T || len(experts) == 0 {
		panic(fmt.Sprintf("cuda.RoutedExperts: z %v u %v, %d ids, %d weights, k %d, %d experts", z, u, len(ids), len(weights), k, len(experts)))
	}
	if T == 0 {
		return
	}
	inter, lat := experts[0].W1.Rows, experts[0].W1.Cols
	f := experts[0].W1.Format
	if z.Cols != lat || u.Cols != lat {
		panic(fmt.Sprintf("cuda.RoutedExperts: z %v u %v for experts [%d, %d]", z, u, inter, lat))
	}
	p := kernels.GroupExperts(ids, k, len(experts))
	for _, e := range p.Experts {
		x := experts[e]
		for _, m := range []*kernels.Matrix{x.W1, x.W3, x.W2} {
			if m.Format != f {
				panic(fmt.Sprintf("cuda.RoutedExperts: expert %d weight %s is %s, expert 0's are %s", e, m.Name, m.Format, f))
			}
		}
	}
	tab := func(pick func(kernels.Expert) *kernels.Matrix, scales bool) []uint64 {
		t := make([]uint64, len(p.Experts))
		for g, e := range p.Experts {
			md := b.matrix(pick(experts[e]))
			if scales {
				t[g] = uint64(md.scales)
			} else {
				t[g] = uint64(md.data)
			}
		}
		return t
	}
	w1 := func(x kernels.Expert) *kernels.Matrix { return x.W1 }
	w3 := func(x kernels.Expert) *kernels.Matrix { return x.W3 }
	w2 := func(x kernels.Expert) *kernels.Matrix { return x.W2 }
	b.enter()
	defer runtime.UnlockOSThread()
	N := T * k
	xn, hn, yn := uint64(N*lat*4), uint64(N*inter*4), uint64(N*lat*4)
	xg, g, up, y := b.alloc(xn), b.alloc(hn), b.alloc(hn), b.alloc(yn)
	defer b.release(xg, xn)
	defer b.release(g, hn)
	defer b.release(up, hn)
	defer b.release(y, yn)
	offs, order, pos := b.temp(p.Offs), b.temp(p.Order), b.temp(p.Pos)
	b.launch("elementwise", "tandem_gather_rows", strided(N*lat), block256, xg, b.ptr(z), order, i64(N), i32(lat))
	G := uint32(len(p.Experts))
	grid := func(O int) [3]uint32 { return [3]uint32{uint32((O + 63) / 64), uint32((p.MaxRows + 63) / 64), G} }
	blk := [3]uint32{128, 1, 1}
	b.launch("gemm", "tandem_gemm_bf16_grouped", grid(inter), blk, g, xg, offs, b.temp(tab(w1, false)), b.temp(tab(w1, true)), i32(f), i32(inter), i32(lat))
	b.launch("gemm", "tandem_gemm_bf16_grouped", grid(inter), blk, up, xg, offs, b.temp(tab(w3, false)), b.temp(tab(w3, true)), i32(f), i32(inter), i32(lat))
	b.launch("elementwise", "tandem_situ", strided(N*inter), block256, g, g, up, i64(N*inter), f32(beta1), f32(beta2))
	b.launch("gemm", "tandem_gemm_bf16_grouped", grid(lat), blk, y, g, offs, b.temp(tab(w2, false)), b.temp(tab(w2, true)), i32(f), i32(lat), i32(inter))
	b.launch("elementwise", "tandem_moe_combine", strided(T*lat), block256, b.ptr(u), y, pos, b.temp(weights), i64(T), i32(k), i32(lat))
}
