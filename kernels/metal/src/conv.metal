// KDA's short depthwise causal convolution followed by SiLU.
#include "prelude.metal"

#define CONV_MAX_K 8

struct ConvParams {
	uint lo, n, P, K;
};

// For rows [lo, lo+n) of x [*, P] (one sequence's span):
// y_t[c] = Σ_j w[c, j] · u_{t−K+1+j}[c] (j in order), dst_t[c] = y·σ(y),
// where inputs before the span come from tail [P, K−1] (oldest first), and
// tail becomes the span's last K−1 inputs. One thread per channel walks the
// tokens in order with the window in registers, so dst may be x.
// Threadgroups of 256, grid-stride over P. K ≤ 8 (the host checks; K3: 4).
kernel void tandem_short_conv_silu(device float* dst, device const float* x, device const float* w, device float* tail, constant ConvParams& p,
                                   KPOS) {
	uint K = p.K, P = p.P;
	for (long c = (long)tgp.x * tsz.x + tid; c < (long)P; c += (long)ntg.x * tsz.x) {
		float hist[CONV_MAX_K];
		if (K < 1 || K > CONV_MAX_K) { // a launcher slip: NaN rather than overflowing hist
			for (uint i = 0; i < p.n; i++) dst[(i64)(p.lo + i) * P + c] = f32_nan();
			continue;
		}
		for (uint s = 0; s + 1 < K; s++) hist[s] = tail[c * (K - 1) + s];
		for (uint i = 0; i < p.n; i++) {
			i64 t = p.lo + i;
			float xv = x[t * P + c];
			float y = 0;
			for (uint j = 0; j + 1 < K; j++) y += w[c * K + j] * hist[j];
			y += w[c * K + K - 1] * xv;
			for (uint s = 0; s + 2 < K; s++) hist[s] = hist[s + 1];
			if (K > 1) hist[K - 2] = xv;
			dst[t * P + c] = y * dev_sigmoid(y);
		}
		for (uint s = 0; s + 1 < K; s++) tail[c * (K - 1) + s] = hist[planted("tandem_short_conv_silu") ? K - 2 - s : s];
	}
}
