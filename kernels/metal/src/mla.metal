// Gated NoPE MLA's attention core in the weight-absorbed form (spec §3.4):
// attention straight over the latent cache rows, kv_b_proj folded into the
// query and the output. Per (row i, head h):
//   q_lat = W_kᵀ q_nope               (W_k: kv_b_proj rows h·(nope+v) + d)
//   s_t   = (q_lat·c_kv[t] + q_pe·k_pe[t]) · scale,  t ≤ Tc − n + i
//   o     = W_v (Σ_t softmax(s)_t c_kv[t])
// The decode step reads each cached row once per head; keys are split over
// the threadgroup's SIMD-groups, each with its own online softmax (fp32),
// merged through threadgroup memory. It also serves local prefill (the
// expanded form computes the same function in exact arithmetic; it is not
// written for Metal yet).
//
// Grid (n, heads); threadgroups of 256. Threadgroup memory (floats):
// lora (q_lat) + rope (q_pe) + 8·(lora + 2) (per-SIMD-group state) + lora
// (merged c_kv mix) + 1, with lora = cols − rope ≤ 512 (K3: 512 + 64).
#include "prelude.metal"

#define MLA_MAX_LORA 512

struct MLAParams {
	uint lo, n, Tc, heads, nope, rope, vdim, cols, bf16, fmt;
	float scale;
};

DEVICE float latent_at(device const u8* cache, uint bf16, i64 i) {
	return bf16 ? bf16_to_f32(((device const u16*)cache)[i]) : ((device const float*)cache)[i];
}

kernel void tandem_mla_absorbed(device float* o, device const float* q, device const u8* cache, device const u8* kvb, device const u8* kvbs,
                                constant MLAParams& p, threadgroup float* tg TG(0), KPOS) {
	uint i = tgp.x, h = tgp.y;
	uint lora = p.cols - p.rope, hw = p.nope + p.vdim, nsg = tsz.x / SIMD;
	device float* out = o + (i64)(p.lo + i) * p.heads * p.vdim + (i64)h * p.vdim;
	if (lora > MLA_MAX_LORA || p.rope > p.cols || p.n > p.Tc) { // a launcher slip: NaN rather than overflowing acc
		for (uint j = tid; j < p.vdim; j += tsz.x) out[j] = f32_nan();
		return;
	}
	threadgroup float* qlat = tg;
	threadgroup float* qpe = qlat + lora;
	threadgroup float* st = qpe + p.rope;
	threadgroup float* olat = st + nsg * (lora + 2);
	threadgroup float* tot = olat + lora;
	device const float* qr = q + (i64)(p.lo + i) * p.heads * (p.nope + p.rope) + (i64)h * (p.nope + p.rope);

	for (uint l = tid; l < lora; l += tsz.x) {
		float a = 0;
		for (uint d = 0; d < p.nope; d++) a += qr[d] * weight_at(kvb, kvbs, (int)p.fmt, (int)lora, (int)(h * hw + d), (int)l);
		qlat[l] = a;
	}
	for (uint j = tid; j < p.rope; j += tsz.x) qpe[j] = qr[p.nope + j];
	threadgroup_barrier(mem_flags::mem_threadgroup);

	// Keys t ≤ last, SIMD-group sg taking t = sg, sg + nsg, …
	i64 last = (i64)p.Tc - p.n + i;
	if (planted("tandem_mla_absorbed") && last + 1 < (i64)p.Tc) last++;
	float m = -f32_inf(), sum = 0, acc[MLA_MAX_LORA / SIMD];
	for (uint a = 0; a < MLA_MAX_LORA / SIMD; a++) acc[a] = 0;
	for (i64 t = sg; t <= last; t += nsg) {
		i64 row = t * p.cols;
		float d = 0;
		for (uint l = lane; l < lora; l += SIMD) d += qlat[l] * latent_at(cache, p.bf16, row + l);
		for (uint j = lane; j < p.rope; j += SIMD) d += qpe[j] * latent_at(cache, p.bf16, row + lora + j);
		float s = simd_sum(d) * p.scale;
		float mn = s > m ? s : m;
		float corr = dev_exp(m - mn), e = dev_exp(s - mn);
		sum = sum * corr + e;
		for (uint l = lane, a = 0; l < lora; l += SIMD, a++) acc[a] = acc[a] * corr + e * latent_at(cache, p.bf16, row + l);
		m = mn;
	}
	threadgroup float* mine = st + sg * (lora + 2);
	if (lane == 0) mine[0] = m, mine[1] = sum;
	for (uint l = lane, a = 0; l < lora; l += SIMD, a++) mine[2 + l] = acc[a];
	threadgroup_barrier(mem_flags::mem_threadgroup);

	// Merge the SIMD-groups' states (a group with no keys has m = −∞).
	float M = -f32_inf();
	for (uint w = 0; w < nsg; w++) M = st[w * (lora + 2)] > M ? st[w * (lora + 2)] : M;
	for (uint l = tid; l < lora; l += tsz.x) {
		float a = 0;
		for (uint w = 0; w < nsg; w++) a += st[w * (lora + 2) + 2 + l] * dev_exp(st[w * (lora + 2)] - M);
		olat[l] = a;
	}
	if (tid == 0) {
		float s = 0;
		for (uint w = 0; w < nsg; w++) s += st[w * (lora + 2) + 1] * dev_exp(st[w * (lora + 2)] - M);
		tot[0] = s;
	}
	threadgroup_barrier(mem_flags::mem_threadgroup);

	for (uint j = sg; j < p.vdim; j += nsg) {
		float d = 0;
		for (uint l = lane; l < lora; l += SIMD) d += weight_at(kvb, kvbs, (int)p.fmt, (int)lora, (int)(h * hw + p.nope + j), (int)l) * olat[l];
		d = simd_sum(d);
		if (lane == 0) out[j] = d / tot[0];
	}
}
