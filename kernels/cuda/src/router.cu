// Stable LatentMoE's sigmoid router: top-k experts per row.
#include "prelude.cuh"

#define ROUTER_MAX_PER_LANE 32 // E ≤ 1024
#define ROUTER_MAX_K 32

// For each row r of logits [rows, E]: s = σ(logit); select the k experts of
// highest s + bias (ties to the lower id), best first, into ids[r*k ...];
// weights = s / (Σ selected s + 1e-20) when renorm (else s), times scale.
// One warp per row: each lane owns experts lane, lane+32, ...; each of the
// k rounds takes the warp's best untaken (value, id) by butterfly shuffles.
// Block 128 (4 rows), grid ⌈rows/4⌉. E ≤ 1024, k ≤ 32 (the host checks).
KERNEL void tandem_router_topk(const float* logits, const float* bias, long long rows, int E, int k, int renorm, float scale, int* ids, float* weights) {
	int lane = thread_x() & 31;
	long long r = (long long)block_x() * (block_dim_x() / 32) + (thread_x() >> 5);
	if (r >= rows) return; // the whole warp leaves together
	if (E > 32 * ROUTER_MAX_PER_LANE || k > ROUTER_MAX_K || k > E || k < 1) {
		// A launcher slip: no selection rather than out-of-bounds writes.
		for (int j = lane; j < k; j += 32) ids[r * k + j] = -1, weights[r * k + j] = f32_nan();
		return;
	}
	float s[ROUTER_MAX_PER_LANE], sel[ROUTER_MAX_PER_LANE];
	u32 taken = 0;
	int mine = 0;
	for (int e = lane; e < E; e += 32, mine++) {
		s[mine] = dev_sigmoid(logits[r * E + e]);
		sel[mine] = s[mine] + bias[e];
	}
	float top_s[ROUTER_MAX_K];
	int top_id[ROUTER_MAX_K];
	float sum = 0;
	for (int j = 0; j < k; j++) {
		float bv = -f32_inf(), bs = 0;
		int bid = 0x7fffffff;
		for (int m = 0; m < mine; m++) {
			if (taken & (1u << m)) continue;
			int id = lane + 32 * m;
			if (sel[m] > bv || (sel[m] == bv && id < bid)) bv = sel[m], bs = s[m], bid = id;
		}
		for (int d = 16; d > 0; d >>= 1) {
			float ov = shfl_xor_f32(bv, d), os = shfl_xor_f32(bs, d);
			int oid = shfl_xor_i32(bid, d);
#ifdef PLANTED_BUG
			if (ov > bv || (ov == bv && oid > bid)) bv = ov, bs = os, bid = oid;
#else
			if (ov > bv || (ov == bv && oid < bid)) bv = ov, bs = os, bid = oid;
#endif
		}
		if (bid % 32 == lane) taken |= 1u << (bid / 32);
		top_s[j] = bs;
		top_id[j] = bid;
		sum += bs;
	}
	if (lane == 0) {
		for (int j = 0; j < k; j++) {
			ids[r * k + j] = top_id[j];
			float wv = renorm ? top_s[j] / (sum + 1e-20f) : top_s[j];
			weights[r * k + j] = wv * scale;
		}
	}
}
