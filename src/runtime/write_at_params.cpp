// write_at's host-side checks (write_at_params.hpp).
#include "write_at_params.hpp"

#include <fmt/format.h>

#include <limits>
#include <string>
#include <vector>

#include "kernel_fail.hpp"
#include "tessel/ops/registry.hpp"

namespace tessel {

namespace {

[[noreturn]] void fail(const KernelArgs& a, const char* backend, const std::string& why) { kernel_fail(a, backend, why); }

}  // namespace

WriteAtParams write_at_params(const KernelArgs& a, const char* backend) {
  if (a.in.size() != 3 || a.in_shapes.size() != 3 || a.in_dtypes.size() != 3)
    fail(a, backend, "expected 3 operands (dst, indices, values) with shapes and dtypes");
  if (!a.attrs) fail(a, backend, "KernelArgs.attrs is null (the axis is an attribute)");
  const Shape& d = a.in_shapes[0];
  int64_t ax = a.attrs->axis;
  if (ax < 0) ax += static_cast<int64_t>(d.size());
  if (ax < 0 || ax >= static_cast<int64_t>(d.size()))
    fail(a, backend, fmt::format("axis {} is out of range for dst of rank {}", a.attrs->axis, d.size()));
  if (a.in_dtypes[1] != DType::i32) fail(a, backend, "indices must be i32");
  if (a.in_dtypes[0] != a.out_dtype || a.in_dtypes[2] != a.out_dtype)
    fail(a, backend, "dst, values and the result must share a dtype");
  if (a.out_shape != d) fail(a, backend, "the result shape must be dst's " + shape_str(d));
  WriteAtParams p;
  const std::size_t x = static_cast<std::size_t>(ax);
  for (std::size_t i = 0; i < x; ++i) p.P *= d[i];
  for (std::size_t i = x + 1; i < d.size(); ++i) p.S *= d[i];
  p.n = d[x];
  if (num_elements(a.in_shapes[1]) != p.P || num_elements(a.in_shapes[2]) != p.P * p.S)
    fail(a, backend, "indices and values must have dst's dims before and without the axis");
  // dst's block along the axis (it may be split): its offset and the global extent.
  if (!a.in_offsets.empty() && a.in_offsets[0].size() == d.size()) p.off = a.in_offsets[0][x];
  else if (x < a.out_offset.size()) p.off = a.out_offset[x];
  p.N = !a.in_global_shapes.empty() && a.in_global_shapes[0].size() == d.size() ? a.in_global_shapes[0][x]
        : p.off == 0                                                            ? p.n
                                                                                : std::numeric_limits<int64_t>::max();
  p.elem = dtype_size(a.out_dtype);
  return p;
}

}  // namespace tessel
