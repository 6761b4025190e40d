// src/runtime/cuda/kernels/fused_eval.hpp — the per-element evaluation of a fused expression (launchers.hpp,
// FusedProgram): eval_fused(p, i) is the program's value at element i of the result, as the
// interpreter kernels of fused.cu compute it (k_fused, k_fused_softmax_rows). TESSEL_HD: the host
// compiler builds it too, and tests/unit/test_cuda_device_math.cpp runs it on the host against
// the CPU fused kernel (cpu_fused.cpp).
//
// Operands are loaded to f32 (i32 stays i32), each float step is computed with the unfused op's
// per-element code (elementwise_math.cuh) and rounded to its dtype, as the unfused chain's
// intermediate buffer would be.
#pragma once

#include <cmath>
#include <cstdint>

#include "dtype_convert.hpp"
#include "elementwise_math.cuh"
#include "launchers.hpp"

namespace tessel::cuda_kernels {

union Val {
  float f;
  int32_t i;
};

constexpr int8_t kBf16 = static_cast<int8_t>(DType::bf16);
constexpr int8_t kF16 = static_cast<int8_t>(DType::f16);
constexpr int8_t kI32 = static_cast<int8_t>(DType::i32);

static_assert(kBf16 == 1 && kF16 == 2, "round_to_dtype (dtype_convert.hpp) numbers the dtypes as DType does");

TESSEL_HD Val load_val(const void* p, int8_t dt, int64_t off) {
  Val v;
  if (dt == kI32) v.i = static_cast<const int32_t*>(p)[off];
  else if (dt == kBf16) v.f = bf16_bits_to_f32(static_cast<const uint16_t*>(p)[off]);
  else if (dt == kF16) v.f = f16_bits_to_f32(static_cast<const uint16_t*>(p)[off]);
  else v.f = static_cast<const float*>(p)[off];
  return v;
}

TESSEL_HD void store_val(void* p, int8_t dt, int64_t i, Val v) {
  if (dt == kI32) static_cast<int32_t*>(p)[i] = v.i;
  else if (dt == kBf16) static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v.f);
  else if (dt == kF16) static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v.f);
  else static_cast<float*>(p)[i] = v.f;
}

// The program's value at element i of the result (row-major over p.shape).
TESSEL_HD Val eval_fused(const FusedProgram& p, int64_t i) {
  int64_t coord[kMaxRank];
  if (p.small) {
    uint32_t rest = static_cast<uint32_t>(i);
    for (int d = p.rank - 1; d >= 0; --d) {
      const uint32_t q = p.div[d].div(rest);
      coord[d] = rest - q * p.div[d].d;
      rest = q;
    }
  } else {
    int64_t rest = i;
    for (int d = p.rank - 1; d >= 0; --d) {
      coord[d] = rest % p.shape[d];
      rest /= p.shape[d];
    }
  }
  Val v[kMaxFusedSteps];
  for (int k = 0; k < p.nsteps; ++k) {
    const FusedStep& st = p.steps[k];
    Val r;
    r.i = 0;
    switch (static_cast<FusedKind>(st.kind)) {
      case FusedKind::Operand: {
        int64_t off = 0;
        for (int d = 0; d < p.rank; ++d) off += coord[d] * p.stride[st.operand][d];
        r = load_val(p.in[st.operand], p.in_dtype[st.operand], off);
        break;
      }
      case FusedKind::Literal:
        if (st.dtype == kI32) r.i = st.lit_i;
        else r.f = st.lit_f;
        break;
      case FusedKind::Unary: {
        const Val x = v[st.arg[0]];
        if (st.dtype == kI32) r.i = unary_i(static_cast<Unary>(st.op), x.i);  // neg and relu
        else
          r.f = round_to_dtype(unary_f(static_cast<Unary>(st.op), x.f), st.dtype);
        break;
      }
      case FusedKind::Binary: {
        const Val x = v[st.arg[0]], y = v[st.arg[1]];
        if (st.arg_dtype == kI32) r.i = binary_i(static_cast<Binary>(st.op), x.i, y.i);
        else r.f = round_to_dtype(binary_f(static_cast<Binary>(st.op), x.f, y.f), st.dtype);
        break;
      }
      case FusedKind::Compare: {
        const Val x = v[st.arg[0]], y = v[st.arg[1]];
        r.i = st.arg_dtype == kI32 ? compare(static_cast<Binary>(st.op), x.i, y.i)
                                   : compare(static_cast<Binary>(st.op), x.f, y.f);
        break;
      }
      case FusedKind::Where:
        r = v[st.arg[0]].i != 0 ? v[st.arg[1]] : v[st.arg[2]];
        break;
      case FusedKind::Cast: {
        const Val x = v[st.arg[0]];
        if (st.arg_dtype == st.dtype) r = x;
        else if (st.arg_dtype == kI32) r.f = round_to_dtype(i32_to_f32_rn(x.i), st.dtype);
        else if (st.dtype == kI32) r.i = f32_to_i32_sat(x.f);
        else r.f = round_to_dtype(x.f, st.dtype);
        break;
      }
      case FusedKind::CausalMask: {
        const int64_t q = p.rank >= 2 ? coord[p.rank - 2] : 0, key = p.rank >= 1 ? coord[p.rank - 1] : 0;
        r = v[st.arg[0]];
        if (key + p.koff > q + p.qoff) r.f = -INFINITY;
        break;
      }
    }
    v[k] = r;
  }
  return v[p.nsteps - 1];
}

}  // namespace tessel::cuda_kernels
