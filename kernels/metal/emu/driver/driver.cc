// driver.cc: runs tandem's Metal kernels (kernels/metal/src) in the host
// emulator, one dispatch per request, as the Go backend (kernels/metal)
// encodes them: the test's emulated device sends each dispatch here.
//
// Request (kernels/internal/emuharness's protocol; the op is the kernel's
// name): parameters gx gy gz (threadgroups), tx ty tz (threads per
// threadgroup), nargs, and per argument i: ki = 0 for a buffer (bi: the
// index of its memory array mN, oi: the byte offset), 1 for bytes (array
// pi, the kernel's constant struct) or 2 for threadgroup memory (si bytes).
// Arrays mN are the distinct buffers the arguments point into (so aliased
// arguments alias here too); wN = 1 marks one the kernel may write, which
// the answer returns. The driver answers requests until its input ends.
#include "../../../internal/emuharness/driverio.h"

#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "../../src/conv.metal"
#include "../../src/elementwise.metal"
#include "../../src/gemv.metal"
#include "../../src/kda.metal"
#include "../../src/mla.metal"
#include "../../src/norm.metal"
#include "../../src/router.metal"

namespace {

using driverio::fail;
using driverio::Req;

// Args is one dispatch's decoded arguments: for argument i, a pointer to
// its bytes (buffer plus offset, constant bytes, or nullptr for threadgroup
// memory) and its size.
struct Args {
	std::vector<uint8_t*> ptr;
	std::vector<size_t> size;
	std::vector<int> kind;
};

constexpr int kPos = 6; // KPOS's arguments

template <class T> T arg(const std::string& name, Args& a, size_t i, memu::Worker& w) {
	if constexpr (std::is_pointer_v<T>) {
		if (a.kind[i] == 1) fail(name + ": argument " + std::to_string(i) + " is a pointer, given constant bytes");
		if (a.kind[i] == 2) return (T)w.tgmem.data();
		return (T)a.ptr[i];
	} else {
		using V = std::remove_cvref_t<T>;
		static_assert(std::is_reference_v<T>, "kernel arguments are pointers or constant references");
		if (a.kind[i] != 1 || a.size[i] != sizeof(V))
			fail(name + ": argument " + std::to_string(i) + " wants " + std::to_string(sizeof(V)) + " constant bytes, given " + std::to_string(a.size[i]));
		return *(const V*)a.ptr[i];
	}
}

template <class... P, size_t... I>
void call_with(void (*fn)(P...), const std::string& name, Args& a, memu::Worker& w, uint tid, const memu::Launch& l, std::index_sequence<I...>) {
	using Tup = std::tuple<P...>;
	fn(arg<std::tuple_element_t<I, Tup>>(name, a, I, w)..., memu::tg_pos, l.groups, tid, l.threads, tid % memu::kSimd, tid / memu::kSimd);
}

using Invoker = void (*)(const std::string&, Args&, memu::Worker&, uint, const memu::Launch&);

template <class... P> constexpr size_t nbuf(void (*)(P...)) { return sizeof...(P) - kPos; }

#define K(fn)                                                                                                                  \
	{                                                                                                                          \
		#fn, {nbuf(fn), [](const std::string& n, Args& a, memu::Worker& w, uint tid, const memu::Launch& l) {                  \
			      call_with(fn, n, a, w, tid, l, std::make_index_sequence<nbuf(fn)>{});                                          \
		      } }                                                                                                              \
	}

const std::unordered_map<std::string, std::pair<size_t, Invoker>> kernels = {
    K(tandem_add),         K(tandem_add_bias),      K(tandem_sigmoid),       K(tandem_mul_sigmoid),   K(tandem_situ),
    K(tandem_kda_gate),    K(tandem_gather_rows),   K(tandem_embed),         K(tandem_moe_combine),   K(tandem_copy_block),
    K(tandem_write_latent), K(tandem_attnres_acc),  K(tandem_rmsnorm),       K(tandem_l2norm_groups), K(tandem_attnres_score),
    K(tandem_softmax_rows), K(tandem_gemv),         K(tandem_router_topk),   K(tandem_short_conv_silu), K(tandem_kda_recurrent),
    K(tandem_mla_absorbed),
};

void run(Req& r) {
	auto it = kernels.find(r.op);
	if (it == kernels.end()) fail("unknown kernel " + r.op);
	auto [want, inv] = it->second;
	size_t n = (size_t)r.i("nargs");
	if (n != want) fail(r.op + ": " + std::to_string(n) + " arguments, the kernel takes " + std::to_string(want));
	memu::Launch l;
	l.groups = {(uint)r.i("gx"), (uint)r.i("gy"), (uint)r.i("gz")};
	l.threads = {(uint)r.i("tx"), (uint)r.i("ty"), (uint)r.i("tz")};
	Args a;
	for (size_t i = 0; i < n; i++) {
		std::string s = std::to_string(i);
		int kind = (int)r.i("k" + s);
		a.kind.push_back(kind);
		if (kind == 0) {
			std::string m = "m" + std::to_string(r.i("b" + s));
			size_t off = (size_t)r.i("o" + s), have = r.bytes(m);
			if (off > have) fail(r.op + ": argument " + s + " offset " + std::to_string(off) + " past its buffer of " + std::to_string(have));
			a.ptr.push_back(r.raw<uint8_t>(m) + off);
			a.size.push_back(have - off);
		} else if (kind == 1) {
			a.ptr.push_back(r.raw<uint8_t>("p" + s));
			a.size.push_back(r.bytes("p" + s));
		} else if (kind == 2) {
			if (l.tgmem) fail(r.op + ": more than one threadgroup memory argument");
			l.tgmem = (size_t)r.i("s" + s);
			a.ptr.push_back(nullptr);
			a.size.push_back(l.tgmem);
		} else {
			fail(r.op + ": argument " + s + " of kind " + std::to_string(kind));
		}
	}
	if (l.tgmem > 32 << 10) fail(r.op + ": " + std::to_string(l.tgmem) + " bytes of threadgroup memory (Apple GPUs allow 32 KiB)");
	const std::string name = r.op;
	memu::dispatch(l, [&](memu::Worker& w, uint tid) { inv(name, a, w, tid, l); });
	for (auto& [k, v] : r.a)
		if (k[0] == 'm' && r.has("w" + k.substr(1)) && r.i("w" + k.substr(1))) r.result(k);
}

} // namespace

int main() {
	Req r;
	while (driverio::try_read_req(r)) {
		run(r);
		driverio::write_out(r);
	}
	return 0;
}
