// src/runtime/write_at_params.hpp — internal: the host-side checks and sizes of the write_at
// kernels, shared by every backend (CPU: src/runtime/cpu/cpu_kernels_index.cpp; CUDA:
// src/runtime/cuda/cuda_kernels.cpp), so both refuse the same arguments with the same message
// (RuntimeError naming the backend, the op and its operand types). The indices themselves are
// checked by each kernel (on the host for the CPU, on the device for CUDA).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessel/runtime/kernels.hpp"

namespace tessel {

struct WriteAtParams {
  int64_t P = 1;    // the leading positions (dst's dims before the axis, one index each)
  int64_t n = 0;    // this block's extent along the axis
  int64_t S = 1;    // the elements of a row (dst's dims after the axis)
  int64_t off = 0;  // this block's first position along the axis
  int64_t N = 0;    // the axis' global extent: an index must be in [0, N)
  std::size_t elem = 0;  // bytes per element
};

WriteAtParams write_at_params(const KernelArgs& a, const char* backend);

}  // namespace tessel
