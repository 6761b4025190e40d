// thread_reduce.hpp (private) — the element loops of the thread communicator's reductions
// (reduce_scatter, all_reduce): bf16/f16 <-> f32 conversions, one view per dtype (how it is
// stored, what it accumulates in), the sum and max ops, and reduce() over the members'
// buffers in member order. Everything is inline in this header so that the loops are compiled
// (and vectorised) where thread_communicator.cpp calls them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tessel/core/common.hpp"

namespace tessel {
namespace detail {

// ---- bf16 / f16 <-> f32 (private and inline: the reduction loops must vectorise) ----

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float bf16_to_float(uint16_t v) { return float_of(static_cast<uint32_t>(v) << 16); }
inline uint16_t float_to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // qNaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float mag = static_cast<float>(mant) * (1.0f / 16777216.0f);  // subnormal: m·2^-24
    return float_of(bits_of(mag) | sign);
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (mant << 13));
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}
// Round to nearest even (F. Giesen's float_to_half_fast3_rtne).
inline uint16_t float_to_f16(float f) {
  uint32_t u = bits_of(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t o;
  if (u >= (127u + 16u) << 23) {
    o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < (113u << 23)) {
    const uint32_t magic_u = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    o = bits_of(float_of(u) + float_of(magic_u)) - magic_u;
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;
    u += mant_odd;
    o = u >> 13;
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}

struct F32T {
  using Store = float;
  using Acc = float;
  static Acc load(Store v) { return v; }
  static Store store(Acc v) { return v; }
};
struct I32T {
  using Store = int32_t;
  using Acc = int32_t;
  static Acc load(Store v) { return v; }
  static Store store(Acc v) { return v; }
};
struct BF16T {
  using Store = uint16_t;
  using Acc = float;
  static Acc load(Store v) { return bf16_to_float(v); }
  static Store store(Acc v) { return float_to_bf16(v); }
};
struct F16T {
  using Store = uint16_t;
  using Acc = float;
  static Acc load(Store v) { return f16_to_float(v); }
  static Store store(Acc v) { return float_to_f16(v); }
};

struct SumOp {
  static float apply(float a, float b) { return a + b; }
  // Two's complement wrap-around instead of signed-overflow UB.
  static int32_t apply(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
};
struct MaxOp {
  // NaN-propagating: a NaN anywhere makes the result NaN, whatever the member order.
  static float apply(float a, float b) { return (b > a || b != b) ? b : a; }
  static int32_t apply(int32_t a, int32_t b) { return b > a ? b : a; }
};

// out[k] = src[0][k] op src[1][k] op ... op src[n-1][k], member order 0..n-1 (so every
// member computing an element gets the same bits). Works tile by tile through an
// accumulator that stays in L1, reading every source of a tile before writing that tile:
// `out` may therefore alias one of the sources exactly (in-place reduce_scatter and
// all_reduce). bf16/f16 accumulate in f32 and round once.
template <class T, class Op>
__attribute__((always_inline)) inline void reduce_tile(typename T::Store* out,
                                                       const void* const* src_v, int n,
                                                       std::size_t base, std::size_t m,
                                                       typename T::Acc* acc) {
  using Store = typename T::Store;
  const Store* s0 = static_cast<const Store*>(src_v[0]) + base;
  for (std::size_t k = 0; k < m; ++k) acc[k] = T::load(s0[k]);
  for (int i = 1; i < n; ++i) {
    const Store* si = static_cast<const Store*>(src_v[i]) + base;
    for (std::size_t k = 0; k < m; ++k) acc[k] = Op::apply(acc[k], T::load(si[k]));
  }
  for (std::size_t k = 0; k < m; ++k) out[base + k] = T::store(acc[k]);
}

template <class T, class Op>
void reduce_typed(void* out_v, const void* const* src_v, int n, std::size_t count) {
  constexpr std::size_t kTile = 2048;
  typename T::Acc acc[kTile];
  auto* out = static_cast<typename T::Store*>(out_v);
  std::size_t base = 0;
  // Full tiles with a compile-time trip count: GCC's -O2 vectoriser (very-cheap cost model)
  // only vectorises loops that need no scalar epilogue; this makes f32 sums ~2x faster.
  for (; base + kTile <= count; base += kTile)
    reduce_tile<T, Op>(out, src_v, n, base, kTile, acc);
  if (base < count) reduce_tile<T, Op>(out, src_v, n, base, count - base, acc);
}

template <class Op>
void reduce_op(void* out, const void* const* src, int n, std::size_t count, DType dtype) {
  switch (dtype) {
    case DType::f32: return reduce_typed<F32T, Op>(out, src, n, count);
    case DType::i32: return reduce_typed<I32T, Op>(out, src, n, count);
    case DType::bf16: return reduce_typed<BF16T, Op>(out, src, n, count);
    case DType::f16: return reduce_typed<F16T, Op>(out, src, n, count);
  }
}

inline void reduce(void* out, const void* const* src, int n, std::size_t count, DType dtype,
                   ReduceOp op) {
  if (count == 0) return;
  if (op == ReduceOp::Sum)
    reduce_op<SumOp>(out, src, n, count, dtype);
  else
    reduce_op<MaxOp>(out, src, n, count, dtype);
}

inline std::size_t elem_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::i32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 4;
}

}  // namespace detail
}  // namespace tessel
