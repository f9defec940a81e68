// metalemu.h: runs tandem's Metal kernels (kernels/metal/src/*.metal,
// compiled as C++20 with -DMETALEMU) on the CPU, to check them without a
// Mac.
//
// A threadgroup's threads are fibers on one OS thread, switched
// only where a kernel synchronises: threadgroup_barrier and the SIMD-group
// collectives (simd_sum, simd_max, simd_shuffle_xor, simd_broadcast) at a
// SIMD width of 32. A fiber that reaches one parks until every thread it
// waits for has arrived, so the emulated threads run in lockstep at those
// points as on the GPU, and everything between them runs unsynchronised: a
// kernel that reads threadgroup memory another thread writes without a
// barrier between them gets whatever the schedule gives, and the schedule
// is round-robin, which a real GPU is not. Threadgroup memory (kernel
// arguments [[threadgroup(i)]]) is filled with NaN bytes before each
// threadgroup, so a read before any write shows. A barrier or collective
// that not every live thread of its group can reach (one returned early)
// is reported and the driver exits: on a GPU that is undefined behaviour.
//
// Threadgroups are spread over a few OS threads, each with its own fibers
// and threadgroup memory, in no fixed order.
//
// What it cannot check: MSL's own rules (address spaces, the compiler's
// acceptance of the source), Metal's math library's precision (the
// primitives here are the C library's), and timing. Those need a Mac.
#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <atomic>
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

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;

struct uint3 {
	uint x = 0, y = 0, z = 0;
};

namespace memu {

constexpr int kSimd = 32;
constexpr size_t kStack = 256 << 10;

[[noreturn]] inline void die(const char* what) {
	std::fprintf(stderr, "metalemu: %s\n", what);
	std::exit(3);
}

// Sync is one barrier: a count of parked threads and a generation that
// the last arrival advances.
struct Sync {
	int count = 0;
	unsigned gen = 0;
};

// A fiber starts once per dispatch and worker (setcontext) and is resumed
// with _longjmp after that: unlike swapcontext, that switch makes no
// system call, and the emulator switches at every collective.
struct Fiber {
	ucontext_t ctx;
	jmp_buf jb;
	char* stack = nullptr;
	bool started = false, done = false;
	unsigned turn = 0; // collectives taken, to pick an exchange buffer
};

// Launch describes a dispatch: threadgroups, threads per threadgroup and
// bytes of threadgroup memory.
struct Launch {
	uint3 groups, threads;
	size_t tgmem = 0;
};

struct Worker;
using Body = std::function<void(Worker&, uint)>;

// Worker is one OS thread running threadgroups one at a time with one
// fiber per thread; the fibers go from threadgroup to threadgroup through
// an end-of-threadgroup barrier whose last arrival takes the next one.
struct Worker {
	int n = 0, live = 0, parked = 0, cur = 0;
	std::vector<Fiber> f;
	jmp_buf main;
	Sync tg, end;
	std::vector<Sync> simd;           // per SIMD-group
	std::vector<uint64_t> ex[2];      // per SIMD-group exchange: 32 values
	std::vector<unsigned char> tgmem; // threadgroup memory
	const Body* body = nullptr;
	const Launch* launch = nullptr;
	std::atomic<long>* next = nullptr;
	long total = 0;
	bool finished = false;
};

inline thread_local Worker* W;
inline thread_local uint3 tg_pos;

// next_live returns the next live fiber after i (round-robin), or -1.
inline int next_live(Worker& w, int i) {
	for (int k = 1; k <= w.n; k++) {
		int j = (i + k) % w.n;
		if (!w.f[j].done) return j;
	}
	return -1;
}

[[noreturn]] inline void jump(Worker& w, int to) {
	w.cur = to;
	Fiber& f = w.f[to];
	if (f.started) _longjmp(f.jb, 1);
	f.started = true;
	setcontext(&f.ctx);
	die("setcontext failed");
}

inline void yield() {
	Worker& w = *W;
	int from = w.cur, to = next_live(w, from);
	if (to == from || to < 0) return;
	if (_setjmp(w.f[from].jb)) return; // resumed
	jump(w, to);
}

// wait parks the calling fiber at s until need fibers have arrived; the
// last arrival runs on_release first.
template <class F> void wait(Sync& s, int need, const char* what, F on_release) {
	Worker& w = *W;
	unsigned g = s.gen;
	if (++s.count == need) {
		s.count = 0;
		on_release();
		s.gen++;
		w.parked -= need - 1;
		return;
	}
	w.parked++;
	while (s.gen == g) {
		if (w.parked == w.live) die(what);
		yield();
	}
}
inline void wait(Sync& s, int need, const char* what) {
	wait(s, need, what, [] {});
}

// take starts the worker's next threadgroup, or marks the worker finished.
inline void take(Worker& w) {
	long g = w.next->fetch_add(1);
	if (g >= w.total) {
		w.finished = true;
		return;
	}
	const uint3& G = w.launch->groups;
	tg_pos = {(uint)(g % G.x), (uint)(g / G.x % G.y), (uint)(g / ((long)G.x * G.y))};
	std::memset(w.tgmem.data(), 0xff, w.tgmem.size()); // NaN: a read before a write shows
}

inline void fiber_main(int i) {
	Worker& w = *W;
	while (!w.finished) {
		(*w.body)(w, (uint)i);
		wait(w.end, w.n, "a barrier or SIMD collective waits for threads that have returned", [&w] { take(w); });
	}
	w.f[i].done = true;
	w.live--;
	if (w.live == 0) _longjmp(w.main, 1);
	jump(w, next_live(w, i));
}

// stack_pool returns worker wid's fiber stacks for n threads, kept for the
// driver's lifetime: a driver runs thousands of dispatches, and mapping and
// unmapping 256 stacks for each one would cost more than most kernels.
inline char* stack_pool(int wid, int n) {
	static std::vector<std::unique_ptr<char[]>> pool(8);
	static std::vector<int> have(8);
	if (have[wid] < n) {
		pool[wid].reset(new char[(size_t)n * kStack]);
		have[wid] = n;
	}
	return pool[wid].get();
}

// dispatch runs body(worker, thread index) for every thread of every
// threadgroup. Threadgroup sizes must be a whole number of SIMD-groups
// (tandem's dispatches always are) and at most 1024.
inline void dispatch(const Launch& l, const Body& body) {
	int n = (int)(l.threads.x * l.threads.y * l.threads.z);
	if (n <= 0 || n % kSimd != 0 || n > 1024) die("threadgroup size must be a multiple of 32, at most 1024");
	long total = (long)l.groups.x * l.groups.y * l.groups.z;
	std::atomic<long> next{0};
	int nw = (int)std::max(1L, std::min<long>(total, std::max(1u, std::min(4u, std::thread::hardware_concurrency())))); // ≤ 8: stack_pool's slots
	auto run = [&](int wid) {
		Worker w;
		W = &w;
		w.n = w.live = n;
		w.f = std::vector<Fiber>(n);
		w.simd.resize(n / kSimd);
		w.ex[0].resize(n), w.ex[1].resize(n);
		w.tgmem.resize(l.tgmem + 16);
		w.body = &body, w.launch = &l, w.next = &next, w.total = total;
		take(w);
		if (w.finished) return;
		ucontext_t tmpl;
		if (getcontext(&tmpl) != 0) die("getcontext failed");
		char* stacks = stack_pool(wid, n);
		for (int i = 0; i < n; i++) {
			Fiber& f = w.f[i];
			f.stack = stacks + (size_t)i * kStack;
			f.ctx = tmpl;
			f.ctx.uc_stack.ss_sp = f.stack;
			f.ctx.uc_stack.ss_size = kStack;
			f.ctx.uc_link = nullptr;
			makecontext(&f.ctx, (void (*)())fiber_main, 1, i);
		}
		if (!_setjmp(w.main)) jump(w, 0);
	};
	std::vector<std::thread> ts;
	for (int i = 1; i < nw; i++) ts.emplace_back(run, i);
	run(0);
	for (auto& t : ts) t.join();
}

// exchange publishes v for the calling lane and returns its SIMD-group's 32
// values after every lane has published. Two buffers are used in turn: a
// lane writes one only after the collective that used the other, which
// every lane leaves only after reading this one the time before.
inline const uint64_t* exchange(uint64_t v) {
	Worker& w = *W;
	int i = w.cur, sg = i / kSimd, lane = i % kSimd;
	uint64_t* buf = w.ex[w.f[i].turn++ & 1].data() + sg * kSimd;
	buf[lane] = v;
	wait(w.simd[sg], kSimd, "a SIMD collective waits for lanes that have returned");
	return buf;
}

template <class T> uint64_t put(T v) {
	static_assert(sizeof(T) <= 8);
	uint64_t u = 0;
	std::memcpy(&u, &v, sizeof(T));
	return u;
}
template <class T> T get(uint64_t u) {
	T v;
	std::memcpy(&v, &u, sizeof(T));
	return v;
}

inline int lane() { return W->cur % kSimd; }

} // namespace memu

// ---- the Metal names the kernels use ----

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return (mem_flags)((int)a | (int)b); }

inline void threadgroup_barrier(mem_flags) {
	memu::Worker& w = *memu::W;
	memu::wait(w.tg, w.n, "threadgroup_barrier waits for threads that have returned");
}

template <class T> T simd_sum(T v) {
	const uint64_t* b = memu::exchange(memu::put(v));
	T s = 0;
	for (int i = 0; i < memu::kSimd; i++) s += memu::get<T>(b[i]);
	return s;
}
template <class T> T simd_max(T v) {
	const uint64_t* b = memu::exchange(memu::put(v));
	T s = memu::get<T>(b[0]);
	for (int i = 1; i < memu::kSimd; i++) s = std::max(s, memu::get<T>(b[i]));
	return s;
}
template <class T> T simd_shuffle_xor(T v, ushort mask) {
	const uint64_t* b = memu::exchange(memu::put(v));
	return memu::get<T>(b[(memu::lane() ^ mask) & (memu::kSimd - 1)]);
}
template <class T> T simd_broadcast(T v, ushort lane) {
	const uint64_t* b = memu::exchange(memu::put(v));
	return memu::get<T>(b[lane & (memu::kSimd - 1)]);
}

template <class T, class F> T as_type(F v) { return std::bit_cast<T>(v); }
template <class T> T min(T a, T b) { return b < a ? b : a; }
template <class T> T max(T a, T b) { return a < b ? b : a; }

// Address spaces and function kinds mean nothing on the host.
#define kernel static
#define device
#define constant const
#define threadgroup
#define thread
#define TG(i)
#define KPOS [[maybe_unused]] uint3 tgp, [[maybe_unused]] uint3 ntg, [[maybe_unused]] uint tid, [[maybe_unused]] uint3 tsz, \
	[[maybe_unused]] uint lane, [[maybe_unused]] uint sg

#define DEVICE static inline
#define GMEM
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long i64;

DEVICE float f32_from_bits(u32 u) { return std::bit_cast<float>(u); }
DEVICE u32 bits_from_f32(float f) { return std::bit_cast<u32>(f); }
DEVICE float ex2_approx(float x) { return std::exp2(x); }
DEVICE float sqrt_rn(float x) { return std::sqrt(x); }
