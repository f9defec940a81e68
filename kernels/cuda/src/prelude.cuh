// prelude.cuh: the restricted CUDA C dialect tandem's kernels are written in.
//
// No CUDA headers: clang compiles the kernels with -nocudainc -nocudalib, so
// everything a kernel may use is defined here, twice where it must be:
//   - for the device (clang -x cuda --cuda-device-only): NVVM builtins, and
//     inline PTX in exactly one wrapper (mma_bf16_16816);
//   - for the host emulator (-DCUEMU, kernels/cuda/emu/cuemu.h): the same
//     names on CPU threads.
// Kernels use only: KERNEL, DEVICE, SHARED, thread_x/y, block_x/y/z,
// block_dim_x, grid_dim_x/y, sync_threads, shfl_xor_f32/_i32,
// mma_bf16_16816, and the portable helpers below. That keeps the emulator
// honest: it implements every primitive a kernel can reach.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifdef CUEMU
#include "../emu/cuemu.h"
#else

#define KERNEL extern "C" __attribute__((global))
#define DEVICE static __attribute__((device)) inline
#define SHARED __attribute__((shared))

DEVICE int thread_x() { return (int)__nvvm_read_ptx_sreg_tid_x(); }
DEVICE int thread_y() { return (int)__nvvm_read_ptx_sreg_tid_y(); }
DEVICE int block_x() { return (int)__nvvm_read_ptx_sreg_ctaid_x(); }
DEVICE int block_y() { return (int)__nvvm_read_ptx_sreg_ctaid_y(); }
DEVICE int block_z() { return (int)__nvvm_read_ptx_sreg_ctaid_z(); }
DEVICE int block_dim_x() { return (int)__nvvm_read_ptx_sreg_ntid_x(); }
DEVICE int grid_dim_x() { return (int)__nvvm_read_ptx_sreg_nctaid_x(); }
DEVICE int grid_dim_y() { return (int)__nvvm_read_ptx_sreg_nctaid_y(); }

DEVICE void sync_threads() { __syncthreads(); }

// Full unrolling of a loop with a constant trip count (keeps register
// arrays such as mma fragments out of local memory).
#define UNROLL _Pragma("unroll")

// Butterfly shuffles over a full warp (every kernel calls them with all 32
// lanes converged).
DEVICE float shfl_xor_f32(float v, int lane_mask) {
	return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, lane_mask, 31);
}
DEVICE int shfl_xor_i32(int v, int lane_mask) {
	return __nvvm_shfl_sync_bfly_i32(0xffffffffu, v, lane_mask, 31);
}

DEVICE float f32_from_bits(u32 u) { return __builtin_bit_cast(float, u); }
DEVICE u32 bits_from_f32(float f) { return __builtin_bit_cast(u32, f); }

// 2^x (ex2.approx.f32: ~2 ulp), IEEE square root.
DEVICE float ex2_approx(float x) { return __nvvm_ex2_approx_f(x); }
DEVICE float sqrt_rn(float x) { return __nvvm_sqrt_rn_f(x); }

// D = A·B + D for one warp: A 16x16 bf16 row-major, B 16x8 bf16 column-major,
// D 16x8 fp32, in the PTX ISA's m16n8k16 fragment layout (g = lane/4,
// t = lane%4; the lower half of each b32 holds the lower column/row index):
//   a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]
//   a[2] = A[g][2t+8..+9]   a[3] = A[g+8][2t+8..+9]
//   b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..+9][g]
//   d[0] = D[g][2t] d[1] = D[g][2t+1] d[2] = D[g+8][2t] d[3] = D[g+8][2t+1]
DEVICE void mma_bf16_16816(float d[4], const u32 a[4], const u32 b[2]) {
	asm volatile(
	    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
	    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#endif // CUEMU

// ---- portable helpers (the same code on the device and in the emulator) ----

#define WARP 32

DEVICE float f32_nan() { return f32_from_bits(0x7fc00000u); }
DEVICE float f32_inf() { return f32_from_bits(0x7f800000u); }

// 2^n for an exponent in the normal range.
DEVICE float exp2i(int n) { return f32_from_bits((u32)(n + 127) << 23); }

DEVICE float dev_exp(float x) { return ex2_approx(x * 1.44269504088896341f); }

DEVICE float dev_sigmoid(float x) { return 1.0f / (1.0f + dev_exp(-x)); }

// tanh: an odd Taylor polynomial near 0 (where 1-e^{-2|x|} would cancel),
// (1-e)/(1+e) with e = e^{-2|x|} elsewhere.
DEVICE float dev_tanh(float x) {
	float a = x < 0 ? -x : x;
	float r;
	if (a < 0.0625f) {
		float a2 = a * a;
		r = a * (1.0f + a2 * (-1.0f / 3 + a2 * (2.0f / 15 + a2 * (-17.0f / 315))));
	} else {
		float e = dev_exp(-2.0f * a);
		r = (1.0f - e) / (1.0f + e);
	}
	return x < 0 ? -r : r;
}

// bf16: widen exactly; narrow with round-to-nearest-even (NaN stays NaN).
DEVICE float bf16_to_f32(u16 h) { return f32_from_bits((u32)h << 16); }
DEVICE u16 f32_to_bf16(float f) {
	u32 u = bits_from_f32(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
	return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
DEVICE u32 pack_bf16x2(float lo, float hi) {
	return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

DEVICE float f16_to_f32(u16 h) {
	u32 s = (u32)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
	if (e == 31) return f32_from_bits(s | 0x7f800000u | (m << 13));
	if (e == 0) {
		float v = (float)m * exp2i(-24);
		return s ? -v : v;
	}
	return f32_from_bits(s | ((e + 112) << 23) | (m << 13));
}

// OCP MX element and scale codes (kernels.Format, mxfp): E8M0 255 is NaN,
// 0 is 2^-127; E2M1 low nibble = even column; E4M3 "FN" has no infinities.
DEVICE float e8m0_scale(u32 s) {
	if (s == 255) return f32_nan();
	if (s == 0) return f32_from_bits(1u << 22);
	return f32_from_bits(s << 23);
}
DEVICE float e2m1_value(u32 code) {
	u32 e = (code >> 1) & 3, m = code & 1;
	float v = e == 0 ? 0.5f * (float)m : (float)(2 + m) * exp2i((int)e - 2);
	return (code & 8) ? -v : v;
}
DEVICE float e4m3_value(u32 b) {
	u32 e = (b >> 3) & 15, m = b & 7;
	float v;
	if (e == 15 && m == 7) v = f32_nan();
	else if (e == 0) v = (float)m * exp2i(-9);
	else v = (float)(8 + m) * exp2i((int)e - 10);
	return (b & 0x80) ? -v : v;
}
DEVICE float e5m2_value(u32 b) {
	u32 e = (b >> 2) & 31, m = b & 3;
	float v;
	if (e == 31) v = m == 0 ? f32_inf() : f32_nan();
	else if (e == 0) v = (float)m * exp2i(-16);
	else v = (float)(4 + m) * exp2i((int)e - 17);
	return (b & 0x80) ? -v : v;
}

// Weight storage formats: the values of kernels.Format.
enum { FMT_F32 = 1, FMT_BF16 = 2, FMT_F16 = 3, FMT_MXFP4 = 4, FMT_MXFP8E4M3 = 5, FMT_MXFP8E5M2 = 6 };

// weight_at decodes element (r, c) of a [rows, cols] weight exactly to fp32
// (MX: element value times its block's power-of-two scale).
DEVICE float weight_at(const u8* data, const u8* scales, int fmt, int cols, int r, int c) {
	long long i = (long long)r * cols + c;
	switch (fmt) {
	case FMT_F32:
		return ((const float*)data)[i];
	case FMT_BF16:
		return bf16_to_f32(((const u16*)data)[i]);
	case FMT_F16:
		return f16_to_f32(((const u16*)data)[i]);
	}
	float s = e8m0_scale(scales[(long long)r * (cols / 32) + c / 32]);
	switch (fmt) {
	case FMT_MXFP4: {
		u32 b = data[i >> 1];
		return e2m1_value((c & 1) ? b >> 4 : b & 15) * s;
	}
	case FMT_MXFP8E4M3:
		return e4m3_value(data[i]) * s;
	case FMT_MXFP8E5M2:
		return e5m2_value(data[i]) * s;
	}
	return f32_nan();
}

// Sum over a warp, the same value in every lane.
DEVICE float warp_sum(float v) {
	for (int m = 16; m > 0; m >>= 1) v += shfl_xor_f32(v, m);
	return v;
}
DEVICE float warp_max(float v) {
	for (int m = 16; m > 0; m >>= 1) {
		float o = shfl_xor_f32(v, m);
		v = o > v ? o : v;
	}
	return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), the same
// value in every thread. scratch holds 32 floats of shared memory; the
// function synchronises before returning so scratch can be reused at once.
DEVICE float block_sum(float v, float* scratch) {
	int lane = thread_x() & 31, w = thread_x() >> 5, nw = block_dim_x() >> 5;
	v = warp_sum(v);
	if (lane == 0) scratch[w] = v;
	sync_threads();
	float t = lane < nw ? scratch[lane] : 0.0f;
	t = warp_sum(t);
	sync_threads();
	return t;
}
