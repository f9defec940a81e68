package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/mxfp"
)

// The GEMM contract (matmul.go): out[t][o] = round(fma chain over k of
// x[t][k]·W[o][k] in fp64, from 0, k in order). refRow decodes a weight row
// with package mxfp only and refGemm runs that chain with math.FMA, one
// output at a time: a definition that shares no code with the kernels.

func refRow(w *kernels.Matrix, r int) []float64 {
	I := w.Cols
	out := make([]float64, I)
	switch w.Format {
	case kernels.F32:
		for k := range out {
			out[k] = float64(math.Float32frombits(binary.LittleEndian.Uint32(w.Data[4*(r*I+k):])))
		}
	case kernels.BF16, kernels.F16:
		for k := range out {
			u := binary.LittleEndian.Uint16(w.Data[2*(r*I+k):])
			if w.Format == kernels.BF16 {
				out[k] = float64(mxfp.BF16ToF32(u))
			} else {
				out[k] = float64(mxfp.F16ToF32(u))
			}
		}
	default:
		f := make([]float32, I)
		sb := I / kernels.MXBlock
		if w.Format == kernels.MXFP4 {
			mxfp.DequantMXFP4(f, w.Data[r*I/2:(r+1)*I/2], w.Scales[r*sb:(r+1)*sb])
		} else {
			mxfp.DequantMXFP8(f, w.Data[r*I:(r+1)*I], w.Scales[r*sb:(r+1)*sb], w.Format == kernels.MXFP8E5M2)
		}
		for k, v := range f {
			out[k] = float64(v)
		}
	}
	return out
}

func refGemm[X, Y float](x []X, T int, w *kernels.Matrix) []Y {
	I, O := w.Cols, w.Rows
	out := make([]Y, T*O)
	for o := 0; o < O; o++ {
		wr := refRow(w, o)
		for t := 0; t < T; t++ {
			var acc float64
			for k := 0; k < I; k++ {
				acc = math.FMA(float64(x[t*I+k]), wr[k], acc)
			}
			out[t*O+o] = Y(acc)
		}
	}
	return out
}

// randMatrix makes a weight of the format with random finite values;
// scaleLo/scaleHi bound the E8M0 scales of MX formats.
func randMatrix(rng *rand.Rand, f kernels.Format, O, I int, scaleLo, scaleHi int) *kernels.Matrix {
	m := &kernels.Matrix{Name: fmt.Sprintf("w_%s_%dx%d", f, O, I), Rows: O, Cols: I, Format: f}
	m.Data = make([]byte, O*f.RowBytes(I))
	switch f {
	case kernels.F32:
		for i := 0; i < O*I; i++ {
			binary.LittleEndian.PutUint32(m.Data[4*i:], math.Float32bits(float32(rng.NormFloat64())))
		}
	case kernels.BF16:
		for i := 0; i < O*I; i++ {
			binary.LittleEndian.PutUint16(m.Data[2*i:], mxfp.F32ToBF16(float32(rng.NormFloat64())))
		}
	case kernels.F16:
		for i := 0; i < O*I; i++ {
			v := float32(rng.NormFloat64() * math.Pow(2, float64(rng.IntN(30)-20))) // subnormals too
			binary.LittleEndian.PutUint16(m.Data[2*i:], mxfp.F32ToF16(v))
		}
	default:
		for i := range m.Data {
			b := byte(rng.Uint32())
			// No NaN element codes: E4M3 S.1111.111, E5M2 S.11111.xx.
			if f == kernels.MXFP8E4M3 && b&0x7F == 0x7F || f == kernels.MXFP8E5M2 && b&0x7C == 0x7C {
				b &^= 0x04
			}
			m.Data[i] = b
		}
		m.Scales = make([]byte, O*I/kernels.MXBlock)
		for i := range m.Scales {
			m.Scales[i] = byte(scaleLo + rng.IntN(scaleHi-scaleLo+1))
		}
	}
	if err := m.Check(); err != nil {
		panic(err)
	}
	return m
}

func randX[X float](rng *rand.Rand, n int) []X {
	x := make([]X, n)
	for i := range x {
		x[i] = X(rng.NormFloat64() * 4)
	}
	if n > 2 {
		x[1] = 0 // exact zeros and a negative zero are part of the contract too
		x[2] = X(math.Copysign(0, -1))
	}
	return x
}

// sameBits reports the first element whose bits differ (any two NaNs match).
func sameBits[Y float](got, want []Y) (int, bool) {
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(g) && math.IsNaN(w) {
			continue
		}
		if math.Float64bits(g) != math.Float64bits(w) {
			return i, false
		}
	}
	return -1, len(got) == len(want)
}

var allFormats = []kernels.Format{kernels.F32, kernels.BF16, kernels.F16, kernels.MXFP4, kernels.MXFP8E4M3, kernels.MXFP8E5M2}

// kernelSets are the kernels a test compares: the portable ones and, where
// the CPU has them, the assembly.
func kernelSets() []*kernelSet {
	ks := []*kernelSet{&goKernels}
	if k := archKernels(); k != nil {
		ks = append(ks, k)
	}
	return ks
}

func useKernels(t testing.TB, k *kernelSet) {
	old := kernelsInUse
	kernelsInUse = k
	t.Cleanup(func() { kernelsInUse = old })
}

// gemmCase checks one shape against the reference with every kernel set and
// thread count, for one input/output precision pair.
func gemmCase[X, Y float](t *testing.T, rng *rand.Rand, w *kernels.Matrix, T int) {
	t.Helper()
	x := randX[X](rng, T*w.Cols)
	want := refGemm[X, Y](x, T, w)
	for _, kn := range kernelSets() {
		useKernels(t, kn)
		for _, threads := range []int{1, 3} {
			got := make([]Y, T*w.Rows)
			gemm(New(threads), got, x, T, w)
			if i, ok := sameBits(got, want); !ok {
				t.Fatalf("%s kernels, %d threads, %s, T=%d: out[%d][%d] = %v (%#x), want %v (%#x)",
					kn.name, threads, w.Name, T, i/w.Rows, i%w.Rows, got[i], math.Float64bits(float64(got[i])), want[i], math.Float64bits(float64(want[i])))
			}
		}
		got := make([]Y, T*w.Rows)
		s := getScratch()
		gemmSerial(got, x, T, w, s)
		putScratch(s)
		if i, ok := sameBits(got, want); !ok {
			t.Fatalf("%s kernels, serial, %s, T=%d: element %d = %v, want %v", kn.name, w.Name, T, i, got[i], want[i])
		}
	}
}

// TestGEMMMatchesDefinition: every T from 1 to 70 (and past one 96-row
// block), each with two weight formats in turn (F32, BF16, F16, MXFP4,
// MXFP8 E4M3/E5M2) and fp32 or fp64 in and out, random I and O off the tile
// and panel sizes, assembly and Go kernels, 1 and 3 threads, serial path:
// all bit-identical to the scalar FMA chain.
func TestGEMMMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	Ts := make([]int, 0, 72)
	for T := 1; T <= 70; T++ {
		Ts = append(Ts, T)
	}
	if !testing.Short() {
		Ts = append(Ts, 101)
	}
	for i, T := range Ts {
		for _, f := range []kernels.Format{allFormats[i%len(allFormats)], allFormats[(i+3)%len(allFormats)]} {
			var I int
			if f.Scaled() {
				I = kernels.MXBlock * (1 + rng.IntN(9)) // up to 288: several 128-wide panels
			} else {
				I = 1 + rng.IntN(300)
			}
			O := 1 + rng.IntN(100)
			if T <= 2 {
				O, I = 67, 8*kernels.MXBlock // a partial group after two full ones, exact panels
			}
			w := randMatrix(rng, f, O, I, 110, 140)
			t.Run(fmt.Sprintf("%s/T%d_O%d_I%d", f, T, O, I), func(t *testing.T) {
				switch (i + int(f)) % 4 {
				case 0:
					gemmCase[float32, float32](t, rng, w, T)
				case 1:
					gemmCase[float64, float64](t, rng, w, T)
				case 2:
					gemmCase[float32, float64](t, rng, w, T)
				default:
					gemmCase[float64, float32](t, rng, w, T)
				}
			})
		}
	}
}

// TestGEMMRangeEdges: MX scales at the ends of the E8M0 range (2^-127 as
// an fp32 subnormal, overflow to infinity, infinity times zero) and
// subnormal, infinite and extreme BF16 weights give the definition's bits.
func TestGEMMRangeEdges(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, f := range []kernels.Format{kernels.MXFP4, kernels.MXFP8E4M3, kernels.MXFP8E5M2} {
		for _, sc := range [][2]int{{0, 3}, {250, 254}, {0, 254}} {
			w := randMatrix(rng, f, 40, 96, sc[0], sc[1])
			t.Run(fmt.Sprintf("%s/scales%d-%d", f, sc[0], sc[1]), func(t *testing.T) {
				gemmCase[float32, float32](t, rng, w, 7)
				gemmCase[float64, float64](t, rng, w, 1)
			})
		}
	}
	w := randMatrix(rng, kernels.BF16, 16, 24, 0, 0)
	special := []uint16{0x0001, 0x8001, 0x007F, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x0000, 0x8000}
	for i := range 16 * 24 {
		if i%3 == 0 {
			binary.LittleEndian.PutUint16(w.Data[2*i:], special[i%len(special)])
		}
	}
	t.Run("BF16/special", func(t *testing.T) { gemmCase[float32, float32](t, rng, w, 5) })
}

// TestGEMMRowIndependence: a row's result is the same whichever rows share
// the call and wherever it lands in a tile (checked against single-row
// calls, so independently of the reference).
func TestGEMMRowIndependence(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	w := randMatrix(rng, kernels.MXFP4, 70, 192, 115, 135)
	for _, kn := range kernelSets() {
		useKernels(t, kn)
		b := New(2)
		x := randX[float32](rng, 70*w.Cols)
		all := make([]float32, 70*w.Rows)
		gemm(b, all, x, 70, w)
		for _, T := range []int{1, 5, 13} {
			for t0 := 0; t0+T <= 70; t0 += 19 {
				part := make([]float32, T*w.Rows)
				gemm(b, part, x[t0*w.Cols:(t0+T)*w.Cols], T, w)
				if i, ok := sameBits(part, all[t0*w.Rows:(t0+T)*w.Rows]); !ok {
					t.Fatalf("%s: rows %d..%d alone differ from the 70-row call at %d", kn.name, t0, t0+T, i)
				}
			}
		}
	}
}

// TestPackMatchesGo: the assembly packers and MXFP4 decoder against the Go
// ones (and mxfp's decoder: every byte under every scale).
func TestPackMatchesGo(t *testing.T) {
	asm := archKernels()
	if asm == nil {
		t.Skip("no assembly kernels on this CPU")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	const lds, k = 77, 48
	src32 := make([]float32, packW*lds)
	src16 := make([]uint16, packW*lds)
	for i := range src32 {
		src32[i] = math.Float32frombits(rng.Uint32())
		src16[i] = uint16(rng.Uint32())
	}
	for _, name := range []string{"f32", "bf16"} {
		want := make([]float32, k*groupW)
		got := make([]float32, k*groupW)
		if name == "f32" {
			goKernels.packF32(&want[0], &src32[0], lds, k)
			asm.packF32(&got[0], &src32[0], lds, k)
		} else {
			goKernels.packBF16(&want[0], &src16[0], lds, k)
			asm.packBF16(&got[0], &src16[0], lds, k)
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("pack %s: element %d = %#x, want %#x", name, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
			}
		}
	}
	// MXFP4: 256 blocks, each byte value once per block position, each scale.
	packed := make([]byte, 256*16)
	scales := make([]byte, 256)
	for b := range scales {
		scales[b] = byte(b)
		for i := 0; i < 16; i++ {
			packed[b*16+i] = byte(b*16 + i + b/16)
		}
	}
	want := make([]float32, 256*32)
	got := make([]float32, 256*32)
	mxfp.DequantMXFP4(want, packed, scales)
	asm.mxfp4(got, packed, scales)
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("mxfp4 element %d (scale %d): %#x, want %#x", i, scales[i/32], math.Float32bits(got[i]), math.Float32bits(want[i]))
		}
	}
}

// TestGoKernelsUnderGODEBUG re-runs the definition test in a child process
// with GODEBUG=cpu.avx2=off, so that CI exercises the switch that turns the
// assembly off and the portable path it falls back to.
func TestGoKernelsUnderGODEBUG(t *testing.T) {
	if os.Getenv("TANDEM_CPU_CHILD") != "" {
		if KernelName() != "go" {
			t.Fatalf("GODEBUG=%s: kernels %q, want the Go ones", os.Getenv("GODEBUG"), KernelName())
		}
		return
	}
	if archKernels() == nil {
		t.Skip("no assembly kernels to turn off")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^(TestGoKernelsUnderGODEBUG|TestGEMMMatchesDefinition)$", "-test.short")
	cmd.Env = append(os.Environ(), "GODEBUG=cpu.avx2=off", "TANDEM_CPU_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PASS") {
		t.Fatalf("child with GODEBUG=cpu.avx2=off: %v\n%s", err, out)
	}
}
