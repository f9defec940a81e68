// Norms and the Attention Residuals depth mix: one block per group (row),
// fp32 sums reduced across the block with warp shuffles.
#include "prelude.cuh"

// RMSNorm over ngroups consecutive groups of `group` values:
// dst = w ⊙ x / sqrt(mean(x²) + eps); w may be null (no weight).
KERNEL void tandem_rmsnorm(float* dst, const float* x, const float* w, long long ngroups, int group, float eps) {
	SHARED float scratch[32];
	for (long long g = block_x(); g < ngroups; g += grid_dim_x()) {
		const float* xs = x + g * group;
		float* ds = dst + g * group;
		float ss = 0;
		for (int i = thread_x(); i < group; i += block_dim_x()) ss += xs[i] * xs[i];
		ss = block_sum(ss, scratch);
#ifdef PLANTED_BUG
		float inv = 1.0f / sqrt_rn(ss / (float)(group - 1) + eps);
#else
		float inv = 1.0f / sqrt_rn(ss / (float)group + eps);
#endif
		for (int i = thread_x(); i < group; i += block_dim_x()) {
			float v = xs[i] * inv;
			ds[i] = w ? w[i] * v : v;
		}
	}
}

// In place: each group of `group` values scaled to unit L2 norm times
// scale, x / sqrt(Σx² + eps) · scale.
KERNEL void tandem_l2norm_groups(float* x, long long ngroups, int group, float eps, float scale) {
	SHARED float scratch[32];
	for (long long g = block_x(); g < ngroups; g += grid_dim_x()) {
		float* xs = x + g * group;
		float ss = 0;
		for (int i = thread_x(); i < group; i += block_dim_x()) ss += xs[i] * xs[i];
		ss = block_sum(ss, scratch);
		float inv = 1.0f / sqrt_rn(ss + eps) * scale;
#ifdef PLANTED_BUG
		if (g == ngroups - 1) inv = scale;
#endif
		for (int i = thread_x(); i < group; i += block_dim_x()) xs[i] *= inv;
	}
}

#define ATTNRES_MAX_SOURCES 64

// Attention Residuals mix per row r of [rows, cols]: with nsrc source
// tensors (device pointers in `sources`), score_j = Σ (v_j/rms(v_j)) ⊙ proj
// = (v_j·proj)/sqrt(mean(v_j²) + eps), and dst[r] = Σ_j softmax(score)_j · v_j[r]
// summed in j order. nsrc ≤ 64.
KERNEL void tandem_attnres_mix(float* dst, const u64* sources, int nsrc, const float* proj, long long rows, int cols, float eps) {
	SHARED float scratch[32];
	SHARED float wts[ATTNRES_MAX_SOURCES];
	if (nsrc < 1 || nsrc > ATTNRES_MAX_SOURCES) { // a launcher slip: NaN rather than overflowing wts
		for (long long r = block_x(); r < rows; r += grid_dim_x())
			for (int i = thread_x(); i < cols; i += block_dim_x()) dst[r * cols + i] = f32_nan();
		return;
	}
	for (long long r = block_x(); r < rows; r += grid_dim_x()) {
		float mx = -f32_inf();
		for (int j = 0; j < nsrc; j++) {
			const float* v = (const float*)sources[j] + r * cols;
			float ss = 0, sp = 0;
			for (int i = thread_x(); i < cols; i += block_dim_x()) {
				ss += v[i] * v[i];
				sp += v[i] * proj[i];
			}
			ss = block_sum(ss, scratch);
			sp = block_sum(sp, scratch);
			float s = sp / sqrt_rn(ss / (float)cols + eps);
			if (thread_x() == 0) wts[j] = s;
			mx = s > mx ? s : mx;
		}
		sync_threads();
		if (thread_x() == 0) {
			float sum = 0;
			for (int j = 0; j < nsrc; j++) {
				wts[j] = dev_exp(wts[j] - mx);
				sum += wts[j];
			}
			for (int j = 0; j < nsrc; j++) wts[j] /= sum;
#ifdef PLANTED_BUG
			wts[0] = 1.0f - wts[0];
#endif
		}
		sync_threads();
		for (int i = thread_x(); i < cols; i += block_dim_x()) {
			float acc = 0;
			for (int j = 0; j < nsrc; j++) acc += wts[j] * ((const float*)sources[j])[r * cols + i];
			dst[r * cols + i] = acc;
		}
		sync_threads();
	}
}
