package conformance

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tandem-inference/tandem/kernels"
)

// K3's widths (configs/models/k3.json).
const (
	hidden    = 7168 // hidden_size
	latent    = 3584 // routed_expert_hidden_size: the LatentMoE width
	moeInter  = 3072 // moe_intermediate_size
	shared    = 2 * moeInter
	experts   = 896 // num_experts (router width)
	kdaDim    = 128 // KDA head_dim (d_k = d_v)
	convK     = 4   // short_conv_kernel_size
	kvLora    = 512 // kv_lora_rank
	rope      = 64  // qk_rope_head_dim
	nope      = 128 // qk_nope_head_dim
	vdim      = 128 // v_head_dim
	latentRow = kvLora + rope
	qLora     = 1536
)

// Tolerances and why (see the package comment for the measures).
const (
	// Data movement copies or rounds exactly the way the reference does.
	tolExact  = 0
	whyExact  = "data movement: bits must match"
	tolF32    = 1e-5
	whyF32    = "fp32 elementwise math vs fp64: a few ulp per value"
	tolBF16   = 1e-2
	whyBF16   = "BF16 inputs (2^-9 relative rounding) with fp32 accumulation vs fp64"
	tolKDA    = 2e-3
	whyKDA    = "fp32 recurrence over 128x128 state vs fp64: error grows with chunks"
	tolRouter = 1e-5
	whyRouter = "fp32 sigmoid: ids exact unless two scores tie within 1e-5"
)

// dims are a run's row and head counts; widths are always K3's.
type dims struct {
	gemm     []int // sequence lengths of row-parallel ops
	seq      []int // sequence lengths of sequence ops (KDA, conv, MLA)
	kdaHeads int
	mlaHeads int
	prefix   int // cached MLA rows before the span
	experts  int // routed experts present
	topK     int
	sources  int // AttnRes sources
}

func (s *suite) dims() dims {
	if s.opt.Short {
		return dims{gemm: []int{1, 6, 9}, seq: []int{5, 70}, kdaHeads: 2, mlaHeads: 2, prefix: 20, experts: 4, topK: 2, sources: 3}
	}
	return dims{gemm: []int{1, 37, 90}, seq: []int{1, 64, 130, 37}, kdaHeads: 8, mlaHeads: 16, prefix: 100, experts: 16, topK: 4, sources: 6}
}

func shape(rows int, lens []int, what string) string {
	return fmt.Sprintf("%d rows %v, %s", rows, lens, what)
}

// timed runs fn and returns its duration.
func timed(fn func()) time.Duration {
	t := time.Now()
	fn()
	return time.Since(t)
}

func (s *suite) opCases() []opCase {
	d := s.dims()
	gl, sl := d.gemm, d.seq
	gT, sT := rowsOf(spans(gl...)), rowsOf(spans(sl...))
	var cs []opCase

	// MatMul in every weight format at K3 shapes.
	for _, m := range []struct {
		f          kernels.Format
		rows, cols int
		what       string
		tol        float64
		why        string
	}{
		{kernels.BF16, qLora, hidden, "q_a_proj", tolBF16, whyBF16},
		{kernels.BF16, hidden, latent, "latent up", tolBF16, whyBF16},
		{kernels.MXFP4, moeInter, latent, "expert w1", tolBF16, whyBF16 + "; MXFP4 dequantises exactly to BF16"},
		{kernels.MXFP8E4M3, 1024, hidden, "MXFP8 E4M3", tolBF16, whyBF16 + "; MXFP8 dequantises exactly to BF16"},
		{kernels.F32, 64, hidden, "F32", tolBF16, whyBF16 + " (F32 weights may be rounded to BF16)"},
	} {
		cs = append(cs, opCase{name: "matmul/" + m.f.String(), shape: shape(gT, gl, fmt.Sprintf("W [%d, %d] %s", m.rows, m.cols, m.what)),
			tol: m.tol, why: m.why, run: func(s *suite) ([][2][]float32, time.Duration, string) {
				g := s.gen("matmul/" + m.f.String())
				w := g.matrix(m.what, m.f, m.rows, m.cols)
				x := g.normal(gT*m.cols, 1)
				want := hostT(gT, m.rows, nil)
				want.Data = make([]float32, gT*m.rows)
				s.ref.MatMul(want, hostT(gT, m.cols, x), w)
				defer s.bind(w)()
				bx, by := s.put(gT, m.cols, x), s.be.NewTensor(gT, m.rows)
				defer s.free(bx, by)
				var got []float32
				dt := timed(func() { s.be.MatMul(by, bx, w); got = s.get(by) })
				return [][2][]float32{{want.Data, got}}, dt, ""
			}})
	}

	cs = append(cs, opCase{name: "embed/BF16", shape: shape(gT, gl, fmt.Sprintf("table [4096, %d]", hidden)), tol: tolExact, why: whyExact,
		run: func(s *suite) ([][2][]float32, time.Duration, string) {
			g := s.gen("embed")
			tab := g.matrix("embed", kernels.BF16, 4096, hidden)
			ids := make([]int32, gT)
			for i := range ids {
				ids[i] = int32(g.r.IntN(4096))
			}
			ids[0] = 4095 // the last row
			want := hostT(gT, hidden, make([]float32, gT*hidden))
			s.ref.Embed(want, tab, ids)
			defer s.bind(tab)()
			bt := s.be.NewTensor(gT, hidden)
			defer s.free(bt)
			var got []float32
			dt := timed(func() { s.be.Embed(bt, tab, ids); got = s.get(bt) })
			return [][2][]float32{{want.Data, got}}, dt, ""
		}})

	// Row-wise elementwise ops and norms.
	type unary struct {
		name, what string
		cols       int
		op         func(b kernels.Backend, x, y *kernels.Tensor, w []float32)
		wlen       int
	}
	eps := float32(1e-5)
	for _, u := range []unary{
		{"rmsnorm/row", "hidden", hidden, func(b kernels.Backend, x, y *kernels.Tensor, w []float32) { b.RMSNorm(y, x, w, 0, eps) }, hidden},
		{"rmsnorm/group128", "KDA o_norm, 96 heads", 96 * kdaDim, func(b kernels.Backend, x, y *kernels.Tensor, w []float32) { b.RMSNorm(y, x, w, kdaDim, eps) }, kdaDim},
		{"rmsnorm/kv_a", "c_kv", kvLora, func(b kernels.Backend, x, y *kernels.Tensor, w []float32) { b.RMSNorm(y, x, w, 0, eps) }, kvLora},
		{"l2norm/group128", "KDA q", 96 * kdaDim, func(b kernels.Backend, x, _ *kernels.Tensor, _ []float32) {
			b.L2NormGroups(x, kdaDim, 1e-6, float32(1/math.Sqrt(kdaDim)))
		}, 0},
		{"sigmoid", "beta", hidden, func(b kernels.Backend, x, _ *kernels.Tensor, _ []float32) { b.Sigmoid(x) }, 0},
		{"addbias", "dt_bias", 96 * kdaDim, func(b kernels.Backend, x, _ *kernels.Tensor, w []float32) { b.AddBias(x, w) }, 96 * kdaDim},
		{"kda_gate", "96 heads", 96 * kdaDim, func(b kernels.Backend, x, _ *kernels.Tensor, w []float32) { b.KDAGate(x, w[:96], kdaDim, -5) }, 96 * kdaDim},
	} {
		u := u
		tol, why := tolF32, whyF32
		if u.name == "addbias" {
			tol, why = tolExact, "one fp32 add per value: bits must match"
		}
		cs = append(cs, opCase{name: u.name, shape: shape(gT, gl, fmt.Sprintf("[%d] %s", u.cols, u.what)), tol: tol, why: why,
			run: func(s *suite) ([][2][]float32, time.Duration, string) {
				g := s.gen(u.name)
				x := g.normal(gT*u.cols, 2)
				var w []float32
				if u.wlen > 0 {
					w = g.normal(u.wlen, 1)
				}
				if u.name == "kda_gate" {
					w = g.uniform(u.wlen, -1, 1) // A_log
				}
				rx, ry := hostT(gT, u.cols, x), hostT(gT, u.cols, make([]float32, gT*u.cols))
				u.op(s.ref, rx, ry, w)
				bx, by := s.put(gT, u.cols, x), s.be.NewTensor(gT, u.cols)
				defer s.free(bx, by)
				var got, want []float32
				dt := timed(func() {
					u.op(s.be, bx, by, w)
					if u.wlen > 0 && u.name != "addbias" && u.name != "kda_gate" {
						got, want = s.get(by), ry.Data
					} else {
						got, want = s.get(bx), rx.Data
					}
				})
				return [][2][]float32{{want, got}}, dt, ""
			}})
	}

	cs = append(cs, opCase{name: "add+mul_sigmoid", shape: shape(gT, gl, fmt.Sprintf("[%d]", hidden)), tol: tolF32, why: whyF32,
		run: func(s *suite) ([][2][]float32, time.Duration, string) {
			g := s.gen("add")
			a, b, gate := g.normal(gT*hidden, 1), g.normal(gT*hidden, 1), g.normal(gT*hidden, 3)
			ra, rb, rs, rg := hostT(gT, hidden, a), hostT(gT, hidden, b), hostT(gT, hidden, make([]float32, gT*hidden)), hostT(gT, hidden, gate)
			s.ref.Add(rs, ra, rb)
			s.ref.MulSigmoid(rs, rg)
			ba, bb, bs, bg := s.put(gT, hidden, a), s.put(gT, hidden, b), s.be.NewTensor(gT, hidden), s.put(gT, hidden, gate)
			defer s.free(ba, bb, bs, bg)
			var got []float32
			dt := timed(func() { s.be.Add(bs, ba, bb); s.be.MulSigmoid(bs, bg); got = s.get(bs) })
			return [][2][]float32{{rs.Data, got}}, dt, ""
		}})

	cs = append(cs, opCase{name: "copy_block", shape: shape(gT, gl, fmt.Sprintf("[%d] columns %d.. and a squeeze", latentRow, kvLora)), tol: tolExact, why: whyExact,
		run: func(s *suite) ([][2][]float32, time.Duration, string) {
			g := s.gen("copy")
			x := g.normal(gT*latentRow, 1)
			rx, ry := hostT(gT, latentRow, x), hostT(gT, kvLora, make([]float32, gT*kvLora))
			s.ref.CopyBlock(ry, 0, 0, rx, 0, 0, gT, kvLora)
			s.ref.CopyBlock(rx, 1, 0, rx, gT-1, 0, 1, latentRow) // squeeze: last row up to row 1
			bx, by := s.put(gT, latentRow, x), s.be.NewTensor(gT, kvLora)
			defer s.free(bx, by)
			var g1, g2 []float32
			dt := timed(func() {
				s.be.CopyBlock(by, 0, 0, bx, 0, 0, gT, kvLora)
				s.be.CopyBlock(bx, 1, 0, bx, gT-1, 0, 1, latentRow)
				g1, g2 = s.get(by), s.get(bx)
			})
			return [][2][]float32{{ry.Data, g1}, {rx.Data, g2}}, dt, ""
		}})

	cs = append(cs, opCase{name: "attnres_mix", shape: shape(gT, gl, fmt.Sprintf("%d sources of [%d]", d.sources, hidden)), tol: tolF32, why: whyF32,
		run: func(s *suite) ([][2][]float32, time.Duration, string) {
			g := s.gen("attnres")
			proj := g.normal(hidden, 0.05)
			var rs, bs []*kernels.Tensor
			for i := 0; i < d.sources; i++ {
				v := g.normal(gT*hidden, float64(i+1))
				rs = append(rs, hostT(gT, hidden, v))
				bs = append(bs, s.put(gT, hidden, v))
			}
			want := hostT(gT, hidden, make([]float32, gT*hidden))
			s.ref.AttnResMix(want, rs, proj, 1e-6)
			out := s.be.NewTensor(gT, hidden)
			defer s.free(append(bs, out)...)
			var got []float32
			dt := timed(func() { s.be.AttnResMix(out, bs, proj, 1e-6); got = s.get(out) })
			return [][2][]float32{{want.Data, got}}, dt, ""
		}})

	cs = append(cs, opCase{name: "short_conv_silu", shape: shape(sT, sl, fmt.Sprintf("P %d, K %d, tails continued", 96*kdaDim, convK)), tol: tolF32, why: whyF32,
		run: func(s *suite) ([][2][]float32, time.Duration, string) {
			P := 96 * kdaDim
			g := s.gen("conv")
			sp := spans(sl...)
			x, w := g.normal(sT*P, 1), g.normal(P*convK, 0.5)
			tails := make([][]float32, len(sp))
			for i := range tails {
				tails[i] = g.normal(P*(convK-1), 1)
			}
			rw := hostT(P, convK, w)
			want := hostT(sT, P, make([]float32, sT*P))
			var pairs [][2][]float32
			refTails := make([][]float32, len(sp))
			for i, span := range sp {
				refTails[i] = slices.Clone(tails[i])
				s.ref.ShortConvSiLU(want, hostT(sT, P, x), span, rw, &kernels.Tensor{Rows: P, Cols: convK - 1, Data: refTails[i]})
			}
			bx, bo, bw := s.put(sT, P, x), s.be.NewTensor(sT, P), s.put(P, convK, w)
			defer s.free(bx, bo, bw)
			var got []float32
			dt := timed(func() {
				for i, span := range sp {
					t := s.be.AttachState(tails[i], P, convK-1)
					s.be.ShortConvSiLU(bo, bx, span, bw, t)
					s.be.DetachState(t, tails[i])
				}
				got = s.get(bo)
			})
			pairs = append(pairs, [2][]float32{want.Data, got})
			for i := range sp {
				pairs = append(pairs, [2][]float32{refTails[i], tails[i]})
			}
			return pairs, dt, ""
		}})

	for _, chunk := range []int{64, 0} {
		name := "kda/chunked64"
		if chunk == 0 {
			name = "kda/recurrent"
		}
		cs = append(cs, opCase{name: name, shape: shape(sT, sl, fmt.Sprintf("%d heads %dx%d, states continued", d.kdaHeads, kdaDim, kdaDim)), tol: tolKDA, why: whyKDA,
			run: func(s *suite) ([][2][]float32, time.Duration, string) {
				H, D := d.kdaHeads, kdaDim
				g := s.gen(name)
				sp := spans(sl...)
				q, k := g.normal(sT*H*D, 1), g.normal(sT*H*D, 1)
				unit := func(v []float32, scale float64) {
					for r := 0; r < len(v)/D; r++ {
						var ss float64
						for _, x := range v[r*D : (r+1)*D] {
							ss += float64(x) * float64(x)
						}
						for c := r * D; c < (r+1)*D; c++ {
							v[c] = float32(float64(v[c]) / math.Sqrt(ss) * scale)
						}
					}
				}
				unit(q, 1/math.Sqrt(float64(D)))
				unit(k, 1)
				v := g.normal(sT*H*D, 1)
				gd := g.uniform(sT*H*D, -5, 0) // the gate's range: lower bound -5
				beta := g.uniform(sT*H, 0, 1)
				states := make([][]float32, len(sp))
				for i := range states {
					states[i] = g.normal(H*D*D, 0.1)
				}
				want := hostT(sT, H*D, make([]float32, sT*H*D))
				ref := make([][]float32, len(sp))
				rq, rk, rv, rg, rb := hostT(sT, H*D, q), hostT(sT, H*D, k), hostT(sT, H*D, v), hostT(sT, H*D, gd), hostT(sT, H, beta)
				for i, span := range sp {
					ref[i] = slices.Clone(states[i])
					s.ref.KDA(want, rq, rk, rv, rg, rb, span, &kernels.Tensor{Rows: H * D, Cols: D, Data: ref[i]}, H, D, D, chunk)
				}
				bq, bk, bv, bg, bb, bo := s.put(sT, H*D, q), s.put(sT, H*D, k), s.put(sT, H*D, v), s.put(sT, H*D, gd), s.put(sT, H, beta), s.be.NewTensor(sT, H*D)
				defer s.free(bq, bk, bv, bg, bb, bo)
				var got []float32
				dt := timed(func() {
					for i, span := range sp {
						st := s.be.AttachState(states[i], H*D, D)
						s.be.KDA(bo, bq, bk, bv, bg, bb, span, st, H, D, D, chunk)
						s.be.DetachState(st, states[i])
					}
					got = s.get(bo)
				})
				pairs := [][2][]float32{{want.Data, got}}
				for i := range sp {
					pairs = append(pairs, [2][]float32{ref[i], states[i]})
				}
				return pairs, dt, ""
			}})
	}

	cs = append(cs, opCase{name: "write_latent/BF16", shape: shape(sT, sl, fmt.Sprintf("[%d] rows after %d cached", latentRow, d.prefix)), tol: tolExact, why: "round to nearest even, as the state contract defines: bits must match",
		run: func(s *suite) ([][2][]float32, time.Duration, string) {
			g := s.gen("write_latent")
			x := g.normal(sT*latentRow, 1)
			n := d.prefix + sT
			refC := &kernels.LatentCache{Rows: n, Cols: latentRow, BF16: make([]uint16, n*latentRow)}
			s.ref.WriteLatent(refC, d.prefix, hostT(sT, latentRow, x), 0, sT)
			beC := &kernels.LatentCache{Rows: n, Cols: latentRow, BF16: make([]uint16, n*latentRow)}
			bx := s.put(sT, latentRow, x)
			defer s.free(bx)
			dt := timed(func() {
				s.be.AttachLatent(beC, d.prefix)
				s.be.WriteLatent(beC, d.prefix, bx, 0, sT)
				s.be.DetachLatent(beC, d.prefix)
			})
			w, gv := make([]float32, len(refC.BF16)), make([]float32, len(beC.BF16))
			for i := range w {
				w[i], gv[i] = float32(refC.BF16[i]), float32(beC.BF16[i]) // compare the bit patterns
			}
			return [][2][]float32{{w, gv}}, dt, ""
		}})

	for _, absorb := range []bool{false, true} {
		name := "mla_attention/expanded"
		if absorb {
			if !s.opt.Absorbed {
				continue
			}
			name = "mla_attention/absorbed"
		}
		cs = append(cs, opCase{name: name, shape: shape(sT, sl, fmt.Sprintf("%d heads, qk %d v %d latent %d, %d cached before", d.mlaHeads, nope+rope, vdim, latentRow, d.prefix)),
			tol: tolBF16, why: whyBF16 + "; softmax in fp32",
			run: func(s *suite) ([][2][]float32, time.Duration, string) {
				H := d.mlaHeads
				g := s.gen("mla") // the same inputs for both forms
				sp := spans(sl...)
				kvb := g.matrix("kv_b_proj", kernels.BF16, H*(nope+vdim), kvLora)
				q := g.normal(sT*H*(nope+rope), 1)
				want := hostT(sT, H*vdim, make([]float32, sT*H*vdim))
				rq := hostT(sT, H*(nope+rope), q)
				caches := make([]*kernels.LatentCache, len(sp))
				for i, span := range sp {
					n := d.prefix + span.Len()
					c := &kernels.LatentCache{Rows: n, Cols: latentRow, BF16: make([]uint16, n*latentRow)}
					s.ref.WriteLatent(c, 0, hostT(n, latentRow, g.normal(n*latentRow, 1)), 0, n)
					caches[i] = c
					s.ref.MLAAttention(want, rq, span, c, kvb, H, nope, rope, vdim, float32(1/math.Sqrt(nope+rope)), absorb)
				}
				defer s.bind(kvb)()
				bq, bo := s.put(sT, H*(nope+rope), q), s.be.NewTensor(sT, H*vdim)
				defer s.free(bq, bo)
				var got []float32
				dt := timed(func() {
					for i, span := range sp {
						c := &kernels.LatentCache{Rows: caches[i].Rows, Cols: latentRow, BF16: caches[i].BF16}
						s.be.AttachLatent(c, c.Rows)
						s.be.MLAAttention(bo, bq, span, c, kvb, H, nope, rope, vdim, float32(1/math.Sqrt(nope+rope)), absorb)
						s.be.DetachLatent(c, c.Rows)
					}
					got = s.get(bo)
				})
				return [][2][]float32{{want.Data, got}}, dt, ""
			}})
	}

	cs = append(cs, opCase{name: "router_topk", shape: shape(gT, gl, fmt.Sprintf("%d experts, top %d", experts, 16)), tol: tolRouter, why: whyRouter,
		run: func(s *suite) ([][2][]float32, time.Duration, string) {
			const k = 16
			g := s.gen("router")
			logits, bias := g.normal(gT*experts, 2), g.normal(experts, 0.1)
			wi, ww := make([]int32, gT*k), make([]float32, gT*k)
			s.ref.RouterTopK(hostT(gT, experts, logits), bias, k, true, 2.5, wi, ww)
			bl := s.put(gT, experts, logits)
			defer s.free(bl)
			gi, gw := make([]int32, gT*k), make([]float32, gT*k)
			dt := timed(func() { s.be.RouterTopK(bl, bias, k, true, 2.5, gi, gw) })
			// An id differs only on a near-tie; then compare the weight of the
			// reference's choice, which is what the mixture uses.
			note := ""
			for i := range wi {
				if wi[i] != gi[i] {
					note = fmt.Sprintf("row %d choice %d: expert %d, reference %d", i/k, i%k, gi[i], wi[i])
					gw[i] = float32(math.Inf(1))
					break
				}
			}
			return [][2][]float32{{ww, gw}}, dt, note
		}})

	cs = append(cs, opCase{name: "routed_experts/MXFP4", shape: shape(gT, gl, fmt.Sprintf("%d experts [%d, %d] MXFP4, top %d", d.experts, moeInter, latent, d.topK)),
		tol: tolBF16, why: whyBF16 + "; SiTU in fp32",
		run: func(s *suite) ([][2][]float32, time.Duration, string) {
			g := s.gen("experts")
			E, k := d.experts, d.topK
			ex := make([]kernels.Expert, E)
			var ms []*kernels.Matrix
			for e := range ex {
				ex[e] = kernels.Expert{W1: g.matrix("w1", kernels.MXFP4, moeInter, latent), W3: g.matrix("w3", kernels.MXFP4, moeInter, latent),
					W2: g.matrix("w2", kernels.MXFP4, latent, moeInter)}
				ms = append(ms, ex[e].W1, ex[e].W3, ex[e].W2)
			}
			z := g.normal(gT*latent, 1)
			ids, wts := make([]int32, gT*k), g.uniform(gT*k, 0.1, 1)
			for r := 0; r < gT; r++ {
				perm := g.r.Perm(E)
				for j := 0; j < k; j++ {
					ids[r*k+j] = int32(perm[j])
				}
			}
			want := hostT(gT, latent, make([]float32, gT*latent))
			s.ref.RoutedExperts(want, hostT(gT, latent, z), ids, wts, k, ex, 4, 25)
			defer s.bind(ms...)()
			bz, bu := s.put(gT, latent, z), s.be.NewTensor(gT, latent)
			defer s.free(bz, bu)
			var got []float32
			dt := timed(func() { s.be.RoutedExperts(bu, bz, ids, wts, k, ex, 4, 25); got = s.get(bu) })
			return [][2][]float32{{want.Data, got}}, dt, ""
		}})

	cs = append(cs, opCase{name: "situ_mlp/BF16", shape: shape(gT, gl, fmt.Sprintf("shared experts %d -> %d -> %d BF16", hidden, shared, hidden)),
		tol: tolBF16, why: whyBF16 + "; SiTU in fp32",
		run: func(s *suite) ([][2][]float32, time.Duration, string) {
			g := s.gen("situ")
			T := min(gT, 8) // the reference spends most of the suite's time here
			gate, up, down := g.matrix("gate", kernels.BF16, shared, hidden), g.matrix("up", kernels.BF16, shared, hidden), g.matrix("down", kernels.BF16, hidden, shared)
			x := g.normal(T*hidden, 1)
			want := hostT(T, hidden, make([]float32, T*hidden))
			s.ref.SiTUMLP(want, hostT(T, hidden, x), gate, up, down, 4, 25)
			defer s.bind(gate, up, down)()
			bx, by := s.put(T, hidden, x), s.be.NewTensor(T, hidden)
			defer s.free(bx, by)
			var got []float32
			dt := timed(func() { s.be.SiTUMLP(by, bx, gate, up, down, 4, 25); got = s.get(by) })
			return [][2][]float32{{want.Data, got}}, dt, ""
		}})
	return cs
}
