// src/runtime/cuda/kernels/dtype_convert.hpp — the dtype conversions of the CUDA kernels on raw bits (bf16 and
// f16 as uint16_t): bf16/f16 <-> f32, i32 -> f32, rounding an f32 value to a dtype. On the device
// each is the cuda_bf16.h / cuda_fp16.h intrinsic (cvt.rn.*); for the host compiler a bit-exact
// round-to-nearest-even of its own, written from the IEEE definitions (not tessel's CPU
// conversions, which the host tests compare it with: tests/unit/test_cuda_device_math.cpp).
//
// NaN: the device returns a NaN (canonical 0x7fff from cvt.rn.*, as cuda_bf16.h's and
// cuda_fp16.h's own host code does); the host fallback returns that canonical NaN too. The CPU
// conversions keep the sign and payload's top bits instead: both are NaN, only the payload
// differs, and no tessel op reads a payload.
#pragma once

#include <cstdint>
#include <cstring>

#include "elementwise_ops.hpp"  // TESSEL_HD

#if defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace tessel::cuda_kernels {

TESSEL_HD uint32_t f32_as_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

TESSEL_HD float bits_as_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

// bf16 -> f32 is exact: the bf16 bits are the f32's top half.
TESSEL_HD float bf16_bits_to_f32(uint16_t h) { return bits_as_f32(static_cast<uint32_t>(h) << 16); }

// f32 -> bf16, round to nearest even; overflow rounds to ±inf (as RNE does), NaN -> 0x7fff.
TESSEL_HD uint16_t f32_to_bf16_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
#else
  const uint32_t u = f32_as_bits(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  const uint32_t kept = u >> 16, rest = u & 0xffffu;  // the 16 bits dropped
  // Up when above half, or at half with an odd kept part (a carry into the exponent is right:
  // it gives the next binade, or inf from the largest finite values).
  const uint32_t up = (rest > 0x8000u || (rest == 0x8000u && (kept & 1u))) ? 1u : 0u;
  return static_cast<uint16_t>(kept + up);
#endif
}

// f16 -> f32 is exact (every f16, subnormals included, is an f32).
TESSEL_HD float f16_bits_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 31) return bits_as_f32(sign | 0x7f800000u | (m << 13));  // inf, NaN (payload kept)
  if (e != 0) return bits_as_f32(sign | ((e + 112u) << 23) | (m << 13));  // rebias 15 -> 127
  if (m == 0) return bits_as_f32(sign);                                   // ±0
  // Subnormal m 2^-24: normalise (the f32 exponent of 2^-14 is 113).
  uint32_t fe = 113;
  while (!(m & 0x400u)) m <<= 1, --fe;
  return bits_as_f32(sign | (fe << 23) | ((m & 0x3ffu) << 13));
#endif
}

// f32 -> f16, round to nearest even, subnormal results included; |v| >= 65520 gives ±inf;
// NaN -> 0x7fff.
TESSEL_HD uint16_t f32_to_f16_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(v));
#else
  const uint32_t u = f32_as_bits(v);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 65520 (a tie above 65504) and up
  const int e = static_cast<int>(a >> 23) - 127;                        // unbiased exponent
  if (e < -25) return static_cast<uint16_t>(sign);                      // below 2^-25: 0 (f32 subnormals too)
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;                       // 24-bit significand
  // Keep the significand's top bits in units of the result's last place: 2^-24 for a
  // subnormal result (e < -14), 2^(e-10) for a normal one; a carry out of the kept bits moves
  // to the next binade, which the exponent field absorbs.
  const int shift = e < -14 ? -(e + 1) : 13;                            // 14..24, or 13
  const uint32_t kept = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  const uint32_t up = (rest > half || (rest == half && (kept & 1u))) ? 1u : 0u;
  if (e < -14) return static_cast<uint16_t>(sign | (kept + up));
  return static_cast<uint16_t>(sign | ((static_cast<uint32_t>(e + 15) << 10) + (kept & 0x3ffu) + up));
#endif
}

// i32 -> f32, round to nearest even (the host's conversion rounds in the default mode).
TESSEL_HD float i32_to_f32_rn(int32_t x) {
#if defined(__CUDA_ARCH__)
  return __int2float_rn(x);
#else
  return static_cast<float>(x);
#endif
}

// v rounded to dtype dt (a DType as int8_t: 1 bf16, 2 f16; anything else is kept), as a
// value of that dtype stored and loaded again.
TESSEL_HD float round_to_dtype(float v, int8_t dt) {
  if (dt == 1) return bf16_bits_to_f32(f32_to_bf16_bits(v));
  if (dt == 2) return f16_bits_to_f32(f32_to_f16_bits(v));
  return v;
}

}  // namespace tessel::cuda_kernels
