// prelude.metal: what every tandem Metal kernel may use, defined twice:
//   - on a Mac, Metal's own names (the Go backend compiles this file, the
//     shared numerics and the kernel files as one library at run time with
//     fast math off);
//   - in the host emulator (-DMETALEMU, kernels/metal/emu/metalemu.h), the
//     same names on CPU fibers.
// Kernels use only: the address spaces (device, constant, threadgroup,
// thread), TG(i) for a [[threadgroup(i)]] argument, KPOS for their position
// arguments, threadgroup_barrier, simd_sum/simd_max/simd_shuffle_xor/
// simd_broadcast (SIMD width 32), and the helpers below and in numerics.h.
// That keeps the emulator honest: it implements every primitive a kernel
// can reach.
#pragma once

#ifdef METALEMU
#include "../emu/metalemu.h"
#else
#include <metal_stdlib>
using namespace metal;

#define TG(i) [[threadgroup(i)]]
// Every kernel ends its arguments with these: threadgroup position and
// count, the thread's index and the threadgroup's size, its SIMD lane and
// SIMD-group.
#define KPOS                                                                                   \
	uint3 tgp [[threadgroup_position_in_grid]], uint3 ntg [[threadgroups_per_grid]],           \
	    uint tid [[thread_index_in_threadgroup]], uint3 tsz [[threads_per_threadgroup]],       \
	    uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]]

#define DEVICE static inline
#define GMEM device
typedef uchar u8;
typedef ushort u16;
typedef uint u32;
typedef long i64;

DEVICE float f32_from_bits(u32 u) { return as_type<float>(u); }
DEVICE u32 bits_from_f32(float f) { return as_type<u32>(f); }
DEVICE float ex2_approx(float x) { return precise::exp2(x); }
DEVICE float sqrt_rn(float x) { return precise::sqrt(x); }
#endif

#define SIMD 32

#include "../../internal/kernelsrc/numerics.h"

// Sum over the threadgroup (a whole number of SIMD-groups, at most 1024
// threads), the same value in every thread. scratch is 32 floats of
// threadgroup memory; the function synchronises before returning so that
// scratch can be reused at once.
DEVICE float tg_sum(float v, threadgroup float* scratch, uint tid, uint nthreads) {
	uint lane = tid % SIMD, w = tid / SIMD, nw = nthreads / SIMD;
	v = simd_sum(v);
	if (lane == 0) scratch[w] = v;
	threadgroup_barrier(mem_flags::mem_threadgroup);
	float t = lane < nw ? scratch[lane] : 0.0f;
	t = simd_sum(t);
	threadgroup_barrier(mem_flags::mem_threadgroup);
	return t;
}

// planted reports whether the emulator's planted-bug build has this
// kernel's bug switched on (TANDEM_PLANT names the kernel): each check must
// catch its kernel's bug alone. Always false on a Mac.
#if defined(METALEMU) && defined(PLANTED_BUG)
DEVICE bool planted(const char* name) {
	const char* p = std::getenv("TANDEM_PLANT");
	return p && std::strcmp(p, name) == 0;
}
#else
#define planted(name) false
#endif
