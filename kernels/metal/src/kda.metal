// Kimi Delta Attention's recurrent form (spec §3.3), the decode step: per
// head and token, S ← diag(α)S with α = e^g; r = Sᵀk; u = β(v − r);
// S ← S + k uᵀ; o = Sᵀq. Column j of S evolves on its own given k, q, g and
// v_j, β, so thread j owns column j in registers for the whole span and
// only the decay factors are shared (threadgroup memory, two barriers a
// token). Sums over c run in c order in fp32.
//
// One threadgroup per head (grid = heads), dv threads rounded up to a
// multiple of 32; threadgroup memory dk floats. Limits: dk, dv ≤ 128
// (a slip writes NaN outputs). It also serves prefill (the chunked form
// computes the same function; it is not written for Metal yet).
#include "prelude.metal"

#define KDA_MAX_D 128

struct KDAParams {
	uint lo, n, heads, dk, dv;
};

kernel void tandem_kda_recurrent(device float* o, device const float* q, device const float* k, device const float* v, device const float* g,
                                 device const float* beta, device float* S, constant KDAParams& p, threadgroup float* alpha TG(0), KPOS) {
	uint h = tgp.x, j = tid, dk = p.dk, dv = p.dv, H = p.heads;
	if (h >= H) return;
	bool ok = dk <= KDA_MAX_D && dv <= KDA_MAX_D && dv <= tsz.x;
	bool bug = planted("tandem_kda_recurrent");
	device float* Sh = S + (i64)h * dk * dv;
	float col[KDA_MAX_D];
	if (ok && j < dv)
		for (uint c = 0; c < dk; c++) col[c] = Sh[(i64)c * dv + j];
	for (uint i = 0; i < p.n; i++) {
		i64 t = p.lo + i;
		device const float* gt = g + t * H * dk + h * dk;
		if (ok)
			for (uint c = tid; c < dk; c += tsz.x) alpha[c] = dev_exp(gt[c]);
		threadgroup_barrier(mem_flags::mem_threadgroup);
		if (j < dv) {
			device const float* kt = k + t * H * dk + h * dk;
			device const float* qt = q + t * H * dk + h * dk;
			float out;
			if (!ok) {
				out = f32_nan();
			} else {
				float r = 0;
				for (uint c = 0; c < dk; c++) {
					float s = col[c] * alpha[c];
					r += (bug ? col[c] : s) * kt[c];
					col[c] = s;
				}
				float u = beta[t * H + h] * (v[t * H * dv + h * dv + j] - r);
				float acc = 0;
				for (uint c = 0; c < dk; c++) {
					col[c] += kt[c] * u;
					acc += col[c] * qt[c];
				}
				out = acc;
			}
			o[t * H * dv + h * dv + j] = out;
		}
		threadgroup_barrier(mem_flags::mem_threadgroup);
	}
	if (ok && j < dv)
		for (uint c = 0; c < dk; c++) Sh[(i64)c * dv + j] = col[c];
}
