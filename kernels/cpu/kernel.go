package cpu

import "math"

// kernelSet is the inner loops of one instruction set. Every set computes
// the same bits as goKernels, the portable definition (tests compare them).
//
// tile6x8 and tile4x8 cover 8 columns at c, x, w; tile2x16 16 columns;
// tile1x32 all 32 (tile.go). k ≥ 1. c rows and w rows are groupW values
// apart; x holds mr values per k.
type kernelSet struct {
	name     string
	tile6x8  func(c, x *float64, w *float32, k int)
	tile4x8  func(c, x *float64, w *float32, k int)
	tile2x16 func(c, x *float64, w *float32, k int)
	tile1x32 func(c, x *float64, w *float32, k int)
	// packF32 and packBF16 transpose packW rows of lds elements apart into
	// a panel: dst[kk*groupW+j] = row j [kk] as fp32, kk < k, k%8 == 0.
	packF32  func(dst *float32, src *float32, lds, k int)
	packBF16 func(dst *float32, src *uint16, lds, k int)
	// mxfp4 decodes nblk blocks of MXFP4 into fp32, as mxfp.DequantMXFP4.
	mxfp4 func(dst []float32, packed, scales []byte)
	// mxfp4Panel packs packW MXFP4 rows (lds bytes apart, their E8M0
	// scales sb bytes apart) of nblk blocks straight into a panel; nil:
	// decode to fp32 and packF32.
	mxfp4Panel func(dst *float32, packed []byte, lds int, scales []byte, sb, nblk int)
	// mxfp4Gemv is the one-row kernel straight from MXFP4 bytes: 16 rows
	// lds bytes apart (scales sb bytes apart) over nblk blocks; nil: decode
	// to fp32 and gemvF32.
	mxfp4Gemv func(acc *[16]float64, xb []float64, packed []byte, lds int, scales []byte, sb, nblk int)
	// gemvF32 and gemvBF16 are the one-row kernels: for 16 weight rows lds
	// elements apart, acc[r] = fma(x[kk], W[r][kk], acc[r]) for kk < k in
	// order, with x broadcast in memory: xb[kk*4+l] = x[kk]; k%8 == 0 for
	// gemvF32, k%16 == 0 for gemvBF16.
	gemvF32  func(acc *[16]float64, xb *float64, w *float32, lds, k int)
	gemvBF16 func(acc *[16]float64, xb *float64, w *uint16, lds, k int)

	// Vector steps of the KDA recurrences (vec.go): each element is one
	// multiply then one add, as the scalar Go loops round them.
	scal      func(y []float64, a float64)                      // y *= a
	decayRead func(row, r []float64, a, kc float64)             // row *= a; r += kc·row
	writeRead func(row, r, acc []float64, kc, qc float64)       // row += kc·r; acc += qc·row
	matAcc    func(y, a, mat []float64, ld int, sub, skip bool) // y ±= Σ_r a[r]·mat row r (vec.go)
	widen     func(dst []float64, src []float32)                // dst = float64(src)
	narrow    func(dst []float32, s []float64)                  // dst = float32(s); s = float64(dst)
	// kdaDots sets l[j] = Σ_c kp[c]·knT[c*ld+j] and a[j] likewise with qp,
	// each sum in c order from 0, for j < nj (and up to nj rounded to 8,
	// which l, a and knT rows must hold); nil: the scalar loop in kda.go.
	kdaDots func(l, a, kp, qp, knT []float64, ld, nj int)

	// situ sets g[i] = situ(g[i], u[i], b1, b2) (elementwise.go), with
	// exactly exp's and tanh's bits (internal/expmath).
	situ func(g, u []float64, b1, b2 float64)
	// sigmoid sets dst[i] = sigmoid(src[i]) (dst may be src); gate is
	// KDAGate's map of one head (kda.go). Both with exp's bits.
	sigmoid func(dst, src []float32)
	gate    func(x []float32, negA float64, lower float32)
}

// goKernels are the portable kernels: the definition the assembly is
// tested against, and what runs where there is no assembly.
var goKernels = kernelSet{
	name:     "go",
	tile6x8:  func(c, x *float64, w *float32, k int) { tileGo(6, 8, c, x, w, k) },
	tile4x8:  func(c, x *float64, w *float32, k int) { tileGo(4, 8, c, x, w, k) },
	tile2x16: func(c, x *float64, w *float32, k int) { tileGo(2, 16, c, x, w, k) },
	tile1x32: func(c, x *float64, w *float32, k int) { tileGo(1, 32, c, x, w, k) },
	packF32:  packF32Go,
	packBF16: packBF16Go,
	mxfp4:    dequantMXFP4,
	gemvF32:  gemv16F32Go,
	gemvBF16: gemv16BF16Go,

	scal:      scalGo,
	decayRead: decayReadGo,
	writeRead: writeReadGo,
	matAcc:    matAccGo,
	widen:     widenGo,
	narrow:    narrowGo,
	situ:      situGo,
	sigmoid:   sigmoidGo,
	gate:      gateGo,
}

// kernelsInUse are the tile kernels every GEMM runs: the assembly of this
// CPU when it has them (kernel_amd64.go), the portable Go ones otherwise.
// Both compute identical bits; tests switch between them.
var kernelsInUse = selectKernels()

func selectKernels() *kernelSet {
	if k := archKernels(); k != nil {
		return k
	}
	return &goKernels
}

// KernelName names the GEMM kernels in use ("avx2" or "go"), for reports.
func KernelName() string { return kernelsInUse.name }

// sameFloat compares bits, any NaN matching any NaN.
func sameFloat(a, b float64) bool {
	return math.Float64bits(a) == math.Float64bits(b) || a != a && b != b
}
