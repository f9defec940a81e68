// cuemu.h: runs tandem's CUDA kernels (kernels/cuda/src/*.cu, compiled as
// C++20 with -DCUEMU) on CPU threads, to check them without a GPU.
//
// One std::thread per CUDA thread of a block; the block's threads run the
// grid's blocks in turn (x fastest, then y, then z), so SHARED is a static
// (one copy shared by the block's threads) and an end-of-block barrier keeps
// a fast thread from starting the next block while others still read the
// shared memory of this one. sync_threads is a std::barrier of the block;
// warp collectives (shuffles, mma.sync) go through a per-warp exchange
// buffer between two arrivals at a per-warp barrier, so every lane must take
// part, as on the device (the kernels only call them converged).
//
// mma_bf16_16816 gathers the warp's A, B and C fragments and computes each
// lane's D elements from the PTX ISA's m16n8k16 layout (prelude.cuh), with
// the exact products summed in double and rounded once: a kernel that
// misplaces a fragment element gets wrong numbers here as on the device.
// What it cannot catch is a misreading of the ISA that this file and the
// kernel share, and anything of the PTX text itself (the driver's JIT
// checks that when a GPU loads it).
#pragma once

#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define KERNEL extern "C"
#define DEVICE static inline
#define SHARED static
#define UNROLL

namespace cuemu {

struct Dim3 {
	unsigned x = 1, y = 1, z = 1;
};

struct Lane {
	uint32_t v[10];
};

// Warp collectives exchange through two buffers used in turn, so one
// barrier arrival per collective suffices: a lane writes buffer b only after
// passing the barrier of the collective that used the other buffer, which
// every lane reaches only after reading b the time before.
struct Warp {
	std::barrier<> bar{32};
	Lane lane[2][32];
	unsigned turn[32] = {};
	Lane* exchange(unsigned l) { return lane[turn[l]++ & 1]; }
};

struct Launch {
	Dim3 grid, block;
	std::barrier<> bar;
	std::vector<std::unique_ptr<Warp>> warps;
	Launch(Dim3 g, Dim3 b, unsigned n) : grid(g), block(b), bar(n) {}
};

inline Launch* current;
inline thread_local unsigned tid[3], bid[3], lin;

inline Warp& my_warp() { return *current->warps[lin / 32]; }

// launch runs body (a call of one kernel) over the grid. Block sizes must be
// a whole number of warps.
inline void launch(Dim3 grid, Dim3 block, const std::function<void()>& body) {
	unsigned n = block.x * block.y * block.z;
	if (n == 0 || n % 32 != 0 || n > 1024) {
		std::fprintf(stderr, "cuemu: block of %u threads (want a multiple of 32, at most 1024)\n", n);
		std::exit(3);
	}
	Launch l(grid, block, n);
	for (unsigned w = 0; w < n / 32; w++) l.warps.push_back(std::make_unique<Warp>());
	current = &l;
	std::vector<std::thread> ts;
	ts.reserve(n);
	for (unsigned t = 0; t < n; t++) {
		ts.emplace_back([&l, &body, t] {
			lin = t;
			tid[0] = t % l.block.x;
			tid[1] = t / l.block.x % l.block.y;
			tid[2] = t / (l.block.x * l.block.y);
			for (unsigned z = 0; z < l.grid.z; z++)
				for (unsigned y = 0; y < l.grid.y; y++)
					for (unsigned x = 0; x < l.grid.x; x++) {
						bid[0] = x, bid[1] = y, bid[2] = z;
						body();
						l.bar.arrive_and_wait();
					}
		});
	}
	for (auto& t : ts) t.join();
	current = nullptr;
}

} // namespace cuemu

DEVICE int thread_x() { return (int)cuemu::tid[0]; }
DEVICE int thread_y() { return (int)cuemu::tid[1]; }
DEVICE int block_x() { return (int)cuemu::bid[0]; }
DEVICE int block_y() { return (int)cuemu::bid[1]; }
DEVICE int block_z() { return (int)cuemu::bid[2]; }
DEVICE int block_dim_x() { return (int)cuemu::current->block.x; }
DEVICE int grid_dim_x() { return (int)cuemu::current->grid.x; }
DEVICE int grid_dim_y() { return (int)cuemu::current->grid.y; }

DEVICE void sync_threads() { cuemu::current->bar.arrive_and_wait(); }

DEVICE float f32_from_bits(uint32_t u) { return std::bit_cast<float>(u); }
DEVICE uint32_t bits_from_f32(float f) { return std::bit_cast<uint32_t>(f); }

DEVICE float ex2_approx(float x) { return std::exp2(x); }
DEVICE float sqrt_rn(float x) { return std::sqrt(x); }

// shfl_xor32 exchanges one 32-bit value across the warp.
DEVICE uint32_t cuemu_shfl_xor32(uint32_t v, int lane_mask) {
	cuemu::Warp& w = cuemu::my_warp();
	unsigned lane = cuemu::lin % 32;
	cuemu::Lane* x = w.exchange(lane);
	x[lane].v[0] = v;
	w.bar.arrive_and_wait();
	return x[(lane ^ (unsigned)lane_mask) & 31].v[0];
}
DEVICE float shfl_xor_f32(float v, int m) { return std::bit_cast<float>(cuemu_shfl_xor32(std::bit_cast<uint32_t>(v), m)); }
DEVICE int shfl_xor_i32(int v, int m) { return (int)cuemu_shfl_xor32((uint32_t)v, m); }

DEVICE void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
	cuemu::Warp& w = cuemu::my_warp();
	unsigned lane = cuemu::lin % 32;
	cuemu::Lane* x = w.exchange(lane);
	uint32_t* me = x[lane].v;
	for (int i = 0; i < 4; i++) me[i] = a[i];
	me[4] = b[0], me[5] = b[1];
	for (int i = 0; i < 4; i++) me[6 + i] = std::bit_cast<uint32_t>(d[i]);
	w.bar.arrive_and_wait();
	auto half = [](uint32_t r, unsigned hi) { return std::bit_cast<float>((hi ? r >> 16 : r & 0xffffu) << 16); };
	// A[row][k]: lane (row%8)*4 + (k%8)/2, register (row>=8) + 2(k>=8).
	auto A = [&](unsigned row, unsigned k) {
		return half(x[(row % 8) * 4 + (k % 8) / 2].v[(row >= 8) + 2 * (k >= 8)], k % 2);
	};
	// B[k][col]: lane col*4 + (k%8)/2, register 4 + (k>=8).
	auto B = [&](unsigned k, unsigned col) { return half(x[col * 4 + (k % 8) / 2].v[4 + (k >= 8)], k % 2); };
	unsigned g = lane / 4, t = lane % 4;
	for (int i = 0; i < 4; i++) {
		unsigned row = g + 8 * (i >= 2), col = 2 * t + (i & 1);
		double s = 0;
		for (unsigned k = 0; k < 16; k++) s += (double)A(row, k) * (double)B(k, col);
		d[i] = (float)((double)std::bit_cast<float>(me[6 + i]) + s);
	}
}
