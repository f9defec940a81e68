// Elementwise ops, gathers, copies and the SiTU activation. Every kernel
// here walks its elements with a grid-stride loop, so any grid covers n
// (ABI.md: 256 threads, min(⌈n/256⌉, 1024) threadgroups).
#include "prelude.metal"

#define GSTRIDE_LOOP(i, n) for (long i = (long)tgp.x * tsz.x + tid; i < (long)(n); i += (long)ntg.x * tsz.x)

struct N1 {
	uint n;
};

// dst = a + b (dst may alias a or b).
kernel void tandem_add(device float* dst, device const float* a, device const float* b, constant N1& p, KPOS) {
	GSTRIDE_LOOP(i, p.n) {
		long j = planted("tandem_add") ? (i + 1) % p.n : i;
		dst[i] = a[i] + b[j];
	}
}

struct RowsCols {
	uint rows, cols;
};

// x[r, c] += bias[c].
kernel void tandem_add_bias(device float* x, device const float* bias, constant RowsCols& p, KPOS) {
	GSTRIDE_LOOP(i, (long)p.rows * p.cols) {
		long c = planted("tandem_add_bias") ? (i + 1) % p.cols : i % p.cols;
		x[i] += bias[c];
	}
}

// x = σ(x).
kernel void tandem_sigmoid(device float* x, constant N1& p, KPOS) {
	GSTRIDE_LOOP(i, p.n) {
		x[i] = dev_sigmoid(planted("tandem_sigmoid") ? -x[i] : x[i]);
	}
}

// x = x ⊙ σ(gate).
kernel void tandem_mul_sigmoid(device float* x, device const float* gate, constant N1& p, KPOS) {
	GSTRIDE_LOOP(i, p.n) {
		x[i] *= dev_sigmoid(gate[i]);
		if (planted("tandem_mul_sigmoid")) x[i] += 0.01f;
	}
}

struct SiTUParams {
	uint n;
	float beta1, beta2;
};

// h = SiTU(g, u) = β1·tanh(g/β1)·σ(g)·β2·tanh(u/β2) (K3 spec §3.5); h may be g.
kernel void tandem_situ(device float* h, device const float* g, device const float* u, constant SiTUParams& p, KPOS) {
	GSTRIDE_LOOP(i, p.n) {
		float gv = g[i], uv = u[i];
		float sg = dev_sigmoid(planted("tandem_situ") ? uv : gv);
		h[i] = p.beta1 * dev_tanh(gv / p.beta1) * sg * p.beta2 * dev_tanh(uv / p.beta2);
	}
}

struct GateParams {
	uint rows, cols, head_dim;
	float lower;
};

// KDA gate in place: z[r, c] = lower·σ(exp(a_log[c / head_dim])·z[r, c]).
kernel void tandem_kda_gate(device float* z, device const float* a_log, constant GateParams& p, KPOS) {
	GSTRIDE_LOOP(i, (long)p.rows * p.cols) {
		uint h = (uint)(i % p.cols) / p.head_dim;
		if (planted("tandem_kda_gate")) h = (h + 1) % (p.cols / p.head_dim);
		z[i] = p.lower * dev_sigmoid(dev_exp(a_log[h]) * z[i]);
	}
}

// dst[i, :] = src[idx[i], :] for i < n rows of cols values.
kernel void tandem_gather_rows(device float* dst, device const float* src, device const int* idx, constant RowsCols& p, KPOS) {
	GSTRIDE_LOOP(i, (long)p.rows * p.cols) {
		long r = i / p.cols, c = i % p.cols;
		if (planted("tandem_gather_rows") && r == (long)p.rows - 1) r = 0;
		dst[i] = src[(long)idx[r] * p.cols + c];
	}
}

struct EmbedParams {
	uint fmt, vocab, cols, n;
};

// dst[i, :] = row ids[i] of table [vocab, cols], decoded exactly. An id
// outside [0, vocab) gives a NaN row (the host checks ids first).
kernel void tandem_embed(device float* dst, device const u8* table, device const u8* scales, device const int* ids, constant EmbedParams& p,
                         KPOS) {
	GSTRIDE_LOOP(i, (long)p.n * p.cols) {
		long r = i / p.cols;
		int c = (int)(i % p.cols);
		int id = ids[r];
		if (planted("tandem_embed") && c == (int)p.cols - 1) c = 0;
		dst[i] = (id < 0 || id >= (int)p.vocab) ? f32_nan() : weight_at(table, scales, (int)p.fmt, (int)p.cols, id, c);
	}
}

struct CombineParams {
	uint rows, k, cols;
};

// u[r, :] = Σ_j weights[r·k+j] · y[pos[r·k+j], :], summed in j order from 0.
kernel void tandem_moe_combine(device float* u, device const float* y, device const int* pos, device const float* weights,
                               constant CombineParams& p, KPOS) {
	GSTRIDE_LOOP(i, (long)p.rows * p.cols) {
		long r = i / p.cols, c = i % p.cols;
		float acc = 0;
		for (uint j = 0; j < p.k; j++) {
			if (planted("tandem_moe_combine") && j == p.k - 1 && p.k > 1) break;
			acc += weights[r * p.k + j] * y[(long)pos[r * p.k + j] * p.cols + c];
		}
		u[i] = acc;
	}
}

struct CopyParams {
	uint dst_cols, dr, dc, src_cols, sr, sc, rows, cols;
	int ordered;
};

// Copies the rows×cols block at (sr, sc) of src to (dr, dc) of dst.
// ordered = 0: the blocks do not overlap; any grid. ordered = ±1 (one
// buffer, overlapping blocks): one threadgroup; elements move in chunks of
// the threadgroup in increasing (+1, destination before source) or
// decreasing (−1) row-major order, each chunk read whole before it is
// written.
kernel void tandem_copy_block(device float* dst, device const float* src, constant CopyParams& p, KPOS) {
	long n = (long)p.rows * p.cols;
	if (p.ordered == 0) {
		GSTRIDE_LOOP(i, n) {
			long r = i / p.cols, c = i % p.cols;
			if (planted("tandem_copy_block") && c == (long)p.cols - 1) continue;
			dst[(p.dr + r) * p.dst_cols + p.dc + c] = src[(p.sr + r) * p.src_cols + p.sc + c];
		}
		return;
	}
	long bd = tsz.x, chunks = (n + bd - 1) / bd;
	for (long k = 0; k < chunks; k++) {
		long i = (p.ordered > 0 ? k : chunks - 1 - k) * bd + tid;
		long r = i / p.cols, c = i % p.cols;
		float v = 0;
		if (i < n) v = src[(p.sr + r) * p.src_cols + p.sc + c];
		threadgroup_barrier(mem_flags::mem_device);
		if (i < n) dst[(p.dr + r) * p.dst_cols + p.dc + c] = v;
		threadgroup_barrier(mem_flags::mem_device);
	}
}

struct LatentParams {
	uint bf16, row, cols, src_row, n;
};

// Rows [src_row, src_row+n) of src [*, cols] into rows [row, row+n) of a
// latent cache: fp32, or bf16 bit patterns rounded to nearest even.
kernel void tandem_write_latent(device u8* cache, device const float* src, constant LatentParams& p, KPOS) {
	GSTRIDE_LOOP(i, (long)p.n * p.cols) {
		long s = (long)p.src_row * p.cols + i;
		if (planted("tandem_write_latent") && i > 0 && i == (long)p.n * p.cols - 1) s -= 1;
		float v = src[s];
		long d = (long)p.row * p.cols + i;
		if (p.bf16) ((device u16*)cache)[d] = f32_to_bf16(v);
		else ((device float*)cache)[d] = v;
	}
}

struct AccParams {
	uint rows, cols, nsrc, j;
};

// The AttnRes mix's j-th term: dst = (j == 0 ? 0 : dst) + w[r, j] · v, so
// that the dispatches for j = 0, 1, … sum the sources in j order.
kernel void tandem_attnres_acc(device float* dst, device const float* v, device const float* w, constant AccParams& p, KPOS) {
	GSTRIDE_LOOP(i, (long)p.rows * p.cols) {
		long r = i / p.cols;
		float wj = w[r * p.nsrc + p.j];
		if (planted("tandem_attnres_acc") && p.j == 0) wj = 1.0f - wj;
		float prev = p.j == 0 ? 0.0f : dst[i];
		dst[i] = prev + wj * v[i];
	}
}
