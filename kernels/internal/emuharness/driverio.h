// driverio.h: the emulator drivers' side of the request protocol
// (kernels/internal/emuharness, harness.go): a header line "op key=value
// ...", then arrays as "name nbytes\n" and the raw bytes, then "end\n";
// answers are arrays and "end\n" on stdout.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace driverio {

[[noreturn]] inline void fail(const std::string& msg) {
	std::fprintf(stderr, "driver: %s\n", msg.c_str());
	std::exit(2);
}

struct Req {
	std::string op;
	std::map<std::string, double> p;
	std::map<std::string, std::vector<uint8_t>> a;
	std::map<std::string, std::vector<uint8_t>> out;

	bool has(const std::string& k) const { return p.count(k) != 0; }
	double num(const std::string& k) const {
		auto it = p.find(k);
		if (it == p.end()) fail(op + ": missing parameter " + k);
		return it->second;
	}
	long long i(const std::string& k) const { return (long long)num(k); }
	float f(const std::string& k) const { return (float)num(k); }
	template <class T> T* in(const std::string& k, size_t want_elems) {
		auto it = a.find(k);
		if (it == a.end()) fail(op + ": missing array " + k);
		if (it->second.size() != want_elems * sizeof(T))
			fail(op + ": array " + k + " has " + std::to_string(it->second.size()) + " bytes, want " + std::to_string(want_elems * sizeof(T)));
		return (T*)it->second.data();
	}
	template <class T> T* raw(const std::string& k) {
		auto it = a.find(k);
		if (it == a.end()) fail(op + ": missing array " + k);
		return (T*)it->second.data();
	}
	size_t bytes(const std::string& k) const {
		auto it = a.find(k);
		return it == a.end() ? 0 : it->second.size();
	}
	template <class T> T* make(const std::string& k, size_t elems) {
		out[k].assign(elems * sizeof(T), 0);
		return (T*)out[k].data();
	}
	// result returns an input array as an output (ops in place).
	void result(const std::string& k) { out[k] = a[k]; }
};

// read_line reads one line; at the end of input it returns false when
// nothing was read and eof_ok, and fails otherwise.
inline bool read_line(std::string& s, bool eof_ok) {
	s.clear();
	int c;
	while ((c = std::getchar()) != EOF && c != '\n') s.push_back((char)c);
	if (c == EOF && s.empty()) {
		if (eof_ok) return false;
		fail("unexpected end of input");
	}
	return true;
}

// try_read_req reads the next request; false when the input has ended
// before one.
inline bool try_read_req(Req& r) {
	r = Req{};
	std::string line;
	if (!read_line(line, true)) return false;
	std::istringstream h(line);
	h >> r.op;
	std::string kv;
	while (h >> kv) {
		auto eq = kv.find('=');
		if (eq == std::string::npos) fail("bad parameter " + kv);
		r.p[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
	}
	for (;;) {
		read_line(line, false);
		std::istringstream l(line);
		std::string name;
		size_t n = 0;
		l >> name;
		if (name == "end") break;
		if (!(l >> n)) fail("bad array line for " + name);
		auto& v = r.a[name];
		v.resize(n + 16); // slack so that an empty array still has a valid pointer
		v.resize(n);
		if (n && std::fread(v.data(), 1, n, stdin) != n) fail("short array " + name);
	}
	return true;
}

inline Req read_req() {
	Req r;
	if (!try_read_req(r)) fail("unexpected end of input");
	return r;
}

inline void write_out(const Req& r) {
	for (auto& [k, v] : r.out) {
		std::printf("%s %zu\n", k.c_str(), v.size());
		std::fwrite(v.data(), 1, v.size(), stdout);
	}
	std::printf("end\n");
	std::fflush(stdout);
}

} // namespace driverio
