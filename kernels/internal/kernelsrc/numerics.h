// numerics.h: the scalar numerics every kernel dialect of tandem shares
// (kernels/cuda/src/prelude.cuh, kernels/metal/src/prelude.metal): special
// values, exp/sigmoid/tanh from one exp2 primitive, bf16/f16 and the OCP MX
// codes, and the exact decode of one weight element in any storage format.
//
// The including prelude defines DEVICE (a function's qualifiers), GMEM (the
// address space of a global pointer), the types u8/u16/u32/i64 and the
// primitives f32_from_bits, bits_from_f32, ex2_approx (2^x) and sqrt_rn.
#pragma once

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
DEVICE float weight_at(GMEM const u8* data, GMEM const u8* scales, int fmt, int cols, int r, int c) {
	i64 i = (i64)r * cols + c;
	switch (fmt) {
	case FMT_F32:
		return ((GMEM const float*)data)[i];
	case FMT_BF16:
		return bf16_to_f32(((GMEM const u16*)data)[i]);
	case FMT_F16:
		return f16_to_f32(((GMEM const u16*)data)[i]);
	}
	float s = e8m0_scale(scales[(i64)r * (cols / 32) + c / 32]);
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
