// Elementwise ops, gathers and the SiTU activation. Every kernel here walks
// its elements with a grid-stride loop, so any grid (see ABI.md) covers n.
#include "prelude.cuh"

DEVICE long long gstride_start() { return (long long)block_x() * block_dim_x() + thread_x(); }
DEVICE long long gstride() { return (long long)grid_dim_x() * block_dim_x(); }

// dst = a + b.
KERNEL void tandem_add(float* dst, const float* a, const float* b, long long n) {
	for (long long i = gstride_start(); i < n; i += gstride()) {
#ifdef PLANTED_BUG
		dst[i] = a[i] + b[(i + 1) % n];
#else
		dst[i] = a[i] + b[i];
#endif
	}
}

// x[r, c] += bias[c] for x [rows, cols].
KERNEL void tandem_add_bias(float* x, const float* bias, long long rows, int cols) {
	long long n = rows * cols;
	for (long long i = gstride_start(); i < n; i += gstride()) {
#ifdef PLANTED_BUG
		x[i] += bias[(i + 1) % cols];
#else
		x[i] += bias[i % cols];
#endif
	}
}

// x = σ(x).
KERNEL void tandem_sigmoid(float* x, long long n) {
	for (long long i = gstride_start(); i < n; i += gstride()) {
#ifdef PLANTED_BUG
		x[i] = dev_sigmoid(-x[i]);
#else
		x[i] = dev_sigmoid(x[i]);
#endif
	}
}

// x = x ⊙ σ(gate).
KERNEL void tandem_mul_sigmoid(float* x, const float* gate, long long n) {
	for (long long i = gstride_start(); i < n; i += gstride()) {
#ifdef PLANTED_BUG
		x[i] = x[i] * dev_sigmoid(gate[i]) + 0.01f;
#else
		x[i] *= dev_sigmoid(gate[i]);
#endif
	}
}

// h = SiTU(g, u) = β1·tanh(g/β1)·σ(g)·β2·tanh(u/β2) (K3 spec §3.5), the
// activation between a SiTU MLP's gate/up and down projections. h may be g.
KERNEL void tandem_situ(float* h, const float* g, const float* u, long long n, float beta1, float beta2) {
	for (long long i = gstride_start(); i < n; i += gstride()) {
		float gv = g[i], uv = u[i];
#ifdef PLANTED_BUG
		h[i] = beta1 * dev_tanh(gv / beta1) * dev_sigmoid(uv) * beta2 * dev_tanh(uv / beta2);
#else
		h[i] = beta1 * dev_tanh(gv / beta1) * dev_sigmoid(gv) * beta2 * dev_tanh(uv / beta2);
#endif
	}
}

// KDA gate in place: z[r, c] = lower·σ(exp(aLog[c / head_dim])·z[r, c]).
KERNEL void tandem_kda_gate(float* z, const float* a_log, long long rows, int cols, int head_dim, float lower) {
	long long n = rows * cols;
	for (long long i = gstride_start(); i < n; i += gstride()) {
		int h = (int)(i % cols) / head_dim;
#ifdef PLANTED_BUG
		h = (h + 1) % (cols / head_dim);
#endif
		z[i] = lower * dev_sigmoid(dev_exp(a_log[h]) * z[i]);
	}
}

// dst[i, :] = src[idx[i], :] for i < n, rows of cols values (the routed
// experts' gather of token rows, grouped by expert).
KERNEL void tandem_gather_rows(float* dst, const float* src, const int* idx, long long n, int cols) {
	long long total = n * cols;
	for (long long i = gstride_start(); i < total; i += gstride()) {
		long long r = i / cols;
		int c = (int)(i % cols);
#ifdef PLANTED_BUG
		if (r == n - 1) r = 0;
#endif
		dst[i] = src[(long long)idx[r] * cols + c];
	}
}

// Embedding gather: dst[i, :] = row ids[i] of table [vocab, cols] in its
// storage format, decoded exactly. An id outside [0, vocab) gives a NaN row
// (the host validates ids before the launch; NaN makes a slip visible).
KERNEL void tandem_embed(float* dst, const u8* table, const u8* scales, int fmt, int vocab, int cols, const int* ids, long long n) {
	long long total = n * cols;
	for (long long i = gstride_start(); i < total; i += gstride()) {
		long long r = i / cols;
		int c = (int)(i % cols);
		int id = ids[r];
#ifdef PLANTED_BUG
		if (c == cols - 1) c = 0;
#endif
		dst[i] = (id < 0 || id >= vocab) ? f32_nan() : weight_at(table, scales, fmt, cols, id, c);
	}
}

// u[r, :] = Σ_j weights[r*k + j] · y[pos[r*k + j], :] in j order: the
// routed experts' combine, where pos maps each (row, slot) to its row of
// the expert-grouped output y.
KERNEL void tandem_moe_combine(float* u, const float* y, const int* pos, const float* weights, long long rows, int k, int cols) {
	long long total = rows * cols;
	for (long long i = gstride_start(); i < total; i += gstride()) {
		long long r = i / cols;
		int c = (int)(i % cols);
		float acc = 0;
		for (int j = 0; j < k; j++) {
#ifdef PLANTED_BUG
			if (j == k - 1 && k > 1) break;
#endif
			acc += weights[r * k + j] * y[(long long)pos[r * k + j] * cols + c];
		}
		u[i] = acc;
	}
}

// Copies the rows×cols block at (sr, sc) of src [*, src_cols] to (dr, dc) of
// dst [*, dst_cols]. ordered = 0: the blocks do not overlap; any grid
// (grid-stride). ordered = +1 / −1 (dst and src the same tensor, blocks
// overlapping): launch one block; the elements go in chunks of blockDim in
// increasing (+1: when the destination starts before the source) or
// decreasing (−1) row-major order, each chunk read whole before it is
// written, so no element is overwritten before it is read.
KERNEL void tandem_copy_block(float* dst, int dst_cols, long long dr, int dc, const float* src, int src_cols, long long sr, int sc,
                              long long rows, int cols, int ordered) {
	long long n = rows * cols;
	if (ordered == 0) {
		for (long long i = gstride_start(); i < n; i += gstride()) {
			long long r = i / cols;
			int c = (int)(i % cols);
#ifdef PLANTED_BUG
			if (c == cols - 1) continue;
#endif
			dst[(dr + r) * dst_cols + dc + c] = src[(sr + r) * src_cols + sc + c];
		}
		return;
	}
	int bd = block_dim_x();
	long long chunks = (n + bd - 1) / bd;
	for (long long k = 0; k < chunks; k++) {
#ifdef PLANTED_BUG
		long long i = (ordered < 0 ? k : chunks - 1 - k) * bd + thread_x();
#else
		long long i = (ordered > 0 ? k : chunks - 1 - k) * bd + thread_x();
#endif
		long long r = i / cols;
		int c = (int)(i % cols);
		float v = 0;
		if (i < n) v = src[(sr + r) * src_cols + sc + c];
		sync_threads();
		if (i < n) dst[(dr + r) * dst_cols + dc + c] = v;
		sync_threads();
	}
}

// Writes rows [src_row, src_row+n) of src [*, cols] into rows [row, row+n)
// of a latent cache [*, cols]: fp32, or bf16 bit patterns rounded to
// nearest even when bf16 != 0. Grid-stride over n·cols.
KERNEL void tandem_write_latent(void* cache, int bf16, long long row, int cols, const float* src, long long src_row, long long n) {
	long long total = n * cols;
	for (long long i = gstride_start(); i < total; i += gstride()) {
#ifdef PLANTED_BUG
		float v = src[(src_row + (i >= cols)) * cols + i];
#else
		float v = src[src_row * cols + i];
#endif
		if (bf16) ((u16*)cache)[row * cols + i] = f32_to_bf16(v);
		else ((float*)cache)[row * cols + i] = v;
	}
}

// Decodes a [rows, cols] weight in its storage format to bf16 bit patterns
// (exact for BF16 and the MX formats; F32 and F16 are rounded to nearest
// even): the "dequantize, then a BF16 GEMM" path, e.g. for cuBLASLt over
// MXFP4 experts. Grid-stride over rows·cols.
KERNEL void tandem_dequant_bf16(u16* dst, const u8* w, const u8* scales, int fmt, long long rows, int cols) {
	long long total = rows * cols;
	for (long long i = gstride_start(); i < total; i += gstride()) {
		long long r = i / cols;
		int c = (int)(i % cols);
#ifdef PLANTED_BUG
		if (fmt != FMT_BF16 && c % 32 == 31) c--;
#endif
		dst[i] = f32_to_bf16(weight_at(w, scales, fmt, cols, (int)r, c));
	}
}
