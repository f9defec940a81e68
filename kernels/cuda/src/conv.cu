// KDA's short depthwise causal convolution followed by SiLU.
#include "prelude.cuh"

#define CONV_MAX_K 8

// For the rows [lo, lo+n) of x [*, P] (one sequence's span):
// y_t[c] = Σ_j w[c, j] · u_{t-K+1+j}[c] (j in order), dst_t[c] = y·σ(y),
// where inputs before the span come from tail [P, K-1] (oldest first), and
// tail is updated to the span's last K-1 inputs. One thread per channel
// walks the tokens in order with the window in registers, so dst may be x.
// K ≤ 8 (the host checks; K3 uses 4).
KERNEL void tandem_short_conv_silu(float* dst, const float* x, long long lo, long long n, int P, const float* w, int K, float* tail) {
	for (long long c = (long long)block_x() * block_dim_x() + thread_x(); c < P; c += (long long)grid_dim_x() * block_dim_x()) {
		float hist[CONV_MAX_K];
		if (K < 1 || K > CONV_MAX_K) { // a launcher slip: NaN rather than overflowing hist
			for (long long i = 0; i < n; i++) dst[(lo + i) * P + c] = f32_nan();
			continue;
		}
		for (int s = 0; s < K - 1; s++) hist[s] = tail[c * (K - 1) + s];
		for (long long i = 0; i < n; i++) {
			long long t = lo + i;
			float xv = x[t * P + c];
			float y = 0;
			for (int j = 0; j < K - 1; j++) y += w[c * K + j] * hist[j];
			y += w[c * K + K - 1] * xv;
			for (int s = 0; s + 1 < K - 1; s++) hist[s] = hist[s + 1];
			if (K > 1) hist[K - 2] = xv;
			dst[t * P + c] = y * dev_sigmoid(y);
		}
		for (int s = 0; s < K - 1; s++) {
#ifdef PLANTED_BUG
			tail[c * (K - 1) + s] = hist[K - 2 - s];
#else
			tail[c * (K - 1) + s] = hist[s];
#endif
		}
	}
}
