package expmath

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"math/big"
	"math/rand/v2"
	"runtime"
	"testing"

	"golang.org/x/sys/cpu"
)

// expInputs are exponent-uniform values over exp's whole finite range
// (subnormal results included), tanh's branches and the probes.
func expInputs(n int) []float64 {
	rng := rand.New(rand.NewPCG(5, 6))
	x := Probes()
	for len(x) < n/2 {
		x = append(x, -750+float64(1462*rng.Float64())) // rounded as on amd64: arm64 would fuse
	}
	for len(x) < n {
		v := math.Ldexp(1+rng.Float64(), rng.IntN(40)-30)
		if rng.IntN(2) == 0 {
			v = -v
		}
		x = append(x, v)
	}
	return x
}

// On amd64 CPUs with FMA, Exp and Tanh return math.Exp's and math.Tanh's
// bits: the reference's results from before it had its own are unchanged.
func TestExpTanhMatchMathOnAMD64(t *testing.T) {
	if runtime.GOARCH != "amd64" || !cpu.X86.HasFMA || !cpu.X86.HasAVX {
		t.Skip("math.Exp takes its FMA branch only on amd64 CPUs with AVX and FMA")
	}
	for _, v := range expInputs(1 << 18) {
		if !sameFloat(Exp(v), math.Exp(v)) {
			t.Fatalf("Exp(%v) = %v, math.Exp %v", v, Exp(v), math.Exp(v))
		}
		if !sameFloat(Tanh(v), math.Tanh(v)) {
			t.Fatalf("Tanh(%v) = %v, math.Tanh %v", v, Tanh(v), math.Tanh(v))
		}
	}
}

// expTanhDigest is the SHA-256 of exp's and tanh's bits on expInputs(1<<16),
// computed on amd64: the same test run for arm64 (scripts/test.sh runs it
// under qemu) checks that both architectures compute the same bits.
const expTanhDigest = "ddef1c9f207036944f8d8606eca3f970e486782310fe98a096efc1f3f69792d6"

func TestExpTanhDigest(t *testing.T) {
	h := sha256.New()
	var b [16]byte
	for _, v := range expInputs(1 << 16) {
		binary.LittleEndian.PutUint64(b[:], math.Float64bits(Exp(v)))
		binary.LittleEndian.PutUint64(b[8:], math.Float64bits(Tanh(v)))
		h.Write(b[:])
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != expTanhDigest {
		t.Fatalf("exp/tanh digest on %s: %s, want %s (computed on amd64)", runtime.GOARCH, got, expTanhDigest)
	}
}

// sameFloat compares bits, any NaN matching any NaN.
func sameFloat(a, b float64) bool {
	return math.Float64bits(a) == math.Float64bits(b) || math.IsNaN(a) && math.IsNaN(b)
}

// bigExp is e**x to prec bits: the Taylor series of x/2**m, squared m
// times.
func bigExp(x float64, prec uint) *big.Float {
	m := 0
	if _, e := math.Frexp(x); e > -10 {
		m = e + 10
	}
	y := new(big.Float).SetPrec(prec).SetFloat64(x)
	y.SetMantExp(y, -m)
	sum := new(big.Float).SetPrec(prec).SetInt64(1)
	term := new(big.Float).SetPrec(prec).SetInt64(1)
	eps := new(big.Float).SetMantExp(big.NewFloat(1), -int(prec)-8)
	for i := int64(1); ; i++ {
		term.Mul(term, y)
		term.Quo(term, new(big.Float).SetInt64(i))
		sum.Add(sum, term)
		if new(big.Float).Abs(term).Cmp(eps) < 0 {
			break
		}
	}
	for ; m > 0; m-- {
		sum.Mul(sum, sum)
	}
	return sum
}

// ulpErr is |got - exact| in units of the last place of exact's float64
// (subnormal spacing below the normal range).
func ulpErr(got float64, exact *big.Float) float64 {
	f, _ := exact.Float64()
	_, e := math.Frexp(f)
	ulp := math.Ldexp(1, max(e-53, -1074))
	d := new(big.Float).SetPrec(exact.Prec()).SetFloat64(got)
	d.Sub(d, exact)
	df, _ := d.Float64()
	return math.Abs(df) / ulp
}

// expFinite is the largest x exp keeps finite: like math.Exp on amd64 it
// overflows once x·log2(e) rounds to 1024, about 0.35 below ln(MaxFloat64).
const expFinite = 709.436

// TestExpAccuracy bounds exp's and tanh's errors against 200-bit
// references: exp under 2 ulp (1.48 measured) up to expFinite (subnormal results
// included), +Inf above it; tanh under 2 (0.99 measured).
func TestExpAccuracy(t *testing.T) {
	n := 20000
	if testing.Short() {
		n = 2000
	}
	const prec = 200
	var worstExp, worstTanh float64
	var atExp, atTanh float64
	for _, x := range expInputs(n) {
		if math.IsNaN(x) || math.IsInf(x, 0) || x < -745 {
			continue
		}
		if x > expFinite {
			if !math.IsInf(Exp(x), 1) {
				t.Fatalf("Exp(%v) = %v: the amd64 routine overflows there", x, Exp(x))
			}
			continue
		}
		if e := ulpErr(Exp(x), bigExp(x, prec)); e > worstExp {
			worstExp, atExp = e, x
		}
		if math.Abs(x) > 44 || x == 0 {
			continue // tanh is ±1 there, and odd
		}
		// tanh x = 1 - 2/(e**2x + 1)
		e2 := bigExp(2*x, prec)
		th := new(big.Float).SetPrec(prec).Add(e2, big.NewFloat(1))
		th.Quo(big.NewFloat(2).SetPrec(prec), th)
		th.Sub(big.NewFloat(1).SetPrec(prec), th)
		if e := ulpErr(Tanh(x), th); e > worstTanh {
			worstTanh, atTanh = e, x
		}
	}
	t.Logf("worst errors: exp %.3f ulp (x = %v), tanh %.3f ulp (x = %v)", worstExp, atExp, worstTanh, atTanh)
	if worstExp >= 2 {
		t.Errorf("Exp(%v) is %.3f ulp off", atExp, worstExp)
	}
	if worstTanh >= 2 {
		t.Errorf("Tanh(%v) is %.3f ulp off", atTanh, worstTanh)
	}
}
