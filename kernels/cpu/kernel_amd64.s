#include "textflag.h"

// AVX2+FMA GEMM kernels over the packed layout of tile.go: accumulator rows
// are 32 doubles (256 bytes) apart, weight-panel rows 32 floats (128 bytes,
// widened exactly by VCVTPS2PD); activation tiles hold mr doubles per k.
// Every VFMADD231PD lane is one output's chain acc = fma(x[k], w[k], acc),
// k in order, so the bits equal math.FMA's.

// (Macros that read named arguments come before the first TEXT so that vet
// does not check those names against the function above them.)

// MXFP4_SCALES writes to slot..slot+3 (SP, fp32 slots) the E8M0
// multipliers (tab.scale, at 32(R10)) of four rows' scales, the first at
// (p) plus slot row strides (sb at sb+32(FP)); clobbers AX and R11.
#define MXFP4_SCALES(p, slot) \
	MOVQ    sb+32(FP), R11       \
	IMULQ   $slot, R11           \
	ADDQ    p, R11               \
	MOVBLZX (R11), AX            \
	MOVL    32(R10)(AX*4), AX    \
	MOVL    AX, (4*slot)(SP)     \
	ADDQ    sb+32(FP), R11       \
	MOVBLZX (R11), AX            \
	MOVL    32(R10)(AX*4), AX    \
	MOVL    AX, (4*slot+4)(SP)   \
	ADDQ    sb+32(FP), R11       \
	MOVBLZX (R11), AX            \
	MOVL    32(R10)(AX*4), AX    \
	MOVL    AX, (4*slot+8)(SP)   \
	ADDQ    sb+32(FP), R11       \
	MOVBLZX (R11), AX            \
	MOVL    32(R10)(AX*4), AX    \
	MOVL    AX, (4*slot+12)(SP)

// MXFP4_SCALE16 stores row r's block multiplier at 256+4r (SP); R13
// walks the rows' scales (sb at sb+40(FP)).
#define MXFP4_SCALE16(r) \
	MOVBLZX (R13), AX            \
	MOVL    32(R10)(AX*4), AX    \
	MOVL    AX, (256+4*r)(SP)    \
	ADDQ    sb+40(FP), R13

// func tile6x8AVX2(c, x *float64, w *float32, k int)
TEXT ·tile6x8AVX2(SB), NOSPLIT, $0-32
	MOVQ c+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ k+24(FP), CX
	VMOVUPD 0(DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 256(DI), Y2
	VMOVUPD 288(DI), Y3
	VMOVUPD 512(DI), Y4
	VMOVUPD 544(DI), Y5
	VMOVUPD 768(DI), Y6
	VMOVUPD 800(DI), Y7
	VMOVUPD 1024(DI), Y8
	VMOVUPD 1056(DI), Y9
	VMOVUPD 1280(DI), Y10
	VMOVUPD 1312(DI), Y11

loop6x8:
	VCVTPS2PD    0(DX), Y12
	VCVTPS2PD    16(DX), Y13
	VBROADCASTSD 0(SI), Y14
	VBROADCASTSD 8(SI), Y15
	VFMADD231PD  Y12, Y14, Y0
	VFMADD231PD  Y13, Y14, Y1
	VFMADD231PD  Y12, Y15, Y2
	VFMADD231PD  Y13, Y15, Y3
	VBROADCASTSD 16(SI), Y14
	VBROADCASTSD 24(SI), Y15
	VFMADD231PD  Y12, Y14, Y4
	VFMADD231PD  Y13, Y14, Y5
	VFMADD231PD  Y12, Y15, Y6
	VFMADD231PD  Y13, Y15, Y7
	VBROADCASTSD 32(SI), Y14
	VBROADCASTSD 40(SI), Y15
	VFMADD231PD  Y12, Y14, Y8
	VFMADD231PD  Y13, Y14, Y9
	VFMADD231PD  Y12, Y15, Y10
	VFMADD231PD  Y13, Y15, Y11
	ADDQ         $48, SI
	ADDQ         $128, DX
	DECQ         CX
	JNZ          loop6x8

	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 256(DI)
	VMOVUPD Y3, 288(DI)
	VMOVUPD Y4, 512(DI)
	VMOVUPD Y5, 544(DI)
	VMOVUPD Y6, 768(DI)
	VMOVUPD Y7, 800(DI)
	VMOVUPD Y8, 1024(DI)
	VMOVUPD Y9, 1056(DI)
	VMOVUPD Y10, 1280(DI)
	VMOVUPD Y11, 1312(DI)
	VZEROUPPER
	RET

// func tile4x8AVX2(c, x *float64, w *float32, k int)
TEXT ·tile4x8AVX2(SB), NOSPLIT, $0-32
	MOVQ c+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ k+24(FP), CX
	VMOVUPD 0(DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 256(DI), Y2
	VMOVUPD 288(DI), Y3
	VMOVUPD 512(DI), Y4
	VMOVUPD 544(DI), Y5
	VMOVUPD 768(DI), Y6
	VMOVUPD 800(DI), Y7

loop4x8:
	VCVTPS2PD    0(DX), Y12
	VCVTPS2PD    16(DX), Y13
	VBROADCASTSD 0(SI), Y14
	VBROADCASTSD 8(SI), Y15
	VFMADD231PD  Y12, Y14, Y0
	VFMADD231PD  Y13, Y14, Y1
	VFMADD231PD  Y12, Y15, Y2
	VFMADD231PD  Y13, Y15, Y3
	VBROADCASTSD 16(SI), Y14
	VBROADCASTSD 24(SI), Y15
	VFMADD231PD  Y12, Y14, Y4
	VFMADD231PD  Y13, Y14, Y5
	VFMADD231PD  Y12, Y15, Y6
	VFMADD231PD  Y13, Y15, Y7
	ADDQ         $32, SI
	ADDQ         $128, DX
	DECQ         CX
	JNZ          loop4x8

	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 256(DI)
	VMOVUPD Y3, 288(DI)
	VMOVUPD Y4, 512(DI)
	VMOVUPD Y5, 544(DI)
	VMOVUPD Y6, 768(DI)
	VMOVUPD Y7, 800(DI)
	VZEROUPPER
	RET

// func tile2x16AVX2(c, x *float64, w *float32, k int)
TEXT ·tile2x16AVX2(SB), NOSPLIT, $0-32
	MOVQ c+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ k+24(FP), CX
	VMOVUPD 0(DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 64(DI), Y2
	VMOVUPD 96(DI), Y3
	VMOVUPD 256(DI), Y4
	VMOVUPD 288(DI), Y5
	VMOVUPD 320(DI), Y6
	VMOVUPD 352(DI), Y7

loop2x16:
	VBROADCASTSD 0(SI), Y14
	VBROADCASTSD 8(SI), Y15
	VCVTPS2PD    0(DX), Y12
	VCVTPS2PD    16(DX), Y13
	VFMADD231PD  Y12, Y14, Y0
	VFMADD231PD  Y12, Y15, Y4
	VFMADD231PD  Y13, Y14, Y1
	VFMADD231PD  Y13, Y15, Y5
	VCVTPS2PD    32(DX), Y12
	VCVTPS2PD    48(DX), Y13
	VFMADD231PD  Y12, Y14, Y2
	VFMADD231PD  Y12, Y15, Y6
	VFMADD231PD  Y13, Y14, Y3
	VFMADD231PD  Y13, Y15, Y7
	ADDQ         $16, SI
	ADDQ         $128, DX
	DECQ         CX
	JNZ          loop2x16

	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	VMOVUPD Y4, 256(DI)
	VMOVUPD Y5, 288(DI)
	VMOVUPD Y6, 320(DI)
	VMOVUPD Y7, 352(DI)
	VZEROUPPER
	RET

// func tile1x32AVX2(c, x *float64, w *float32, k int)
TEXT ·tile1x32AVX2(SB), NOSPLIT, $0-32
	MOVQ c+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ k+24(FP), CX
	VMOVUPD 0(DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 64(DI), Y2
	VMOVUPD 96(DI), Y3
	VMOVUPD 128(DI), Y4
	VMOVUPD 160(DI), Y5
	VMOVUPD 192(DI), Y6
	VMOVUPD 224(DI), Y7

loop1x32:
	VBROADCASTSD 0(SI), Y15
	VCVTPS2PD    0(DX), Y8
	VCVTPS2PD    16(DX), Y9
	VCVTPS2PD    32(DX), Y10
	VCVTPS2PD    48(DX), Y11
	VFMADD231PD  Y8, Y15, Y0
	VFMADD231PD  Y9, Y15, Y1
	VFMADD231PD  Y10, Y15, Y2
	VFMADD231PD  Y11, Y15, Y3
	VCVTPS2PD    64(DX), Y8
	VCVTPS2PD    80(DX), Y9
	VCVTPS2PD    96(DX), Y10
	VCVTPS2PD    112(DX), Y11
	VFMADD231PD  Y8, Y15, Y4
	VFMADD231PD  Y9, Y15, Y5
	VFMADD231PD  Y10, Y15, Y6
	VFMADD231PD  Y11, Y15, Y7
	ADDQ         $8, SI
	ADDQ         $128, DX
	DECQ         CX
	JNZ          loop1x32

	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	VMOVUPD Y4, 128(DI)
	VMOVUPD Y5, 160(DI)
	VMOVUPD Y6, 192(DI)
	VMOVUPD Y7, 224(DI)
	VZEROUPPER
	RET

// TRANSPOSE8 stores the 8x8 transpose of fp32 rows Y0..Y7 (row r, eight
// k values) as eight panel rows (k, rows 0..7) at k*128 (DI): in-lane 4x4
// transposes of rows 0-3 and 4-7, then VPERM2F128 joins the halves.
#define TRANSPOSE8 \
	VUNPCKLPS  Y1, Y0, Y8          \
	VUNPCKHPS  Y1, Y0, Y9          \
	VUNPCKLPS  Y3, Y2, Y10         \
	VUNPCKHPS  Y3, Y2, Y11         \
	VSHUFPS    $0x44, Y10, Y8, Y0  \
	VSHUFPS    $0xEE, Y10, Y8, Y1  \
	VSHUFPS    $0x44, Y11, Y9, Y2  \
	VSHUFPS    $0xEE, Y11, Y9, Y3  \
	VUNPCKLPS  Y5, Y4, Y8          \
	VUNPCKHPS  Y5, Y4, Y9          \
	VUNPCKLPS  Y7, Y6, Y10         \
	VUNPCKHPS  Y7, Y6, Y11         \
	VSHUFPS    $0x44, Y10, Y8, Y4  \
	VSHUFPS    $0xEE, Y10, Y8, Y5  \
	VSHUFPS    $0x44, Y11, Y9, Y6  \
	VSHUFPS    $0xEE, Y11, Y9, Y7  \
	VPERM2F128 $0x20, Y4, Y0, Y8   \
	VPERM2F128 $0x20, Y5, Y1, Y9   \
	VPERM2F128 $0x20, Y6, Y2, Y10  \
	VPERM2F128 $0x20, Y7, Y3, Y11  \
	VMOVUPS    Y8, 0(DI)           \
	VMOVUPS    Y9, 128(DI)         \
	VMOVUPS    Y10, 256(DI)        \
	VMOVUPS    Y11, 384(DI)        \
	VPERM2F128 $0x31, Y4, Y0, Y8   \
	VPERM2F128 $0x31, Y5, Y1, Y9   \
	VPERM2F128 $0x31, Y6, Y2, Y10  \
	VPERM2F128 $0x31, Y7, Y3, Y11  \
	VMOVUPS    Y8, 512(DI)         \
	VMOVUPS    Y9, 640(DI)         \
	VMOVUPS    Y10, 768(DI)        \
	VMOVUPS    Y11, 896(DI)

// func packF32AVX2(dst *float32, src *float32, lds, k int)
// dst[kk*32+j] = src[j*lds+kk] for j < 8, kk < k; k%8 == 0, k > 0.
TEXT ·packF32AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ lds+16(FP), BX
	SHLQ $2, BX
	MOVQ k+24(FP), CX
	SHRQ $3, CX
	LEAQ (BX)(BX*2), R8
	LEAQ (SI)(BX*4), R9

loopPackF32:
	VMOVUPS (SI), Y0
	VMOVUPS (SI)(BX*1), Y1
	VMOVUPS (SI)(BX*2), Y2
	VMOVUPS (SI)(R8*1), Y3
	VMOVUPS (R9), Y4
	VMOVUPS (R9)(BX*1), Y5
	VMOVUPS (R9)(BX*2), Y6
	VMOVUPS (R9)(R8*1), Y7
	TRANSPOSE8
	ADDQ $32, SI
	ADDQ $32, R9
	ADDQ $1024, DI
	DECQ CX
	JNZ  loopPackF32
	VZEROUPPER
	RET

// func packBF16AVX2(dst *float32, src *uint16, lds, k int)
// As packF32AVX2 for bfloat16 rows: a bfloat16 is the top half of its fp32.
TEXT ·packBF16AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ lds+16(FP), BX
	SHLQ $1, BX
	MOVQ k+24(FP), CX
	SHRQ $3, CX
	LEAQ (BX)(BX*2), R8
	LEAQ (SI)(BX*4), R9

loopPackBF16:
	VPMOVZXWD (SI), Y0
	VPMOVZXWD (SI)(BX*1), Y1
	VPMOVZXWD (SI)(BX*2), Y2
	VPMOVZXWD (SI)(R8*1), Y3
	VPMOVZXWD (R9), Y4
	VPMOVZXWD (R9)(BX*1), Y5
	VPMOVZXWD (R9)(BX*2), Y6
	VPMOVZXWD (R9)(R8*1), Y7
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VPSLLD    $16, Y2, Y2
	VPSLLD    $16, Y3, Y3
	VPSLLD    $16, Y4, Y4
	VPSLLD    $16, Y5, Y5
	VPSLLD    $16, Y6, Y6
	VPSLLD    $16, Y7, Y7
	TRANSPOSE8
	ADDQ $16, SI
	ADDQ $16, R9
	ADDQ $1024, DI
	DECQ CX
	JNZ  loopPackBF16
	VZEROUPPER
	RET

// func mxfp4AVX2(dst *float32, packed, scales *byte, nblk int, tab *mxfp4Table)
// Decodes nblk blocks of 32 MXFP4 elements (16 packed bytes, low nibble =
// even column) to fp32: E2M1 value (two PSHUFB byte lookups give its
// bfloat16) times the block's E8M0 multiplier, one VMULPS, exactly the
// float32 product mxfp.DequantMXFP4 forms.
TEXT ·mxfp4AVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ packed+8(FP), SI
	MOVQ scales+16(FP), BX
	MOVQ nblk+24(FP), CX
	MOVQ tab+32(FP), R8
	VMOVDQU 0(R8), X12         // low bytes of the bfloat16 codes
	VMOVDQU 16(R8), X13        // high bytes
	LEAQ    32(R8), R9         // E8M0 multipliers
	MOVL    $0x0F0F0F0F, AX
	MOVQ    AX, X15
	VPBROADCASTD X15, X15

loopMXFP4:
	MOVBLZX      (BX), AX
	VBROADCASTSS (R9)(AX*4), Y14
	VMOVDQU      (SI), X0
	VPSRLW       $4, X0, X1
	VPAND        X15, X0, X0       // even columns
	VPAND        X15, X1, X1       // odd columns
	VPUNPCKLBW   X1, X0, X2        // codes of columns 0..15
	VPUNPCKHBW   X1, X0, X3        // columns 16..31
	VPSHUFB      X2, X12, X4
	VPSHUFB      X2, X13, X5
	VPUNPCKLBW   X5, X4, X6        // bfloat16 of columns 0..7
	VPUNPCKHBW   X5, X4, X7        // 8..15
	VPSHUFB      X3, X12, X4
	VPSHUFB      X3, X13, X5
	VPUNPCKLBW   X5, X4, X8        // 16..23
	VPUNPCKHBW   X5, X4, X9        // 24..31
	VPMOVZXWD    X6, Y6
	VPMOVZXWD    X7, Y7
	VPMOVZXWD    X8, Y8
	VPMOVZXWD    X9, Y9
	VPSLLD       $16, Y6, Y6
	VPSLLD       $16, Y7, Y7
	VPSLLD       $16, Y8, Y8
	VPSLLD       $16, Y9, Y9
	VMULPS       Y14, Y6, Y6
	VMULPS       Y14, Y7, Y7
	VMULPS       Y14, Y8, Y8
	VMULPS       Y14, Y9, Y9
	VMOVUPS      Y6, 0(DI)
	VMOVUPS      Y7, 32(DI)
	VMOVUPS      Y8, 64(DI)
	VMOVUPS      Y9, 96(DI)
	ADDQ         $1, BX
	ADDQ         $16, SI
	ADDQ         $128, DI
	DECQ         CX
	JNZ          loopMXFP4
	VZEROUPPER
	RET

// GEMV_QUAD multiplies a quad of weight rows (Y4..Y7, eight k each) by one
// activation row: an in-lane 4x4 transpose, widening, then eight FMAs in k
// order into the quad's accumulator, with x pre-broadcast in memory (xb[k]
// holds four copies of x[k]).
#define GEMV_QUAD(acc) \
	VUNPCKLPS    Y5, Y4, Y8        \
	VUNPCKHPS    Y5, Y4, Y9        \
	VUNPCKLPS    Y7, Y6, Y10       \
	VUNPCKHPS    Y7, Y6, Y11       \
	VSHUFPS      $0x44, Y10, Y8, Y4 \
	VSHUFPS      $0xEE, Y10, Y8, Y5 \
	VSHUFPS      $0x44, Y11, Y9, Y6 \
	VSHUFPS      $0xEE, Y11, Y9, Y7 \
	VCVTPS2PD    X4, Y8            \
	VFMADD231PD  0(DX), Y8, acc    \
	VCVTPS2PD    X5, Y9            \
	VFMADD231PD  32(DX), Y9, acc   \
	VCVTPS2PD    X6, Y10           \
	VFMADD231PD  64(DX), Y10, acc  \
	VCVTPS2PD    X7, Y11           \
	VFMADD231PD  96(DX), Y11, acc  \
	VEXTRACTF128 $1, Y4, X4        \
	VEXTRACTF128 $1, Y5, X5        \
	VEXTRACTF128 $1, Y6, X6        \
	VEXTRACTF128 $1, Y7, X7        \
	VCVTPS2PD    X4, Y8            \
	VFMADD231PD  128(DX), Y8, acc  \
	VCVTPS2PD    X5, Y9            \
	VFMADD231PD  160(DX), Y9, acc  \
	VCVTPS2PD    X6, Y10           \
	VFMADD231PD  192(DX), Y10, acc \
	VCVTPS2PD    X7, Y11           \
	VFMADD231PD  224(DX), Y11, acc

#define LOAD_F32(base) \
	VMOVUPS (base), Y4       \
	VMOVUPS (base)(BX*1), Y5 \
	VMOVUPS (base)(BX*2), Y6 \
	VMOVUPS (base)(R8*1), Y7

// func gemv16F32AVX2(acc *[16]float64, xb *float64, w *float32, lds, k int)
// acc[r] = fma(x[kk], W[r][kk], acc[r]) for kk < k in order, r < 16, rows
// lds elements apart; k%8 == 0, k > 0.
TEXT ·gemv16F32AVX2(SB), NOSPLIT, $0-40
	MOVQ acc+0(FP), DI
	MOVQ xb+8(FP), DX
	MOVQ w+16(FP), SI
	MOVQ lds+24(FP), BX
	SHLQ $2, BX
	MOVQ k+32(FP), CX
	SHRQ $3, CX
	LEAQ (BX)(BX*2), R8
	LEAQ (SI)(BX*4), R9
	LEAQ (R9)(BX*4), R10
	LEAQ (R10)(BX*4), R11
	VMOVUPD 0(DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 64(DI), Y2
	VMOVUPD 96(DI), Y3

loopGemvF32:
	LOAD_F32(SI)
	GEMV_QUAD(Y0)
	LOAD_F32(R9)
	GEMV_QUAD(Y1)
	LOAD_F32(R10)
	GEMV_QUAD(Y2)
	LOAD_F32(R11)
	GEMV_QUAD(Y3)
	ADDQ $32, SI
	ADDQ $32, R9
	ADDQ $32, R10
	ADDQ $32, R11
	ADDQ $256, DX
	DECQ CX
	JNZ  loopGemvF32

	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	VZEROUPPER
	RET

// GEMV_QUAD16_BF16 runs 16 k of one quad of bfloat16 rows: a bfloat16 is
// the top half of its fp32, so interleaving words with zero widens it; the
// low and high interleaves hold k 0-3|8-11 and 4-7|12-15 of each row,
// whose in-lane transposes then give the FMAs in k order.
#define GEMV_QUAD16_BF16(base, acc) \
	VMOVDQU      (base), Y12             \
	VMOVDQU      (base)(BX*1), Y13       \
	VMOVDQU      (base)(BX*2), Y14       \
	VMOVDQU      (base)(R8*1), Y15       \
	VPXOR        Y4, Y4, Y4              \
	VPUNPCKHWD   Y12, Y4, Y8             \
	VPUNPCKHWD   Y13, Y4, Y9             \
	VPUNPCKHWD   Y14, Y4, Y10            \
	VPUNPCKHWD   Y15, Y4, Y11            \
	VPUNPCKLWD   Y13, Y4, Y5             \
	VPUNPCKLWD   Y14, Y4, Y6             \
	VPUNPCKLWD   Y15, Y4, Y7             \
	VPUNPCKLWD   Y12, Y4, Y4             \
	VUNPCKLPS    Y5, Y4, Y12             \
	VUNPCKHPS    Y5, Y4, Y13             \
	VUNPCKLPS    Y7, Y6, Y14             \
	VUNPCKHPS    Y7, Y6, Y15             \
	VSHUFPS      $0x44, Y14, Y12, Y4     \
	VSHUFPS      $0xEE, Y14, Y12, Y5     \
	VSHUFPS      $0x44, Y15, Y13, Y6     \
	VSHUFPS      $0xEE, Y15, Y13, Y7     \
	VUNPCKLPS    Y9, Y8, Y12             \
	VUNPCKHPS    Y9, Y8, Y13             \
	VUNPCKLPS    Y11, Y10, Y14           \
	VUNPCKHPS    Y11, Y10, Y15           \
	VSHUFPS      $0x44, Y14, Y12, Y8     \
	VSHUFPS      $0xEE, Y14, Y12, Y9     \
	VSHUFPS      $0x44, Y15, Y13, Y10    \
	VSHUFPS      $0xEE, Y15, Y13, Y11    \
	VCVTPS2PD    X4, Y12                 \
	VFMADD231PD  0(DX), Y12, acc         \
	VCVTPS2PD    X5, Y13                 \
	VFMADD231PD  32(DX), Y13, acc        \
	VCVTPS2PD    X6, Y14                 \
	VFMADD231PD  64(DX), Y14, acc        \
	VCVTPS2PD    X7, Y15                 \
	VFMADD231PD  96(DX), Y15, acc        \
	VCVTPS2PD    X8, Y12                 \
	VFMADD231PD  128(DX), Y12, acc       \
	VCVTPS2PD    X9, Y13                 \
	VFMADD231PD  160(DX), Y13, acc       \
	VCVTPS2PD    X10, Y14                \
	VFMADD231PD  192(DX), Y14, acc       \
	VCVTPS2PD    X11, Y15                \
	VFMADD231PD  224(DX), Y15, acc       \
	VEXTRACTF128 $1, Y4, X4              \
	VEXTRACTF128 $1, Y5, X5              \
	VEXTRACTF128 $1, Y6, X6              \
	VEXTRACTF128 $1, Y7, X7              \
	VCVTPS2PD    X4, Y12                 \
	VFMADD231PD  256(DX), Y12, acc       \
	VCVTPS2PD    X5, Y13                 \
	VFMADD231PD  288(DX), Y13, acc       \
	VCVTPS2PD    X6, Y14                 \
	VFMADD231PD  320(DX), Y14, acc       \
	VCVTPS2PD    X7, Y15                 \
	VFMADD231PD  352(DX), Y15, acc       \
	VEXTRACTF128 $1, Y8, X8              \
	VEXTRACTF128 $1, Y9, X9              \
	VEXTRACTF128 $1, Y10, X10            \
	VEXTRACTF128 $1, Y11, X11            \
	VCVTPS2PD    X8, Y12                 \
	VFMADD231PD  384(DX), Y12, acc       \
	VCVTPS2PD    X9, Y13                 \
	VFMADD231PD  416(DX), Y13, acc       \
	VCVTPS2PD    X10, Y14                \
	VFMADD231PD  448(DX), Y14, acc       \
	VCVTPS2PD    X11, Y15                \
	VFMADD231PD  480(DX), Y15, acc

// func gemv16BF16AVX2(acc *[16]float64, xb *float64, w *uint16, lds, k int)
// As gemv16F32AVX2 for bfloat16 rows; k%16 == 0, k > 0.
TEXT ·gemv16BF16AVX2(SB), NOSPLIT, $0-40
	MOVQ acc+0(FP), DI
	MOVQ xb+8(FP), DX
	MOVQ w+16(FP), SI
	MOVQ lds+24(FP), BX
	SHLQ $1, BX
	MOVQ k+32(FP), CX
	SHRQ $4, CX
	LEAQ (BX)(BX*2), R8
	LEAQ (SI)(BX*4), R9
	LEAQ (R9)(BX*4), R10
	LEAQ (R10)(BX*4), R11
	LEAQ (R11)(BX*4), R12 // the next 16 rows, prefetched 512 bytes per step
	VMOVUPD 0(DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 64(DI), Y2
	VMOVUPD 96(DI), Y3

loopGemvBF16:
	PREFETCHT0 0(R12)
	PREFETCHT0 64(R12)
	PREFETCHT0 128(R12)
	PREFETCHT0 192(R12)
	PREFETCHT0 256(R12)
	PREFETCHT0 320(R12)
	PREFETCHT0 384(R12)
	PREFETCHT0 448(R12)
	ADDQ       $512, R12
	GEMV_QUAD16_BF16(SI, Y0)
	GEMV_QUAD16_BF16(R9, Y1)
	GEMV_QUAD16_BF16(R10, Y2)
	GEMV_QUAD16_BF16(R11, Y3)
	ADDQ $32, SI
	ADDQ $32, R9
	ADDQ $32, R10
	ADDQ $32, R11
	ADDQ $512, DX
	DECQ CX
	JNZ  loopGemvBF16

	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	VZEROUPPER
	RET

// MXFP4_K decodes nibble m of the eight rows' dwords in G (bits 4m..4m+3,
// column 8g+m) and stores the eight weights at off(DI): magnitude by
// VPERMPS from the 8-entry table (it reads the low three bits), sign from
// bit 3, one fp32 VMULPS by the rows' block multipliers (Y14), as
// mxfp.DequantMXFP4 forms each weight.
#define MXFP4_K(G, m, off) \
	VPSRLD       $(4*m), G, Y8      \
	VPERMPS      1056(R10), Y8, Y9  \
	VPSLLD       $(28-4*m), G, Y10  \
	VPAND        Y15, Y10, Y10      \
	VORPS        Y10, Y9, Y9        \
	VMULPS       Y14, Y9, Y9        \
	VMOVUPS      Y9, (off)(DI)

#define MXFP4_GROUP(G, off) \
	MXFP4_K(G, 0, off+0*128) \
	MXFP4_K(G, 1, off+1*128) \
	MXFP4_K(G, 2, off+2*128) \
	MXFP4_K(G, 3, off+3*128) \
	MXFP4_K(G, 4, off+4*128) \
	MXFP4_K(G, 5, off+5*128) \
	MXFP4_K(G, 6, off+6*128) \
	MXFP4_K(G, 7, off+7*128)

// func mxfp4PanelAVX2(dst *float32, packed *byte, lds int, scales *byte, sb, nblk int, tab *mxfp4Table)
// Packs eight MXFP4 rows (lds bytes apart, their E8M0 scales sb bytes
// apart) of nblk blocks into a panel: dst[k*32+j] = E2M1(row j, k) *
// tab.scale[scale of row j, block k/32] in fp32. Per block the rows' 16 bytes
// are transposed as dwords (eight columns each), so that one shift selects
// a column of all eight rows.
TEXT ·mxfp4PanelAVX2(SB), NOSPLIT, $32-56
	MOVQ dst+0(FP), DI
	MOVQ packed+8(FP), SI
	MOVQ lds+16(FP), BX
	MOVQ scales+24(FP), DX
	MOVQ nblk+40(FP), CX
	MOVQ tab+48(FP), R10
	LEAQ (BX)(BX*2), R8
	LEAQ (SI)(BX*4), R9
	MOVL $0x80000000, AX
	MOVQ AX, X15
	VPBROADCASTD X15, Y15

loopMXFP4Panel:
	VMOVDQU     (SI), X0
	VMOVDQU     (SI)(BX*1), X1
	VMOVDQU     (SI)(BX*2), X2
	VMOVDQU     (SI)(R8*1), X3
	VINSERTI128 $1, (R9), Y0, Y0
	VINSERTI128 $1, (R9)(BX*1), Y1, Y1
	VINSERTI128 $1, (R9)(BX*2), Y2, Y2
	VINSERTI128 $1, (R9)(R8*1), Y3, Y3
	VPUNPCKLDQ  Y1, Y0, Y4
	VPUNPCKHDQ  Y1, Y0, Y5
	VPUNPCKLDQ  Y3, Y2, Y6
	VPUNPCKHDQ  Y3, Y2, Y7
	VPUNPCKLQDQ Y6, Y4, Y0
	VPUNPCKHQDQ Y6, Y4, Y1
	VPUNPCKLQDQ Y7, Y5, Y2
	VPUNPCKHQDQ Y7, Y5, Y3
	MXFP4_SCALES(DX, 0)
	MXFP4_SCALES(DX, 4)
	VMOVUPS     0(SP), Y14
	MXFP4_GROUP(Y0, 0)
	MXFP4_GROUP(Y1, 1024)
	MXFP4_GROUP(Y2, 2048)
	MXFP4_GROUP(Y3, 3072)
	ADDQ $16, SI
	ADDQ $16, R9
	ADDQ $1, DX
	ADDQ $4096, DI
	DECQ CX
	JNZ  loopMXFP4Panel
	VZEROUPPER
	RET

// MXFP4_TRANSPOSE8 loads block columns of eight MXFP4 rows (r0 and r4
// address rows 0 and 4 of the eight, BX the row stride, R8 three strides)
// and leaves in Y4..Y7 the dwords of column groups 0..3 (eight columns
// each) of rows 0..7, lane by lane.
#define MXFP4_TRANSPOSE8(r0, r4) \
	VMOVDQU     (r0), X8              \
	VMOVDQU     (r0)(BX*1), X9        \
	VMOVDQU     (r0)(BX*2), X10       \
	VMOVDQU     (r0)(R8*1), X11       \
	VINSERTI128 $1, (r4), Y8, Y8      \
	VINSERTI128 $1, (r4)(BX*1), Y9, Y9 \
	VINSERTI128 $1, (r4)(BX*2), Y10, Y10 \
	VINSERTI128 $1, (r4)(R8*1), Y11, Y11 \
	VPUNPCKLDQ  Y9, Y8, Y12           \
	VPUNPCKHDQ  Y9, Y8, Y13           \
	VPUNPCKLDQ  Y11, Y10, Y14         \
	VPUNPCKHDQ  Y11, Y10, Y8          \
	VPUNPCKLQDQ Y14, Y12, Y4          \
	VPUNPCKHQDQ Y14, Y12, Y5          \
	VPUNPCKLQDQ Y8, Y13, Y6           \
	VPUNPCKHQDQ Y8, Y13, Y7

// MXFP4_GEMV_SET decodes column m of eight rows (dwords in G, block
// multipliers in S) and adds it times x[k] (at off(DX)) into the rows'
// accumulators lo (rows 0-3) and hi (rows 4-7).
#define MXFP4_GEMV_SET(G, S, m, off, lo, hi) \
	VPSRLD       $(4*m), G, Y8         \
	VPERMPS      1056(R10), Y8, Y8     \
	VPSLLD       $(28-4*m), G, Y9      \
	VPAND        Y15, Y9, Y9           \
	VORPS        Y9, Y8, Y8            \
	VMULPS       S, Y8, Y8             \
	VCVTPS2PD    X8, Y9                \
	VFMADD231PD  (off)(DX), Y9, lo     \
	VEXTRACTF128 $1, Y8, X8            \
	VCVTPS2PD    X8, Y9                \
	VFMADD231PD  (off)(DX), Y9, hi

#define MXFP4_GEMV_K(m, off) \
	MXFP4_GEMV_SET(Y4, Y6, m, off, Y0, Y1) \
	MXFP4_GEMV_SET(Y5, Y7, m, off, Y2, Y3)

#define MXFP4_GEMV_GROUP(g) \
	VMOVDQU (g*32)(SP), Y4       \
	VMOVDQU (128+g*32)(SP), Y5   \
	MXFP4_GEMV_K(0, g*256+0)     \
	MXFP4_GEMV_K(1, g*256+32)    \
	MXFP4_GEMV_K(2, g*256+64)    \
	MXFP4_GEMV_K(3, g*256+96)    \
	MXFP4_GEMV_K(4, g*256+128)   \
	MXFP4_GEMV_K(5, g*256+160)   \
	MXFP4_GEMV_K(6, g*256+192)   \
	MXFP4_GEMV_K(7, g*256+224)

// func mxfp4GemvAVX2(acc *[16]float64, xb *float64, packed *byte, lds int, scales *byte, sb, nblk int, tab *mxfp4Table)
// The one-row kernel for 16 MXFP4 rows (lds bytes apart, scales sb bytes
// apart) over nblk blocks: acc[r] = fma(x[k], W[r][k], acc[r]) in k order,
// each weight decoded as mxfp4PanelAVX2 does and used from registers; xb
// holds x[k] four times per k. The next 16 rows are prefetched as it goes.
// Frame: 0-255 transposed dwords, 256-319 block multipliers, 320 prefetch
// pointer.
TEXT ·mxfp4GemvAVX2(SB), NOSPLIT, $336-64
	MOVQ xb+8(FP), DX
	MOVQ packed+16(FP), SI
	MOVQ lds+24(FP), BX
	MOVQ scales+32(FP), DI
	MOVQ nblk+48(FP), CX
	MOVQ tab+56(FP), R10
	LEAQ (BX)(BX*2), R8
	LEAQ (SI)(BX*4), R9
	LEAQ (R9)(BX*4), R11
	LEAQ (R11)(BX*4), R12
	LEAQ (R12)(BX*4), AX
	MOVQ AX, 320(SP)
	MOVL $0x80000000, AX
	MOVQ AX, X15
	VPBROADCASTD X15, Y15
	MOVQ acc+0(FP), AX
	VMOVUPD 0(AX), Y0
	VMOVUPD 32(AX), Y1
	VMOVUPD 64(AX), Y2
	VMOVUPD 96(AX), Y3

loopMXFP4Gemv:
	MOVQ       320(SP), AX
	PREFETCHT0 0(AX)
	PREFETCHT0 64(AX)
	PREFETCHT0 128(AX)
	PREFETCHT0 192(AX)
	ADDQ       $256, 320(SP)
	MOVQ       DI, R13
	MXFP4_SCALE16(0)
	MXFP4_SCALE16(1)
	MXFP4_SCALE16(2)
	MXFP4_SCALE16(3)
	MXFP4_SCALE16(4)
	MXFP4_SCALE16(5)
	MXFP4_SCALE16(6)
	MXFP4_SCALE16(7)
	MXFP4_SCALE16(8)
	MXFP4_SCALE16(9)
	MXFP4_SCALE16(10)
	MXFP4_SCALE16(11)
	MXFP4_SCALE16(12)
	MXFP4_SCALE16(13)
	MXFP4_SCALE16(14)
	MXFP4_SCALE16(15)
	MXFP4_TRANSPOSE8(SI, R9)
	VMOVDQU Y4, 0(SP)
	VMOVDQU Y5, 32(SP)
	VMOVDQU Y6, 64(SP)
	VMOVDQU Y7, 96(SP)
	MXFP4_TRANSPOSE8(R11, R12)
	VMOVDQU Y4, 128(SP)
	VMOVDQU Y5, 160(SP)
	VMOVDQU Y6, 192(SP)
	VMOVDQU Y7, 224(SP)
	VMOVUPS 256(SP), Y6
	VMOVUPS 288(SP), Y7
	MXFP4_GEMV_GROUP(0)
	MXFP4_GEMV_GROUP(1)
	MXFP4_GEMV_GROUP(2)
	MXFP4_GEMV_GROUP(3)
	ADDQ $16, SI
	ADDQ $16, R9
	ADDQ $16, R11
	ADDQ $16, R12
	ADDQ $1, DI
	ADDQ $1024, DX
	DECQ CX
	JNZ  loopMXFP4Gemv

	MOVQ acc+0(FP), AX
	VMOVUPD Y0, 0(AX)
	VMOVUPD Y1, 32(AX)
	VMOVUPD Y2, 64(AX)
	VMOVUPD Y3, 96(AX)
	VZEROUPPER
	RET
