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
	if (qk > MLA_MAX_QK || vdim > MLA_TILE) { // a launcher slip: NaN rather than overflowing qs
		if (tid < vdim && tid < MLA_TILE) o[(lo + i) * ((long long)heads * vdim) + (long long)h * vdim + tid] = f32_nan();
		return;
	}
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

// ---- tensor-core form (FA2-style) ----
//
// A block of 4 warps takes 64 query rows of one head (16 per warp) and walks
// the keys in tiles of 64: K (nope and rope parts together) and V are staged
// in shared memory as bf16, S = Q·Kᵀ and O += P·V run on mma.sync m16n8k16
// (Q, K, P and V rounded to bf16, fp32 accumulation), with the online
// softmax in fp32 on the S fragments: each row's max and sum are reduced
// over the four lanes that hold it. The S accumulator fragments of two
// adjacent 8-key tiles are exactly the A fragment of P for 16 keys, so P
// never leaves registers. Fixed maxima: nope+rope ≤ 192 (12 k-steps) and
// vdim ≤ 128 (16 n-tiles); smaller heads are zero-padded.

#define MF_ROWS 64
#define MF_KEYS 64
#define MF_QK 192
#define MF_V 128
#define MF_KLD (MF_QK / 2 + 4)   // u32 pairs per staged key row, padded
#define MF_VLD (MF_KEYS / 2 + 4) // u32 pairs per staged V column, padded

DEVICE float quad_max(float v) {
	float o = shfl_xor_f32(v, 1);
	v = o > v ? o : v;
	o = shfl_xor_f32(v, 2);
	return o > v ? o : v;
}
DEVICE float quad_sum(float v) {
	v += shfl_xor_f32(v, 1);
	return v + shfl_xor_f32(v, 2);
}

// Same parameters and state as tandem_mla_attn_block; grid (⌈n/64⌉, heads),
// block 128, static shared 44,032 B. For the whole cache in one launch pass
// k0 = 0, k1 = Tc, state = 0, flags = 3.
KERNEL void tandem_mla_attn_mma(float* o, const float* q, const float* kv, const float* kpe, long long lo, long long n, long long Tc,
                                int heads, int nope, int rope, int vdim, float scale, long long k0, long long k1, float* state, int flags) {
	SHARED u32 Ks[MF_KEYS][MF_KLD];
	SHARED u32 Vt[MF_V][MF_VLD];
	int tid = thread_x(), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
	int h = block_y(), qk = nope + rope, hw = nope + vdim;
	long long kvs = (long long)heads * hw;
	long long i0 = (long long)block_x() * MF_ROWS;     // the block's first span row
	long long wr = i0 + 16 * warp;                    // the warp's first span row
	long long rowi[2] = {wr + g, wr + g + 8};         // this lane's two rows
	long long pos[2] = {Tc - n + rowi[0], Tc - n + rowi[1]};
	bool valid[2] = {rowi[0] < n, rowi[1] < n};
	if (qk > MF_QK || vdim > MF_V) { // a launcher slip: NaN rather than a silently truncated head
		UNROLL
		for (int r = 0; r < 2; r++)
			if (valid[r])
				for (int d = t; d < vdim; d += 4) o[(lo + rowi[r]) * ((long long)heads * vdim) + (long long)h * vdim + d] = f32_nan();
		return;
	}
	// Q fragments for the 12 k-steps (rows g and g+8 of the warp's 16).
	u32 qa[MF_QK / 16][4];
	UNROLL
	for (int ks = 0; ks < MF_QK / 16; ks++)
		UNROLL
		for (int rr = 0; rr < 4; rr++) {
			int half = rr & 1, hi = rr >> 1; // a0: (g, lo cols) a1: (g+8, lo) a2: (g, hi) a3: (g+8, hi)
			int c = 16 * ks + 8 * hi + 2 * t;
			float x0 = 0, x1 = 0;
			if (valid[half]) {
				const float* qr = q + (lo + rowi[half]) * ((long long)heads * qk) + (long long)h * qk;
				if (c < qk) x0 = qr[c];
				if (c + 1 < qk) x1 = qr[c + 1];
			}
			qa[ks][rr] = pack_bf16x2(x0, x1);
		}
	// Running state per row (m, partial l in this lane) and O fragments.
	float m[2], l[2], acc[MF_V / 8][4];
	UNROLL
	for (int r = 0; r < 2; r++) m[r] = -f32_inf(), l[r] = 0;
	UNROLL
	for (int nt = 0; nt < MF_V / 8; nt++)
		UNROLL
		for (int e = 0; e < 4; e++) acc[nt][e] = 0;
	if (!(flags & MLA_FIRST)) {
		UNROLL
		for (int r = 0; r < 2; r++) {
			if (!valid[r]) continue;
			const float* st = state + (rowi[r] * heads + h) * (long long)(vdim + 2);
			m[r] = st[0];
			l[r] = t == 0 ? st[1] : 0; // the sum is held once per row
			UNROLL
			for (int nt = 0; nt < MF_V / 8; nt++)
				UNROLL
				for (int e = 0; e < 2; e++) {
					int d = 8 * nt + 2 * t + e;
					if (d < vdim) acc[nt][2 * r + e] = st[2 + d];
				}
		}
	}
	// Keys this block needs: up to its last row's position.
	long long last = Tc - n + (i0 + MF_ROWS - 1 < n - 1 ? i0 + MF_ROWS - 1 : n - 1);
	long long end = k1 < last + 1 ? k1 : last + 1;
	for (long long s0 = k0; s0 < end; s0 += MF_KEYS) {
		for (int p = tid; p < MF_KEYS * (MF_QK / 2); p += 128) {
			int kr = p / (MF_QK / 2), c = 2 * (p % (MF_QK / 2));
			long long s = s0 + kr;
			float x0 = 0, x1 = 0;
			if (s < k1) {
				const float* kr_ = kv + (s - k0) * kvs + (long long)h * hw;
				const float* pe = kpe + (s - k0) * rope;
				if (c < nope) x0 = kr_[c];
				else if (c < qk) x0 = pe[c - nope];
				if (c + 1 < nope) x1 = kr_[c + 1];
				else if (c + 1 < qk) x1 = pe[c + 1 - nope];
			}
			Ks[kr][c / 2] = pack_bf16x2(x0, x1);
		}
		for (int p = tid; p < MF_V * (MF_KEYS / 2); p += 128) {
			int d = p / (MF_KEYS / 2), kp = p % (MF_KEYS / 2);
			long long s = s0 + 2 * kp;
			float x0 = 0, x1 = 0;
			if (d < vdim) {
				if (s < k1) x0 = kv[(s - k0) * kvs + (long long)h * hw + nope + d];
				if (s + 1 < k1) x1 = kv[(s + 1 - k0) * kvs + (long long)h * hw + nope + d];
			}
			Vt[d][kp] = pack_bf16x2(x0, x1);
		}
		sync_threads();
		// S = Q·Kᵀ for the warp's 16 rows and the tile's 64 keys.
		float sc[MF_KEYS / 8][4];
		UNROLL
		for (int nt = 0; nt < MF_KEYS / 8; nt++) {
			UNROLL
			for (int e = 0; e < 4; e++) sc[nt][e] = 0;
			UNROLL
			for (int ks = 0; ks < MF_QK / 16; ks++) {
				u32 b[2] = {Ks[8 * nt + g][8 * ks + t], Ks[8 * nt + g][8 * ks + t + 4]};
				mma_bf16_16816(sc[nt], qa[ks], b);
			}
		}
		// Mask (causal, and keys past k1), scale, and the online softmax.
		float f[2];
		UNROLL
		for (int r = 0; r < 2; r++) {
			float tmax = -f32_inf();
			UNROLL
			for (int nt = 0; nt < MF_KEYS / 8; nt++)
				UNROLL
				for (int e = 0; e < 2; e++) {
					long long s = s0 + 8 * nt + 2 * t + e;
#ifdef PLANTED_BUG
					bool see = s < k1 && s <= pos[r] + (nt == 1);
#else
					bool see = s < k1 && s <= pos[r];
#endif
					float v = see ? sc[nt][2 * r + e] * scale : -f32_inf();
					sc[nt][2 * r + e] = v;
					tmax = v > tmax ? v : tmax;
				}
			tmax = quad_max(tmax);
			float mn = tmax > m[r] ? tmax : m[r];
			f[r] = (m[r] == -f32_inf()) ? (mn == -f32_inf() ? 1.0f : 0.0f) : dev_exp(m[r] - mn);
			float ps = 0;
			UNROLL
			for (int nt = 0; nt < MF_KEYS / 8; nt++)
				UNROLL
				for (int e = 0; e < 2; e++) {
					float v = sc[nt][2 * r + e];
					float pv = v == -f32_inf() ? 0.0f : dev_exp(v - mn);
					sc[nt][2 * r + e] = pv;
					ps += pv;
				}
			l[r] = l[r] * f[r] + ps;
			m[r] = mn;
		}
		UNROLL
		for (int nt = 0; nt < MF_V / 8; nt++)
			UNROLL
			for (int e = 0; e < 4; e++) acc[nt][e] *= f[e >> 1];
		// O += P·V: the S fragments of key tiles 2kk and 2kk+1 are P's A
		// fragment for keys 16kk..16kk+15.
		UNROLL
		for (int kk = 0; kk < MF_KEYS / 16; kk++) {
			u32 pa[4] = {pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16x2(sc[2 * kk][2], sc[2 * kk][3]),
			             pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), pack_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
			UNROLL
			for (int nt = 0; nt < MF_V / 8; nt++) {
				u32 b[2] = {Vt[8 * nt + g][8 * kk + t], Vt[8 * nt + g][8 * kk + t + 4]};
				mma_bf16_16816(acc[nt], pa, b);
			}
		}
		sync_threads(); // Ks and Vt are restaged for the next tile
	}
	UNROLL
	for (int r = 0; r < 2; r++) {
		float lt = quad_sum(l[r]);
		if (!valid[r]) continue;
		if (flags & MLA_LAST) {
			float* orow = o + (lo + rowi[r]) * ((long long)heads * vdim) + (long long)h * vdim;
			UNROLL
			for (int nt = 0; nt < MF_V / 8; nt++)
				UNROLL
				for (int e = 0; e < 2; e++) {
					int d = 8 * nt + 2 * t + e;
					if (d < vdim) orow[d] = acc[nt][2 * r + e] / lt;
				}
		} else {
			float* st = state + (rowi[r] * heads + h) * (long long)(vdim + 2);
			if (t == 0) st[0] = m[r], st[1] = lt;
			UNROLL
			for (int nt = 0; nt < MF_V / 8; nt++)
				UNROLL
				for (int e = 0; e < 2; e++) {
					int d = 8 * nt + 2 * t + e;
					if (d < vdim) st[2 + d] = acc[nt][2 * r + e];
				}
		}
	}
}
