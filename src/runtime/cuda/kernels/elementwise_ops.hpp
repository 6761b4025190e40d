// src/runtime/cuda/kernels/elementwise_ops.hpp — the elementwise op codes of the CUDA kernels, and TESSEL_HD, the
// qualifier of the device math that the host compiles too. No include: the same text is
// compiled by nvcc (src/runtime/cuda/kernels/*.cu), by the host compiler (launchers.hpp, and the host tests of
// the device math, tests/unit/test_cuda_device_math.cpp) and, at run time, by NVRTC inside the
// generated fused kernels (src/runtime/cuda/fused_jit.cpp).
#pragma once

// A function of the device math: __host__ __device__ under nvcc and NVRTC (both define
// __CUDACC__), a plain inline function for the host compiler, so the very code the kernels run
// is evaluated on the host by the unit tests against the CPU kernels.
#ifndef TESSEL_HD
#if defined(__CUDACC__)
#define TESSEL_HD __host__ __device__ __forceinline__
#else
#define TESSEL_HD inline
#endif
#endif

namespace tessel::cuda_kernels {

enum class Unary : int { Neg, Exp, Log, Tanh, Gelu, Relu, Sqrt, Rsqrt, Sigmoid, Silu };
enum class Binary : int { Add, Sub, Mul, Div, Max, GeluGrad, Eq, Ne, Lt, Le, Gt, Ge };  // comparisons last

}  // namespace tessel::cuda_kernels
