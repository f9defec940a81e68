// Matrix products y[T, O] = x[T, I] · Wᵀ for a weight W [O, I] in its
// storage format (kernels.Format), fp32 activations in and out.
//
// tandem_gemm_bf16 (and its grouped form for routed experts) runs on the
// tensor cores: x is rounded to bf16, W decoded to bf16 (exact for BF16 and
// every MX format; F32/F16 weights are rounded), mma.sync m16n8k16 with fp32
// accumulation. A 128-thread block computes a 64x64 tile of y; each of its
// four warps a 32x32 quarter as 2x4 mma tiles, over k in steps of 32 staged
// through shared memory as packed bf16 pairs. Edges are zero-padded, so any
// T, O, I work. This is the portable version (no ldmatrix, cp.async or
// wgmma); cuBLASLt is the fast path where it is installed.
//
// tandem_gemm_f32 keeps fp32 end to end (weights decoded exactly to fp32,
// fp32 FMA in k order): the exact-format path for small matrices whose
// inputs must not be rounded to bf16.
#include "prelude.cuh"

#define GB_M 64
#define GB_N 64
#define GB_K 32
#define GB_KP (GB_K / 2)   // packed bf16 pairs per tile row
#define GB_LD (GB_KP + 4)  // padded row stride: rows g and g+1 fall in different banks

DEVICE void gemm_bf16_tile(float* y, const float* x, long long rows, int O, int I, const u8* w, const u8* ws, int fmt, long long m0, int n0) {
	SHARED u32 As[GB_M][GB_LD];
	SHARED u32 Bs[GB_N][GB_LD];
	int tid = thread_x(), lane = tid & 31, warp = tid >> 5;
	int g = lane >> 2, t = lane & 3;
	int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
	float acc[2][4][4];
	for (int mi = 0; mi < 2; mi++)
		for (int ni = 0; ni < 4; ni++)
			for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0;
	for (int k0 = 0; k0 < I; k0 += GB_K) {
		for (int p = tid; p < GB_M * GB_KP; p += 128) {
			int r = p / GB_KP, kp = p % GB_KP, k = k0 + 2 * kp;
			long long row = m0 + r;
			float lo = 0, hi = 0;
			if (row < rows) {
				const float* xr = x + row * I;
				if (k < I) lo = xr[k];
				if (k + 1 < I) hi = xr[k + 1];
			}
			As[r][kp] = pack_bf16x2(lo, hi);
		}
		for (int p = tid; p < GB_N * GB_KP; p += 128) {
			int r = p / GB_KP, kp = p % GB_KP, k = k0 + 2 * kp, col = n0 + r;
			float lo = 0, hi = 0;
			if (col < O) {
				if (k < I) lo = weight_at(w, ws, fmt, I, col, k);
				if (k + 1 < I) hi = weight_at(w, ws, fmt, I, col, k + 1);
			}
			Bs[r][kp] = pack_bf16x2(lo, hi);
		}
		sync_threads();
		for (int kk = 0; kk < GB_KP; kk += 8) { // 16 values of k = 8 pairs
			u32 a[2][4], b[4][2];
			for (int mi = 0; mi < 2; mi++) {
				int r = wm + 16 * mi + g;
				a[mi][0] = As[r][kk + t];
#ifdef PLANTED_BUG
				a[mi][1] = As[r][kk + t + 4];
				a[mi][2] = As[r + 8][kk + t];
#else
				a[mi][1] = As[r + 8][kk + t];
				a[mi][2] = As[r][kk + t + 4];
#endif
				a[mi][3] = As[r + 8][kk + t + 4];
			}
			for (int ni = 0; ni < 4; ni++) {
				int c = wn + 8 * ni + g;
				b[ni][0] = Bs[c][kk + t];
				b[ni][1] = Bs[c][kk + t + 4];
			}
			for (int mi = 0; mi < 2; mi++)
				for (int ni = 0; ni < 4; ni++) mma_bf16_16816(acc[mi][ni], a[mi], b[ni]);
		}
		sync_threads();
	}
	for (int mi = 0; mi < 2; mi++)
		for (int ni = 0; ni < 4; ni++)
			for (int e = 0; e < 4; e++) {
				long long row = m0 + wm + 16 * mi + g + 8 * (e >> 1);
				int col = n0 + wn + 8 * ni + 2 * t + (e & 1);
				if (row < rows && col < O) y[row * O + col] = acc[mi][ni][e];
			}
}

// y [T, O] = x [T, I] · Wᵀ on the tensor cores. Grid (⌈O/64⌉, ⌈T/64⌉), 128 threads.
KERNEL void tandem_gemm_bf16(float* y, const float* x, long long T, int O, int I, const u8* w, const u8* ws, int fmt) {
	gemm_bf16_tile(y, x, T, O, I, w, ws, fmt, (long long)block_y() * GB_M, block_x() * GB_N);
}

// Grouped form for routed experts: group e owns rows [offs[e], offs[e+1])
// of x [N, I] and y [N, O] and multiplies them by its own weight (device
// pointers w[e], ws[e]; every weight [O, I] in format fmt). Grid
// (⌈O/64⌉, ⌈max rows/64⌉, groups), 128 threads.
KERNEL void tandem_gemm_bf16_grouped(float* y, const float* x, const int* offs, const u64* w, const u64* ws, int fmt, int O, int I) {
	int e = block_z();
	long long lo = offs[e], rows = (long long)offs[e + 1] - lo;
	long long m0 = (long long)block_y() * GB_M;
	if (m0 >= rows) return; // the whole block leaves together: no barrier is split
	gemm_bf16_tile(y + lo * O, x + lo * I, rows, O, I, (const u8*)w[e], (const u8*)ws[e], fmt, m0, block_x() * GB_N);
}

#define GF 16

// y [T, O] = x [T, I] · Wᵀ in fp32, W decoded exactly. Grid (⌈O/16⌉, ⌈T/16⌉),
// 256 threads; each output is one fp32 FMA chain in k order.
KERNEL void tandem_gemm_f32(float* y, const float* x, long long T, int O, int I, const u8* w, const u8* ws, int fmt) {
	SHARED float Xs[GF][GF + 1];
	SHARED float Ws[GF][GF + 1];
	int tx = thread_x() & 15, ty = thread_x() >> 4;
	long long row = (long long)block_y() * GF + ty;
	int col = block_x() * GF + tx;
	float acc = 0;
	for (int k0 = 0; k0 < I; k0 += GF) {
		long long xr = (long long)block_y() * GF + ty;
		int wr = block_x() * GF + ty, k = k0 + tx;
		Xs[ty][tx] = (xr < T && k < I) ? x[xr * I + k] : 0.0f;
		Ws[ty][tx] = (wr < O && k < I) ? weight_at(w, ws, fmt, I, wr, k) : 0.0f;
		sync_threads();
#ifdef PLANTED_BUG
		for (int kk = 0; kk < GF - 1; kk++) acc += Xs[ty][kk] * Ws[tx][kk];
#else
		for (int kk = 0; kk < GF; kk++) acc += Xs[ty][kk] * Ws[tx][kk];
#endif
		sync_threads();
	}
	if (row < T && col < O) y[row * O + col] = acc;
}
