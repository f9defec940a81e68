// Gated NoPE MLA prefill attention in the expanded form (K3 spec §3.4):
// the latent cache rows are split into c_kv and k_pe, K_nope and V are
// expanded by one GEMM (c_kv · kv_b_projᵀ, tandem_gemm_bf16), and a causal
// attention with an online softmax in fp32 runs over the expanded keys.
#include "prelude.cuh"

// Splits cache rows [rows, cols] (fp32, or bf16 bit patterns when bf16 != 0)
// into ckv [rows, cols-rope] and kpe [rows, rope], as fp32. Grid-stride
// over rows·cols.
KERNEL void tandem_mla_split_cache(float* ckv, float* kpe, const void* cache, int bf16, long long rows, int cols, int rope) {
	long long total = rows * cols;
	int lora = cols - rope;
	for (long long i = (long long)block_x() * block_dim_x() + thread_x(); i < total; i += (long long)grid_dim_x() * block_dim_x()) {
		long long r = i / cols;
		int c = (int)(i % cols);
		float x = bf16 ? bf16_to_f32(((const u16*)cache)[i]) : ((const float*)cache)[i];
#ifdef PLANTED_BUG
		if (c == lora) x = 0;
#endif
		if (c < lora) ckv[r * lora + c] = x;
		else kpe[r * rope + (c - lora)] = x;
	}
}

#define MLA_TILE 128
#define MLA_MAX_QK 256
#define MLA_FIRST 1 // the launch starts the rows' softmax state
#define MLA_LAST 2  // the launch finishes it and writes o

// The attention of one (row, head) over keys [k0, min(k1, p+1)), where the
// row's absolute position is p = Tc − n + i; kv and kpe hold key rows
// [k0, k1) only. The running softmax state (max, sum, V accumulator) starts
// fresh (MLA_FIRST) or is loaded from state, and is stored back there, or
// finished into o (MLA_LAST).
DEVICE void mla_attn_range(float* o, const float* q, const float* kv, const float* kpe, long long lo, long long n, long long Tc,
                           int heads, int nope, int rope, int vdim, float scale, long long k0, long long k1, float* state, int flags) {
	SHARED float qs[MLA_MAX_QK];
	SHARED float pr[MLA_TILE];
	SHARED float scratch[32];
	long long i = block_x();
	int h = block_y(), tid = thread_x();
	long long p = Tc - n + i;
	int qk = nope + rope, hw = nope + vdim;
	long long kvs = (long long)heads * hw;
	float* st = state ? state + (i * heads + h) * (long long)(vdim + 2) : 0;
	float m = -f32_inf(), l = 0, acc = 0;
	if (!(flags & MLA_FIRST)) {
		m = st[0], l = st[1];
		if (tid < vdim) acc = st[2 + tid];
	}
	const float* qr = q + (lo + i) * ((long long)heads * qk) + (long long)h * qk;
	for (int j = tid; j < qk; j += MLA_TILE) qs[j] = qr[j];
	sync_threads();
#ifdef PLANTED_BUG
	long long end = k1 < p + 2 ? k1 : p + 2; // one future key
#else
	long long end = k1 < p + 1 ? k1 : p + 1;
#endif
	for (long long s0 = k0; s0 < end; s0 += MLA_TILE) {
		long long s = s0 + tid;
		float sc = -f32_inf();
		if (s < end) {
			const float* kr = kv + (s - k0) * kvs + (long long)h * hw;
			const float* pe = kpe + (s - k0) * rope;
			float d = 0;
			for (int j = 0; j < nope; j++) d += qs[j] * kr[j];
			for (int j = 0; j < rope; j++) d += qs[nope + j] * pe[j];
			sc = d * scale;
		}
		// Tile maximum across the block (warp shuffles, then the warps).
		float tm = warp_max(sc);
		if ((tid & 31) == 0) scratch[tid >> 5] = tm;
		sync_threads();
		tm = scratch[0];
		for (int w = 1; w < MLA_TILE / 32; w++) tm = scratch[w] > tm ? scratch[w] : tm;
		float mn = tm > m ? tm : m;
		float e = sc == -f32_inf() ? 0.0f : dev_exp(sc - mn);
		pr[tid] = e;
		float f = m == -f32_inf() ? 0.0f : dev_exp(m - mn);
		sync_threads(); // pr complete; scratch read by everyone
		l = l * f + block_sum(e, scratch);
		if (tid < vdim) {
			acc *= f;
			int last = end - s0 < MLA_TILE ? (int)(end - s0) : MLA_TILE;
			for (int t = 0; t < last; t++) acc += pr[t] * kv[(s0 - k0 + t) * kvs + (long long)h * hw + nope + tid];
		}
		m = mn;
		sync_threads(); // pr is rewritten by the next tile
	}
	if (flags & MLA_LAST) {
		if (tid < vdim) o[(lo + i) * ((long long)heads * vdim) + (long long)h * vdim + tid] = acc / l;
	} else {
		if (tid == 0) st[0] = m, st[1] = l;
		if (tid < vdim) st[2 + tid] = acc;
	}
}

// Attention of the span's rows over all Tc cache rows, causal: the span's
// row i sits at absolute position Tc − n + i and sees keys 0..that.
// q [*, heads·(nope+rope)] and o [*, heads·vdim] are indexed by the span's
// rows [lo, lo+n); kv [Tc, heads·(nope+vdim)] holds each head's K_nope then
// V; kpe [Tc, rope] is shared by the heads. score = (q_nope·k_nope +
// q_pe·k_pe)·scale, softmax and the V sum in fp32 with a running maximum
// (online softmax) over tiles of 128 keys. One block of 128 threads per
// (row, head): grid (n, heads); nope+rope ≤ 256, vdim ≤ 128.
KERNEL void tandem_mla_attn(float* o, const float* q, const float* kv, const float* kpe, long long lo, long long n, long long Tc,
                            int heads, int nope, int rope, int vdim, float scale) {
	mla_attn_range(o, q, kv, kpe, lo, n, Tc, heads, nope, rope, vdim, scale, 0, Tc, 0, MLA_FIRST | MLA_LAST);
}

// The same over one block of keys [k0, k1): kv and kpe hold only those rows
// (expanded from cache rows k0..k1), so a long cache is expanded and
// attended a block at a time in bounded scratch. state [n, heads, vdim+2]
// (fp32) carries each (row, head)'s softmax between the launches; flags:
// 1 on the first block (k0 = 0), 2 on the last (writes o), 3 for one block.
KERNEL void tandem_mla_attn_block(float* o, const float* q, const float* kv, const float* kpe, long long lo, long long n, long long Tc,
                                  int heads, int nope, int rope, int vdim, float scale, long long k0, long long k1, float* state, int flags) {
	mla_attn_range(o, q, kv, kpe, lo, n, Tc, heads, nope, rope, vdim, scale, k0, k1, state, flags);
}
