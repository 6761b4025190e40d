// Host tests of the CUDA kernels' device math against the CPU kernels (issue 22): the
// TESSEL_HD functions of kernels/ (elementwise_math.cuh: unary_f, unary_i, binary_f, binary_i,
// compare, f32_to_i32_sat, max_nan; dtype_convert.hpp: the bf16/f16/i32 conversions;
// launchers.hpp: loop_offsets; fused_eval.hpp: the fused-expression interpreter) are compiled
// by the host compiler and each kernel's per-element loop is replayed on the host exactly as the
// .cu file writes it (load with to_f, compute, store with from_f), then compared with
// run_cpu_kernel on the same operands:
//  * every unary, binary and comparison op in f32, bf16 and f16 (and i32 where the op takes it),
//    every dtype conversion (cast between any two of f32, bf16, f16, i32);
//  * operands: special values (NaN, ±inf, ±0, subnormals, FLT_MAX, bf16 and f16 rounding ties
//    and overflow, INT_MIN, -1, 0 for i32 division) crossed with each other, then seeded random
//    values (uniform, log-uniform over every binade, random bit patterns);
//  * broadcast binary ops, comparisons and where through make_loop and loop_offsets, with the
//    32-bit (FastDivmod) and the 64-bit decomposition;
//  * random fused expressions of the exact ops (every dtype, casts, where, comparisons, literals,
//    broadcast operands) through fused_program_of and eval_fused against the CPU fused kernel,
//    and a few with one transcendental op at the root.
// Exact ops are compared bit for bit (any NaN equals any NaN: the payloads differ, see
// dtype_convert.hpp). The transcendental ops (exp, log, tanh, gelu, sigmoid, silu,
// gelu_grad) use the host libm here (CUDA's own libdevice on the GPU) and Eigen's vectorised
// functions in the CPU kernels: they are compared within a bound in ulps of the result dtype
// (transcendental_ulps) or, for results below the smallest normal, within that absolute amount;
// the largest difference seen is printed.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../../src/runtime/cuda/kernels/fused_eval.hpp"
#include "../../src/runtime/cuda/fused_program.hpp"
#include "tessel/ir/fused_expr.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/tensor.hpp"
#include "test_util.hpp"

using namespace tessel;
namespace ck = tessel::cuda_kernels;

namespace {

constexpr DType kFloatTypes[] = {DType::f32, DType::bf16, DType::f16};
constexpr DType kAllTypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32};

int8_t dt8(DType t) { return static_cast<int8_t>(t); }

float f32_of_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Element i's bits (2 or 4 bytes).
uint32_t bits_at(const HostTensor& t, int64_t i) {
  if (dtype_size(t.dtype()) == 2) return t.as<uint16_t>()[i];
  return t.as<uint32_t>()[i];
}
void set_bits(HostTensor& t, int64_t i, uint32_t b) {
  if (dtype_size(t.dtype()) == 2) t.as<uint16_t>()[i] = static_cast<uint16_t>(b);
  else t.as<uint32_t>()[i] = b;
}

// The float value of element bits of a float dtype (the CPU's conversions).
float value_of(DType t, uint32_t b) {
  if (t == DType::bf16) return bf16_to_f32(static_cast<uint16_t>(b));
  if (t == DType::f16) return f16_to_f32(static_cast<uint16_t>(b));
  return f32_of_bits(b);
}

// Distance in representable values of dtype t (the ordered bit patterns; -0 and +0 are one value).
int64_t ulp_distance(DType t, uint32_t a, uint32_t b) {
  const int bits = dtype_size(t) == 2 ? 16 : 32;
  const uint32_t sign = 1u << (bits - 1);
  auto ordered = [&](uint32_t u) { return (u & sign) ? -static_cast<int64_t>(u & (sign - 1)) : static_cast<int64_t>(u); };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

float smallest_normal(DType t) {
  if (t == DType::f16) return 6.103515625e-05f;  // 2^-14
  return std::numeric_limits<float>::min();      // f32 and bf16 share the exponent range
}

// The bound on the transcendental ops' difference, in ulps of the result dtype: CUDA's expf,
// logf and tanhf are within 2 ulp of the exact value (CUDA C Programming Guide, "Mathematical
// Functions"), glibc's within 1, Eigen's vectorised versions within a few; the composed ops
// (gelu, sigmoid, silu) add a division. A difference in f32 of a few ulp becomes at most one
// ulp of bf16 or f16 (or none) after rounding. gelu_grad is checked against its terms' size
// instead (it cancels: see gelu_grad_close).
int64_t transcendental_ulps(DType t) { return t == DType::f32 ? 8 : 1; }
// gelu's exponent argument z = 2c (x + 0.044715 x^3) reaches |z| of about 88 before exp
// overflows, and a rounding of z more or less (a multiply-add the compiler contracts in one
// build and not in another: the ASan build's CPU kernel differs from the Release one here)
// moves z by up to an ulp of z (2^-17 for |z| in [64, 128)), so exp(z) and the result by up to
// 2^-17 relative, 64 ulps of f32 per rounding: the f32 bound is 8 ulps plus four roundings'
// worth (107 ulps seen under ASan).
int64_t gelu_ulps(DType t) { return t == DType::f32 ? 8 + 4 * 64 : 1; }
int64_t op_ulps(const std::string& f, DType t) { return f == "gelu" ? gelu_ulps(t) : transcendental_ulps(t); }

// The largest difference seen per op and dtype, printed at the end of each test case.
struct Worst {
  std::map<std::string, int64_t> ulps;
  void note(const std::string& what, int64_t u) {
    auto& w = ulps[what];
    if (u > w) w = u;
  }
  void print(const char* title) const {
    std::printf("%s, largest difference from the CPU kernel (ulps of the result dtype):", title);
    for (const auto& [k, v] : ulps) std::printf(" %s %lld;", k.c_str(), static_cast<long long>(v));
    std::printf("\n");
  }
};

// Whether element bits `got` (the device math) match `want` (the CPU kernel): bit-identical, or
// both NaN; within `max_ulps` (0: exact only) or, both below the dtype's smallest normal, within
// it absolutely.
bool close(DType t, uint32_t got, uint32_t want, int64_t max_ulps, int64_t* ulps = nullptr) {
  if (ulps) *ulps = 0;
  if (got == want) return true;
  if (t == DType::i32) return false;
  const float g = value_of(t, got), w = value_of(t, want);
  if (std::isnan(g) || std::isnan(w)) return std::isnan(g) && std::isnan(w);
  const int64_t d = ulp_distance(t, got, want);
  if (ulps) *ulps = d;
  if (max_ulps == 0) return false;
  if (d <= max_ulps) return true;
  const float tiny = smallest_normal(t);
  if (std::fabs(g) <= tiny && std::fabs(w) <= tiny) return true;
  // Eigen's exp saturates to inf from x = 88.3763 on (exp(88.3763) = 2^127.5), where the true
  // value is finite up to x = 88.7228: the CPU's inf then stands for a value of at least 2^127,
  // and its 0 (sigmoid, silu, gelu: a quotient by that exp) for one below 2^-118.
  const float big = 1.7014118e38f, small = 3.3087225e-36f;  // 2^127, 2^-118
  auto stands_for = [&](float saturated, float exact) {
    if (std::isinf(saturated)) return !std::isinf(exact) && std::fabs(exact) >= big && (exact > 0) == (saturated > 0);
    return saturated == 0.0f && std::fabs(exact) <= small;
  };
  return stands_for(w, g) || stands_for(g, w);
}

std::string describe_bits(DType t, uint32_t b) {
  char buf[96];
  if (t == DType::i32) std::snprintf(buf, sizeof buf, "%d", static_cast<int32_t>(b));
  else std::snprintf(buf, sizeof buf, "%.9g (0x%0*x)", static_cast<double>(value_of(t, b)), dtype_size(t) == 2 ? 4 : 8, b);
  return buf;
}

// ---- operand values -------------------------------------------------------------------------------

std::vector<float> special_floats() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 2.0f, -3.0f, 7.0f, inf, -inf, nan, -nan,
                          std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(), -std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          // the edges of exp, gelu and sigmoid
                          88.72f, 89.0f, -87.33f, -88.0f, -103.0f, -104.0f, 20.0f, -20.0f, 9.0f, -9.0f, 1e-8f,
                          -1e-8f, 1e20f, -1e20f, 3.0e38f, -5.5f, 4.5f};
  for (uint32_t b : {0x007fffffu,  // the largest f32 subnormal
                     // bf16 ties (the 16 dropped bits exactly 0x8000): even kept part rounds down, odd up
                     0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, 0x3f808001u, 0x3f807fffu,
                     0x7f7f8000u,  // the largest finite bf16 plus half an ulp: a tie that rounds to inf
                     0x7f7f7fffu, 0x7f7fffffu, 0x00008000u, 0x00018000u, 0x80018000u,
                     // f16 ties: 1 + 2^-11 (down), 1 + 3 * 2^-11 (up)
                     0x3f801000u, 0x3f803000u, 0xbf803000u,
                     0x477fe000u,  // 65504, the largest f16
                     0x477fefffu,  // just below 65520: rounds to 65504
                     0x477ff000u,  // 65520: the tie above 65504, rounds to inf
                     0x47800000u,  // 65536
                     0x33800000u,  // 2^-24, the smallest f16 subnormal
                     0x33000000u,  // 2^-25: a tie with 0, rounds to 0
                     0x33000001u,  // just above: rounds to 2^-24
                     0x33c00000u,  // 1.5 * 2^-24: a tie, rounds up to 2^-23 (even)
                     0x38800000u,  // 2^-14, the smallest f16 normal
                     0x387fc000u,  // 1023.5 * 2^-24: a tie between the largest f16 subnormal and 2^-14
                     0x387fe000u}) {
    v.push_back(f32_of_bits(b));
    v.push_back(-f32_of_bits(b));
  }
  return v;
}

std::vector<int32_t> special_ints() {
  const int32_t mn = std::numeric_limits<int32_t>::min(), mx = std::numeric_limits<int32_t>::max();
  return {0, 1, -1, 2, -2, 3, 7, -7, mn, mn + 1, mx, mx - 1, 16777216, 16777217, 16777219, -16777217,
          1 << 30, 33554435, 2147483520, -2147483520, 65521, -65521};
}

// One float of a seeded mixture: uniform on [-8, 8], log-uniform over every binade with a
// random sign, or a random bit pattern (NaNs and infinities included).
float random_float(std::mt19937_64& rng) {
  const uint64_t r = rng();
  switch (r % 3) {
    case 0: return std::uniform_real_distribution<float>(-8.0f, 8.0f)(rng);
    case 1: {
      const float m = std::ldexp(1.0f + static_cast<float>(rng() % (1u << 23)) / 8388608.0f,
                                 static_cast<int>(rng() % 280) - 150);
      return (r >> 8) & 1 ? -m : m;
    }
    default: return f32_of_bits(static_cast<uint32_t>(rng()));
  }
}

int32_t random_int(std::mt19937_64& rng) {
  const uint64_t r = rng();
  if (r % 2) return static_cast<int32_t>(static_cast<uint32_t>(rng()));
  return static_cast<int32_t>(rng() % 41) - 20;
}

// Writes value v into element i of t (a bf16/f16 element holds v rounded by the CPU conversion).
void put(HostTensor& t, int64_t i, float v) {
  if (t.dtype() == DType::f32) set_bits(t, i, ck::f32_as_bits(v));
  else t.set(i, static_cast<double>(v));
}

// A tensor [n] of dtype t: the special values first (role 0: each once; role 1, a binary op's
// lhs: each repeated as often as there are specials; role 2, its rhs: the specials cycled, so
// the two cross), then random ones; for bf16/f16 a third of the random elements are random bit
// patterns (every 16-bit value is a bf16 or f16 value, NaN payloads and subnormals included).
HostTensor operand(DType t, int64_t n, std::mt19937_64& rng, int role) {
  HostTensor x(t, {n});
  const auto fs = special_floats();
  const auto is = special_ints();
  const int64_t ns = static_cast<int64_t>(t == DType::i32 ? is.size() : fs.size());
  const int64_t crossed = ns * ns;
  for (int64_t i = 0; i < n; ++i) {
    int64_t k = -1;
    if (role == 0 && i < ns) k = i;                        // unary: each special once
    if (role == 1 && i < crossed) k = i / ns;              // lhs: special i / ns
    if (role == 2 && i < crossed) k = i % ns;              // rhs: special i % ns
    if (t == DType::i32) {
      set_bits(x, i, static_cast<uint32_t>(k >= 0 ? is[static_cast<std::size_t>(k)] : random_int(rng)));
    } else if (k >= 0) {
      put(x, i, fs[static_cast<std::size_t>(k)]);
    } else if (t != DType::f32 && rng() % 3 == 0) {
      set_bits(x, i, static_cast<uint32_t>(rng() & 0xffffu));
    } else {
      put(x, i, random_float(rng));
    }
  }
  return x;
}

// run_cpu_kernel on operands `in`: the result (poisoned first: an unwritten element fails).
HostTensor cpu_run(OpKind kind, const std::vector<const HostTensor*>& in, DType out_dtype, const Shape& out_shape,
                   const OpAttrs& attrs = OpAttrs{}) {
  return tessel_test::run_cpu_op(kind, attrs, in, out_dtype, out_shape);
}

// The device kernels' loads and stores (device_common.cuh to_f / from_f; fused_eval.hpp's).
float load_f(const HostTensor& t, int64_t i) { return ck::load_val(t.data(), dt8(t.dtype()), i).f; }
int32_t load_i(const HostTensor& t, int64_t i) { return ck::load_val(t.data(), dt8(t.dtype()), i).i; }
void store_f(HostTensor& t, int64_t i, float v) {
  ck::Val r;
  r.f = v;
  ck::store_val(t.data(), dt8(t.dtype()), i, r);
}
void store_i(HostTensor& t, int64_t i, int32_t v) {
  ck::Val r;
  r.i = v;
  ck::store_val(t.data(), dt8(t.dtype()), i, r);
}

// Compares every element; fails naming the first few mismatches with their operands.
void compare_all(const std::string& what, const HostTensor& got, const HostTensor& want, int64_t max_ulps,
                 Worst& worst, uint64_t seed, const std::function<std::string(int64_t)>& operands) {
  REQUIRE(got.numel() == want.numel());
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    int64_t u = 0;
    const uint32_t g = bits_at(got, i), w = bits_at(want, i);
    if (!close(want.dtype(), g, w, max_ulps, &u)) {
      if (bad++ < 5)
        FAIL_CHECK("seed " << seed << ": " << what << " element " << i << " (" << operands(i) << "): device math "
                             << describe_bits(want.dtype(), g) << ", CPU kernel " << describe_bits(want.dtype(), w)
                             << " (" << u << " ulps; bound " << max_ulps << ")");
    } else if (max_ulps > 0 && u <= max_ulps) {  // not one of close()'s subnormal or overflow cases
      worst.note(what, u);
    }
  }
  if (bad) FAIL_CHECK(what << ": " << bad << " of " << want.numel() << " elements differ (seed " << seed << ")");
}

bool is_transcendental(ck::Unary op) {
  return op != ck::Unary::Neg && op != ck::Unary::Relu && op != ck::Unary::Sqrt && op != ck::Unary::Rsqrt;
}

std::string unary_name(OpKind k) { return op_name(k); }

}  // namespace

TEST_CASE("device math: every unary op on the host equals the CPU kernel", "[cuda-math][unit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("device unary math vs the CPU kernels", seed, 1);
  std::mt19937_64 rng(seed);
  constexpr int64_t n = 30000;
  Worst worst;
  for (DType t : kAllTypes) {
    const HostTensor x = operand(t, n, rng, 0);
    auto operands = [&](int64_t i) { return "x = " + describe_bits(t, bits_at(x, i)); };
    for (const auto& [kind, op] : cuda::kUnaryCodes) {
      if (t == DType::i32 && op != ck::Unary::Neg && op != ck::Unary::Relu) continue;
      const std::string what = unary_name(kind) + " " + dtype_name(t);
      const HostTensor want = cpu_run(kind, {&x}, t, {n});
      HostTensor got(t, {n});
      got.poison();
      for (int64_t i = 0; i < n; ++i) {  // elementwise.cu k_unary, k_unary_i32
        if (t == DType::i32) store_i(got, i, ck::unary_i(op, load_i(x, i)));
        else store_f(got, i, ck::unary_f(op, load_f(x, i)));
        // Eigen's log takes an f32 subnormal for FLT_MIN (log gives -87.34 for all of them);
        // libm's and CUDA's logf do not: those elements are left out (the CPU kernel's limit).
        const float xv = t == DType::i32 ? 1.0f : load_f(x, i);
        if (op == ck::Unary::Log && xv != 0.0f && std::fabs(xv) < std::numeric_limits<float>::min())
          set_bits(got, i, bits_at(want, i));
      }
      compare_all(what, got, want,
                  op == ck::Unary::Gelu ? gelu_ulps(t) : is_transcendental(op) ? transcendental_ulps(t) : 0, worst, seed,
                  operands);
    }
  }
  worst.print("unary ops");
}

namespace {

// gelu_grad cancels (its two terms have opposite signs for x < 0), so its bound is relative to
// the size of the terms: |device - CPU| <= 2^-18 |y| (s + |2 x s (1 - s) c (1 + 0.134145 x^2)|)
// (s = sigmoid(2 c (x + 0.044715 x^3)), in double), plus one ulp of the result dtype.
bool gelu_grad_close(DType t, float x, float y, uint32_t got, uint32_t want) {
  if (close(t, got, want, transcendental_ulps(t))) return true;
  const double c = 0.7978845608028654, xd = x;
  // An infinite y times the CPU's s = 0 (its exp saturated: 2z < -88.37) is NaN, times the
  // device's tiny s ±inf.
  if (!std::isfinite(y) && 2.0 * c * (xd + 0.044715 * xd * xd * xd) < -88.0) return true;
  const float g = value_of(t, got), w = value_of(t, want);
  if (!std::isfinite(g) || !std::isfinite(w)) return false;
  // Where sigmoid(2z) < 2^-100 its exp(-2z) is near or past f32's overflow, where Eigen's exp
  // and libm's part (Eigen's saturates to inf a little below FLT_MAX): the result is then a
  // tiny multiple of y either way, bounded as if s were 2^-100.
  const double s = std::max(1.0 / (1.0 + std::exp(-2.0 * c * (xd + 0.044715 * xd * xd * xd))), std::ldexp(1.0, -100));
  const double scale = std::fabs(static_cast<double>(y)) *
                       (s + std::fabs(2.0 * xd * s * (1.0 - s) * c * (1.0 + 0.134145 * xd * xd)));
  return std::fabs(static_cast<double>(g) - w) <= std::ldexp(scale, -18) + std::ldexp(std::fabs(w), -7);
}

}  // namespace

TEST_CASE("device math: every binary op and comparison on the host equals the CPU kernel", "[cuda-math][unit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("device binary math vs the CPU kernels", seed, 1);
  std::mt19937_64 rng(seed);
  Worst worst;
  for (DType t : kAllTypes) {
    const int64_t ns = static_cast<int64_t>(t == DType::i32 ? special_ints().size() : special_floats().size());
    const int64_t n = ns * ns + 30000;
    const HostTensor a = operand(t, n, rng, 1), b = operand(t, n, rng, 2);
    auto operands = [&](int64_t i) {
      return "x = " + describe_bits(t, bits_at(a, i)) + ", y = " + describe_bits(t, bits_at(b, i));
    };
    for (const auto& [kind, op] : cuda::kBinaryCodes) {
      const bool cmp = op >= ck::Binary::Eq;
      if (t == DType::i32 && op == ck::Binary::GeluGrad) continue;
      const std::string what = std::string(op_name(kind)) + " " + dtype_name(t);
      const DType out_t = cmp ? DType::i32 : t;
      const HostTensor want = cpu_run(kind, {&a, &b}, out_t, {n});
      HostTensor got(out_t, {n});
      got.poison();
      for (int64_t i = 0; i < n; ++i) {  // elementwise.cu k_binary, k_binary_i32, k_compare, k_compare_i32
        if (t == DType::i32) {
          const int32_t x = load_i(a, i), y = load_i(b, i);
          store_i(got, i, cmp ? ck::compare(op, x, y) : ck::binary_i(op, x, y));
        } else if (cmp) {
          store_i(got, i, ck::compare(op, load_f(a, i), load_f(b, i)));
        } else {
          store_f(got, i, ck::binary_f(op, load_f(a, i), load_f(b, i)));
        }
      }
      if (op == ck::Binary::GeluGrad) {
        int64_t bad = 0;
        for (int64_t i = 0; i < n; ++i)
          if (!gelu_grad_close(t, load_f(a, i), load_f(b, i), bits_at(got, i), bits_at(want, i)) && bad++ < 5)
            FAIL_CHECK("seed " << seed << ": " << what << " element " << i << " (" << operands(i) << "): device math "
                                 << describe_bits(t, bits_at(got, i)) << ", CPU kernel "
                                 << describe_bits(t, bits_at(want, i)));
        REQUIRE(bad == 0);
        continue;
      }
      compare_all(what, got, want, 0, worst, seed, operands);
    }
  }
}

TEST_CASE("device math: every dtype conversion on the host equals the CPU cast kernel", "[cuda-math][unit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("device dtype conversions vs the CPU cast kernel", seed, 1);
  std::mt19937_64 rng(seed);
  constexpr int64_t n = 50000;
  Worst worst;
  for (DType from : kAllTypes) {
    const HostTensor x = operand(from, n, rng, 0);
    auto operands = [&](int64_t i) { return "x = " + describe_bits(from, bits_at(x, i)); };
    for (DType to : kAllTypes) {
      if (from == to) continue;  // a copy on both sides
      const std::string what = std::string("cast ") + dtype_name(from) + " -> " + dtype_name(to);
      const HostTensor want = cpu_run(OpKind::Cast, {&x}, to, {n});
      HostTensor got(to, {n});
      got.poison();
      for (int64_t i = 0; i < n; ++i) {  // elementwise.cu k_cast_if, k_cast_fi, k_cast_ff
        if (from == DType::i32) store_f(got, i, ck::i32_to_f32_rn(load_i(x, i)));
        else if (to == DType::i32) store_i(got, i, ck::f32_to_i32_sat(load_f(x, i)));
        else store_f(got, i, load_f(x, i));
      }
      compare_all(what, got, want, 0, worst, seed, operands);
    }
  }
  // Every bf16 and f16 value converts to f32 as the CPU converts it, and every f32 of a few
  // million (all exponents, all low bits near the rounding points) back as well.
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    INFO("bits 0x" << std::hex << h);
    REQUIRE(close(DType::f32, ck::f32_as_bits(ck::bf16_bits_to_f32(b)), ck::f32_as_bits(bf16_to_f32(b)), 0));
    REQUIRE(close(DType::f32, ck::f32_as_bits(ck::f16_bits_to_f32(b)), ck::f32_as_bits(f16_to_f32(b)), 0));
  }
  for (uint64_t k = 0; k < (uint64_t{1} << 22); ++k) {
    // high 9 bits (sign, exponent) x the low bits around the two rounding points, and random
    const uint32_t hi = static_cast<uint32_t>(k >> 13) << 23;
    const uint32_t lo = static_cast<uint32_t>(k & 0x1fffu);
    const uint32_t u = k % 4 == 3 ? static_cast<uint32_t>(rng()) : hi | ((k & 1) ? lo : (lo << 10) | (lo & 0x3ffu));
    const float f = f32_of_bits(u);
    const uint16_t db = ck::f32_to_bf16_bits(f), cb = f32_to_bf16(f);
    const uint16_t dh = ck::f32_to_f16_bits(f), chh = f32_to_f16(f);
    if (!close(DType::bf16, db, cb, 0) || !close(DType::f16, dh, chh, 0))
      FAIL("seed " << seed << ": f32 0x" << std::hex << u << " -> bf16 device 0x" << db << " CPU 0x" << cb
                   << "; -> f16 device 0x" << dh << " CPU 0x" << chh);
  }
}

TEST_CASE("device math: broadcast binary ops and comparisons and where through loop_offsets equal the CPU kernels",
          "[cuda-math][unit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("loop_offsets on random broadcasts vs the CPU kernels", seed, 300);
  std::mt19937_64 rng(seed);
  Worst worst;
  for (int c = 0; c < 300; ++c) {
    const int rank = 1 + static_cast<int>(rng() % 5);
    Shape os;
    for (int d = 0; d < rank; ++d) os.push_back(1 + static_cast<int64_t>(rng() % 5));
    auto broadcast_of = [&]() {  // a random operand shape that broadcasts to os
      Shape s(os.begin() + static_cast<long>(rng() % (os.size() + 1)), os.end());
      for (auto& d : s)
        if (rng() % 3 == 0) d = 1;
      return s;
    };
    const DType t = kAllTypes[rng() % 4];
    const Shape sa = broadcast_of(), sb = broadcast_of(), sc = broadcast_of();
    HostTensor a(t, sa), b(t, sb), cond(DType::i32, sc);
    for (int64_t i = 0; i < a.numel(); ++i)
      if (t == DType::i32) set_bits(a, i, static_cast<uint32_t>(random_int(rng)));
      else put(a, i, random_float(rng));
    for (int64_t i = 0; i < b.numel(); ++i)
      if (t == DType::i32) set_bits(b, i, static_cast<uint32_t>(random_int(rng)));
      else put(b, i, random_float(rng));
    for (int64_t i = 0; i < cond.numel(); ++i) set_bits(cond, i, static_cast<uint32_t>(rng() % 3));
    const ck::Loop loop3 = cuda::make_loop(os, {contiguous_strides(os), cuda::broadcast_strides(sa, os),
                                                cuda::broadcast_strides(sb, os)});
    const ck::Loop loop4 = cuda::make_loop(os, {contiguous_strides(os), cuda::broadcast_strides(sc, os),
                                                cuda::broadcast_strides(sa, os), cuda::broadcast_strides(sb, os)});
    const ck::Binary op = t == DType::i32 ? ck::Binary::Div : ck::Binary::Sub;
    const OpKind kind = t == DType::i32 ? OpKind::Div : OpKind::Sub;
    const HostTensor want_bin = cpu_run(kind, {&a, &b}, t, os);
    const HostTensor want_cmp = cpu_run(OpKind::Lt, {&a, &b}, DType::i32, os);
    const HostTensor want_where = cpu_run(OpKind::Where, {&cond, &a, &b}, t, os);
    for (bool small : {true, false}) {  // the FastDivmod decomposition and the 64-bit one
      ck::Loop l3 = loop3, l4 = loop4;
      if (small) l3 = ck::with_divisors(l3), l4 = ck::with_divisors(l4);
      REQUIRE(l3.small == small);
      HostTensor got_bin(t, os), got_cmp(DType::i32, os), got_where(t, os);
      got_bin.poison(), got_cmp.poison(), got_where.poison();
      for (int64_t i = 0; i < l3.size(); ++i) {  // elementwise.cu k_binary, k_compare
        int64_t off[3];
        ck::loop_offsets<3>(l3, i, off);
        if (t == DType::i32) {
          store_i(got_bin, off[0], ck::binary_i(op, load_i(a, off[1]), load_i(b, off[2])));
          store_i(got_cmp, off[0], ck::compare(ck::Binary::Lt, load_i(a, off[1]), load_i(b, off[2])));
        } else {
          store_f(got_bin, off[0], ck::binary_f(op, load_f(a, off[1]), load_f(b, off[2])));
          store_i(got_cmp, off[0], ck::compare(ck::Binary::Lt, load_f(a, off[1]), load_f(b, off[2])));
        }
      }
      for (int64_t i = 0; i < l4.size(); ++i) {  // elementwise.cu k_where (element bits)
        int64_t off[4];
        ck::loop_offsets<4>(l4, i, off);
        set_bits(got_where, off[0], load_i(cond, off[1]) != 0 ? bits_at(a, off[2]) : bits_at(b, off[3]));
      }
      const std::string what = fmt::format("case {} {} {} {} {} {}", c, dtype_name(t), shape_str(os), shape_str(sa),
                                           shape_str(sb), small ? "32-bit" : "64-bit");
      auto none = [](int64_t) { return std::string("broadcast"); };
      compare_all(what + " " + op_name(kind), got_bin, want_bin, 0, worst, seed, none);
      compare_all(what + " lt", got_cmp, want_cmp, 0, worst, seed, none);
      compare_all(what + " where", got_where, want_where, 0, worst, seed, none);
    }
  }
}

namespace {

// A random expression of the exact ops of dtype `t` over operands $0 f32, $1 bf16, $2 f16, $3 i32.
std::string random_expr(std::mt19937_64& rng, DType t, int depth) {
  static const char* kDt[] = {"f32", "bf16", "f16", "i32"};
  const int ti = static_cast<int>(t);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  if (depth == 0 || pick(4) == 0) {
    if (pick(4) != 0) return fmt::format("${}", ti);
    static const char* kLitF[] = {"0.5", "-2", "3", "0", "inf", "-inf", "nan", "1e-40", "65520", "1.00390625"};
    static const char* kLitI[] = {"0", "-1", "3", "-2147483648", "2147483647", "7"};
    return fmt::format("{}:{}[]", t == DType::i32 ? kLitI[pick(6)] : kLitF[pick(10)], kDt[ti]);
  }
  auto sub = [&](DType u) { return random_expr(rng, u, depth - 1); };
  const DType other = kAllTypes[pick(4)];
  if (t == DType::i32) {
    static const char* kOps[] = {"add", "sub", "mul", "div", "max"};
    static const char* kCmp[] = {"eq", "ne", "lt", "le", "gt", "ge"};
    switch (pick(6)) {
      case 0: return fmt::format("{}({})", pick(2) ? "neg" : "relu", sub(t));
      case 1: return fmt::format("{}({},{})", kOps[pick(5)], sub(t), sub(t));
      case 2: return fmt::format("{}({},{})", kCmp[pick(6)], sub(other), sub(other));
      case 3: return fmt::format("where({},{},{})", sub(DType::i32), sub(t), sub(t));
      default: return fmt::format("cast<i32>({})", sub(other));
    }
  }
  static const char* kOps[] = {"add", "sub", "mul", "div", "max"};
  switch (pick(5)) {
    case 0: return fmt::format("{}({})", pick(3) == 0 ? "sqrt" : pick(2) ? "neg" : "relu", sub(t));
    case 1:
    case 2: return fmt::format("{}({},{})", kOps[pick(5)], sub(t), sub(t));
    case 3: return fmt::format("where({},{},{})", sub(DType::i32), sub(t), sub(t));
    default: return fmt::format("cast<{}>({})", kDt[ti], sub(other));
  }
}

// The CPU fused kernel and the device interpreter (fused_program_of, eval_fused) on `expr`.
void check_fused(const std::string& expr, const std::vector<const HostTensor*>& in, int64_t max_ulps, Worst& worst,
                 uint64_t seed) {
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (const HostTensor* t : in) shapes.push_back(t->shape()), dtypes.push_back(t->dtype());
  FusedExpr e = parse_fused_expr(expr);
  const ResultType type = type_fused_expr(e, shapes, dtypes);
  if (e.nodes.size() > static_cast<std::size_t>(ck::kMaxFusedSteps)) {  // the backend lowers these unfused
    CHECK_THROWS_WITH(cuda::fused_program_of(e, shapes, dtypes, type.shape), Catch::Contains("limits"));
    return;
  }
  OpAttrs attrs;
  attrs.equation = expr;
  const HostTensor want = cpu_run(OpKind::FusedElementwise, in, type.dtype, type.shape, attrs);
  ck::FusedProgram p = cuda::fused_program_of(e, shapes, dtypes, type.shape);
  for (std::size_t i = 0; i < in.size(); ++i) p.in[i] = in[i]->data();
  HostTensor got(type.dtype, type.shape);
  for (bool small : {true, false}) {
    got.poison();
    const ck::FusedProgram q = small ? ck::with_divisors(p) : p;
    for (int64_t i = 0; i < want.numel(); ++i)  // fused.cu k_fused
      ck::store_val(got.data(), dt8(type.dtype), i, ck::eval_fused(q, i));
    compare_all(fmt::format("fused {} ({})", expr, small ? "32-bit" : "64-bit"), got, want, max_ulps, worst, seed,
                [](int64_t) { return std::string("operands"); });
  }
}

}  // namespace

TEST_CASE("device math: the fused-expression interpreter on the host equals the CPU fused kernel",
          "[cuda-math][unit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("random fused expressions, device interpreter vs the CPU fused kernel", seed, 400);
  std::mt19937_64 rng(seed);
  Worst worst;
  for (int c = 0; c < 400; ++c) {
    // operands $0 f32, $1 bf16, $2 f16, $3 i32, each broadcast to [A, B, C]
    const Shape os = {1 + static_cast<int64_t>(rng() % 4), 1 + static_cast<int64_t>(rng() % 5),
                      1 + static_cast<int64_t>(rng() % 6)};
    std::vector<HostTensor> ops;
    for (DType t : kAllTypes) {
      Shape s(os.begin() + static_cast<long>(rng() % 3), os.end());
      for (auto& d : s)
        if (rng() % 3 == 0) d = 1;
      HostTensor x(t, s);
      const auto fs = special_floats();
      for (int64_t i = 0; i < x.numel(); ++i) {
        if (t == DType::i32) set_bits(x, i, static_cast<uint32_t>(random_int(rng) % 4));
        else if (rng() % 4 == 0) put(x, i, fs[rng() % fs.size()]);
        else put(x, i, random_float(rng));
      }
      ops.push_back(std::move(x));
    }
    const DType root = kAllTypes[rng() % 4];
    std::string expr = random_expr(rng, root, 1 + static_cast<int>(rng() % 4));
    // The kernel takes only the operands the expression reads: renumber them in order.
    std::vector<const HostTensor*> in;
    int slot[4] = {-1, -1, -1, -1};
    for (std::size_t at = expr.find('$'); at != std::string::npos; at = expr.find('$', at + 1)) {
      int& k = slot[expr[at + 1] - '0'];
      if (k < 0) k = static_cast<int>(in.size()), in.push_back(&ops[static_cast<std::size_t>(expr[at + 1] - '0')]);
      expr[at + 1] = static_cast<char>('a' + k);  // marked, so a renumbered operand is not renumbered again
    }
    for (std::size_t at = expr.find('$'); at != std::string::npos; at = expr.find('$', at + 1))
      expr[at + 1] = static_cast<char>('0' + (expr[at + 1] - 'a'));
    if (in.empty() || expr.find('(') == std::string::npos) continue;  // no operand, or no op
    INFO("seed " << seed << " case " << c << ": " << expr);
    check_fused(expr, in, 0, worst, seed);
  }
  // One transcendental op at the root over exact ones (bound as the unary ops'), in each dtype.
  const HostTensor x32 = operand(DType::f32, 4096, rng, 0), y32 = operand(DType::f32, 4096, rng, 0);
  for (DType t : kFloatTypes) {
    const HostTensor x = cpu_run(OpKind::Cast, {&x32}, t, {4096}), y = cpu_run(OpKind::Cast, {&y32}, t, {4096});
    for (const char* f : {"exp", "tanh", "gelu", "sigmoid", "silu"})
      check_fused(fmt::format("{}(add(mul($0,0.5:{}[]),$1))", f, dtype_name(t)), {&x, &y}, op_ulps(f, t), worst,
                  seed);
    // log's argument kept out of the f32 subnormals (Eigen's log takes them for FLT_MIN)
    check_fused(fmt::format("log(max(add(mul($0,0.5:{0}[]),$1),1e-30:{0}[]))", dtype_name(t)), {&x, &y},
                transcendental_ulps(t), worst, seed);
  }
  worst.print("fused expressions");
}
