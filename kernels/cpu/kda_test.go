package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-inference/tandem/kernels"
)

func randTensor(rng *rand.Rand, rows, cols int, f func() float64) *kernels.Tensor {
	t := &kernels.Tensor{Rows: rows, Cols: cols, Data: make([]float32, rows*cols)}
	for i := range t.Data {
		t.Data[i] = float32(f())
	}
	return t
}

func sameF32(got, want []float32) int {
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

// TestKDAMatchesReference: the vectorised recurrences (assembly and Go)
// give the bits of the scalar code they replaced (kda_ref_test.go), for the
// sequential and chunked forms, head sizes off the vector width, spans that
// start mid-tensor and continue a non-zero state, 1 and 3 threads.
func TestKDAMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	type shape struct{ heads, dk, dv, T int }
	shapes := []shape{{2, 16, 16, 70}, {3, 7, 13, 20}, {1, 128, 128, 40}, {2, 9, 4, 5}}
	for _, sh := range shapes {
		for _, chunk := range []int{0, 1, 3, 16, 64} {
			H, dk, dv, T := sh.heads, sh.dk, sh.dv, sh.T
			q := randTensor(rng, T+3, H*dk, func() float64 { return rng.NormFloat64() / math.Sqrt(float64(dk)) })
			k := randTensor(rng, T+3, H*dk, func() float64 { return rng.NormFloat64() / math.Sqrt(float64(dk)) })
			v := randTensor(rng, T+3, H*dv, rng.NormFloat64)
			g := randTensor(rng, T+3, H*dk, func() float64 { return -5 * rng.Float64() })
			beta := randTensor(rng, T+3, H, rng.Float64)
			for i := range g.Data[:H*dk] {
				if i%5 == 0 {
					k.Data[i] = 0 // exact zeros take the skip branches
				}
			}
			S0 := make([]float32, H*dk*dv)
			for i := range S0 {
				S0[i] = float32(rng.NormFloat64() * 0.1)
			}
			span := kernels.Span{Lo: 2, Hi: 2 + T}
			wantO := &kernels.Tensor{Rows: T + 3, Cols: H * dv, Data: make([]float32, (T+3)*H*dv)}
			wantS := append([]float32(nil), S0...)
			refKDA(wantO, q, k, v, g, beta, span, wantS, H, dk, dv, chunk)
			for _, kn := range kernelSets() {
				useKernels(t, kn)
				for _, threads := range []int{1, 3} {
					name := fmt.Sprintf("%s/threads%d/H%d_dk%d_dv%d_T%d_chunk%d", kn.name, threads, H, dk, dv, T, chunk)
					o := &kernels.Tensor{Rows: T + 3, Cols: H * dv, Data: make([]float32, (T+3)*H*dv)}
					S := append([]float32(nil), S0...)
					New(threads).KDA(o, q, k, v, g, beta, span, stateT(S), H, dk, dv, chunk)
					if i := sameF32(o.Data, wantO.Data); i >= 0 {
						t.Fatalf("%s: output %d = %g, want %g", name, i, o.Data[i], wantO.Data[i])
					}
					if i := sameF32(S, wantS); i >= 0 {
						t.Fatalf("%s: state %d = %g, want %g", name, i, S[i], wantS[i])
					}
				}
			}
		}
	}
}

// TestVecMatchesGo: each vector step of the recurrences against its Go
// loop, in fp64 (the KDA outputs are rounded to fp32, which would hide a
// last-bit difference such as a fused multiply-add).
func TestVecMatchesGo(t *testing.T) {
	asm := archKernels()
	if asm == nil {
		t.Skip("no assembly kernels on this CPU")
	}
	rng := rand.New(rand.NewPCG(11, 12))
	vec := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = rng.NormFloat64()
		}
		return v
	}
	same := func(name string, got, want []float64) {
		t.Helper()
		for i := range want {
			if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
				t.Fatalf("%s: element %d = %v, want %v", name, i, got[i], want[i])
			}
		}
	}
	for _, n := range []int{1, 3, 4, 7, 8, 13, 128} {
		x, y, z := vec(n), vec(n), vec(n)
		a, b := rng.NormFloat64(), rng.NormFloat64()
		cp := func(v []float64) []float64 { return append([]float64(nil), v...) }

		y1, y2 := cp(y), cp(y)
		asm.scal(y1, a)
		goKernels.scal(y2, a)
		same(fmt.Sprintf("scal n=%d", n), y1, y2)

		r1, r2, y1, y2 := cp(x), cp(x), cp(y), cp(y)
		asm.decayRead(y1, r1, a, b)
		goKernels.decayRead(y2, r2, a, b)
		same(fmt.Sprintf("decayRead row n=%d", n), y1, y2)
		same(fmt.Sprintf("decayRead r n=%d", n), r1, r2)

		r1, y1, y2 = cp(x), cp(y), cp(y)
		z1, z2 := cp(z), cp(z)
		asm.writeRead(y1, r1, z1, a, b)
		goKernels.writeRead(y2, r1, z2, a, b)
		same(fmt.Sprintf("writeRead row n=%d", n), y1, y2)
		same(fmt.Sprintf("writeRead acc n=%d", n), z1, z2)

		// widen and narrow, with values that round in fp32 and out of range.
		big := cp(y)
		for i := range big {
			big[i] *= math.Pow(10, float64(rng.IntN(80)-40))
		}
		big[0] = 1e300
		if n > 2 {
			big[1], big[2] = math.NaN(), 1e-310
		}
		f1, f2 := make([]float32, n), make([]float32, n)
		b1, b2 := cp(big), cp(big)
		asm.narrow(f1, b1)
		goKernels.narrow(f2, b2)
		same(fmt.Sprintf("narrow back n=%d", n), b1, b2)
		if i := sameF32(f1, f2); i >= 0 && !(f1[i] != f1[i] && f2[i] != f2[i]) {
			t.Fatalf("narrow n=%d: element %d = %v, want %v", n, i, f1[i], f2[i])
		}
		w1, w2 := make([]float64, n), make([]float64, n)
		asm.widen(w1, f1)
		goKernels.widen(w2, f1)
		same(fmt.Sprintf("widen n=%d", n), w1, w2)
	}
	// matAcc: lengths on and off the 32-element slices, zero coefficients
	// (skipped or not), both signs.
	for _, n := range []int{5, 32, 64, 100, 128} {
		const m, ld = 9, 131
		mat := vec(m * ld)
		a := vec(m)
		a[2], a[5], a[7] = 0, math.Copysign(0, -1), math.NaN()
		mat[5*ld] = math.Inf(1) // 0·inf is NaN unless the row is skipped
		for _, sub := range []bool{false, true} {
			for _, skip := range []bool{false, true} {
				y1, y2 := vec(n), []float64(nil)
				y2 = append(y2, y1...)
				asm.matAcc(y1, a, mat, ld, sub, skip)
				goKernels.matAcc(y2, a, mat, ld, sub, skip)
				for i := range y2 {
					if !sameFloat(y1[i], y2[i]) {
						t.Fatalf("matAcc n=%d sub=%v skip=%v: element %d = %v, want %v", n, sub, skip, i, y1[i], y2[i])
					}
				}
			}
		}
	}
	// kdaDots against the scalar sums of kda.go, for nj off the 8-lane block.
	const dk, ld = 37, 24
	kp, qp, knT := vec(dk), vec(dk), vec(dk*ld)
	for _, nj := range []int{1, 5, 8, 9, 24} {
		l, a := make([]float64, ld), make([]float64, ld)
		asm.kdaDots(l, a, kp, qp, knT, ld, nj)
		for j := 0; j < nj; j++ {
			var sl, sa float64
			for c := 0; c < dk; c++ {
				sl += kp[c] * knT[c*ld+j]
				sa += qp[c] * knT[c*ld+j]
			}
			if math.Float64bits(l[j]) != math.Float64bits(sl) || math.Float64bits(a[j]) != math.Float64bits(sa) {
				t.Fatalf("kdaDots nj=%d: j=%d gives %v, %v, want %v, %v", nj, j, l[j], a[j], sl, sa)
			}
		}
	}
}

// TestKDAChunkedEqualsRecurrence: the chunked (UT/WY) form equals the
// sequential recurrence within 1e-5 for chunk sizes 1, 16 and 64, on
// lengths that are not multiples of the chunk, continuing from a non-zero
// state, with decays down to the -5 lower bound.
func TestKDAChunkedEqualsRecurrence(t *testing.T) {
	const H, D = 3, 32
	rng := rand.New(rand.NewPCG(7, 11))
	b := New(2)
	for _, T := range []int{1, 37, 150} {
		mk := func(cols int, f func() float32) *kernels.Tensor {
			x := b.NewTensor(T, cols)
			for i := range x.Data {
				x.Data[i] = f()
			}
			return x
		}
		normal := func() float32 { return float32(rng.NormFloat64()) }
		q, k, v := mk(H*D, normal), mk(H*D, normal), mk(H*D, normal)
		b.L2NormGroups(q, D, 1e-6, float32(1/math.Sqrt(D)))
		b.L2NormGroups(k, D, 1e-6, 1)
		g := mk(H*D, func() float32 { return float32(-5 * rng.Float64()) }) // log decay in (-5, 0)
		beta := mk(H, func() float32 { return float32(rng.Float64()) })
		S0 := make([]float32, H*D*D)
		for i := range S0 {
			S0[i] = float32(0.1 * rng.NormFloat64())
		}
		run := func(chunk int) ([]float32, []float32) {
			o := b.NewTensor(T, H*D)
			S := append([]float32(nil), S0...)
			b.KDA(o, q, k, v, g, beta, kernels.Span{Lo: 0, Hi: T}, stateT(S), H, D, D, chunk)
			return o.Data, S
		}
		wantO, wantS := run(0)
		for _, chunk := range []int{1, 16, 64} {
			o, S := run(chunk)
			for name, pair := range map[string][2][]float32{"output": {o, wantO}, "state": {S, wantS}} {
				for i := range pair[0] {
					if d := math.Abs(float64(pair[0][i] - pair[1][i])); d > 1e-5 {
						t.Fatalf("T=%d chunk %d: %s[%d] = %g, recurrence %g (diff %.2g)", T, chunk, name, i, pair[0][i], pair[1][i], d)
					}
				}
			}
		}
	}
}
