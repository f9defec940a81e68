// GEMV and small-batch GEMM: y[T, O] = x[T, I] · Wᵀ with W [O, I] in its
// storage format, decoded on the fly (MXFP4 and MXFP8 exactly: element ×
// the block's power-of-two scale), fp32 products and sums. Decode reads
// each weight once per 8 tokens: that is what bounds a decode step (the
// routed experts' MXFP4 bytes dominate), so the kernel is built around
// streaming W, not around reuse.
//
// Threadgroups of 256 threads (8 SIMD-groups); SIMD-group sg of threadgroup
// (bx, by) computes output row bx·8 + sg for tokens by·8 … by·8+7: each
// lane walks the row's 32-column blocks lane, lane+32, … (MX: one scale per
// block), keeps 8 running sums, and one simd_sum per token ends the row.
// Grid (⌈O/8⌉, ⌈T/8⌉). Any T, O ≥ 1; I ≥ 1 (MX: a multiple of 32, as
// kernels.Matrix.Check requires).
#include "prelude.metal"

#define GEMV_TOK 8

struct GemvParams {
	uint T, O, I, fmt;
};

kernel void tandem_gemv(device float* y, device const float* x, device const u8* w, device const u8* ws, constant GemvParams& p, KPOS) {
	uint o = tgp.x * (tsz.x / SIMD) + sg;
	uint t0 = tgp.y * GEMV_TOK;
	if (o >= p.O || t0 >= p.T) return; // whole SIMD-groups leave together
	uint nt = min((uint)GEMV_TOK, p.T - t0);
	float acc[GEMV_TOK];
	for (uint t = 0; t < GEMV_TOK; t++) acc[t] = 0;
	bool bug = planted("tandem_gemv");
	for (uint c0 = lane * 32; c0 < p.I; c0 += 32 * SIMD) {
		uint cn = min(32u, p.I - c0);
		float wv[32];
		if (p.fmt == FMT_MXFP4) {
			// 16 bytes of nibbles (low = even column) and one scale.
			float s = e8m0_scale(ws[(i64)o * (p.I / 32) + c0 / 32]);
			device const u8* b = w + ((i64)o * p.I + c0) / 2;
			for (uint j = 0; j < 16; j++) {
				u32 v = b[j];
				wv[2 * j] = e2m1_value(bug ? v >> 4 : v & 15) * s;
				wv[2 * j + 1] = e2m1_value(bug ? v & 15 : v >> 4) * s;
			}
		} else if (p.fmt == FMT_BF16) {
			device const u16* b = (device const u16*)w + (i64)o * p.I + c0;
			for (uint j = 0; j < cn; j++) wv[j] = bf16_to_f32(b[bug ? j ^ 1 : j]);
		} else {
			for (uint j = 0; j < cn; j++) wv[j] = weight_at(w, ws, (int)p.fmt, (int)p.I, (int)o, (int)(c0 + (bug ? j ^ 1 : j)));
		}
		for (uint t = 0; t < nt; t++) {
			device const float* xr = x + (i64)(t0 + t) * p.I + c0;
			float d = 0;
			for (uint j = 0; j < cn; j++) d += wv[j] * xr[j];
			acc[t] += d;
		}
	}
	for (uint t = 0; t < nt; t++) {
		float s = simd_sum(acc[t]);
		if (lane == 0) y[(i64)(t0 + t) * p.O + o] = s;
	}
}
