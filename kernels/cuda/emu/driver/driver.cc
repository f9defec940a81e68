// driver.cc: runs one kernel (or a short chain of kernels, launched as the
// Go backend launches them) in the host emulator on inputs from stdin and
// writes the outputs to stdout. The Go test (kernels/cuda/emu) builds it
// with -DCUEMU (and once more with -DPLANTED_BUG) and compares the outputs
// with kernels/cpu.
//
// The protocol is kernels/internal/emuharness's (driverio.h). Launch geometry follows kernels/cuda/src/ABI.md; grids are
// deliberately small where a kernel strides, so the stride loops run.
#include "../../src/prelude.cuh"

#include "../../src/conv.cu"
#include "../../src/elementwise.cu"
#include "../../src/gemm.cu"
#include "../../src/kda.cu"
#include "../../src/mla.cu"
#include "../../src/norm.cu"
#include "../../src/router.cu"

#include "../../../internal/emuharness/driverio.h"

#include <algorithm>

namespace {

using driverio::fail;
using driverio::Req;

unsigned cdiv(long long a, long long b) { return (unsigned)((a + b - 1) / b); }

// Elementwise launches: 128 threads, at most 4 blocks (the stride loops run).
cuemu::Dim3 ew_grid(long long n) { return {std::max(1u, std::min(cdiv(n, 128), 4u)), 1, 1}; }
const cuemu::Dim3 ew_block{128, 1, 1};

size_t weight_bytes(int fmt, long long rows, long long cols) {
	switch (fmt) {
	case FMT_F32: return 4 * rows * cols;
	case FMT_BF16:
	case FMT_F16: return 2 * rows * cols;
	case FMT_MXFP4: return rows * cols / 2;
	case FMT_MXFP8E4M3:
	case FMT_MXFP8E5M2: return rows * cols;
	}
	fail("unknown format " + std::to_string(fmt));
}
size_t scale_bytes(int fmt, long long rows, long long cols) {
	return fmt >= FMT_MXFP4 ? rows * cols / 32 : 0;
}

void gemm(const std::string& kind, float* y, const float* x, long long T, int O, int I, const u8* w, const u8* ws, int fmt) {
	if (kind == "f32")
		cuemu::launch({cdiv(O, 16), cdiv(T, 16), 1}, {256, 1, 1}, [&] { tandem_gemm_f32(y, x, T, O, I, w, ws, fmt); });
	else
		cuemu::launch({cdiv(O, 64), cdiv(T, 64), 1}, {128, 1, 1}, [&] { tandem_gemm_bf16(y, x, T, O, I, w, ws, fmt); });
}

void run(Req& r) {
	const std::string& op = r.op;
	if (op == "add") {
		long long n = r.i("n");
		float *a = r.in<float>("a", n), *b = r.in<float>("b", n), *d = r.make<float>("dst", n);
		cuemu::launch(ew_grid(n), ew_block, [&] { tandem_add(d, a, b, n); });
	} else if (op == "add_bias") {
		long long rows = r.i("rows");
		int cols = (int)r.i("cols");
		float *x = r.in<float>("x", rows * cols), *b = r.in<float>("bias", cols);
		cuemu::launch(ew_grid(rows * cols), ew_block, [&] { tandem_add_bias(x, b, rows, cols); });
		r.result("x");
	} else if (op == "sigmoid") {
		long long n = r.i("n");
		float* x = r.in<float>("x", n);
		cuemu::launch(ew_grid(n), ew_block, [&] { tandem_sigmoid(x, n); });
		r.result("x");
	} else if (op == "mul_sigmoid") {
		long long n = r.i("n");
		float *x = r.in<float>("x", n), *g = r.in<float>("gate", n);
		cuemu::launch(ew_grid(n), ew_block, [&] { tandem_mul_sigmoid(x, g, n); });
		r.result("x");
	} else if (op == "situ") {
		long long n = r.i("n");
		float *g = r.in<float>("g", n), *u = r.in<float>("u", n), *h = r.make<float>("h", n);
		float b1 = r.f("beta1"), b2 = r.f("beta2");
		cuemu::launch(ew_grid(n), ew_block, [&] { tandem_situ(h, g, u, n, b1, b2); });
	} else if (op == "kda_gate") {
		long long rows = r.i("rows");
		int cols = (int)r.i("cols"), hd = (int)r.i("head_dim");
		float* z = r.in<float>("z", rows * cols);
		float* al = r.in<float>("a_log", cols / hd);
		float lower = r.f("lower");
		cuemu::launch(ew_grid(rows * cols), ew_block, [&] { tandem_kda_gate(z, al, rows, cols, hd, lower); });
		r.result("z");
	} else if (op == "embed") {
		int fmt = (int)r.i("fmt"), vocab = (int)r.i("vocab"), cols = (int)r.i("cols");
		long long n = r.i("n");
		u8* t = r.in<u8>("table", weight_bytes(fmt, vocab, cols));
		u8* s = r.in<u8>("scales", scale_bytes(fmt, vocab, cols));
		int* ids = r.in<int>("ids", n);
		float* d = r.make<float>("dst", n * cols);
		cuemu::launch(ew_grid(n * cols), ew_block, [&] { tandem_embed(d, t, s, fmt, vocab, cols, ids, n); });
	} else if (op == "gemm") {
		long long T = r.i("T");
		int O = (int)r.i("O"), I = (int)r.i("I"), fmt = (int)r.i("fmt");
		float* x = r.in<float>("x", T * I);
		u8* w = r.in<u8>("w", weight_bytes(fmt, O, I));
		u8* ws = r.in<u8>("ws", scale_bytes(fmt, O, I));
		float* y = r.make<float>("y", T * O);
		gemm(r.i("f32") ? "f32" : "bf16", y, x, T, O, I, w, ws, fmt);
	} else if (op == "situ_mlp") {
		// The dense SiTU MLP as the backend runs it: gate and up projections,
		// the activation (in place in g), the down projection.
		long long T = r.i("T");
		int d = (int)r.i("d"), inter = (int)r.i("inter"), fmt = (int)r.i("fmt");
		float b1 = r.f("beta1"), b2 = r.f("beta2");
		float* x = r.in<float>("x", T * d);
		std::vector<float> g(T * inter), u(T * inter);
		size_t wb = weight_bytes(fmt, inter, d), sb = scale_bytes(fmt, inter, d);
		gemm("bf16", g.data(), x, T, inter, d, r.in<u8>("gate", wb), r.in<u8>("gate_s", sb), fmt);
		gemm("bf16", u.data(), x, T, inter, d, r.in<u8>("up", wb), r.in<u8>("up_s", sb), fmt);
		long long n = T * inter;
		cuemu::launch(ew_grid(n), ew_block, [&] { tandem_situ(g.data(), g.data(), u.data(), n, b1, b2); });
		float* y = r.make<float>("y", T * d);
		gemm("bf16", y, g.data(), T, d, inter, r.in<u8>("down", wb), r.in<u8>("down_s", sb), fmt);
	} else if (op == "routed_experts") {
		// Routed experts as the backend runs them. The host has grouped the
		// T·k (row, slot) pairs by expert: order[i] is the token row of
		// grouped row i, offs [G+1] the groups' bounds, pos [T·k] the grouped
		// row of each slot, and expert weights are concatenated per group.
		long long T = r.i("T");
		int k = (int)r.i("k"), lat = (int)r.i("lat"), inter = (int)r.i("inter"), G = (int)r.i("groups"), fmt = (int)r.i("fmt");
		int maxrows = (int)r.i("maxrows");
		float b1 = r.f("beta1"), b2 = r.f("beta2");
		long long N = T * k;
		float* z = r.in<float>("z", T * lat);
		int* order = r.in<int>("order", N);
		int* offs = r.in<int>("offs", G + 1);
		int* pos = r.in<int>("pos", N);
		float* wts = r.in<float>("weights", N);
		size_t wb1 = weight_bytes(fmt, inter, lat), sb1 = scale_bytes(fmt, inter, lat);
		size_t wb2 = weight_bytes(fmt, lat, inter), sb2 = scale_bytes(fmt, lat, inter);
		u8 *w1 = r.in<u8>("w1", G * wb1), *w3 = r.in<u8>("w3", G * wb1), *w2 = r.in<u8>("w2", G * wb2);
		u8 *s1 = r.in<u8>("s1", G * sb1), *s3 = r.in<u8>("s3", G * sb1), *s2 = r.in<u8>("s2", G * sb2);
		std::vector<u64> p1(G), p3(G), p2(G), q1(G), q3(G), q2(G);
		for (int e = 0; e < G; e++) {
			p1[e] = (u64)(w1 + e * wb1), p3[e] = (u64)(w3 + e * wb1), p2[e] = (u64)(w2 + e * wb2);
			q1[e] = (u64)(s1 + e * sb1), q3[e] = (u64)(s3 + e * sb1), q2[e] = (u64)(s2 + e * sb2);
		}
		std::vector<float> xg(N * lat), g(N * inter), u(N * inter), y(N * lat);
		cuemu::launch(ew_grid(N * lat), ew_block, [&] { tandem_gather_rows(xg.data(), z, order, N, lat); });
		cuemu::Dim3 g13{cdiv(inter, 64), cdiv(maxrows, 64), (unsigned)G}, g2{cdiv(lat, 64), cdiv(maxrows, 64), (unsigned)G};
		cuemu::launch(g13, {128, 1, 1}, [&] { tandem_gemm_bf16_grouped(g.data(), xg.data(), offs, p1.data(), q1.data(), fmt, inter, lat); });
		cuemu::launch(g13, {128, 1, 1}, [&] { tandem_gemm_bf16_grouped(u.data(), xg.data(), offs, p3.data(), q3.data(), fmt, inter, lat); });
		cuemu::launch(ew_grid(N * inter), ew_block, [&] { tandem_situ(g.data(), g.data(), u.data(), N * inter, b1, b2); });
		cuemu::launch(g2, {128, 1, 1}, [&] { tandem_gemm_bf16_grouped(y.data(), g.data(), offs, p2.data(), q2.data(), fmt, lat, inter); });
		float* out = r.make<float>("u", T * lat);
		cuemu::launch(ew_grid(T * lat), ew_block, [&] { tandem_moe_combine(out, y.data(), pos, wts, T, k, lat); });
	} else if (op == "rmsnorm") {
		long long ng = r.i("ngroups");
		int group = (int)r.i("group");
		float* x = r.in<float>("x", ng * group);
		float* w = r.i("has_w") ? r.in<float>("w", group) : nullptr;
		float eps = r.f("eps");
		float* d = r.make<float>("dst", ng * group);
		cuemu::launch({(unsigned)std::min(ng, 8LL), 1, 1}, {128, 1, 1}, [&] { tandem_rmsnorm(d, x, w, ng, group, eps); });
	} else if (op == "l2norm_groups") {
		long long ng = r.i("ngroups");
		int group = (int)r.i("group");
		float* x = r.in<float>("x", ng * group);
		float eps = r.f("eps"), scale = r.f("scale");
		cuemu::launch({(unsigned)std::min(ng, 8LL), 1, 1}, {128, 1, 1}, [&] { tandem_l2norm_groups(x, ng, group, eps, scale); });
		r.result("x");
	} else if (op == "attnres_mix") {
		int nsrc = (int)r.i("nsrc"), cols = (int)r.i("cols");
		long long rows = r.i("rows");
		float* src = r.in<float>("src", nsrc * rows * cols);
		float* proj = r.in<float>("proj", cols);
		std::vector<u64> ptrs(nsrc);
		for (int j = 0; j < nsrc; j++) ptrs[j] = (u64)(src + j * rows * cols);
		float eps = r.f("eps");
		float* d = r.make<float>("dst", rows * cols);
		cuemu::launch({(unsigned)std::min(rows, 8LL), 1, 1}, {128, 1, 1}, [&] { tandem_attnres_mix(d, ptrs.data(), nsrc, proj, rows, cols, eps); });
	} else if (op == "short_conv_silu") {
		long long rows = r.i("rows"), lo = r.i("lo"), n = r.i("n");
		int P = (int)r.i("P"), K = (int)r.i("K");
		float* x = r.in<float>("x", rows * P);
		float* w = r.in<float>("w", (size_t)P * K);
		float* tail = r.in<float>("tail", (size_t)P * (K - 1));
		// In place, as the model calls it (dst = x).
		cuemu::launch({std::max(1u, std::min(cdiv(P, 128), 2u)), 1, 1}, {128, 1, 1}, [&] { tandem_short_conv_silu(x, x, lo, n, P, w, K, tail); });
		r.result("x");
		r.result("tail");
	} else if (op == "router_topk") {
		long long rows = r.i("rows");
		int E = (int)r.i("E"), k = (int)r.i("k"), renorm = (int)r.i("renorm");
		float scale = r.f("scale");
		float *lg = r.in<float>("logits", rows * E), *b = r.in<float>("bias", E);
		int* ids = r.make<int>("ids", rows * k);
		float* w = r.make<float>("weights", rows * k);
		cuemu::launch({cdiv(rows, 4), 1, 1}, {128, 1, 1}, [&] { tandem_router_topk(lg, b, rows, E, k, renorm, scale, ids, w); });
	} else if (op == "kda") {
		long long rows = r.i("rows"), lo = r.i("lo"), n = r.i("n");
		int H = (int)r.i("heads"), dk = (int)r.i("dk"), dv = (int)r.i("dv"), chunk = (int)r.i("chunk");
		float *q = r.in<float>("q", rows * H * dk), *k = r.in<float>("k", rows * H * dk), *g = r.in<float>("g", rows * H * dk);
		float *v = r.in<float>("v", rows * H * dv), *beta = r.in<float>("beta", rows * H);
		float* S = r.in<float>("S", (size_t)H * dk * dv);
		float* o = r.make<float>("o", rows * H * dv);
		cuemu::launch({(unsigned)H, 1, 1}, {128, 1, 1}, [&] { tandem_kda_chunked(o, q, k, v, g, beta, lo, n, S, H, dk, dv, chunk); });
		r.result("S");
	} else if (op == "mla") {
		// Expanded MLA prefill as the backend runs it: split the cache,
		// expand K_nope and V with one GEMM, attend.
		long long rows = r.i("rows"), lo = r.i("lo"), n = r.i("n"), Tc = r.i("Tc");
		int H = (int)r.i("heads"), nope = (int)r.i("nope"), rope = (int)r.i("rope"), vdim = (int)r.i("vdim");
		int cols = (int)r.i("cols"), bf16 = (int)r.i("bf16"), fmt = (int)r.i("fmt");
		int lora = cols - rope, hw = nope + vdim;
		float scale = r.f("scale");
		float* q = r.in<float>("q", rows * H * (nope + rope));
		u8* cache = r.in<u8>("cache", (size_t)Tc * cols * (bf16 ? 2 : 4));
		u8* kvb = r.in<u8>("kvb", weight_bytes(fmt, (long long)H * hw, lora));
		u8* kvbs = r.in<u8>("kvb_s", scale_bytes(fmt, (long long)H * hw, lora));
		std::vector<float> ckv(Tc * lora), kpe(Tc * rope + 1), kv(Tc * H * hw);
		if (r.i("key_block") <= 0) {
			cuemu::launch(ew_grid(Tc * cols), ew_block, [&] { tandem_mla_split_cache(ckv.data(), kpe.data(), cache, bf16, Tc, cols, rope); });
			gemm("bf16", kv.data(), ckv.data(), Tc, H * hw, lora, kvb, kvbs, fmt);
		}
		float* o = r.make<float>("o", rows * H * vdim);
		long long kb = r.i("key_block");
		bool mma = r.i("mma") != 0;
		cuemu::Dim3 mgrid{cdiv(n, 64), (unsigned)H, 1};
		if (kb <= 0 && mma) {
			cuemu::launch(mgrid, {128, 1, 1}, [&] { tandem_mla_attn_mma(o, q, kv.data(), kpe.data(), lo, n, Tc, H, nope, rope, vdim, scale, 0, Tc, nullptr, 3); });
		} else if (kb <= 0) {
			cuemu::launch({(unsigned)n, (unsigned)H, 1}, {128, 1, 1}, [&] { tandem_mla_attn(o, q, kv.data(), kpe.data(), lo, n, Tc, H, nope, rope, vdim, scale); });
		} else {
			// Key blocks as a long cache needs them: expand rows [k0, k1)
			// only (the split and the GEMM over those cache rows) and carry
			// the softmax state between the launches.
			std::vector<float> state(n * H * (vdim + 2));
			std::vector<float> bkv(kb * H * hw);
			for (long long k0 = 0; k0 < Tc; k0 += kb) {
				long long k1 = std::min(Tc, k0 + kb), rb = k1 - k0;
				int flags = (k0 == 0 ? 1 : 0) | (k1 == Tc ? 2 : 0);
				const u8* crow = cache + k0 * cols * (bf16 ? 2 : 4);
				cuemu::launch(ew_grid(rb * cols), ew_block, [&] { tandem_mla_split_cache(ckv.data(), kpe.data(), crow, bf16, rb, cols, rope); });
				gemm("bf16", bkv.data(), ckv.data(), rb, H * hw, lora, kvb, kvbs, fmt);
				if (mma)
					cuemu::launch(mgrid, {128, 1, 1}, [&] {
						tandem_mla_attn_mma(o, q, bkv.data(), kpe.data(), lo, n, Tc, H, nope, rope, vdim, scale, k0, k1, state.data(), flags);
					});
				else
					cuemu::launch({(unsigned)n, (unsigned)H, 1}, {128, 1, 1}, [&] {
						tandem_mla_attn_block(o, q, bkv.data(), kpe.data(), lo, n, Tc, H, nope, rope, vdim, scale, k0, k1, state.data(), flags);
					});
			}
		}
	} else if (op == "copy_block") {
		// dst and src are one tensor [rows_total, cols_total] when "same" is
		// set (the overlapping moves), else two.
		long long R = r.i("R"), dr = r.i("dr"), sr = r.i("sr"), rows = r.i("rows");
		int C = (int)r.i("C"), dc = (int)r.i("dc"), sc = (int)r.i("sc"), cols = (int)r.i("cols"), ordered = (int)r.i("ordered");
		float* dst = r.in<float>("dst", R * C);
		float* src = r.i("same") ? dst : r.in<float>("src", R * C);
		cuemu::Dim3 grid = ordered ? cuemu::Dim3{1, 1, 1} : ew_grid(rows * cols);
		cuemu::launch(grid, ew_block, [&] { tandem_copy_block(dst, C, dr, dc, src, C, sr, sc, rows, cols, ordered); });
		r.result("dst");
	} else if (op == "write_latent") {
		long long rows = r.i("rows"), row = r.i("row"), src_row = r.i("src_row"), n = r.i("n");
		int cols = (int)r.i("cols"), bf16 = (int)r.i("bf16");
		u8* cache = r.in<u8>("cache", rows * cols * (bf16 ? 2 : 4));
		float* src = r.in<float>("src", rows * cols);
		cuemu::launch(ew_grid(n * cols), ew_block, [&] { tandem_write_latent(cache, bf16, row, cols, src, src_row, n); });
		r.result("cache");
	} else if (op == "dequant_bf16") {
		long long rows = r.i("rows");
		int cols = (int)r.i("cols"), fmt = (int)r.i("fmt");
		u8* w = r.in<u8>("w", weight_bytes(fmt, rows, cols));
		u8* ws = r.in<u8>("ws", scale_bytes(fmt, rows, cols));
		u16* d = r.make<u16>("dst", rows * cols);
		cuemu::launch(ew_grid(rows * cols), ew_block, [&] { tandem_dequant_bf16(d, w, ws, fmt, rows, cols); });
	} else {
		fail("unknown op " + op);
	}
}

} // namespace

int main() {
	Req r = driverio::read_req();
	run(r);
	driverio::write_out(r);
	return 0;
}
