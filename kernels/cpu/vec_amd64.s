#include "textflag.h"

// AVX2 forms of vec.go: per element one multiply, then one add or
// subtract, exactly as the scalar Go loops round on amd64.

// func scalAVX2(y *float64, n int, a float64)
// y[j] *= a
TEXT ·scalAVX2(SB), NOSPLIT, $0-24
	MOVQ         y+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSD a+16(FP), Y0
	CMPQ         CX, $4
	JLT          scalTail

scalLoop:
	VMULPD  (DI), Y0, Y1
	VMOVUPD Y1, (DI)
	ADDQ    $32, DI
	SUBQ    $4, CX
	CMPQ    CX, $4
	JGE     scalLoop

scalTail:
	TESTQ CX, CX
	JZ    scalDone

scalOne:
	VMOVSD (DI), X1
	VMULSD X0, X1, X1
	VMOVSD X1, (DI)
	ADDQ   $8, DI
	DECQ   CX
	JNZ    scalOne

scalDone:
	VZEROUPPER
	RET

// func decayReadAVX2(row, r *float64, n int, a, kc float64)
// row[j] *= a; r[j] += kc*row[j]
TEXT ·decayReadAVX2(SB), NOSPLIT, $0-40
	MOVQ         row+0(FP), DI
	MOVQ         r+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSD a+24(FP), Y0
	VBROADCASTSD kc+32(FP), Y1
	CMPQ         CX, $4
	JLT          decayTail

decayLoop:
	VMULPD  (DI), Y0, Y2
	VMOVUPD Y2, (DI)
	VMULPD  Y2, Y1, Y3
	VADDPD  (SI), Y3, Y3
	VMOVUPD Y3, (SI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $4, CX
	CMPQ    CX, $4
	JGE     decayLoop

decayTail:
	TESTQ CX, CX
	JZ    decayDone

decayOne:
	VMOVSD (DI), X2
	VMULSD X0, X2, X2
	VMOVSD X2, (DI)
	VMULSD X2, X1, X3
	VADDSD (SI), X3, X3
	VMOVSD X3, (SI)
	ADDQ   $8, SI
	ADDQ   $8, DI
	DECQ   CX
	JNZ    decayOne

decayDone:
	VZEROUPPER
	RET

// func writeReadAVX2(row, r, acc *float64, n int, kc, qc float64)
// row[j] += kc*r[j]; acc[j] += qc*row[j]
TEXT ·writeReadAVX2(SB), NOSPLIT, $0-48
	MOVQ         row+0(FP), DI
	MOVQ         r+8(FP), SI
	MOVQ         acc+16(FP), DX
	MOVQ         n+24(FP), CX
	VBROADCASTSD kc+32(FP), Y0
	VBROADCASTSD qc+40(FP), Y1
	CMPQ         CX, $4
	JLT          writeTail

writeLoop:
	VMULPD  (SI), Y0, Y2
	VADDPD  (DI), Y2, Y2
	VMOVUPD Y2, (DI)
	VMULPD  Y2, Y1, Y3
	VADDPD  (DX), Y3, Y3
	VMOVUPD Y3, (DX)
	ADDQ    $32, SI
	ADDQ    $32, DI
	ADDQ    $32, DX
	SUBQ    $4, CX
	CMPQ    CX, $4
	JGE     writeLoop

writeTail:
	TESTQ CX, CX
	JZ    writeDone

writeOne:
	VMOVSD (SI), X2
	VMULSD X0, X2, X2
	VADDSD (DI), X2, X2
	VMOVSD X2, (DI)
	VMULSD X2, X1, X3
	VADDSD (DX), X3, X3
	VMOVSD X3, (DX)
	ADDQ   $8, SI
	ADDQ   $8, DI
	ADDQ   $8, DX
	DECQ   CX
	JNZ    writeOne

writeDone:
	VZEROUPPER
	RET

// func kdaDotsAVX2(l, a, kp, qp, knT *float64, ld, dk, nj int)
// For eight j at a time (j < nj rounded up to 8): l[j] = Σ_c kp[c]*knT[c*ld+j]
// and a[j] = Σ_c qp[c]*knT[c*ld+j], each lane summing in c order from 0.
TEXT ·kdaDotsAVX2(SB), NOSPLIT, $0-64
	MOVQ l+0(FP), DI
	MOVQ a+8(FP), DX
	MOVQ knT+32(FP), R8
	MOVQ ld+40(FP), R9
	SHLQ $3, R9
	MOVQ nj+56(FP), R10

dotsBlock:
	MOVQ   kp+16(FP), SI
	MOVQ   qp+24(FP), BX
	MOVQ   R8, R11
	MOVQ   dk+48(FP), CX
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3

dotsK:
	VBROADCASTSD (SI), Y4
	VBROADCASTSD (BX), Y5
	VMOVUPD      (R11), Y6
	VMOVUPD      32(R11), Y7
	VMULPD       Y6, Y4, Y8
	VADDPD       Y8, Y0, Y0
	VMULPD       Y7, Y4, Y9
	VADDPD       Y9, Y1, Y1
	VMULPD       Y6, Y5, Y10
	VADDPD       Y10, Y2, Y2
	VMULPD       Y7, Y5, Y11
	VADDPD       Y11, Y3, Y3
	ADDQ         $8, SI
	ADDQ         $8, BX
	ADDQ         R9, R11
	DECQ         CX
	JNZ          dotsK

	VMOVUPD Y0, (DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, (DX)
	VMOVUPD Y3, 32(DX)
	ADDQ    $64, DI
	ADDQ    $64, DX
	ADDQ    $64, R8
	SUBQ    $8, R10
	JG      dotsBlock
	VZEROUPPER
	RET

// func widenAVX2(dst *float64, src *float32, n int)
// dst[i] = float64(src[i]); n%8 == 0, n > 0.
TEXT ·widenAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX

widenLoop:
	VCVTPS2PD (SI), Y0
	VCVTPS2PD 16(SI), Y1
	VMOVUPD   Y0, (DI)
	VMOVUPD   Y1, 32(DI)
	ADDQ      $32, SI
	ADDQ      $64, DI
	DECQ      CX
	JNZ       widenLoop
	VZEROUPPER
	RET

// func narrowAVX2(dst *float32, s *float64, n int)
// dst[i] = float32(s[i]) (round to nearest even, as Go converts), then
// s[i] = float64(dst[i]); n%8 == 0, n > 0.
TEXT ·narrowAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX

narrowLoop:
	VCVTPD2PSY (SI), X0
	VCVTPD2PSY 32(SI), X1
	VMOVUPS    X0, (DI)
	VMOVUPS    X1, 16(DI)
	VCVTPS2PD  X0, Y0
	VCVTPS2PD  X1, Y1
	VMOVUPD    Y0, (SI)
	VMOVUPD    Y1, 32(SI)
	ADDQ       $64, SI
	ADDQ       $32, DI
	DECQ       CX
	JNZ        narrowLoop
	VZEROUPPER
	RET

// func matAddAVX2(y *float64, n int, a *float64, m int, mat *float64, ld int, skip bool)
// For 32-element slices of y (n%32 == 0, n > 0), y[j] += a[r]*mat[r*ld+j]
// for r < m in order (each a multiply, then the add), skipping rows
// whose a[r] == 0 when skip is set: the loops of kda.go with the slice of y
// held in registers across all r.
TEXT ·matAddAVX2(SB), NOSPLIT, $0-49
	MOVQ    y+0(FP), DI
	MOVQ    n+8(FP), CX
	SHRQ    $5, CX
	MOVQ    mat+32(FP), R10
	MOVQ    ld+40(FP), R11
	SHLQ    $3, R11
	MOVBLZX skip+48(FP), R12
	VXORPD  X15, X15, X15

matAddChunk:
	VMOVUPD 0(DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 64(DI), Y2
	VMOVUPD 96(DI), Y3
	VMOVUPD 128(DI), Y4
	VMOVUPD 160(DI), Y5
	VMOVUPD 192(DI), Y6
	VMOVUPD 224(DI), Y7
	MOVQ    a+16(FP), SI
	MOVQ    m+24(FP), BX
	MOVQ    R10, DX

matAddRow:
	VMOVSD (SI), X8
	TESTQ  R12, R12
	JZ     matAddUse
	VUCOMISD X15, X8
	JNE    matAddUse
	JP     matAddUse
	JMP    matAddNext

matAddUse:
	VBROADCASTSD X8, Y8
	VMULPD 0(DX), Y8, Y9
	VADDPD Y9, Y0, Y0
	VMULPD 32(DX), Y8, Y10
	VADDPD Y10, Y1, Y1
	VMULPD 64(DX), Y8, Y11
	VADDPD Y11, Y2, Y2
	VMULPD 96(DX), Y8, Y12
	VADDPD Y12, Y3, Y3
	VMULPD 128(DX), Y8, Y9
	VADDPD Y9, Y4, Y4
	VMULPD 160(DX), Y8, Y10
	VADDPD Y10, Y5, Y5
	VMULPD 192(DX), Y8, Y11
	VADDPD Y11, Y6, Y6
	VMULPD 224(DX), Y8, Y12
	VADDPD Y12, Y7, Y7

matAddNext:
	ADDQ $8, SI
	ADDQ R11, DX
	DECQ BX
	JNZ  matAddRow

	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	VMOVUPD Y4, 128(DI)
	VMOVUPD Y5, 160(DI)
	VMOVUPD Y6, 192(DI)
	VMOVUPD Y7, 224(DI)
	ADDQ    $256, DI
	ADDQ    $256, R10
	DECQ    CX
	JNZ     matAddChunk
	VZEROUPPER
	RET

// func matSubAVX2(y *float64, n int, a *float64, m int, mat *float64, ld int, skip bool)
// For 32-element slices of y (n%32 == 0, n > 0), y[j] -= a[r]*mat[r*ld+j]
// for r < m in order (each a multiply, then the subtract), skipping rows
// whose a[r] == 0 when skip is set: the loops of kda.go with the slice of y
// held in registers across all r.
TEXT ·matSubAVX2(SB), NOSPLIT, $0-49
	MOVQ    y+0(FP), DI
	MOVQ    n+8(FP), CX
	SHRQ    $5, CX
	MOVQ    mat+32(FP), R10
	MOVQ    ld+40(FP), R11
	SHLQ    $3, R11
	MOVBLZX skip+48(FP), R12
	VXORPD  X15, X15, X15

matSubChunk:
	VMOVUPD 0(DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 64(DI), Y2
	VMOVUPD 96(DI), Y3
	VMOVUPD 128(DI), Y4
	VMOVUPD 160(DI), Y5
	VMOVUPD 192(DI), Y6
	VMOVUPD 224(DI), Y7
	MOVQ    a+16(FP), SI
	MOVQ    m+24(FP), BX
	MOVQ    R10, DX

matSubRow:
	VMOVSD (SI), X8
	TESTQ  R12, R12
	JZ     matSubUse
	VUCOMISD X15, X8
	JNE    matSubUse
	JP     matSubUse
	JMP    matSubNext

matSubUse:
	VBROADCASTSD X8, Y8
	VMULPD 0(DX), Y8, Y9
	VSUBPD Y9, Y0, Y0
	VMULPD 32(DX), Y8, Y10
	VSUBPD Y10, Y1, Y1
	VMULPD 64(DX), Y8, Y11
	VSUBPD Y11, Y2, Y2
	VMULPD 96(DX), Y8, Y12
	VSUBPD Y12, Y3, Y3
	VMULPD 128(DX), Y8, Y9
	VSUBPD Y9, Y4, Y4
	VMULPD 160(DX), Y8, Y10
	VSUBPD Y10, Y5, Y5
	VMULPD 192(DX), Y8, Y11
	VSUBPD Y11, Y6, Y6
	VMULPD 224(DX), Y8, Y12
	VSUBPD Y12, Y7, Y7

matSubNext:
	ADDQ $8, SI
	ADDQ R11, DX
	DECQ BX
	JNZ  matSubRow

	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	VMOVUPD Y4, 128(DI)
	VMOVUPD Y5, 160(DI)
	VMOVUPD Y6, 192(DI)
	VMOVUPD Y7, 224(DI)
	ADDQ    $256, DI
	ADDQ    $256, R10
	DECQ    CX
	JNZ     matSubChunk
	VZEROUPPER
	RET
