// kernels/fused.cu — the fused-expression kernel (fused_elementwise, and the prologue of
// fused_softmax): one thread per result element walks the expression's steps (launchers.hpp,
// FusedProgram) in registers, reading each operand once through its broadcast strides and
// writing the result once — the memory traffic of one elementwise kernel for the whole chain.
//
// Each float step runs the unfused op's per-element code (elementwise_math.cuh) in f32 and is
// rounded to its dtype, as the unfused chain's intermediate buffer would be, so a fused chain
// computes what the unfused kernels compute. The step values live in a per-thread array indexed
// at run time (local memory, cached in L1): the simple form; specialising the common chains
// into straight-line code is a later optimisation.
#include <fmt/format.h>

#include "device_common.cuh"
#include "elementwise_math.cuh"

namespace tessel::cuda_kernels {
namespace {

union Val {
  float f;
  int32_t i;
};

constexpr int8_t kBf16 = static_cast<int8_t>(DType::bf16);
constexpr int8_t kF16 = static_cast<int8_t>(DType::f16);
constexpr int8_t kI32 = static_cast<int8_t>(DType::i32);

__device__ __forceinline__ float round_to(float v, int8_t dt) {
  if (dt == kBf16) return __bfloat162float(__float2bfloat16_rn(v));
  if (dt == kF16) return __half2float(__float2half_rn(v));
  return v;
}

__device__ __forceinline__ Val load(const void* p, int8_t dt, int64_t off) {
  Val v;
  if (dt == kI32) v.i = static_cast<const int32_t*>(p)[off];
  else if (dt == kBf16) v.f = __bfloat162float(static_cast<const __nv_bfloat16*>(p)[off]);
  else if (dt == kF16) v.f = __half2float(static_cast<const __half*>(p)[off]);
  else v.f = static_cast<const float*>(p)[off];
  return v;
}

__device__ __forceinline__ void store(void* p, int8_t dt, int64_t i, Val v) {
  if (dt == kI32) static_cast<int32_t*>(p)[i] = v.i;
  else if (dt == kBf16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v.f);
  else if (dt == kF16) static_cast<__half*>(p)[i] = __float2half_rn(v.f);
  else static_cast<float*>(p)[i] = v.f;
}

__global__ void k_fused(FusedProgram p, void* out, int8_t out_t, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) {
    int64_t coord[kMaxRank];
    int64_t rest = i;
    for (int d = p.rank - 1; d >= 0; --d) {
      coord[d] = rest % p.shape[d];
      rest /= p.shape[d];
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
          r = load(p.in[st.operand], p.in_dtype[st.operand], off);
          break;
        }
        case FusedKind::Literal:
          if (st.dtype == kI32) r.i = st.lit_i;
          else r.f = st.lit_f;
          break;
        case FusedKind::Unary: {
          const Val x = v[st.arg[0]];
          if (st.dtype == kI32)  // neg and relu of i32 (wrapping negation)
            r.i = static_cast<Unary>(st.op) == Unary::Neg ? static_cast<int32_t>(0u - static_cast<uint32_t>(x.i))
                                                          : (x.i > 0 ? x.i : 0);
          else
            r.f = round_to(unary_f(static_cast<Unary>(st.op), x.f), st.dtype);
          break;
        }
        case FusedKind::Binary: {
          const Val x = v[st.arg[0]], y = v[st.arg[1]];
          if (st.arg_dtype == kI32) r.i = binary_i(static_cast<Binary>(st.op), x.i, y.i);
          else r.f = round_to(binary_f(static_cast<Binary>(st.op), x.f, y.f), st.dtype);
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
          else if (st.arg_dtype == kI32) r.f = round_to(__int2float_rn(x.i), st.dtype);
          else if (st.dtype == kI32) r.i = f32_to_i32_sat(x.f);
          else r.f = round_to(x.f, st.dtype);
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
    store(out, out_t, i, v[p.nsteps - 1]);
  }
}

}  // namespace

void fused_elementwise(const FusedProgram& p, void* out, DType out_t, StreamHandle s) {
  if (p.nsteps < 1 || p.nsteps > kMaxFusedSteps || p.noperands > kMaxFusedOperands || p.rank > kMaxRank)
    throw RuntimeError(fmt::format("cuda kernel fused_elementwise: {} steps, {} operands, rank {} (limits {}, {}, {})",
                                   p.nsteps, p.noperands, p.rank, kMaxFusedSteps, kMaxFusedOperands, kMaxRank));
  int64_t n = 1;
  for (int d = 0; d < p.rank; ++d) n *= p.shape[d];
  if (n == 0) return;
  k_fused<<<grid_for(n), kThreads, 0, as_stream(s)>>>(p, out, static_cast<int8_t>(out_t), n);
  TESSEL_CUDA_LAUNCH_CHECK("fused_elementwise");
}

}  // namespace tessel::cuda_kernels
