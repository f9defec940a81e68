package metal

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/tandem-inference/tandem/kernels"
)

// The dispatches follow src/ABI.md: argument order, parameter structs,
// threadgroups and threads.

// params packs a kernel's constant struct: every field is a 4-byte uint,
// int or float (int values are stored as uint32, float32 as their bits).
func params(vals ...any) Arg {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		var u uint32
		switch x := v.(type) {
		case int:
			if x < 0 || x > math.MaxUint32 {
				panic(fmt.Sprintf("metal: parameter %d = %d does not fit a uint", i, x))
			}
			u = uint32(x)
		case int32:
			u = uint32(x)
		case float32:
			u = math.Float32bits(x)
		case bool:
			if x {
				u = 1
			}
		default:
			panic(fmt.Sprintf("metal: parameter %d of type %T", i, v))
		}
		binary.LittleEndian.PutUint32(b[4*i:], u)
	}
	return Arg{Bytes: b}
}

func tgmem(n int) Arg { return Arg{Threadgroup: n} }

// strided is the grid of a grid-stride kernel over n elements.
func strided(n int) [3]int { return [3]int{max(1, min((n+255)/256, 1024)), 1, 1} }

// perGroup is the grid of a threadgroup-per-group kernel.
func perGroup(n int) [3]int { return [3]int{max(1, min(n, 65535)), 1, 1} }

var (
	tg256 = [3]int{256, 1, 1}
	tg128 = [3]int{128, 1, 1}
)

// scratch is tg_sum's threadgroup memory: 32 floats.
const scratch = 32 * 4

func sameShape(op string, a, c *kernels.Tensor) {
	if a.Rows != c.Rows || a.Cols != c.Cols {
		panic(fmt.Sprintf("metal.%s: %v and %v", op, a, c))
	}
}

// Embed gathers table rows; ids are checked on the host (a bad id is a
// programmer error, as on the CPU).
func (b *Backend) Embed(dst *kernels.Tensor, table *kernels.Matrix, ids []int32) {
	if dst.Rows != len(ids) || dst.Cols != table.Cols {
		panic(fmt.Sprintf("metal.Embed: %v for %d ids of a [%d, %d] table", dst, len(ids), table.Rows, table.Cols))
	}
	for i, id := range ids {
		if id < 0 || int(id) >= table.Rows {
			panic(fmt.Sprintf("metal.Embed: id %d at %d outside [0, %d)", id, i, table.Rows))
		}
	}
	if len(ids) == 0 {
		return
	}
	w, ws := b.weight(table)
	t := b.temp("Embed", ids)
	defer t.Release()
	b.dispatch("tandem_embed", strided(len(ids)*table.Cols), tg256, b.out(dst), w, ws, Arg{Buf: t},
		params(int(table.Format), table.Rows, table.Cols, len(ids)))
}

// MatMul is the GEMV kernel for every format and row count.
func (b *Backend) MatMul(dst, x *kernels.Tensor, w *kernels.Matrix) {
	if x.Cols != w.Cols || dst.Cols != w.Rows || dst.Rows != x.Rows {
		panic(fmt.Sprintf("metal.MatMul: %v · [%d, %d]ᵀ into %v", x, w.Rows, w.Cols, dst))
	}
	b.gemv(b.out(dst), b.in(x), x.Rows, w)
}

// gemvTok and gemvRows are the GEMV kernel's tokens and output rows per
// threadgroup.
const gemvTok, gemvRows = 8, 8

func (b *Backend) gemv(y, x Arg, T int, w *kernels.Matrix) {
	if T == 0 {
		return
	}
	wd, ws := b.weight(w)
	y.Write = true
	b.dispatch("tandem_gemv", [3]int{(w.Rows + gemvRows - 1) / gemvRows, (T + gemvTok - 1) / gemvTok, 1}, tg256,
		y, x, wd, ws, params(T, w.Rows, w.Cols, int(w.Format)))
}

// RMSNorm resolves the group as the CPU backend does: len(w), else group,
// else the row.
func (b *Backend) RMSNorm(dst, x *kernels.Tensor, w []float32, group int, eps float32) {
	sameShape("RMSNorm", dst, x)
	if len(w) > 0 {
		group = len(w)
	} else if group == 0 {
		group = x.Cols
	}
	if group <= 0 || x.Cols%group != 0 {
		panic(fmt.Sprintf("metal.RMSNorm: group %d of %v", group, x))
	}
	n := x.Rows * x.Cols / group
	if n == 0 {
		return
	}
	wa := Arg{Buf: b.view(x).buf} // bound, not read, without a weight
	if len(w) > 0 {
		t := b.temp("RMSNorm", w)
		defer t.Release()
		wa = Arg{Buf: t}
	}
	b.dispatch("tandem_rmsnorm", perGroup(n), tg256, b.out(dst), b.in(x), wa, params(n, group, len(w) > 0, eps), tgmem(scratch))
}

// L2NormGroups scales each group of `group` values in place.
func (b *Backend) L2NormGroups(x *kernels.Tensor, group int, eps, scale float32) {
	if group <= 0 || x.Cols%group != 0 {
		panic(fmt.Sprintf("metal.L2NormGroups: group %d of %v", group, x))
	}
	n := x.Rows * x.Cols / group
	if n == 0 {
		return
	}
	b.dispatch("tandem_l2norm_groups", perGroup(n), tg256, b.out(x), params(n, group, eps, scale), tgmem(scratch))
}

// Add computes dst = a + c.
func (b *Backend) Add(dst, a, c *kernels.Tensor) {
	sameShape("Add", dst, a)
	sameShape("Add", dst, c)
	if n := dst.Rows * dst.Cols; n > 0 {
		b.dispatch("tandem_add", strided(n), tg256, b.out(dst), b.in(a), b.in(c), params(n))
	}
}

// AddBias adds bias to every row.
func (b *Backend) AddBias(x *kernels.Tensor, bias []float32) {
	if len(bias) != x.Cols {
		panic(fmt.Sprintf("metal.AddBias: %d biases for %v", len(bias), x))
	}
	if x.Rows == 0 {
		return
	}
	t := b.temp("AddBias", bias)
	defer t.Release()
	b.dispatch("tandem_add_bias", strided(x.Rows*x.Cols), tg256, b.out(x), Arg{Buf: t}, params(x.Rows, x.Cols))
}

// Sigmoid applies σ in place.
func (b *Backend) Sigmoid(x *kernels.Tensor) {
	if n := x.Rows * x.Cols; n > 0 {
		b.dispatch("tandem_sigmoid", strided(n), tg256, b.out(x), params(n))
	}
}

// MulSigmoid computes x ⊙ σ(gate) in place.
func (b *Backend) MulSigmoid(x, gate *kernels.Tensor) {
	sameShape("MulSigmoid", x, gate)
	if n := x.Rows * x.Cols; n > 0 {
		b.dispatch("tandem_mul_sigmoid", strided(n), tg256, b.out(x), b.in(gate), params(n))
	}
}

// situ applies SiTU to n values: h = SiTU(g, u).
func (b *Backend) situ(h, g, u Arg, n int, beta1, beta2 float32) {
	h.Write = true
	b.dispatch("tandem_situ", strided(n), tg256, h, g, u, params(n, beta1, beta2))
}

// SiTUMLP is gate and up GEMVs, SiTU, and the down GEMV.
func (b *Backend) SiTUMLP(dst, x *kernels.Tensor, gate, up, down *kernels.Matrix, beta1, beta2 float32) {
	T, inter := x.Rows, gate.Rows
	if gate.Cols != x.Cols || up.Rows != inter || up.Cols != x.Cols || down.Cols != inter || down.Rows != dst.Cols || dst.Rows != T {
		panic(fmt.Sprintf("metal.SiTUMLP: x %v dst %v gate [%d,%d] up [%d,%d] down [%d,%d]", x, dst, gate.Rows, gate.Cols, up.Rows, up.Cols, down.Rows, down.Cols))
	}
	if T == 0 {
		return
	}
	g, u := b.buffer("SiTUMLP", 4*T*inter), b.buffer("SiTUMLP", 4*T*inter)
	defer g.Release()
	defer u.Release()
	b.gemv(Arg{Buf: g}, b.in(x), T, gate)
	b.gemv(Arg{Buf: u}, b.in(x), T, up)
	b.situ(Arg{Buf: g}, Arg{Buf: g}, Arg{Buf: u}, T*inter, beta1, beta2)
	b.gemv(b.out(dst), Arg{Buf: g}, T, down)
}

// AttnResMix is per source a score dispatch, then a softmax over the
// sources per row, then per source the weighted term added in source
// order (src/ABI.md).
func (b *Backend) AttnResMix(dst *kernels.Tensor, sources []*kernels.Tensor, proj []float32, eps float32) {
	rows, cols, n := dst.Rows, dst.Cols, len(sources)
	if len(proj) != cols || n == 0 {
		panic(fmt.Sprintf("metal.AttnResMix: %v with %d sources and %d projection values", dst, n, len(proj)))
	}
	for _, s := range sources {
		sameShape("AttnResMix", dst, s)
	}
	if rows == 0 {
		return
	}
	pj := b.temp("AttnResMix", proj)
	defer pj.Release()
	sc := b.buffer("AttnResMix", 4*rows*n)
	defer sc.Release()
	for j, s := range sources {
		b.dispatch("tandem_attnres_score", perGroup(rows), tg256, Arg{Buf: sc, Write: true}, b.in(s), Arg{Buf: pj}, params(rows, cols, n, j, eps), tgmem(scratch))
	}
	b.dispatch("tandem_softmax_rows", strided(rows), tg256, Arg{Buf: sc, Write: true}, params(rows, n))
	for j, s := range sources {
		b.dispatch("tandem_attnres_acc", strided(rows*cols), tg256, b.out(dst), b.in(s), Arg{Buf: sc}, params(rows, cols, n, j))
	}
}

// convMaxK is the conv kernel's largest window.
const convMaxK = 8

// ShortConvSiLU is one dispatch over the span's channels.
func (b *Backend) ShortConvSiLU(dst, x *kernels.Tensor, span kernels.Span, w *kernels.Tensor, tail *kernels.Tensor) {
	P, K := w.Rows, w.Cols
	if x.Cols != P || dst.Cols != P || tail.Rows*tail.Cols != P*(K-1) || K < 1 || K > convMaxK || span.Lo < 0 || span.Hi > x.Rows {
		panic(fmt.Sprintf("metal.ShortConvSiLU: x %v dst %v w %v tail %v span %v", x, dst, w, tail, span))
	}
	if span.Len() == 0 {
		return
	}
	// w is the model's own host tensor (a weight), or a backend tensor.
	wa := Arg{}
	if w.Dev != nil {
		wa = b.in(w)
	} else {
		t := b.temp("ShortConvSiLU", w.Data)
		defer t.Release()
		wa = Arg{Buf: t}
	}
	b.dispatch("tandem_short_conv_silu", strided(P), tg256, b.out(dst), b.in(x), wa, b.out(tail), params(span.Lo, span.Len(), P, K))
}

// KDAGate maps z to the log decay in place.
func (b *Backend) KDAGate(z *kernels.Tensor, aLog []float32, headDim int, lower float32) {
	heads := z.Cols / max(headDim, 1)
	if headDim <= 0 || heads*headDim != z.Cols || len(aLog) < heads {
		panic(fmt.Sprintf("metal.KDAGate: %v with head dim %d and %d A_log", z, headDim, len(aLog)))
	}
	if z.Rows == 0 {
		return
	}
	t := b.temp("KDAGate", aLog[:heads])
	defer t.Release()
	b.dispatch("tandem_kda_gate", strided(z.Rows*z.Cols), tg256, b.out(z), Arg{Buf: t}, params(z.Rows, z.Cols, headDim, lower))
}

// kdaMax is the recurrent kernel's largest head dimension.
const kdaMax = 128

// KDA runs the recurrent kernel for every chunk size: the chunked form
// computes the same function (the CPU backend's two forms agree within
// conformance's tolerance), and Metal's chunked kernel is not written yet.
func (b *Backend) KDA(o, q, k, v, g, beta *kernels.Tensor, span kernels.Span, S *kernels.Tensor, heads, dk, dv, chunk int) {
	if q.Cols != heads*dk || k.Cols != heads*dk || g.Cols != heads*dk || v.Cols != heads*dv || o.Cols != heads*dv ||
		beta.Cols != heads || S.Rows*S.Cols != heads*dk*dv || dk > kdaMax || dv > kdaMax || dk <= 0 || dv <= 0 || span.Lo < 0 || span.Hi > q.Rows {
		panic(fmt.Sprintf("metal.KDA: q %v k %v v %v g %v beta %v o %v S %v for %d heads %dx%d", q, k, v, g, beta, o, S, heads, dk, dv))
	}
	if span.Len() == 0 {
		return
	}
	threads := (dv + 31) / 32 * 32
	b.dispatch("tandem_kda_recurrent", [3]int{heads, 1, 1}, [3]int{threads, 1, 1}, b.out(o), b.in(q), b.in(k), b.in(v), b.in(g), b.in(beta), b.out(S),
		params(span.Lo, span.Len(), heads, dk, dv), tgmem(4*dk))
}

// WriteLatent writes rows into the attached cache.
func (b *Backend) WriteLatent(c *kernels.LatentCache, row int, src *kernels.Tensor, srcRow, n int) {
	ld, ok := c.Dev.(*latentDev)
	if !ok || src.Cols != c.Cols || row < 0 || row+n > c.Rows || srcRow < 0 || srcRow+n > src.Rows {
		panic(fmt.Sprintf("metal.WriteLatent: %d rows from %d of %v into row %d of a [%d, %d] cache (attached %v)", n, srcRow, src, row, c.Rows, c.Cols, ok))
	}
	if n == 0 {
		return
	}
	b.dispatch("tandem_write_latent", strided(n*c.Cols), tg256, Arg{Buf: ld.buf, Write: true}, b.in(src), params(ld.bf16, row, c.Cols, srcRow, n))
}

// mlaMaxLora is the absorbed kernel's largest latent width.
const mlaMaxLora = 512

// MLAAttention runs the weight-absorbed kernel for both forms: they are
// equal in exact arithmetic, and Metal's expanded (prefill) kernel is not
// written yet.
func (b *Backend) MLAAttention(o, q *kernels.Tensor, span kernels.Span, c *kernels.LatentCache, kvb *kernels.Matrix, heads, nope, rope, vdim int, scale float32, absorb bool) {
	ld, ok := c.Dev.(*latentDev)
	lora, n, Tc := c.Cols-rope, span.Len(), c.Rows
	if !ok || q.Cols != heads*(nope+rope) || o.Cols != heads*vdim || kvb.Rows != heads*(nope+vdim) || kvb.Cols != lora || n > Tc ||
		lora > mlaMaxLora || lora <= 0 || span.Lo < 0 || span.Hi > q.Rows {
		panic(fmt.Sprintf("metal.MLAAttention: q %v o %v kvb [%d,%d] cache [%d,%d] (attached %v) span %v, heads %d nope %d rope %d v %d",
			q, o, kvb.Rows, kvb.Cols, Tc, c.Cols, ok, span, heads, nope, rope, vdim))
	}
	if n == 0 || heads == 0 {
		return
	}
	const sgs = 8 // SIMD-groups of a 256-thread threadgroup
	tg := 4 * (lora + rope + sgs*(lora+2) + lora + 1)
	w, ws := b.weight(kvb)
	b.dispatch("tandem_mla_absorbed", [3]int{n, heads, 1}, tg256, b.out(o), b.in(q), Arg{Buf: ld.buf}, w, ws,
		params(span.Lo, n, Tc, heads, nope, rope, vdim, c.Cols, ld.bf16, int(kvb.Format), scale), tgmem(tg))
}

// RouterTopK selects on the device and waits for the ids and weights (the
// contract's one routing crossing).
func (b *Backend) RouterTopK(logits *kernels.Tensor, bias []float32, k int, renorm bool, scale float32, ids []int32, weights []float32) {
	E, T := logits.Cols, logits.Rows
	if len(bias) != E || len(ids) != T*k || len(weights) != T*k || k > E || E > 1024 || k > 32 || k < 1 {
		panic(fmt.Sprintf("metal.RouterTopK: logits %v, %d biases, k %d, %d ids, %d weights", logits, len(bias), k, len(ids), len(weights)))
	}
	if T == 0 {
		return
	}
	bt := b.temp("RouterTopK", bias)
	defer bt.Release()
	di, dw := b.buffer("RouterTopK", 4*T*k), b.buffer("RouterTopK", 4*T*k)
	defer di.Release()
	defer dw.Release()
	b.dispatch("tandem_router_topk", [3]int{(T + 3) / 4, 1, 1}, tg128, b.in(logits), Arg{Buf: bt}, Arg{Buf: di, Write: true}, Arg{Buf: dw, Write: true},
		params(T, E, k, renorm, scale))
	b.wait("RouterTopK")
	for i := range ids {
		ids[i] = int32(binary.LittleEndian.Uint32(di.Bytes()[4*i:]))
		weights[i] = math.Float32frombits(binary.LittleEndian.Uint32(dw.Bytes()[4*i:]))
	}
}

// RoutedExperts groups the (row, slot) pairs by expert on the host
// (kernels.GroupExperts), gathers the rows once, runs each used expert's
// gate and up GEMVs over its rows, SiTU over all of them, each expert's
// down GEMV, and the j-ordered combine.
func (b *Backend) RoutedExperts(u, z *kernels.Tensor, ids []int32, weights []float32, k int, experts []kernels.Expert, beta1, beta2 float32) {
	T := z.Rows
	if len(ids) != T*k || len(weights) != T*k || u.Rows != T || len(experts) == 0 {
		panic(fmt.Sprintf("metal.RoutedExperts: z %v u %v, %d ids, %d weights, k %d, %d experts", z, u, len(ids), len(weights), k, len(experts)))
	}
	if T == 0 {
		return
	}
	inter, lat := experts[0].W1.Rows, experts[0].W1.Cols
	if z.Cols != lat || u.Cols != lat {
		panic(fmt.Sprintf("metal.RoutedExperts: z %v u %v for experts [%d, %d]", z, u, inter, lat))
	}
	p := kernels.GroupExperts(ids, k, len(experts))
	for _, e := range p.Experts {
		x := experts[e]
		if x.W1.Rows != inter || x.W1.Cols != lat || x.W3.Rows != inter || x.W3.Cols != lat || x.W2.Rows != lat || x.W2.Cols != inter {
			panic(fmt.Sprintf("metal.RoutedExperts: expert %d's shapes differ from expert 0's [%d, %d]", e, inter, lat))
		}
	}
	N := T * k
	xg, g, up, y := b.buffer("RoutedExperts", 4*N*lat), b.buffer("RoutedExperts", 4*N*inter), b.buffer("RoutedExperts", 4*N*inter), b.buffer("RoutedExperts", 4*N*lat)
	order, pos, wt := b.temp("RoutedExperts", p.Order), b.temp("RoutedExperts", p.Pos), b.temp("RoutedExperts", weights)
	for _, buf := range []Buffer{xg, g, up, y, order, pos, wt} {
		defer buf.Release()
	}
	b.dispatch("tandem_gather_rows", strided(N*lat), tg256, Arg{Buf: xg, Write: true}, b.in(z), Arg{Buf: order}, params(N, lat))
	for i, e := range p.Experts {
		r0, rn := int(p.Offs[i]), int(p.Offs[i+1]-p.Offs[i])
		b.gemv(Arg{Buf: g, Off: 4 * r0 * inter}, Arg{Buf: xg, Off: 4 * r0 * lat}, rn, experts[e].W1)
		b.gemv(Arg{Buf: up, Off: 4 * r0 * inter}, Arg{Buf: xg, Off: 4 * r0 * lat}, rn, experts[e].W3)
	}
	b.situ(Arg{Buf: g}, Arg{Buf: g}, Arg{Buf: up}, N*inter, beta1, beta2)
	for i, e := range p.Experts {
		r0, rn := int(p.Offs[i]), int(p.Offs[i+1]-p.Offs[i])
		b.gemv(Arg{Buf: y, Off: 4 * r0 * lat}, Arg{Buf: g, Off: 4 * r0 * inter}, rn, experts[e].W2)
	}
	b.dispatch("tandem_moe_combine", strided(T*lat), tg256, b.out(u), Arg{Buf: y}, Arg{Buf: pos}, Arg{Buf: wt}, params(T, k, lat))
}

// CopyBlock copies a block of values; overlapping blocks of one buffer go
// through one ordered threadgroup.
func (b *Backend) CopyBlock(dst *kernels.Tensor, dr, dc int, src *kernels.Tensor, sr, sc, rows, cols int) {
	if rows < 0 || cols < 0 || dr < 0 || dc < 0 || sr < 0 || sc < 0 ||
		dr+rows > dst.Rows || dc+cols > dst.Cols || sr+rows > src.Rows || sc+cols > src.Cols {
		panic(fmt.Sprintf("metal.CopyBlock: %dx%d from (%d,%d) of %v to (%d,%d) of %v", rows, cols, sr, sc, src, dr, dc, dst))
	}
	if rows == 0 || cols == 0 {
		return
	}
	dv, sv := b.view(dst), b.view(src)
	ordered := 0
	if dv.buf == sv.buf {
		// Element offsets within the buffer decide the overlap and the order.
		d0 := dv.off/4 + dr*dst.Cols + dc
		s0 := sv.off/4 + sr*src.Cols + sc
		d1 := d0 + (rows-1)*dst.Cols + cols
		s1 := s0 + (rows-1)*src.Cols + cols
		if d0 < s1 && s0 < d1 {
			ordered = 1
			if d0 > s0 {
				ordered = -1
			}
		}
	}
	grid := strided(rows * cols)
	if ordered != 0 {
		grid = [3]int{1, 1, 1}
	}
	b.dispatch("tandem_copy_block", grid, tg256, b.out(dst), b.in(src), params(dst.Cols, dr, dc, src.Cols, sr, sc, rows, cols, int32(ordered)))
}
