package cpu

import (
	"fmt"

	"github.com/tandem-inference/tandem/internal/expmath"
	"github.com/tandem-inference/tandem/kernels"
)

// The KDA code as it was before its inner loops were vectorised, kept as
// the reference the current code must match bit for bit (kda_test.go).

// refKDA is Backend.KDA over refKDAHead, on one goroutine.
func refKDA(o, q, k, v, g, beta *kernels.Tensor, span kernels.Span, S []float32, heads, dk, dv, chunk int) {
	w := newRefKDAWork(dk, dv, chunk)
	for h := 0; h < heads; h++ {
		hv := refKDAHead{q: q, k: k, v: v, g: g, beta: beta, o: o, h: h, dk: dk, dv: dv,
			S: S[h*dk*dv : (h+1)*dk*dv]}
		if chunk <= 0 {
			hv.recurrent(span, w)
		} else {
			hv.chunked(span, chunk, w)
		}
	}
}

// refKDAHead addresses one head's columns of the batch tensors.
type refKDAHead struct {
	q, k, v, g, beta, o *kernels.Tensor
	h, dk, dv           int
	S                   []float32
}

func (hv *refKDAHead) qRow(t int) []float32 { return hv.q.Data[t*hv.q.Cols+hv.h*hv.dk:][:hv.dk] }
func (hv *refKDAHead) kRow(t int) []float32 { return hv.k.Data[t*hv.k.Cols+hv.h*hv.dk:][:hv.dk] }
func (hv *refKDAHead) gRow(t int) []float32 { return hv.g.Data[t*hv.g.Cols+hv.h*hv.dk:][:hv.dk] }
func (hv *refKDAHead) vRow(t int) []float32 { return hv.v.Data[t*hv.v.Cols+hv.h*hv.dv:][:hv.dv] }
func (hv *refKDAHead) oRow(t int) []float32 { return hv.o.Data[t*hv.o.Cols+hv.h*hv.dv:][:hv.dv] }
func (hv *refKDAHead) betaAt(t int) float64 { return float64(hv.beta.Data[t*hv.beta.Cols+hv.h]) }

// refKDAWork is per-worker scratch, reused across heads.
type refKDAWork struct {
	S, r            []float64 // state [dk, dv], read vector
	gam, kp, kn, qp []float64 // [C, dk]
	vv, wm, u       []float64 // [C, dv], [C, dk], [C, dv]
	lmat, aqk       []float64 // [C, C]
	decayC          []float64 // [dk]
}

func newRefKDAWork(dk, dv, chunk int) *refKDAWork {
	C := max(chunk, 1)
	return &refKDAWork{
		S: make([]float64, dk*dv), r: make([]float64, dv),
		gam: make([]float64, C*dk), kp: make([]float64, C*dk), kn: make([]float64, C*dk), qp: make([]float64, C*dk),
		vv: make([]float64, C*dv), wm: make([]float64, C*dk), u: make([]float64, C*dv),
		lmat: make([]float64, C*C), aqk: make([]float64, C*C), decayC: make([]float64, dk),
	}
}

func (hv *refKDAHead) loadS(w *refKDAWork) {
	for i, x := range hv.S {
		w.S[i] = float64(x)
	}
}

// storeS rounds the working state to fp32 and reloads it, so the working
// copy always equals what a later call would start from.
func (hv *refKDAHead) storeS(w *refKDAWork) {
	for i, x := range w.S {
		f := float32(x)
		hv.S[i] = f
		w.S[i] = float64(f)
	}
}

// recurrent is the sequential form (spec §3.3):
// S ← diag(α)S; r = Sᵀk; S ← S + β k (v − r)ᵀ; o = Sᵀq.
func (hv *refKDAHead) recurrent(span kernels.Span, w *refKDAWork) {
	dk, dv := hv.dk, hv.dv
	S, r := w.S, w.r
	hv.loadS(w)
	for t := span.Lo; t < span.Hi; t++ {
		q, k, v, g := hv.qRow(t), hv.kRow(t), hv.vRow(t), hv.gRow(t)
		beta := hv.betaAt(t)
		clear(r)
		for c := 0; c < dk; c++ {
			a := expmath.Exp(float64(g[c]))
			row := S[c*dv : (c+1)*dv]
			kc := float64(k[c])
			for j := range row {
				row[j] *= a
				r[j] += kc * row[j]
			}
		}
		for j := range r {
			r[j] = beta * (float64(v[j]) - r[j])
		}
		out := hv.oRow(t)
		acc := make([]float64, dv) // small; dv floats per token
		for c := 0; c < dk; c++ {
			row := S[c*dv : (c+1)*dv]
			kc, qc := float64(k[c]), float64(q[c])
			for j := range row {
				row[j] += kc * r[j]
				acc[j] += qc * row[j]
			}
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
func (hv *refKDAHead) chunked(span kernels.Span, C int, w *refKDAWork) {
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
		L, A := w.lmat, w.aqk
		for i := 0; i < n; i++ {
			bi := hv.betaAt(c0 + i)
			kpi, qpi := kp[i*dk:(i+1)*dk], qp[i*dk:(i+1)*dk]
			for j := 0; j <= i; j++ {
				knj := kn[j*dk : (j+1)*dk]
				var sl, sa float64
				for c, x := range knj {
					sl += kpi[c] * x
					sa += qpi[c] * x
				}
				L[i*C+j] = bi * sl
				A[i*C+j] = sa
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
			for j := 0; j < i; j++ {
				l := L[i*C+j]
				if l == 0 {
					continue
				}
				wj, uj := wm[j*dk:(j+1)*dk], u[j*dv:(j+1)*dv]
				for c := range wi {
					wi[c] -= l * wj[c]
				}
				for x := range ui {
					ui[x] -= l * uj[x]
				}
			}
		}
		// Ṽ = U − W S (in place in u); O = (Q⊙e^Γ) S + A_qk Ṽ.
		for i := 0; i < n; i++ {
			wi, ui := wm[i*dk:(i+1)*dk], u[i*dv:(i+1)*dv]
			for c, x := range wi {
				if x == 0 {
					continue
				}
				row := S[c*dv : (c+1)*dv]
				for j := range ui {
					ui[j] -= x * row[j]
				}
			}
		}
		for i := 0; i < n; i++ {
			acc := vv[i*dv : (i+1)*dv] // V no longer needed: reuse as the output accumulator
			clear(acc)
			qpi := qp[i*dk : (i+1)*dk]
			for c, x := range qpi {
				if x == 0 {
					continue
				}
				row := S[c*dv : (c+1)*dv]
				for j := range acc {
					acc[j] += x * row[j]
				}
			}
			for j := 0; j <= i; j++ {
				a := A[i*C+j]
				uj := u[j*dv : (j+1)*dv]
				for x := range acc {
					acc[x] += a * uj[x]
				}
			}
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
			row := S[c*dv : (c+1)*dv]
			for j := range row {
				row[j] *= eC
			}
		}
		for i := 0; i < n; i++ {
			ui := u[i*dv : (i+1)*dv]
			for c := 0; c < dk; c++ {
				f := kn[i*dk+c] * w.decayC[c]
				if f == 0 {
					continue
				}
				row := S[c*dv : (c+1)*dv]
				for j := range row {
					row[j] += f * ui[j]
				}
			}
		}
		hv.storeS(w)
	}
}
