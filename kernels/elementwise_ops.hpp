// kernels/elementwise_ops.hpp — the elementwise op codes of the CUDA kernels. No include: the
// same text is compiled by nvcc (kernels/*.cu), by the host compiler (launchers.hpp) and, at
// run time, by NVRTC inside the generated fused kernels (src/runtime/cuda/fused_jit.cpp).
#pragma once

namespace tessel::cuda_kernels {

enum class Unary : int { Neg, Exp, Log, Tanh, Gelu, Relu, Sqrt, Rsqrt, Sigmoid, Silu };
enum class Binary : int { Add, Sub, Mul, Div, Max, GeluGrad, Eq, Ne, Lt, Le, Gt, Ge };  // comparisons last

}  // namespace tessel::cuda_kernels
