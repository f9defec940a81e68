#include "textflag.h"

// Four-lane AVX2 ports of math.Exp (the amd64 assembly, its FMA branch) and
// math.Tanh (pure Go, which amd64 never fuses), operation for operation, so
// that every lane returns the bits the scalar function returns; used for
// SiTU's exp and tanh (situ.go). kernel_amd64.go checks them against the
// math package at start-up and tests check them over many inputs.

#define M_Abs mathC<>+0(SB)
#define M_Sign mathC<>+32(SB)
#define M_MaxFin mathC<>+64(SB)
#define M_NegInf mathC<>+96(SB)
#define M_PosInf mathC<>+128(SB)
#define M_Ovf mathC<>+160(SB)
#define M_Log2e mathC<>+192(SB)
#define M_Ln2u mathC<>+224(SB)
#define M_Ln2l mathC<>+256(SB)
#define M_C0625 mathC<>+288(SB)
#define M_C64 mathC<>+320(SB)
#define M_C56 mathC<>+352(SB)
#define M_C48 mathC<>+384(SB)
#define M_C40 mathC<>+416(SB)
#define M_C32 mathC<>+448(SB)
#define M_C24 mathC<>+480(SB)
#define M_Half mathC<>+512(SB)
#define M_One mathC<>+544(SB)
#define M_Two mathC<>+576(SB)
#define M_MinusOne mathC<>+608(SB)
#define M_Tiny mathC<>+640(SB)
#define M_Bias1022 mathC<>+672(SB)
#define M_OneQ mathC<>+704(SB)
#define M_M52Q mathC<>+736(SB)
#define M_C2046Q mathC<>+768(SB)
#define M_HalfMaxLog mathC<>+800(SB)
#define M_Tanh0625 mathC<>+832(SB)
#define M_P0 mathC<>+864(SB)
#define M_P1 mathC<>+896(SB)
#define M_P2 mathC<>+928(SB)
#define M_Q0 mathC<>+960(SB)
#define M_Q1 mathC<>+992(SB)
#define M_Q2 mathC<>+1024(SB)
#define M_Bias1023D mathC<>+1056(SB)

DATA mathC<>+0(SB)/8, $0x7FFFFFFFFFFFFFFF
DATA mathC<>+8(SB)/8, $0x7FFFFFFFFFFFFFFF
DATA mathC<>+16(SB)/8, $0x7FFFFFFFFFFFFFFF
DATA mathC<>+24(SB)/8, $0x7FFFFFFFFFFFFFFF
DATA mathC<>+32(SB)/8, $0x8000000000000000
DATA mathC<>+40(SB)/8, $0x8000000000000000
DATA mathC<>+48(SB)/8, $0x8000000000000000
DATA mathC<>+56(SB)/8, $0x8000000000000000
DATA mathC<>+64(SB)/8, $0x7FEFFFFFFFFFFFFF
DATA mathC<>+72(SB)/8, $0x7FEFFFFFFFFFFFFF
DATA mathC<>+80(SB)/8, $0x7FEFFFFFFFFFFFFF
DATA mathC<>+88(SB)/8, $0x7FEFFFFFFFFFFFFF
DATA mathC<>+96(SB)/8, $0xFFF0000000000000
DATA mathC<>+104(SB)/8, $0xFFF0000000000000
DATA mathC<>+112(SB)/8, $0xFFF0000000000000
DATA mathC<>+120(SB)/8, $0xFFF0000000000000
DATA mathC<>+128(SB)/8, $0x7FF0000000000000
DATA mathC<>+136(SB)/8, $0x7FF0000000000000
DATA mathC<>+144(SB)/8, $0x7FF0000000000000
DATA mathC<>+152(SB)/8, $0x7FF0000000000000
DATA mathC<>+160(SB)/8, $7.09782712893384e+02
DATA mathC<>+168(SB)/8, $7.09782712893384e+02
DATA mathC<>+176(SB)/8, $7.09782712893384e+02
DATA mathC<>+184(SB)/8, $7.09782712893384e+02
DATA mathC<>+192(SB)/8, $1.4426950408889634073599246810018920
DATA mathC<>+200(SB)/8, $1.4426950408889634073599246810018920
DATA mathC<>+208(SB)/8, $1.4426950408889634073599246810018920
DATA mathC<>+216(SB)/8, $1.4426950408889634073599246810018920
DATA mathC<>+224(SB)/8, $0.69314718055966295651160180568695068359375
DATA mathC<>+232(SB)/8, $0.69314718055966295651160180568695068359375
DATA mathC<>+240(SB)/8, $0.69314718055966295651160180568695068359375
DATA mathC<>+248(SB)/8, $0.69314718055966295651160180568695068359375
DATA mathC<>+256(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA mathC<>+264(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA mathC<>+272(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA mathC<>+280(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA mathC<>+288(SB)/8, $0.0625
DATA mathC<>+296(SB)/8, $0.0625
DATA mathC<>+304(SB)/8, $0.0625
DATA mathC<>+312(SB)/8, $0.0625
DATA mathC<>+320(SB)/8, $2.4801587301587301587e-5
DATA mathC<>+328(SB)/8, $2.4801587301587301587e-5
DATA mathC<>+336(SB)/8, $2.4801587301587301587e-5
DATA mathC<>+344(SB)/8, $2.4801587301587301587e-5
DATA mathC<>+352(SB)/8, $1.9841269841269841270e-4
DATA mathC<>+360(SB)/8, $1.9841269841269841270e-4
DATA mathC<>+368(SB)/8, $1.9841269841269841270e-4
DATA mathC<>+376(SB)/8, $1.9841269841269841270e-4
DATA mathC<>+384(SB)/8, $1.3888888888888888889e-3
DATA mathC<>+392(SB)/8, $1.3888888888888888889e-3
DATA mathC<>+400(SB)/8, $1.3888888888888888889e-3
DATA mathC<>+408(SB)/8, $1.3888888888888888889e-3
DATA mathC<>+416(SB)/8, $8.3333333333333333333e-3
DATA mathC<>+424(SB)/8, $8.3333333333333333333e-3
DATA mathC<>+432(SB)/8, $8.3333333333333333333e-3
DATA mathC<>+440(SB)/8, $8.3333333333333333333e-3
DATA mathC<>+448(SB)/8, $4.1666666666666666667e-2
DATA mathC<>+456(SB)/8, $4.1666666666666666667e-2
DATA mathC<>+464(SB)/8, $4.1666666666666666667e-2
DATA mathC<>+472(SB)/8, $4.1666666666666666667e-2
DATA mathC<>+480(SB)/8, $1.6666666666666666667e-1
DATA mathC<>+488(SB)/8, $1.6666666666666666667e-1
DATA mathC<>+496(SB)/8, $1.6666666666666666667e-1
DATA mathC<>+504(SB)/8, $1.6666666666666666667e-1
DATA mathC<>+512(SB)/8, $0.5
DATA mathC<>+520(SB)/8, $0.5
DATA mathC<>+528(SB)/8, $0.5
DATA mathC<>+536(SB)/8, $0.5
DATA mathC<>+544(SB)/8, $1.0
DATA mathC<>+552(SB)/8, $1.0
DATA mathC<>+560(SB)/8, $1.0
DATA mathC<>+568(SB)/8, $1.0
DATA mathC<>+576(SB)/8, $2.0
DATA mathC<>+584(SB)/8, $2.0
DATA mathC<>+592(SB)/8, $2.0
DATA mathC<>+600(SB)/8, $2.0
DATA mathC<>+608(SB)/8, $-1.0
DATA mathC<>+616(SB)/8, $-1.0
DATA mathC<>+624(SB)/8, $-1.0
DATA mathC<>+632(SB)/8, $-1.0
DATA mathC<>+640(SB)/8, $0x0010000000000000
DATA mathC<>+648(SB)/8, $0x0010000000000000
DATA mathC<>+656(SB)/8, $0x0010000000000000
DATA mathC<>+664(SB)/8, $0x0010000000000000
DATA mathC<>+672(SB)/8, $0x00000000000003FE
DATA mathC<>+680(SB)/8, $0x00000000000003FE
DATA mathC<>+688(SB)/8, $0x00000000000003FE
DATA mathC<>+696(SB)/8, $0x00000000000003FE
DATA mathC<>+704(SB)/8, $0x0000000000000001
DATA mathC<>+712(SB)/8, $0x0000000000000001
DATA mathC<>+720(SB)/8, $0x0000000000000001
DATA mathC<>+728(SB)/8, $0x0000000000000001
DATA mathC<>+736(SB)/8, $0xFFFFFFFFFFFFFFCC
DATA mathC<>+744(SB)/8, $0xFFFFFFFFFFFFFFCC
DATA mathC<>+752(SB)/8, $0xFFFFFFFFFFFFFFCC
DATA mathC<>+760(SB)/8, $0xFFFFFFFFFFFFFFCC
DATA mathC<>+768(SB)/8, $0x00000000000007FE
DATA mathC<>+776(SB)/8, $0x00000000000007FE
DATA mathC<>+784(SB)/8, $0x00000000000007FE
DATA mathC<>+792(SB)/8, $0x00000000000007FE
DATA mathC<>+800(SB)/8, $44.014845965556527147994
DATA mathC<>+808(SB)/8, $44.014845965556527147994
DATA mathC<>+816(SB)/8, $44.014845965556527147994
DATA mathC<>+824(SB)/8, $44.014845965556527147994
DATA mathC<>+832(SB)/8, $0.625
DATA mathC<>+840(SB)/8, $0.625
DATA mathC<>+848(SB)/8, $0.625
DATA mathC<>+856(SB)/8, $0.625
DATA mathC<>+864(SB)/8, $-9.64399179425052238628e-1
DATA mathC<>+872(SB)/8, $-9.64399179425052238628e-1
DATA mathC<>+880(SB)/8, $-9.64399179425052238628e-1
DATA mathC<>+888(SB)/8, $-9.64399179425052238628e-1
DATA mathC<>+896(SB)/8, $-9.92877231001918586564e1
DATA mathC<>+904(SB)/8, $-9.92877231001918586564e1
DATA mathC<>+912(SB)/8, $-9.92877231001918586564e1
DATA mathC<>+920(SB)/8, $-9.92877231001918586564e1
DATA mathC<>+928(SB)/8, $-1.61468768441708447952e3
DATA mathC<>+936(SB)/8, $-1.61468768441708447952e3
DATA mathC<>+944(SB)/8, $-1.61468768441708447952e3
DATA mathC<>+952(SB)/8, $-1.61468768441708447952e3
DATA mathC<>+960(SB)/8, $1.12811678491632931402e2
DATA mathC<>+968(SB)/8, $1.12811678491632931402e2
DATA mathC<>+976(SB)/8, $1.12811678491632931402e2
DATA mathC<>+984(SB)/8, $1.12811678491632931402e2
DATA mathC<>+992(SB)/8, $2.23548839060100448583e3
DATA mathC<>+1000(SB)/8, $2.23548839060100448583e3
DATA mathC<>+1008(SB)/8, $2.23548839060100448583e3
DATA mathC<>+1016(SB)/8, $2.23548839060100448583e3
DATA mathC<>+1024(SB)/8, $4.84406305325125486048e3
DATA mathC<>+1032(SB)/8, $4.84406305325125486048e3
DATA mathC<>+1040(SB)/8, $4.84406305325125486048e3
DATA mathC<>+1048(SB)/8, $4.84406305325125486048e3
DATA mathC<>+1056(SB)/4, $1023
DATA mathC<>+1060(SB)/4, $1023
DATA mathC<>+1064(SB)/4, $1023
DATA mathC<>+1068(SB)/4, $1023
GLOBL mathC<>(SB), RODATA|NOPTR, $1072

// VEXP: Y0 = exp(Y0) lane by lane; clobbers Y1-Y9.
#define VEXP \
	VANDPD       M_Abs, Y0, Y1           \
	VPCMPGTQ     M_MaxFin, Y1, Y2        \
	VCMPPD       $0x1e, M_Ovf, Y0, Y3    \
	VPCMPEQQ     M_NegInf, Y0, Y1        \
	VMULPD       M_Log2e, Y0, Y4         \
	VCVTPD2DQY   Y4, X5                  \
	VCVTDQ2PD    X5, Y4                  \
	VMOVAPD      Y0, Y6                  \
	VFNMADD231PD M_Ln2u, Y4, Y6          \
	VFNMADD231PD M_Ln2l, Y4, Y6          \
	VMULPD       M_C0625, Y6, Y6         \
	VMOVUPD      M_C64, Y7               \
	VFMADD213PD  M_C56, Y6, Y7           \
	VFMADD213PD  M_C48, Y6, Y7           \
	VFMADD213PD  M_C40, Y6, Y7           \
	VFMADD213PD  M_C32, Y6, Y7           \
	VFMADD213PD  M_C24, Y6, Y7           \
	VFMADD213PD  M_Half, Y6, Y7          \
	VFMADD213PD  M_One, Y6, Y7           \
	VMULPD       Y7, Y6, Y6              \
	VADDPD       M_Two, Y6, Y7           \
	VMULPD       Y7, Y6, Y6              \
	VADDPD       M_Two, Y6, Y7           \
	VMULPD       Y7, Y6, Y6              \
	VADDPD       M_Two, Y6, Y7           \
	VMULPD       Y7, Y6, Y6              \
	VADDPD       M_Two, Y6, Y7           \
	VFMADD213PD  M_One, Y7, Y6           \
	VPADDD       M_Bias1023D, X5, X5     \
	VPMOVSXDQ    X5, Y4                  \
	VPSLLQ       $52, Y4, Y7             \
	VMULPD       Y7, Y6, Y7              \
	VPADDQ       M_Bias1022, Y4, Y8      \
	VPSLLQ       $52, Y8, Y8             \
	VMULPD       Y8, Y6, Y8              \
	VMULPD       M_Tiny, Y8, Y8          \
	VMOVDQU      M_OneQ, Y9              \
	VPCMPGTQ     Y4, Y9, Y9              \
	VBLENDVPD    Y9, Y8, Y7, Y7          \
	VMOVDQU      M_M52Q, Y9              \
	VPCMPGTQ     Y4, Y9, Y9              \
	VPANDN       Y7, Y9, Y7              \
	VPCMPGTQ     M_C2046Q, Y4, Y9        \
	VPOR         Y3, Y9, Y3              \
	VBLENDVPD    Y3, M_PosInf, Y7, Y7    \
	VBLENDVPD    Y2, Y0, Y7, Y7          \
	VPANDN       Y7, Y1, Y0

// VTANH: Y0 = tanh(Y0) lane by lane; clobbers Y1-Y12.
#define VTANH \
	VMOVAPD   Y0, Y10                  \
	VANDPD    M_Abs, Y0, Y11           \
	VCMPPD    $0x1e, M_HalfMaxLog, Y11, Y12 \
	VADDPD    Y11, Y11, Y0             \
	VEXP                               \
	VADDPD    M_One, Y0, Y0            \
	VMOVUPD   M_Two, Y1                \
	VDIVPD    Y0, Y1, Y1               \
	VMOVUPD   M_One, Y2                \
	VSUBPD    Y1, Y2, Y2               \
	VXORPD    Y3, Y3, Y3               \
	VCMPPD    $0x11, Y3, Y10, Y4       \
	VANDPD    M_Sign, Y4, Y5           \
	VXORPD    Y5, Y2, Y2               \
	VMULPD    Y10, Y10, Y3             \
	VMULPD    M_P0, Y3, Y5             \
	VADDPD    M_P1, Y5, Y5             \
	VMULPD    Y3, Y5, Y5               \
	VADDPD    M_P2, Y5, Y5             \
	VADDPD    M_Q0, Y3, Y6             \
	VMULPD    Y3, Y6, Y6               \
	VADDPD    M_Q1, Y6, Y6             \
	VMULPD    Y3, Y6, Y6               \
	VADDPD    M_Q2, Y6, Y6             \
	VMULPD    Y3, Y10, Y7              \
	VMULPD    Y5, Y7, Y7               \
	VDIVPD    Y6, Y7, Y7               \
	VADDPD    Y7, Y10, Y7              \
	VXORPD    Y3, Y3, Y3               \
	VCMPPD    $0x00, Y3, Y10, Y8       \
	VBLENDVPD Y8, Y10, Y7, Y7          \
	VCMPPD    $0x1d, M_Tanh0625, Y11, Y8 \
	VBLENDVPD Y8, Y2, Y7, Y7           \
	VMOVUPD   M_One, Y9                \
	VBLENDVPD Y4, M_MinusOne, Y9, Y9   \
	VBLENDVPD Y12, Y9, Y7, Y0

// func expAVX2(dst, src *float64, n int)
// n%4 == 0, n > 0.
TEXT ·expAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $2, CX

expLoop:
	VMOVUPD (SI), Y0
	VEXP
	VMOVUPD Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	DECQ    CX
	JNZ     expLoop
	VZEROUPPER
	RET

// func tanhAVX2(dst, src *float64, n int)
// n%4 == 0, n > 0.
TEXT ·tanhAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $2, CX

tanhLoop:
	VMOVUPD (SI), Y0
	VTANH
	VMOVUPD Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	DECQ    CX
	JNZ     tanhLoop
	VZEROUPPER
	RET

// func situAVX2(gs, us *float64, n int, beta1, beta2 float64)
// g[i] = beta1*tanh(g[i]/beta1) * (1/(1+exp(-g[i]))) * beta2 * tanh(u[i]/beta2),
// multiplied left to right as situ does; n%4 == 0, n > 0.
TEXT ·situAVX2(SB), NOSPLIT, $0-40
	MOVQ         gs+0(FP), DI
	MOVQ         us+8(FP), SI
	MOVQ         n+16(FP), CX
	SHRQ         $2, CX
	VBROADCASTSD beta1+24(FP), Y14
	VBROADCASTSD beta2+32(FP), Y15

situLoop:
	VMOVUPD (DI), Y0
	VDIVPD  Y14, Y0, Y0
	VTANH
	VMULPD  Y0, Y14, Y13
	VMOVUPD (DI), Y0
	VXORPD  M_Sign, Y0, Y0
	VEXP
	VADDPD  M_One, Y0, Y0
	VMOVUPD M_One, Y1
	VDIVPD  Y0, Y1, Y1
	VMULPD  Y1, Y13, Y13
	VMULPD  Y15, Y13, Y13
	VMOVUPD (SI), Y0
	VDIVPD  Y15, Y0, Y0
	VTANH
	VMULPD  Y0, Y13, Y13
	VMOVUPD Y13, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	DECQ    CX
	JNZ     situLoop
	VZEROUPPER
	RET

// func sigmoidAVX2(dst, src *float32, n int)
// dst[i] = float32(1 / (1 + exp(-float64(src[i])))), as sigmoid does;
// n%4 == 0, n > 0.
TEXT ·sigmoidAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $2, CX

sigmoidLoop:
	VCVTPS2PD  (SI), Y0
	VXORPD     M_Sign, Y0, Y0
	VEXP
	VADDPD     M_One, Y0, Y0
	VMOVUPD    M_One, Y1
	VDIVPD     Y0, Y1, Y1
	VCVTPD2PSY Y1, X1
	VMOVUPS    X1, (DI)
	ADDQ       $16, SI
	ADDQ       $16, DI
	DECQ       CX
	JNZ        sigmoidLoop
	VZEROUPPER
	RET

// func gateAVX2(x *float32, n int, negA float64, lower float32)
// x[i] = lower * float32(1 / (1 + exp(negA*float64(x[i])))), KDAGate's map
// for one head; n%4 == 0, n > 0.
TEXT ·gateAVX2(SB), NOSPLIT, $0-28
	MOVQ         x+0(FP), DI
	MOVQ         n+8(FP), CX
	SHRQ         $2, CX
	VBROADCASTSD negA+16(FP), Y14
	VBROADCASTSS lower+24(FP), X15

gateLoop:
	VCVTPS2PD  (DI), Y0
	VMULPD     Y0, Y14, Y0
	VEXP
	VADDPD     M_One, Y0, Y0
	VMOVUPD    M_One, Y1
	VDIVPD     Y0, Y1, Y1
	VCVTPD2PSY Y1, X1
	VMULPS     X1, X15, X1
	VMOVUPS    X1, (DI)
	ADDQ       $16, DI
	DECQ       CX
	JNZ        gateLoop
	VZEROUPPER
	RET
