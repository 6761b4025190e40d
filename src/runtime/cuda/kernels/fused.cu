// src/runtime/cuda/kernels/fused.cu — the fused-expression interpreter kernel (fused_elementwise, and the
// prologue of fused_softmax): one thread per result element walks the expression's steps
// (launchers.hpp, FusedProgram), reading each operand once through its broadcast strides and
// writing the result once — the memory traffic of one elementwise kernel for the whole chain.
//
// Each float step runs the unfused op's per-element code (elementwise_math.cuh) in f32 and is
// rounded to its dtype, as the unfused chain's intermediate buffer would be, so a fused chain
// computes what the unfused kernels compute. The per-element evaluation (eval_fused) is in
// fused_eval.hpp, which the host compiler builds too (tests/unit/test_cuda_device_math.cpp runs it
// against the CPU fused kernel). The step values live in a per-thread array indexed
// at run time (local memory, cached in L1). This is the fallback: by default each program is
// compiled into straight-line code at run time (src/runtime/cuda/fused_jit.cpp), which computes
// the same bits several times faster (docs/backend-cuda.md has the H200 figures).
#include <fmt/format.h>

#include "device_common.cuh"
#include "fused_eval.hpp"

namespace tessel::cuda_kernels {
namespace {

__global__ void k_fused(FusedProgram p, void* out, int8_t out_t, int64_t n) {
  TESSEL_GRID_STRIDE(i, n) store_val(out, out_t, i, eval_fused(p, i));
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
