// src/runtime/cuda/kernels/device_common.cuh — what every .cu file of kernels/ shares: dtype loads/stores
// through f32, the Loop offset decomposition, launch configuration and error checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "elementwise_math.cuh"  // max_nan
#include "launchers.hpp"  // Loop, loop_offsets

namespace tessel::cuda_kernels {

[[noreturn]] void throw_cuda(cudaError_t e, const char* what, const char* file, int line);

// After every launch: a bad configuration (too many blocks, too much shared memory) is
// reported at once, with the launcher that failed.
#define TESSEL_CUDA_LAUNCH_CHECK(what)                                                  \
  do {                                                                                  \
    cudaError_t _e = cudaGetLastError();                                                \
    if (_e != cudaSuccess) ::tessel::cuda_kernels::throw_cuda(_e, what, __FILE__, __LINE__); \
  } while (0)

constexpr int kThreads = 256;

// Blocks of a grid-stride loop over n elements (capped: each thread then does several).
inline unsigned grid_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > (int64_t{1} << 20)) b = int64_t{1} << 20;
  return static_cast<unsigned>(b);
}

inline cudaStream_t as_stream(StreamHandle s) { return static_cast<cudaStream_t>(s); }

template <class T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }

template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

// Records the first error of a stream; later ones are dropped.
__device__ __forceinline__ void report(DeviceError* err, unsigned seq, int code, long long value, long long pos,
                                       long long bound) {
  if (!err) return;
  if (atomicCAS(&err->flag, 0, 1) == 0) {
    err->code = code;
    err->seq = seq;
    err->value = value;
    err->position = pos;
    err->bound = bound;
    __threadfence();
  }
}

#define TESSEL_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// Calls f with the CUDA type of a float dtype (float, __nv_bfloat16, __half).
template <class F>
void dispatch_float(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(__nv_bfloat16{}); return;
    case DType::f16: f(__half{}); return;
    default: break;
  }
  throw RuntimeError(std::string("cuda kernel ") + what + ": needs a float dtype, got " + dtype_name(t));
}

// Calls f with an unsigned type of the element size.
template <class F>
void dispatch_elem(std::size_t elem, const char* what, F&& f) {
  switch (elem) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
    default: break;
  }
  throw RuntimeError(std::string("cuda kernel ") + what + ": unsupported element size " + std::to_string(elem));
}

// A value of T from its bits (the launchers take fill values as raw bits).
template <class T>
inline T bits_as(uint64_t bits) {
  T v;
  static_assert(sizeof(T) <= sizeof(uint64_t), "element too large");
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

}  // namespace tessel::cuda_kernels
