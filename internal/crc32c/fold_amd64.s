//go:build amd64 && !purego

#include "textflag.h"

// Folding constants for the bit-reflected CRC-32C polynomial: for a 128-bit
// lane whose low quadword is the earlier data, folding it D bits forward
// multiplies the low quadword by x^(D+32) mod P and the high one by
// x^(D-32) mod P, each bit-reflected and shifted left by one.
DATA fold2048<>+0(SB)/8, $0xdcb17aa4 // D = 2048: across one 256-byte step
DATA fold2048<>+8(SB)/8, $0xb9e02b86
GLOBL fold2048<>(SB), RODATA|NOPTR, $16
DATA fold512<>+0(SB)/8, $0x740eef02 // D = 512: one register onto the next
DATA fold512<>+8(SB)/8, $0x9e4addf8
GLOBL fold512<>(SB), RODATA|NOPTR, $16

// func foldAVX512(init uint32, p *byte, n int, out *[64]byte)
TEXT ·foldAVX512(SB), NOSPLIT, $0-32
	MOVL init+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ out+24(FP), DI

	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVD     AX, X4 // zeroes the rest of Z4
	VPXORQ    Z4, Z0, Z0
	VBROADCASTI32X4 fold2048<>(SB), Z5
	ADDQ      $256, SI
	SUBQ      $256, CX

loop:
	CMPQ CX, $256
	JB   reduce
	VPCLMULQDQ $0x00, Z5, Z0, Z6
	VPCLMULQDQ $0x11, Z5, Z0, Z0
	VPTERNLOGQ $0x96, 0(SI), Z6, Z0
	VPCLMULQDQ $0x00, Z5, Z1, Z7
	VPCLMULQDQ $0x11, Z5, Z1, Z1
	VPTERNLOGQ $0x96, 64(SI), Z7, Z1
	VPCLMULQDQ $0x00, Z5, Z2, Z8
	VPCLMULQDQ $0x11, Z5, Z2, Z2
	VPTERNLOGQ $0x96, 128(SI), Z8, Z2
	VPCLMULQDQ $0x00, Z5, Z3, Z9
	VPCLMULQDQ $0x11, Z5, Z3, Z3
	VPTERNLOGQ $0x96, 192(SI), Z9, Z3
	ADDQ $256, SI
	SUBQ $256, CX
	JMP  loop

reduce:
	// Z0 onto Z1, Z1 onto Z2, Z2 onto Z3: 64 bytes apart each.
	VBROADCASTI32X4 fold512<>(SB), Z5
	VPCLMULQDQ $0x00, Z5, Z0, Z6
	VPCLMULQDQ $0x11, Z5, Z0, Z0
	VPTERNLOGQ $0x96, Z6, Z0, Z1
	VPCLMULQDQ $0x00, Z5, Z1, Z6
	VPCLMULQDQ $0x11, Z5, Z1, Z1
	VPTERNLOGQ $0x96, Z6, Z1, Z2
	VPCLMULQDQ $0x00, Z5, Z2, Z6
	VPCLMULQDQ $0x11, Z5, Z2, Z2
	VPTERNLOGQ $0x96, Z6, Z2, Z3
	VMOVDQU64 Z3, 0(DI)
	VZEROUPPER
	RET
