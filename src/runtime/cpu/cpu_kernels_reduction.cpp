// src/runtime/cpu/cpu_kernels_reduction.cpp — the CPU kernel of reduce_sum, reduce_max and
// reduce_mean over any set of dims, on f32 (bf16/f16 through f32) and i32 (sums wrap around),
// with reduce_into's strided loop (cpu_kernel_util.hpp).
#include <string>
#include <vector>

#include "tessel/runtime/tensor.hpp"

#include "cpu_elementwise.hpp"
#include "cpu_kernel_families.hpp"
#include "cpu_kernel_util.hpp"

namespace tessel::cpu_detail {

// ---- reductions ------------------------------------------------------------------------------

void k_reduce(const KernelArgs& a) {
  check_arity(a, 1, 1);
  const OpAttrs& at = attrs_of(a);
  const Shape& is = a.in_shapes[0];
  std::vector<bool> reduced(is.size(), false);
  for (int64_t d : at.dims) {
    const int64_t nd = normalize_dim(a, d, is.size(), "reduced dim");
    if (reduced[nd]) fail(a, "reduced dim " + std::to_string(d) + " is listed twice");
    reduced[nd] = true;
  }
  std::vector<int64_t> ostr(is.size(), 0);
  int64_t acc = 1, count = 1;
  for (std::size_t d = is.size(); d-- > 0;) {
    if (reduced[d]) {
      count *= is[d];
    } else {
      ostr[d] = acc;
      acc *= is[d];
    }
  }
  const int64_t n = num_elements(a.out_shape);
  if (acc != n)
    fail(a, "the result has " + std::to_string(n) + " elements but reducing " +
                shape_str(is) + " over the given dims leaves " + std::to_string(acc));
  if (a.in_dtypes[0] == DType::i32 || a.out_dtype == DType::i32) {
    if (a.in_dtypes[0] != a.out_dtype) fail(a, "operand and result dtypes differ");
    const int32_t* x = static_cast<const int32_t*>(a.in[0]);
    int32_t* y = static_cast<int32_t*>(a.out);
    if (a.kind == OpKind::ReduceSum) reduce_into<int32_t>(x, is, ostr, y, n, SumR{});
    else if (a.kind == OpKind::ReduceMax) reduce_into<int32_t>(x, is, ostr, y, n, MaxR{});
    else fail(a, "reduce_mean needs a float type");
    return;
  }
  FVec ib, ob;
  const float* x = in_f32(a, 0, ib);
  float* y = out_f32(a, ob);
  if (a.kind == OpKind::ReduceMax) {
    reduce_into<float>(x, is, ostr, y, n, MaxR{});
  } else {
    reduce_into<float>(x, is, ostr, y, n, SumR{});
    if (a.kind == OpKind::ReduceMean) {
      // Mean over the extent of the given (possibly local) operand; the partitioner
      // rewrites a mean over a sharded dim itself.
      const float inv = 1.0f / static_cast<float>(count);
      for (int64_t i = 0; i < n; ++i) y[i] *= inv;
    }
  }
  finish_out(a, ob);
}

}  // namespace tessel::cpu_detail
