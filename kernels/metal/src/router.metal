// Stable LatentMoE's sigmoid router: top-k experts per row.
#include "prelude.metal"

#define ROUTER_MAX_PER_LANE 32 // E ≤ 1024
#define ROUTER_MAX_K 32

struct RouterParams {
	uint rows, E, k, renorm;
	float scale;
};

// For each row r of logits [rows, E]: s = σ(logit); the k experts of
// highest s + bias (ties to the lower id), best first, into ids[r·k …];
// weights = s / (Σ selected s + 1e-20) when renorm (else s), times scale.
// One SIMD-group per row: lane l owns experts l, l+32, …; each of the k
// rounds takes the group's best untaken (value, id) by butterfly shuffles.
// Threadgroups of 128 (4 rows), ⌈rows/4⌉ of them. E ≤ 1024, 1 ≤ k ≤ 32 (the
// host checks; a slip writes id −1 and NaN weights rather than overflowing).
kernel void tandem_router_topk(device const float* logits, device const float* bias, device int* ids, device float* weights,
                               constant RouterParams& p, KPOS) {
	uint r = tgp.x * (tsz.x / SIMD) + sg;
	if (r >= p.rows) return; // the whole SIMD-group leaves together
	uint E = p.E, k = p.k;
	if (E > SIMD * ROUTER_MAX_PER_LANE || k > ROUTER_MAX_K || k > E || k < 1) {
		for (uint j = lane; j < k; j += SIMD) ids[(i64)r * k + j] = -1, weights[(i64)r * k + j] = f32_nan();
		return;
	}
	float s[ROUTER_MAX_PER_LANE], sel[ROUTER_MAX_PER_LANE];
	u32 taken = 0;
	int mine = 0;
	for (uint e = lane; e < E; e += SIMD, mine++) {
		s[mine] = dev_sigmoid(logits[(i64)r * E + e]);
		sel[mine] = s[mine] + bias[e];
	}
	float top_s[ROUTER_MAX_K];
	int top_id[ROUTER_MAX_K];
	float sum = 0;
	bool bug = planted("tandem_router_topk");
	for (uint j = 0; j < k; j++) {
		float bv = -f32_inf(), bs = 0;
		int bid = 0x7fffffff;
		for (int m = 0; m < mine; m++) {
			if (taken & (1u << m)) continue;
			int id = (int)lane + SIMD * m;
			if (sel[m] > bv || (sel[m] == bv && id < bid)) bv = sel[m], bs = s[m], bid = id;
		}
		for (ushort d = 16; d > (bug ? 1 : 0); d >>= 1) { // the bug skips the last butterfly step
			float ov = simd_shuffle_xor(bv, d), os = simd_shuffle_xor(bs, d);
			int oid = simd_shuffle_xor(bid, d);
			if (ov > bv || (ov == bv && oid < bid)) bv = ov, bs = os, bid = oid;
		}
		if (bid % SIMD == (int)lane) taken |= 1u << (bid / SIMD);
		top_s[j] = bs;
		top_id[j] = bid;
		sum += bs;
	}
	if (lane == 0) {
		for (uint j = 0; j < k; j++) {
			ids[(i64)r * k + j] = top_id[j];
			float wv = p.renorm ? top_s[j] / (sum + 1e-20f) : top_s[j];
			weights[(i64)r * k + j] = wv * p.scale;
		}
	}
}
