// sample_tokens' host-side checks (sample_tokens_params.hpp).
#include "sample_tokens_params.hpp"

#include <string>

#include "kernel_fail.hpp"

namespace tessel {

SampleTokensParams sample_tokens_params(const KernelArgs& a, const char* backend) {
  if (a.in.size() != 5 || a.in_shapes.size() != 5 || a.in_dtypes.size() != 5)
    kernel_fail(a, backend, "expected 5 operands (logits, keys, temperature, top_k, top_p) with shapes and dtypes");
  const Shape& l = a.in_shapes[0];
  if (l.empty()) kernel_fail(a, backend, "logits must have a vocabulary dim");
  if (a.in_dtypes[0] == DType::i32) kernel_fail(a, backend, "logits must be a float dtype");
  const Shape rows(l.begin(), l.end() - 1);
  const DType want[] = {DType::i32, DType::i32, DType::f32, DType::i32, DType::f32};
  for (std::size_t i = 1; i < 5; ++i) {
    if (a.in_shapes[i] != rows)
      kernel_fail(a, backend, "keys, temperature, top_k and top_p must have the logits' dims without the last: " +
                                  shape_str(rows));
    if (a.in_dtypes[i] != want[i]) kernel_fail(a, backend, "keys and top_k must be i32, temperature and top_p f32");
  }
  if (a.out_shape != rows || a.out_dtype != DType::i32)
    kernel_fail(a, backend, "the result must be i32 " + shape_str(rows));
  SampleTokensParams p;
  p.rows = num_elements(rows);
  p.V = l.back();
  return p;
}

}  // namespace tessel
