package machine

import (
	"math"
	"runtime"
	"testing"
)

// TestSumWords: the bandwidth probe's read loop really reads every word
// (vector and scalar paths, ragged lengths).
func TestSumWords(t *testing.T) {
	buf := make([]uint64, 1000)
	for i := range buf {
		buf[i] = uint64(i*i + 7)
	}
	for _, n := range []int{0, 3, 16, 17, 999, 1000} {
		var want uint64
		for _, v := range buf[:n] {
			want += v
		}
		if got := sumWords(buf[:n]); got != want {
			t.Fatalf("sumWords of %d words = %d, want %d", n, got, want)
		}
	}
}

// TestFMALoopCountsWork: the timed FMA loop runs the number of chains and
// iterations its FLOP count assumes (each chain adds a·b per iteration).
func TestFMALoopCountsWork(t *testing.T) {
	if !hasSIMDFMA() {
		t.Skip("no SIMD FMA loop on this CPU")
	}
	const n = 1000
	a, b := math.Float64frombits(0x3FEFFFFFFFFFFFFF), math.Float64frombits(0x3FF0000000000001)
	// The loop returns one lane of its chains' sum; all lanes are equal.
	want := float64(simdChains) * n * a * b
	if got := simdFMALoop(n); math.Abs(got-want) > 1e-9*want {
		t.Fatalf("fma loop (%s): %g, want %g", simdFMAName, got, want)
	}
}

// TestLimitsPositive: both probes return a rate (no timing asserted).
func TestLimitsPositive(t *testing.T) {
	if g := FMAGFLOPS(1); !(g > 0) || math.IsInf(g, 0) {
		t.Fatalf("FMAGFLOPS(1) = %g (%s)", g, FMAKind())
	}
	if testing.Short() {
		t.Skip("the bandwidth probe reads 256 MiB three times")
	}
	if g := MemReadGBPS(2); !(g > 0) || math.IsInf(g, 0) {
		t.Fatalf("MemReadGBPS(2) = %g", g)
	}
}

// TestPageFaultMicros: where memory can be mapped (every unix) the probe
// returns a cost per page, finite and positive (no timing asserted).
func TestPageFaultMicros(t *testing.T) {
	us, ok := PageFaultMicros()
	if runtime.GOOS != "windows" && !ok {
		t.Fatal("PageFaultMicros: not measured")
	}
	if ok && (!(us > 0) || math.IsInf(us, 0)) {
		t.Fatalf("PageFaultMicros = %g us", us)
	}
}
