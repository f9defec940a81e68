package cpu

import (
	"math"

	"golang.org/x/sys/cpu"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/mxfp"
)

// AVX2+FMA kernels, in kernel_amd64.s. Their contracts are those of the
// kernelSet fields; they are tested bit for bit against goKernels.
//
//go:noescape
func tile6x8AVX2(c, x *float64, w *float32, k int)

//go:noescape
func tile4x8AVX2(c, x *float64, w *float32, k int)

//go:noescape
func tile2x16AVX2(c, x *float64, w *float32, k int)

//go:noescape
func tile1x32AVX2(c, x *float64, w *float32, k int)

//go:noescape
func packF32AVX2(dst *float32, src *float32, lds, k int)

//go:noescape
func packBF16AVX2(dst *float32, src *uint16, lds, k int)

//go:noescape
func mxfp4PanelAVX2(dst *float32, packed *byte, lds int, scales *byte, sb, nblk int, tab *mxfp4Table)

//go:noescape
func mxfp4GemvAVX2(acc *[16]float64, xb *float64, packed *byte, lds int, scales *byte, sb, nblk int, tab *mxfp4Table)

//go:noescape
func gemv16F32AVX2(acc *[16]float64, xb *float64, w *float32, lds, k int)

//go:noescape
func gemv16BF16AVX2(acc *[16]float64, xb *float64, w *uint16, lds, k int)

//go:noescape
func mxfp4AVX2(dst *float32, packed, scales *byte, nblk int, tab *mxfp4Table)

// mxfp4Table drives the vector MXFP4 decoder: every E2M1 value is a
// bfloat16 (its float32 low half is zero), so two byte lookups (PSHUFB)
// build it, and the block's E8M0 multiplier comes from scale. Both are
// taken from package mxfp so the decoder multiplies exactly what
// mxfp.DequantMXFP4 does.
type mxfp4Table struct {
	lo, hi [16]byte     // offsets 0, 16 (the assembly relies on the layout)
	scale  [256]float32 // offset 32
	mag    [8]float32   // offset 1056: E2M1 magnitudes; code c|8 is -E2M1[c]
}

var mxfp4Tab, mxfp4TabOK = newMXFP4Table()

func newMXFP4Table() (t mxfp4Table, ok bool) {
	for c, v := range mxfp.E2M1 {
		u := math.Float32bits(v)
		if u&0xFFFF != 0 {
			return t, false
		}
		t.lo[c], t.hi[c] = byte(u>>16), byte(u>>24)
		if c < 8 {
			t.mag[c] = v
		} else if u != math.Float32bits(mxfp.E2M1[c-8])|1<<31 {
			return t, false
		}
	}
	for s := range t.scale {
		t.scale[s] = mxfp.E8M0(uint8(s))
	}
	return t, true
}

func mxfp4Vec(dst []float32, packed, scales []byte) {
	if len(dst) != 2*len(packed) || len(dst) != 32*len(scales) {
		mxfp.DequantMXFP4(dst, packed, scales) // panics with the shape
		return
	}
	if len(scales) > 0 {
		mxfp4AVX2(&dst[0], &packed[0], &scales[0], len(scales), &mxfp4Tab)
	}
}

var avx2Kernels = func() kernelSet {
	k := kernelSet{
		name:     "avx2",
		tile6x8:  tile6x8AVX2,
		tile4x8:  tile4x8AVX2,
		tile2x16: tile2x16AVX2,
		tile1x32: tile1x32AVX2,
		packF32:  packF32AVX2,
		packBF16: packBF16AVX2,
		mxfp4:    mxfp4Vec,
		gemvF32:  gemv16F32AVX2,
		mxfp4Gemv: func(acc *[16]float64, xb []float64, packed []byte, lds int, scales []byte, sb, nblk int) {
			_ = xb[4*kernels.MXBlock*nblk-1]
			_ = packed[(gemvRows-1)*lds+nblk*kernels.MXBlock/2-1]
			_ = scales[(gemvRows-1)*sb+nblk-1]
			mxfp4GemvAVX2(acc, &xb[0], &packed[0], lds, &scales[0], sb, nblk, &mxfp4Tab)
		},
		mxfp4Panel: func(dst *float32, packed []byte, lds int, scales []byte, sb, nblk int) {
			_ = packed[(packW-1)*lds+nblk*kernels.MXBlock/2-1]
			_ = scales[(packW-1)*sb+nblk-1]
			mxfp4PanelAVX2(dst, &packed[0], lds, &scales[0], sb, nblk, &mxfp4Tab)
		},
		gemvBF16: gemv16BF16AVX2,

		scal:      scalVec,
		decayRead: decayReadVec,
		writeRead: writeReadVec,
		kdaDots:   kdaDotsVec,
		matAcc:    matAccVec,
		widen:     widenVec,
		narrow:    narrowVec,
		situ:      situGo,
		sigmoid:   sigmoidGo,
		gate:      gateGo,
	}
	if vecMathOK {
		k.situ, k.sigmoid, k.gate = situVec, sigmoidVec, gateVec
	}
	if !mxfp4TabOK {
		k.mxfp4 = dequantMXFP4
		k.mxfp4Panel = nil
		k.mxfp4Gemv = nil
	}
	return k
}()

// archKernels returns the AVX2 kernels when the CPU and OS support AVX2 and
// FMA (GODEBUG=cpu.avx2=off or cpu.fma=off turns them off).
func archKernels() *kernelSet {
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		return &avx2Kernels
	}
	return nil
}
