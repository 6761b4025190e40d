// src/runtime/cuda/kernels/reduce_common.cuh — what the reducing kernels share (reduction.cu and
// nn.cu): warp and block reductions in a fixed order (lane-strided partial sums, then shuffles),
// so the same input gives the same bits on every device that computes it, and the row launch
// geometry.
#pragma once

#include <string>

#include "device_common.cuh"

namespace tessel::cuda_kernels {

constexpr unsigned kFull = 0xffffffffu;

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return max_nan(a, b); }
};

template <class Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Block-wide reduction (blockDim.x a multiple of 32, at most 1024); every thread gets it.
template <class Op>
__device__ float block_reduce(float v, Op op, float identity) {
  __shared__ float shm[32];
  __shared__ float result;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce(v, op);
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    float w = lane < nw ? shm[lane] : identity;
    w = warp_reduce(w, op);
    if (lane == 0) result = w;
  }
  __syncthreads();
  const float r = result;
  __syncthreads();  // shm and result may be reused by the next call
  return r;
}

// Threads per row block: enough for the row, a multiple of 32, at most 1024.
inline unsigned row_threads(int64_t len) {
  if (len >= 1024) return 1024;
  int64_t t = ((len + 31) / 32) * 32;
  return static_cast<unsigned>(t < 32 ? 32 : t);
}

inline void check_rows(int64_t rows, const char* what) {
  if (rows > 0x7fffffff)
    throw RuntimeError(std::string("cuda kernel ") + what + ": " + std::to_string(rows) +
                       " rows exceed one grid dimension (2^31 - 1)");
}

}  // namespace tessel::cuda_kernels
