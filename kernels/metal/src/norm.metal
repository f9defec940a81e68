// Norms and the Attention Residuals scores: one threadgroup per group
// (row), fp32 sums reduced over the threadgroup by SIMD sums (tg_sum).
// Threadgroups of 256 threads; min(groups, 65535) threadgroups, each
// walking groups tgp.x, tgp.x + ntg.x, …; threadgroup memory 32 floats.
#include "prelude.metal"

struct NormParams {
	uint ngroups, group, has_w;
	float eps;
};

// RMSNorm over ngroups groups of `group` values: dst = w ⊙ x / sqrt(mean(x²) + eps)
// (w ignored unless has_w).
kernel void tandem_rmsnorm(device float* dst, device const float* x, device const float* w, constant NormParams& p,
                           threadgroup float* scratch TG(0), KPOS) {
	for (uint g = tgp.x; g < p.ngroups; g += ntg.x) {
		device const float* xs = x + (long)g * p.group;
		device float* ds = dst + (long)g * p.group;
		float ss = 0;
		for (uint i = tid; i < p.group; i += tsz.x) ss += xs[i] * xs[i];
		ss = tg_sum(ss, scratch, tid, tsz.x);
		float n = planted("tandem_rmsnorm") ? (float)(p.group - 1) : (float)p.group;
		float inv = 1.0f / sqrt_rn(ss / n + p.eps);
		for (uint i = tid; i < p.group; i += tsz.x) {
			float v = xs[i] * inv;
			ds[i] = p.has_w ? w[i] * v : v;
		}
	}
}

struct L2Params {
	uint ngroups, group;
	float eps, scale;
};

// In place: each group scaled to unit L2 norm times scale, x / sqrt(Σx² + eps) · scale.
kernel void tandem_l2norm_groups(device float* x, constant L2Params& p, threadgroup float* scratch TG(0), KPOS) {
	for (uint g = tgp.x; g < p.ngroups; g += ntg.x) {
		device float* xs = x + (long)g * p.group;
		float ss = 0;
		for (uint i = tid; i < p.group; i += tsz.x) ss += xs[i] * xs[i];
		ss = tg_sum(ss, scratch, tid, tsz.x);
		float inv = 1.0f / sqrt_rn(ss + p.eps) * p.scale;
		if (planted("tandem_l2norm_groups") && g == p.ngroups - 1) inv = p.scale;
		for (uint i = tid; i < p.group; i += tsz.x) xs[i] *= inv;
	}
}

struct ScoreParams {
	uint rows, cols, nsrc, j;
	float eps;
};

// The AttnRes score of source j for each row: score[r, j] =
// (v[r]·proj)/sqrt(mean(v[r]²) + eps), one dispatch per source.
kernel void tandem_attnres_score(device float* score, device const float* v, device const float* proj, constant ScoreParams& p,
                                 threadgroup float* scratch TG(0), KPOS) {
	for (uint r = tgp.x; r < p.rows; r += ntg.x) {
		device const float* vr = v + (long)r * p.cols;
		float ss = 0, sp = 0;
		for (uint i = tid; i < p.cols; i += tsz.x) {
			ss += vr[i] * vr[i];
			sp += vr[i] * proj[i];
		}
		ss = tg_sum(ss, scratch, tid, tsz.x);
		sp = tg_sum(sp, scratch, tid, tsz.x);
		if (planted("tandem_attnres_score")) ss = 0;
		if (tid == 0) score[(long)r * p.nsrc + p.j] = sp / sqrt_rn(ss / (float)p.cols + p.eps);
	}
}

// In place, per row of x [rows, cols]: softmax (max subtracted, fp32).
// One thread per row: grid-stride over rows (cols is the number of AttnRes
// sources, a few dozen).
struct SoftmaxParams {
	uint rows, cols;
};

kernel void tandem_softmax_rows(device float* x, constant SoftmaxParams& p, KPOS) {
	for (long r = (long)tgp.x * tsz.x + tid; r < (long)p.rows; r += (long)ntg.x * tsz.x) {
		device float* xr = x + r * p.cols;
		float mx = -f32_inf();
		for (uint j = 0; j < p.cols; j++) mx = xr[j] > mx ? xr[j] : mx;
		float sum = 0;
		for (uint j = 0; j < p.cols; j++) {
			xr[j] = dev_exp(xr[j] - mx);
			sum += xr[j];
		}
		if (planted("tandem_softmax_rows")) sum *= 0.5f;
		for (uint j = 0; j < p.cols; j++) xr[j] /= sum;
	}
}
