// src/runtime/cpu/cpu_elementwise.hpp — the per-element math of the CPU elementwise kernels,
// shared by the one-op kernels (cpu_kernels_elementwise.cpp; max rows and softmax in
// cpu_kernels_reduction.cpp and cpu_kernels_nn.cpp) and the fused_elementwise kernel
// (cpu_fused.cpp), so a fused chain computes every element with exactly the code of the
// unfused one (bit-identical results). Internal to the CPU backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <Eigen/Dense>

#include "tessel/ir/graph.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/tensor.hpp"
#include "onednn_einsum.hpp"

namespace tessel::cpu_detail {

// y[0..n) = op(x[0..n)) for a float unary op, in f32 with Eigen's array math (vectorised).
// Returns false for a kind that is not a unary op. Eigen runs the packets of an aligned
// destination and the last n % packet elements one at a time, so callers that split a buffer
// into blocks keep every block start 64-byte aligned and every block but the last a multiple
// of 64 bytes: each element then takes the path (and gets the bits) it gets unsplit.
inline bool unary_f32(OpKind kind, const float* px, float* py, int64_t n) {
  Eigen::Map<const Eigen::ArrayXf> x(px, n);
  Eigen::Map<Eigen::ArrayXf> y(py, n);
  switch (kind) {
    // x * -1, not -x: Eigen 3.4's AVX negation is 0 - x, which gives +0 for +0 in whole packets
    // (and -0 in the scalar tail), where IEEE negation (and the CUDA kernel) gives -0.
    case OpKind::Neg: y = x * -1.0f; break;
    case OpKind::Exp: y = x.exp(); break;
    case OpKind::Log: y = x.log(); break;
    case OpKind::Tanh: y = x.tanh(); break;
    case OpKind::Gelu: {
      // GPT-2's tanh approximation: 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3),
      // computed as x / (1 + exp(-2z)) — the same function (1 + tanh z = 2 sigmoid 2z)
      // without the cancellation in 1 + tanh(z) for z << 0, where the f32 tanh form keeps
      // only a few significant bits (x = -4.5 gives 1 + tanh = 2.3e-6, one ulp of 1 is 2.6%
      // of it). Extremes are exact: x -> -inf gives -0, x -> +inf gives x.
      const float c2 = 2.0f * 0.7978845608028654f;
      y = x / (1.0f + (-c2 * (x + 0.044715f * x.cube())).exp());
      break;
    }
    case OpKind::Relu: y = (x > 0.0f).select(x, 0.0f); break;
    // sqrt and rsqrt correctly rounded (IEEE sqrt, then one division), as the CUDA kernels
    // compute them: Eigen 3.4's packet sqrt and rsqrt (EIGEN_FAST_MATH, on by default) are a
    // hardware reciprocal-sqrt estimate and a Newton step, 1-2 bits short, with sqrt(inf) = NaN
    // and sqrt(-0) = +0 (found by tests/unit/test_cuda_device_math.cpp).
    case OpKind::Sqrt: y = x.unaryExpr([](float v) { return std::sqrt(v); }); break;
    case OpKind::Rsqrt: y = x.unaryExpr([](float v) { return 1.0f / std::sqrt(v); }); break;
    // exp(-x) overflows to inf for x << 0, giving exactly 0 (sigmoid) and -0 (silu).
    case OpKind::Sigmoid: y = 1.0f / (1.0f + (-x).exp()); break;
    case OpKind::Silu: y = x / (1.0f + (-x).exp()); break;
    default: return false;
  }
  return true;
}

// Integer semantics (docs/ir.md, "Integer semantics"): i32 add/sub/mul wrap around modulo
// 2^32 (two's complement), computed in uint32 so there is no signed-overflow UB; i32 div
// truncates toward zero and follows XLA for the two inputs C++ leaves undefined (x86 traps
// on both): x / 0 = -1 and INT_MIN / -1 = INT_MIN. Every element gets a value, so a run
// never stops on data, and the reference and the partitioned run agree element for element.
inline int32_t wrap_i32(uint32_t u) { return static_cast<int32_t>(u); }
inline int32_t add_i32(int32_t x, int32_t y) { return wrap_i32(uint32_t(x) + uint32_t(y)); }
inline int32_t sub_i32(int32_t x, int32_t y) { return wrap_i32(uint32_t(x) - uint32_t(y)); }
inline int32_t mul_i32(int32_t x, int32_t y) { return wrap_i32(uint32_t(x) * uint32_t(y)); }
inline int32_t div_i32(int32_t x, int32_t y) {
  if (y == 0) return -1;
  if (y == -1) return wrap_i32(0u - uint32_t(x));  // INT_MIN / -1 wraps to INT_MIN
  return x / y;
}

struct AddF {
  template <class T> T operator()(T x, T y) const { return x + y; }
  int32_t operator()(int32_t x, int32_t y) const { return add_i32(x, y); }
};
struct SubF {
  template <class T> T operator()(T x, T y) const { return x - y; }
  int32_t operator()(int32_t x, int32_t y) const { return sub_i32(x, y); }
};
struct MulF {
  template <class T> T operator()(T x, T y) const { return x * y; }
  int32_t operator()(int32_t x, int32_t y) const { return mul_i32(x, y); }
};
struct DivF {
  template <class T> T operator()(T x, T y) const { return x / y; }
  int32_t operator()(int32_t x, int32_t y) const { return div_i32(x, y); }
};
struct MaxF { template <class T> T operator()(T x, T y) const { return (x != x || x > y) ? x : y; } };
// o = g * gelu'(x) for gelu(x) = x s, s = sigmoid(2z), z = c (x + 0.044715 x^3) (the forward's
// stable form): gelu'(x) = s + 2 x s (1 - s) c (1 + 3 * 0.044715 x^2). Float only; o may be x
// or g. Vectorised: s in chunks of kGeluGradChunk through Eigen's exp (as unary_f32's, packets
// for whole packets of an aligned chunk, then one at a time), so callers that split the buffer
// into blocks starting at multiples of the chunk (the fused kernel's kBlock) get the bits of the
// whole-buffer call. (It was a scalar std::exp per element: 12% of the gpt example's step.)
constexpr int64_t kGeluGradChunk = 256;
inline void gelu_grad_f32(const float* px, const float* pg, float* po, int64_t n) {
  const float c = 0.7978845608028654f;
  alignas(64) float sb[kGeluGradChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kGeluGradChunk) {
    const int64_t m = std::min(kGeluGradChunk, n - i0);
    const float* x = px + i0;
    Eigen::Map<const Eigen::ArrayXf> xa(x, m);
    Eigen::Map<Eigen::ArrayXf> s(sb, m);
    s = 1.0f / (1.0f + (-2.0f * c * (xa + 0.044715f * xa * xa * xa)).exp());
    const float* g = pg + i0;
    float* o = po + i0;
    for (int64_t j = 0; j < m; ++j) {
      const float xf = x[j], sj = sb[j];
      o[j] = g[j] * (sj + 2.0f * xf * sj * (1.0f - sj) * c * (1.0f + 0.134145f * xf * xf));
    }
  }
}

// Float -> i32 as documented in builders.hpp: truncate, saturate, NaN -> 0 (no UB for any
// input, unlike a plain static_cast).
inline int32_t f32_to_i32_sat(float v) {
  if (v != v) return 0;
  if (v >= 2147483648.0f) return std::numeric_limits<int32_t>::max();
  if (v <= -2147483648.0f) return std::numeric_limits<int32_t>::min();
  return static_cast<int32_t>(v);
}


// max reduction: identity, combine, and the max of one contiguous row.
struct MaxR {
  template <class T> static T identity() {
    return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                : std::numeric_limits<T>::lowest();
  }
  // NaN propagates (like numpy.maximum).
  template <class T> T operator()(T x, T y) const { return (x != x || x > y) ? x : y; }
  // Float rows go through Eigen's vectorised max with NaN propagation (the scalar loop with its
  // NaN test was most of softmax's and cross-entropy's time); the value is the same element
  // (max is exact), only the sign of a zero maximum may come from another equal element.
  template <class T> static T row(const T* p, int64_t n) {
    if constexpr (std::is_same_v<T, float>)
      return Eigen::Map<const Eigen::ArrayXf>(p, n).template maxCoeff<Eigen::PropagateNaN>();
    T m = p[0];
    for (int64_t j = 1; j < n; ++j) m = (m != m || m > p[j]) ? m : p[j];
    return m;
  }
};

// softmax over the middle dim of x viewed as [outer, len, inner], in f32, into y (y may be
// x). A row whose max is -inf (fully masked) gives zeros, not NaN.
inline void softmax_f32(const float* x, float* y, int64_t outer, int64_t len, int64_t inner) {
  if (len > 0 && outer > 0 && inner > 0) {
    if (inner == 1) {
      for (int64_t o = 0; o < outer; ++o) {
        Eigen::Map<const Eigen::ArrayXf> xr(x + o * len, len);
        Eigen::Map<Eigen::ArrayXf> yr(y + o * len, len);
        const float m = MaxR::row(x + o * len, len);
        if (m == -std::numeric_limits<float>::infinity()) {  // fully masked row: define as zeros rather than NaN
          yr.setZero();
          continue;
        }
        yr = (xr - m).exp();
        yr *= 1.0f / yr.sum();
      }
    } else {
      // Axis not last: sweep whole [inner] rows at a time so accesses stay contiguous.
      std::vector<float, AlignedAllocator<float>> mx(static_cast<std::size_t>(inner)), sum(static_cast<std::size_t>(inner));
      for (int64_t o = 0; o < outer; ++o) {
        const float* xb = x + o * len * inner;
        float* yb = y + o * len * inner;
        std::fill(mx.begin(), mx.end(), -std::numeric_limits<float>::infinity());
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int64_t l = 0; l < len; ++l)
          for (int64_t i = 0; i < inner; ++i) mx[i] = MaxF{}(mx[i], xb[l * inner + i]);
        for (int64_t l = 0; l < len; ++l)
          for (int64_t i = 0; i < inner; ++i) {
            const float e = mx[i] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(xb[l * inner + i] - mx[i]);
            yb[l * inner + i] = e;
            sum[i] += e;
          }
        for (int64_t i = 0; i < inner; ++i) sum[i] = sum[i] > 0.0f ? 1.0f / sum[i] : 0.0f;
        for (int64_t l = 0; l < len; ++l)
          for (int64_t i = 0; i < inner; ++i) yb[l * inner + i] *= sum[i];
      }
    }
  }
}

// The fused_elementwise and fused_softmax kernels (cpu_fused.cpp).
void fused_elementwise_kernel(const KernelArgs& a);
void fused_softmax_kernel(const KernelArgs& a);
// fused_einsum: the einsum of the first operands, then its epilogue over the product in place.
void fused_einsum_kernel(const KernelArgs& a);
// fused_einsum's epilogue as post-op steps over the args' epilogue operands (cached per thread
// by the epilogue's text); false when it is not a post-op chain (onednn_einsum.hpp).
bool fused_einsum_post_ops(const KernelArgs& a, EinsumEpilogue& ep);
// fused_einsum without post-ops: the product (`product`: fused_einsum_product_args(a)) into the
// result, then the epilogue over it in place.
void fused_einsum_loop(const KernelArgs& a, const KernelArgs& product);

}  // namespace tessel::cpu_detail
