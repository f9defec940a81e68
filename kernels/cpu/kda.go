package cpu

import (
	"fmt"
	"sync"

	"github.com/tandem-inference/tandem/internal/expmath"
	"github.com/tandem-inference/tandem/kernels"
)

// ShortConvSiLU is KDA's depthwise causal conv of kernel K followed by SiLU
// (spec §3.3): y_t[c] = Σ_j w[c, j] · u_{t-K+1+j}[c]; inputs before the span
// come from tail [P, K-1] (oldest first), which is updated to the last K-1
// inputs. Each worker takes a block of channels and walks the tokens with
// a window of the last K inputs (so dst may be x), summing in j order.
func (b *Backend) ShortConvSiLU(dst, x *kernels.Tensor, span kernels.Span, w *kernels.Tensor, tt *kernels.Tensor) {
	P, K := w.Rows, w.Cols
	tail := tt.Data
	if x.Cols != P || dst.Cols != P || len(tail) != P*(K-1) {
		panic(fmt.Sprintf("cpu.ShortConvSiLU: x %v, w %v, tail %d", x, w, len(tail)))
	}
	n := span.Len()
	b.parallel(P, max(64, b.grainFor(P)), func(lo, hi int) {
		m := hi - lo
		buf := make([]float32, (K+2)*m)
		win, y, sg := buf[:K*m], buf[K*m:(K+1)*m], buf[(K+1)*m:]
		row := func(s int) []float32 { return win[s%K*m:][:m] } // history position s
		for c := lo; c < hi; c++ {
			for s := 0; s < K-1; s++ {
				row(s)[c-lo] = tail[c*(K-1)+s]
			}
		}
		for i := 0; i < n; i++ {
			t := span.Lo + i
			copy(row(K-1+i), x.Data[t*P+lo:t*P+hi])
			clear(y)
			for j := 0; j < K; j++ {
				h := row(i + j)
				for c := range y {
					y[c] += float32(w.Data[(lo+c)*K+j] * h[c])
				}
			}
			kernelsInUse.sigmoid(sg, y)
			out := dst.Data[t*P+lo : t*P+hi]
			for c := range out {
				out[c] = y[c] * sg[c]
			}
		}
		for c := lo; c < hi; c++ {
			for s := 0; s < K-1; s++ {
				tail[c*(K-1)+s] = row(n + s)[c-lo]
			}
		}
	})
}

// KDAGate maps z to the log decay g = lower·σ(exp(aLog[h])·z) in place.
func (b *Backend) KDAGate(z *kernels.Tensor, aLog []float32, headDim int, lower float32) {
	heads := z.Cols / headDim
	if heads*headDim != z.Cols || len(aLog) < heads {
		panic(fmt.Sprintf("cpu.KDAGate: %v with head dim %d and %d A_log", z, headDim, len(aLog)))
	}
	negA := make([]float64, heads)
	for h := range negA {
		negA[h] = -expmath.Exp(float64(aLog[h]))
	}
	for r := 0; r < z.Rows; r++ {
		row := z.Row(r)
		for h, na := range negA {
			kernelsInUse.gate(row[h*headDim:(h+1)*headDim], na, lower)
		}
	}
}

// gateGo sets x[i] = lower·σ(−negA·x[i]) as KDAGate defines it.
func gateGo(x []float32, negA float64, lower float32) {
	for i, v := range x {
		x[i] = lower * float32(1/(1+expmath.Exp(negA*float64(v))))
	}
}

// KDA runs the gated delta rule for every head over the span's rows.
// Internally it works in fp64 per head; S is stored back as fp32 after every
// chunk (and every token of the recurrence), so that splitting a sequence at
// a multiple of the chunk size gives bit-identical results.
func (b *Backend) KDA(o, q, k, v, g, beta *kernels.Tensor, span kernels.Span, st *kernels.Tensor, heads, dk, dv, chunk int) {
	S := st.Data
	if q.Cols != heads*dk || k.Cols != heads*dk || g.Cols != heads*dk || v.Cols != heads*dv || o.Cols != heads*dv ||
		beta.Cols != heads || len(S) != heads*dk*dv {
		panic(fmt.Sprintf("cpu.KDA: q %v k %v v %v g %v beta %v o %v S %d for %d heads %dx%d", q, k, v, g, beta, o, len(S), heads, dk, dv))
	}
	b.parallel(heads, 1, func(lo, hi int) {
		w := getKDAWork(dk, dv, chunk)
		defer kdaPool.Put(w)
		w.ks = kernelsInUse
		for h := lo; h < hi; h++ {
			hv := kdaHead{q: q, k: k, v: v, g: g, beta: beta, o: o, h: h, dk: dk, dv: dv,
				S: S[h*dk*dv : (h+1)*dk*dv]}
			if chunk <= 0 {
				hv.recurrent(span, w)
			} else {
				hv.chunked(span, chunk, w)
			}
		}
	})
}

// kdaHead addresses one head's columns of the batch tensors.
type kdaHead struct {
	q, k, v, g, beta, o *kernels.Tensor
	h, dk, dv           int
	S                   []float32
}

func (hv *kdaHead) qRow(t int) []float32 { return hv.q.Data[t*hv.q.Cols+hv.h*hv.dk:][:hv.dk] }
func (hv *kdaHead) kRow(t int) []float32 { return hv.k.Data[t*hv.k.Cols+hv.h*hv.dk:][:hv.dk] }
func (hv *kdaHead) gRow(t int) []float32 { return hv.g.Data[t*hv.g.Cols+hv.h*hv.dk:][:hv.dk] }
func (hv *kdaHead) vRow(t int) []float32 { return hv.v.Data[t*hv.v.Cols+hv.h*hv.dv:][:hv.dv] }
func (hv *kdaHead) oRow(t int) []float32 { return hv.o.Data[t*hv.o.Cols+hv.h*hv.dv:][:hv.dv] }
func (hv *kdaHead) betaAt(t int) float64 { return float64(hv.beta.Data[t*hv.beta.Cols+hv.h]) }

// kdaWork is per-worker scratch, reused across heads.
type kdaWork struct {
	ks              *kernelSet
	S, r, acc       []float64 // state [dk, dv], read vector, output row
	gam, kp, kn, qp []float64 // [C, dk]
	knT             []float64 // kn transposed, [dk, cp] (vector kernels)
	vv, wm, u       []float64 // [C, dv], [C, dk], [C, dv]
	lmat, aqk       []float64 // [C, cp]
	decayC, f       []float64 // [dk], [C]
	cp              int       // row stride of lmat, aqk and knT: C rounded up to 8
	dk, dv, chunk   int       // the shape it was made for
}

// kdaPool keeps workers' scratch between calls (a decode step would
// otherwise allocate a state-sized buffer per layer and worker).
var kdaPool sync.Pool

func getKDAWork(dk, dv, chunk int) *kdaWork {
	if w, ok := kdaPool.Get().(*kdaWork); ok && w.dk == dk && w.dv == dv && w.chunk == max(chunk, 1) {
		return w
	}
	return newKDAWork(dk, dv, chunk)
}

func newKDAWork(dk, dv, chunk int) *kdaWork {
	C := max(chunk, 1)
	cp := (C + 7) &^ 7
	return &kdaWork{
		S: make([]float64, dk*dv), r: make([]float64, dv), acc: make([]float64, dv),
		gam: make([]float64, C*dk), kp: make([]float64, C*dk), kn: make([]float64, C*dk), qp: make([]float64, C*dk),
		knT: make([]float64, dk*cp),
		vv:  make([]float64, C*dv), wm: make([]float64, C*dk), u: make([]float64, C*dv),
		lmat: make([]float64, C*cp), aqk: make([]float64, C*cp), decayC: make([]float64, dk), f: make([]float64, C), cp: cp,
		dk: dk, dv: dv, chunk: C,
	}
}

func (hv *kdaHead) loadS(w *kdaWork) { w.ks.widen(w.S, hv.S) }

// storeS rounds the working state to fp32 and reloads it, so the working
// copy always equals what a later call would start from.
func (hv *kdaHead) storeS(w *kdaWork) { w.ks.narrow(hv.S, w.S) }

// recurrent is the sequential form (spec §3.3):
// S ← diag(α)S; r = Sᵀk; S ← S + β k (v − r)ᵀ; o = Sᵀq.
func (hv *kdaHead) recurrent(span kernels.Span, w *kdaWork) {
	dk, dv := hv.dk, hv.dv
	S, r := w.S, w.r
	hv.loadS(w)
	for t := span.Lo; t < span.Hi; t++ {
		q, k, v, g := hv.qRow(t), hv.kRow(t), hv.vRow(t), hv.gRow(t)
		beta := hv.betaAt(t)
		clear(r)
		for c := 0; c < dk; c++ {
			w.ks.decayRead(S[c*dv:(c+1)*dv], r, expmath.Exp(float64(g[c])), float64(k[c]))
		}
		for j := range r {
			r[j] = beta * (float64(v[j]) - r[j])
		}
		out := hv.oRow(t)
		acc := w.acc
		clear(acc)
		for c := 0; c < dk; c++ {
			w.ks.writeRead(S[c*dv:(c+1)*dv], r, acc, float64(k[c]), float64(q[c]))
		}
		for j := range out {
			out[j] = float32(acc[j])
		}
		hv.storeS(w)
	}
}

// chunked is the UT/WY chunk form (spec §3.3) with tiles of C tokens. The
// decay products exp(Γi−Γj) are formed as exp(Γi)·exp(−Γj) in fp64, which
// cannot overflow for C ≤ 128 with the −5 lower bound (e^640 < fp64 max).
func (hv *kdaHead) chunked(span kernels.Span, C int, w *kdaWork) {
	if C > 128 {
		panic(fmt.Sprintf("cpu.KDA: chunk %d too large for fp64 decay factors (max 128)", C))
	}
	dk, dv := hv.dk, hv.dv
	hv.loadS(w)
	S := w.S
	for c0 := span.Lo; c0 < span.Hi; c0 += C {
		n := min(C, span.Hi-c0)
		gam, kp, kn, qp, vv := w.gam, w.kp, w.kn, w.qp, w.vv
		// Γ (inclusive cumulative log decay), K⊙e^Γ, K⊙e^−Γ, Q⊙e^Γ.
		for i := 0; i < n; i++ {
			t := c0 + i
			g, k, q, v := hv.gRow(t), hv.kRow(t), hv.qRow(t), hv.vRow(t)
			for c := 0; c < dk; c++ {
				G := float64(g[c])
				if i > 0 {
					G += gam[(i-1)*dk+c]
				}
				gam[i*dk+c] = G
				e, ei := expmath.Exp(G), expmath.Exp(-G)
				kp[i*dk+c] = float64(k[c]) * e
				kn[i*dk+c] = float64(k[c]) * ei
				qp[i*dk+c] = float64(q[c]) * e
			}
			for j := 0; j < dv; j++ {
				vv[i*dv+j] = float64(v[j])
			}
		}
		// L[i,j] = β_i Σ_c k_i k_j e^{Γi−Γj} (j < i); A_qk[i,j] likewise for q, j ≤ i.
		L, A, cp := w.lmat, w.aqk, w.cp
		if w.ks.kdaDots != nil {
			// Vector kernels take K⊙e^−Γ column-major, so that each lane's sum
			// runs over c in order for its own j.
			for j := 0; j < n; j++ {
				for c, x := range kn[j*dk : (j+1)*dk] {
					w.knT[c*cp+j] = x
				}
			}
		}
		for i := 0; i < n; i++ {
			bi := hv.betaAt(c0 + i)
			kpi, qpi := kp[i*dk:(i+1)*dk], qp[i*dk:(i+1)*dk]
			if w.ks.kdaDots != nil {
				w.ks.kdaDots(L[i*cp:(i+1)*cp], A[i*cp:(i+1)*cp], kpi, qpi, w.knT, cp, i+1)
				for j := 0; j <= i; j++ {
					L[i*cp+j] = bi * L[i*cp+j]
				}
				continue
			}
			for j := 0; j <= i; j++ {
				knj := kn[j*dk : (j+1)*dk]
				var sl, sa float64
				for c, x := range knj {
					sl += float64(kpi[c] * x)
					sa += float64(qpi[c] * x)
				}
				L[i*cp+j] = bi * sl
				A[i*cp+j] = sa
			}
		}
		// W = (I+L)⁻¹ diag(β) (K⊙e^Γ), U = (I+L)⁻¹ diag(β) V by forward substitution.
		wm, u := w.wm, w.u
		for i := 0; i < n; i++ {
			bi := hv.betaAt(c0 + i)
			wi, ui := wm[i*dk:(i+1)*dk], u[i*dv:(i+1)*dv]
			for c := range wi {
				wi[c] = bi * kp[i*dk+c]
			}
			for j := range ui {
				ui[j] = bi * vv[i*dv+j]
			}
			w.ks.matAcc(wi, L[i*cp:i*cp+i], wm, dk, true, true)
			w.ks.matAcc(ui, L[i*cp:i*cp+i], u, dv, true, true)
		}
		// Ṽ = U − W S (in place in u); O = (Q⊙e^Γ) S + A_qk Ṽ.
		for i := 0; i < n; i++ {
			w.ks.matAcc(u[i*dv:(i+1)*dv], wm[i*dk:(i+1)*dk], S, dv, true, true)
		}
		for i := 0; i < n; i++ {
			acc := vv[i*dv : (i+1)*dv] // V no longer needed: reuse as the output accumulator
			clear(acc)
			w.ks.matAcc(acc, qp[i*dk:(i+1)*dk], S, dv, false, true)
			w.ks.matAcc(acc, A[i*cp:i*cp+i+1], u, dv, false, false)
			out := hv.oRow(c0 + i)
			for j := range out {
				out[j] = float32(acc[j])
			}
		}
		// S ← e^{Γ_C} ⊙rows S + Σ_i (k_i ⊙ e^{Γ_C−Γ_i}) Ṽ_iᵀ.
		last := (n - 1) * dk
		for c := 0; c < dk; c++ {
			eC := expmath.Exp(gam[last+c])
			w.decayC[c] = eC
			w.ks.scal(S[c*dv:(c+1)*dv], eC)
		}
		// Row c of S takes the chunk's rows i in order (as a loop over i
		// then c would), with coefficients k_i[c]·e^{Γ_C−Γ_i}[c].
		f := w.f[:n]
		for c := 0; c < dk; c++ {
			for i := range f {
				f[i] = kn[i*dk+c] * w.decayC[c]
			}
			w.ks.matAcc(S[c*dv:(c+1)*dv], f, u, dv, false, true)
		}
		hv.storeS(w)
	}
}
