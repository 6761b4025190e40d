// kernels/fused.cu — the fused-expression interpreter kernel (fused_elementwise, and the
// prologue of fused_softmax): one thread per result element walks the expression's steps
// (launchers.hpp, FusedProgram), reading each operand once through its broadcast strides and
// writing the result once — the memory traffic of one elementwise kernel for the whole chain.
//
// Each float step runs the unfused op's per-element code (elementwise_math.cuh) in f32 and is
// rounded to its dtype, as the unfused chain's intermediate buffer would be, so a fused chain
// computes what the unfused kernels compute. The step values live in a per-thread array indexed
// at run time (local memory, cached in L1). This is the fallback: by default each program is
// compiled into straight-line code at run time (src/runtime/cuda/fused_jit.cpp), which computes
// the same bits several times faster (docs/backend-cuda.md has the H200 figures).
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

// The program's value at element i of the result (row-major over p.shape).
__device__ __forceinline__ Val eval_fused(const FusedProgram& p, int64_t i) {
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
  return v[p.nsteps - 1];
}

__global__ void k_fused(FusedProgram p, void* out, int8_t out_t, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) store(out, out_t, i, eval_fused(p, i));
}

// softmax over the last axis of the program's result, rows of len <= kMaxRow: one warp per
// row; the row's values are evaluated once (rounded to the result's dtype, as the unfused
// chain's softmax operand would be) into the warp's slice of shared memory; max and sum by
// shuffles in a fixed order; one write. A fully masked row (max -inf) is zeros, as the softmax
// kernel's. The expression is evaluated in a plain loop (one copy of the interpreter: unrolled,
// its code grows with the row and runs slower).
constexpr int kMaxRow = 1024;

template <class T>
__global__ void k_fused_softmax_rows(FusedProgram p, T* out, int64_t rows, int64_t len) {
  extern __shared__ float row_buf[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + warp;
  if (row >= rows) return;
  float* x = row_buf + warp * len;
  float m = -INFINITY;
  for (int64_t l = lane; l < len; l += 32) {
    const float v = to_f<T>(from_f<T>(eval_fused(p, row * len + l).f));
    x[l] = v;
    m = max_nan(m, v);
  }
  for (int o = 16; o > 0; o >>= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
  T* y = out + row * len;
  if (m == -INFINITY) {
    for (int64_t l = lane; l < len; l += 32) y[l] = from_f<T>(0.0f);
    return;
  }
  float s = 0.0f;
  for (int64_t l = lane; l < len; l += 32) {
    const float e = expf(x[l] - m);
    x[l] = e;
    s += e;
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float inv = 1.0f / s;
  for (int64_t l = lane; l < len; l += 32) y[l] = from_f<T>(x[l] * inv);
}

}  // namespace

void fused_elementwise(const FusedProgram& p, void* out, DType out_t, StreamHandle s) {
  if (p.nsteps < 1 || p.nsteps > kMaxFusedSteps || p.noperands > kMaxFusedOperands || p.rank > kMaxRank)
    throw RuntimeError(fmt::format("cuda kernel fused_elementwise: {} steps, {} operands, rank {} (limits {}, {}, {})",
                                   p.nsteps, p.noperands, p.rank, kMaxFusedSteps, kMaxFusedOperands, kMaxRank));
  const FusedProgram q = with_divisors(p);
  const int64_t n = q.size();
  if (n == 0) return;
  k_fused<<<grid_for(n), kThreads, 0, as_stream(s)>>>(q, out, static_cast<int8_t>(out_t), n);
  TESSEL_CUDA_LAUNCH_CHECK("fused_elementwise");
}

bool fused_softmax_last_axis(const FusedProgram& p, void* out, DType out_t, StreamHandle s) {
  if (p.rank < 1 || out_t == DType::i32) return false;
  const int64_t len = p.shape[p.rank - 1];
  if (len < 1 || len > kMaxRow) return false;
  const FusedProgram q = with_divisors(p);
  const int64_t rows = q.size() / len;
  if (rows == 0) return true;
  constexpr int kWarps = kThreads / 32;
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return false;
  const std::size_t shared = sizeof(float) * kWarps * static_cast<std::size_t>(len);  // at most 32 KiB
  dispatch_float(out_t, "fused_softmax", [&](auto tag) {
    using T = decltype(tag);
    k_fused_softmax_rows<T><<<static_cast<unsigned>(blocks), kThreads, shared, as_stream(s)>>>(q, static_cast<T*>(out),
                                                                                              rows, len);
  });
  TESSEL_CUDA_LAUNCH_CHECK("fused_softmax");
  return true;
}

}  // namespace tessel::cuda_kernels
