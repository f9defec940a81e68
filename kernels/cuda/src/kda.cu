// Kimi Delta Attention: the gated delta rule in its chunked (UT/WY) form
// (K3 spec §3.3), one block per head, the same steps as kernels/cpu's
// chunked KDA in fp32:
//   Γ = inclusive cumsum of the log decay g within the chunk;
//   L[i,j] = β_i Σ_c k_i k_j e^{Γi−Γj} (j < i),  A[i,j] = Σ_c q_i k_j e^{Γi−Γj} (j ≤ i);
//   W = (I+L)⁻¹ diag(β)(K⊙e^Γ),  U = (I+L)⁻¹ diag(β)V  (forward substitution);
//   Ṽ = U − W S;  O = (Q⊙e^Γ) S + A Ṽ;
//   S ← diag(e^{Γ_C}) S + Σ_i (k_i ⊙ e^{Γ_C−Γ_i}) Ṽ_iᵀ.
// e^{±Γ} are formed in fp32: |Γ| ≤ chunk·|lower bound| must stay below 88
// (16 × 5 = 80 for K3).
//
// The state S [dk, dv] of the head stays in global memory (the caller's
// state buffer, fp32): thread j owns column j of S, Ṽ and O, so the state
// update needs no shared copy and no synchronisation; the per-chunk
// operands (K⊙e^{±Γ}, Q⊙e^Γ, L, A, W, U) are in shared memory (~42 KB).
#include "prelude.cuh"

#define KDA_MAX_C 16
#define KDA_MAX_DK 128
#define KDA_MAX_DV 128

// q, k, g [*, heads·dk]; v, o [*, heads·dv]; beta [*, heads]; the span is
// rows [lo, lo+n); S [heads, dk, dv]. chunk in 1..16, dk and dv ≤ 128.
// Grid (heads), block 128.
KERNEL void tandem_kda_chunked(float* o, const float* q, const float* k, const float* v, const float* g, const float* beta,
                               long long lo, long long n, float* S, int heads, int dk, int dv, int chunk) {
	SHARED float kp[KDA_MAX_C][KDA_MAX_DK];
	SHARED float kn[KDA_MAX_C][KDA_MAX_DK];
	SHARED float qp[KDA_MAX_C][KDA_MAX_DK];
	SHARED float W[KDA_MAX_C][KDA_MAX_DK];
	SHARED float U[KDA_MAX_C][KDA_MAX_DV];
	SHARED float L[KDA_MAX_C][KDA_MAX_C + 1];
	SHARED float A[KDA_MAX_C][KDA_MAX_C + 1];
	SHARED float decay[KDA_MAX_DK];
	SHARED float bet[KDA_MAX_C];
	int h = block_x(), tid = thread_x(), bd = block_dim_x();
	long long qs = (long long)heads * dk, vs = (long long)heads * dv;
	float* Sh = S + (long long)h * dk * dv;
	// Guards against a launcher slip, not part of the math: any chunk is the
	// same function (clamped to what shared memory holds); heads wider than
	// the shared arrays get NaN outputs and an untouched state rather than
	// out-of-bounds writes.
	if (chunk > KDA_MAX_C) chunk = KDA_MAX_C;
	if (chunk < 1) chunk = 1;
	if (dk > KDA_MAX_DK || dv > KDA_MAX_DV) {
		for (long long i = 0; i < n; i++)
			for (int c = tid; c < dv; c += bd) o[(lo + i) * vs + (long long)h * dv + c] = f32_nan();
		return;
	}
	for (long long c0 = lo; c0 < lo + n; c0 += chunk) {
		int nc = (int)(lo + n - c0 < chunk ? lo + n - c0 : chunk);
		for (int c = tid; c < dk; c += bd) {
			float G = 0;
			for (int i = 0; i < nc; i++) {
				long long row = (c0 + i) * qs + (long long)h * dk + c;
				G += g[row];
				float e = dev_exp(G), ei = dev_exp(-G);
				kp[i][c] = k[row] * e;
				kn[i][c] = k[row] * ei;
				qp[i][c] = q[row] * e;
			}
			decay[c] = dev_exp(G);
		}
		for (int i = tid; i < nc; i += bd) bet[i] = beta[(c0 + i) * heads + h];
		sync_threads();
		for (int pr = tid; pr < nc * nc; pr += bd) {
			int i = pr / nc, j = pr % nc;
			float sl = 0, sa = 0;
			if (j <= i) {
				for (int c = 0; c < dk; c++) {
					sl += kp[i][c] * kn[j][c];
					sa += qp[i][c] * kn[j][c];
				}
			}
			L[i][j] = j < i ? bet[i] * sl : 0;
			A[i][j] = sa;
		}
		sync_threads();
		// Forward substitution, one column per thread (rows depend only on
		// earlier rows of the same column).
		for (int c = tid; c < dk; c += bd)
			for (int i = 0; i < nc; i++) {
				float w = bet[i] * kp[i][c];
				for (int j = 0; j < i; j++) w -= L[i][j] * W[j][c];
				W[i][c] = w;
			}
		for (int c = tid; c < dv; c += bd)
			for (int i = 0; i < nc; i++) {
				float u = bet[i] * v[(c0 + i) * vs + (long long)h * dv + c];
#ifdef PLANTED_BUG
				for (int j = 0; j + 1 < i; j++) u -= L[i][j] * U[j][c];
#else
				for (int j = 0; j < i; j++) u -= L[i][j] * U[j][c];
#endif
				U[i][c] = u;
			}
		sync_threads(); // W is read across columns below
		for (int jv = tid; jv < dv; jv += bd) {
			for (int i = 0; i < nc; i++) {
				float u = U[i][jv];
				for (int c = 0; c < dk; c++) u -= W[i][c] * Sh[(long long)c * dv + jv];
				U[i][jv] = u;
			}
			for (int i = 0; i < nc; i++) {
				float acc = 0;
				for (int c = 0; c < dk; c++) acc += qp[i][c] * Sh[(long long)c * dv + jv];
				for (int m = 0; m <= i; m++) acc += A[i][m] * U[m][jv];
				o[(c0 + i) * vs + (long long)h * dv + jv] = acc;
			}
			for (int c = 0; c < dk; c++) {
				float s = Sh[(long long)c * dv + jv] * decay[c];
				for (int i = 0; i < nc; i++) s += kn[i][c] * decay[c] * U[i][jv];
				Sh[(long long)c * dv + jv] = s;
			}
		}
		sync_threads(); // the next chunk overwrites the shared operands
	}
}
