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

// Scalar numerics shared with the Metal kernels: DEVICE, GMEM (the address
// space of global pointers: none in CUDA) and i64 are this dialect's.
#define GMEM
typedef long long i64;
#include "../../internal/kernelsrc/numerics.h"

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
