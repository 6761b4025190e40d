// src/runtime/cuda/cuda_loop.hpp — building the kernels' Loop (an index space with per-operand
// strides) on the host: size-1 dims dropped, adjacent dims contiguous for every operand merged
// (the CPU kernels' strided_loop does the same), so most layouts reach the GPU as 1–2 dims.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "gemm_plan.hpp"  // contiguous_strides
#include "launchers.hpp"
#include "tessel/core/common.hpp"

namespace tessel::cuda {

// Strides of `in` broadcast (numpy, right-aligned) to `out`; 0 where broadcast. Throws
// RuntimeError when it does not broadcast.
inline std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  if (in.size() > out.size())
    throw RuntimeError("operand " + shape_str(in) + " has a higher rank than the result " + shape_str(out));
  const auto cs = contiguous_strides(in);
  const std::size_t lead = out.size() - in.size();
  std::vector<int64_t> st(out.size(), 0);
  for (std::size_t d = lead; d < out.size(); ++d) {
    const int64_t n = in[d - lead];
    if (n == out[d]) st[d] = n == 1 ? 0 : cs[d - lead];
    else if (n != 1) throw RuntimeError("operand " + shape_str(in) + " does not broadcast to " + shape_str(out));
  }
  return st;
}

// The Loop over `shape` with one stride vector per operand (at most kMaxOperands). Throws
// RuntimeError when more than kMaxRank dims remain after merging.
inline cuda_kernels::Loop make_loop(const Shape& shape, std::initializer_list<std::vector<int64_t>> strides) {
  using cuda_kernels::kMaxOperands;
  using cuda_kernels::kMaxRank;
  const std::vector<std::vector<int64_t>> st(strides);
  if (st.size() > static_cast<std::size_t>(kMaxOperands)) throw RuntimeError("make_loop: too many operands");
  cuda_kernels::Loop l;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const int64_t n = shape[d];
    if (n == 0) {  // empty space
      l.rank = 1;
      l.shape[0] = 0;
      return l;
    }
    if (n == 1) continue;
    if (l.rank > 0) {
      bool merge = true;
      for (std::size_t k = 0; k < st.size(); ++k)
        if (l.stride[k][l.rank - 1] != st[k][d] * n) merge = false;
      if (merge) {
        l.shape[l.rank - 1] *= n;
        for (std::size_t k = 0; k < st.size(); ++k) l.stride[k][l.rank - 1] = st[k][d];
        continue;
      }
    }
    if (l.rank == kMaxRank)
      throw RuntimeError("the index space " + shape_str(shape) + " has more than " + std::to_string(kMaxRank) +
                         " dims that cannot be merged (the CUDA kernels' limit)");
    l.shape[l.rank] = n;
    for (std::size_t k = 0; k < st.size(); ++k) l.stride[k][l.rank] = st[k][d];
    ++l.rank;
  }
  return l;  // rank 0: a scalar (size() == 1)
}

}  // namespace tessel::cuda
