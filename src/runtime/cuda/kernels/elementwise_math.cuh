// src/runtime/cuda/kernels/elementwise_math.cuh — the per-element math of the elementwise ops, shared by the
// one-op kernels (elementwise.cu), the reductions (reduction.cu, nn.cu: max_nan) and the
// fused-expression interpreter (fused_eval.hpp), so a fused chain computes each node with the
// very code of its unfused op.
//
// Every function is TESSEL_HD (elementwise_ops.hpp): the host compiler builds this header too,
// and tests/unit/test_cuda_device_math.cpp evaluates it on the host against the CPU kernels on
// random and special values (the transcendental functions there are the host libm's, which
// differ from CUDA's by a few ulp; the test bounds the difference). Device-only intrinsics have
// no place here.
//
// The same text is compiled at run time by NVRTC into the generated fused kernels
// (src/runtime/cuda/fused_jit.cpp), after elementwise_ops.hpp and a preamble that defines
// int32_t and uint32_t: so JIT-compiled chains compute with this very code too.
#pragma once

#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstdint>

#include "elementwise_ops.hpp"
#endif

namespace tessel::cuda_kernels {

// NaN propagates (numpy.maximum, the CPU kernels' MaxF).
TESSEL_HD float max_nan(float x, float y) { return (x != x || x > y) ? x : y; }

TESSEL_HD float unary_f(Unary op, float x) {
  switch (op) {
    case Unary::Neg: return -x;
    case Unary::Exp: return expf(x);
    case Unary::Log: return logf(x);
    case Unary::Tanh: return tanhf(x);
    case Unary::Gelu: {
      // As the CPU kernel: x / (1 + exp(-2z)), z = sqrt(2/pi) (x + 0.044715 x^3) — GPT-2's tanh
      // approximation without the cancellation of 1 + tanh(z) for z << 0.
      const float c2 = 2.0f * 0.7978845608028654f;
      return x / (1.0f + expf(-c2 * (x + 0.044715f * (x * x * x))));
    }
    case Unary::Relu: return x > 0.0f ? x : 0.0f;
    case Unary::Sqrt: return sqrtf(x);
    case Unary::Rsqrt: return 1.0f / sqrtf(x);  // IEEE sqrt and division, not the approximate rsqrtf
    case Unary::Sigmoid: return 1.0f / (1.0f + expf(-x));
    case Unary::Silu: return x / (1.0f + expf(-x));
  }
  return x;
}

TESSEL_HD float binary_f(Binary op, float x, float y) {
  switch (op) {
    case Binary::Add: return x + y;
    case Binary::Sub: return x - y;
    case Binary::Mul: return x * y;
    case Binary::Div: return x / y;
    case Binary::Max: return max_nan(x, y);
    case Binary::GeluGrad: {
      // y * gelu'(x), as the CPU kernel: s = sigmoid(2z), gelu' = s + 2 x s (1 - s) c (1 + 3 * 0.044715 x^2).
      // Products associate as the CPU kernel's (cpu_elementwise.hpp gelu_grad_f32), left to right:
      // 0.134145 x x overflows only where the CPU's does (|x| > 5e19), not x x (|x| > 1.8e19,
      // where the device gave NaN and the CPU y or 0: found by tests/unit/test_cuda_device_math.cpp).
      const float c = 0.7978845608028654f;
      const float s = 1.0f / (1.0f + expf(-2.0f * c * (x + 0.044715f * x * x * x)));
      return y * (s + 2.0f * x * s * (1.0f - s) * c * (1.0f + 0.134145f * x * x));
    }
    default: return 0.0f;
  }
}

// The i32 unary ops (neg and relu; the others take floats): negation wraps (-INT_MIN = INT_MIN).
TESSEL_HD int32_t unary_i(Unary op, int32_t x) {
  return op == Unary::Neg ? static_cast<int32_t>(0u - static_cast<uint32_t>(x)) : (x > 0 ? x : 0);
}

// i32 semantics of docs/ir.md: wrap modulo 2^32; x / 0 = -1, INT_MIN / -1 = INT_MIN.
TESSEL_HD int32_t binary_i(Binary op, int32_t x, int32_t y) {
  const uint32_t ux = static_cast<uint32_t>(x), uy = static_cast<uint32_t>(y);
  switch (op) {
    case Binary::Add: return static_cast<int32_t>(ux + uy);
    case Binary::Sub: return static_cast<int32_t>(ux - uy);
    case Binary::Mul: return static_cast<int32_t>(ux * uy);
    case Binary::Div:
      if (y == 0) return -1;
      if (y == -1) return static_cast<int32_t>(0u - ux);
      return x / y;
    case Binary::Max: return x > y ? x : y;
    default: return 0;
  }
}

template <class V>
TESSEL_HD int32_t compare(Binary op, V x, V y) {
  switch (op) {
    case Binary::Eq: return x == y;
    case Binary::Ne: return x != y;
    case Binary::Lt: return x < y;
    case Binary::Le: return x <= y;
    case Binary::Gt: return x > y;
    case Binary::Ge: return x >= y;
    default: return 0;
  }
}

TESSEL_HD int32_t f32_to_i32_sat(float v) {
  if (v != v) return 0;
  if (v >= 2147483648.0f) return 2147483647;
  if (v <= -2147483648.0f) return -2147483647 - 1;
  return static_cast<int32_t>(v);
}

}  // namespace tessel::cuda_kernels
