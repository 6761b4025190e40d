// src/runtime/cpu/cpu_kernels_layout.cpp — the CPU kernels that fill or move data without
// arithmetic: constant, reshape and sharding_constraint (a copy), transpose, broadcast, slice
// and concat. All but constant are dtype-generic by element size: bit-exact copies.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tessel/runtime/tensor.hpp"

#include "cpu_kernel_families.hpp"
#include "cpu_kernel_util.hpp"

namespace tessel::cpu_detail {

// ---- data movement -----------------------------------------------------------------------------
void k_constant(const KernelArgs& a) {
  check_arity(a, 0, 0);
  const OpAttrs& at = attrs_of(a);
  const int64_t n = num_elements(a.out_shape);
  switch (a.out_dtype) {
    case DType::f32: std::fill_n(static_cast<float*>(a.out), n, static_cast<float>(at.scalar)); break;
    case DType::bf16:
      std::fill_n(static_cast<uint16_t*>(a.out), n, f32_to_bf16(static_cast<float>(at.scalar)));
      break;
    case DType::f16:
      std::fill_n(static_cast<uint16_t*>(a.out), n, f32_to_f16(static_cast<float>(at.scalar)));
      break;
    case DType::i32: {
      if (!(at.scalar >= -2147483648.0 && at.scalar <= 2147483647.0))
        fail(a, "constant " + std::to_string(at.scalar) + " does not fit in i32");
      std::fill_n(static_cast<int32_t*>(a.out), n, static_cast<int32_t>(at.scalar));
      break;
    }
  }
}

void k_copy(const KernelArgs& a) {  // Reshape, ShardingConstraint
  check_arity(a, 1, 1);
  check_same_dtype(a);
  if (num_elements(a.in_shapes[0]) != num_elements(a.out_shape))
    fail(a, "operand and result element counts differ");
  const std::size_t bytes = static_cast<std::size_t>(num_elements(a.out_shape)) * dtype_size(a.out_dtype);
  if (bytes && a.out != a.in[0]) std::memmove(a.out, a.in[0], bytes);
}

void k_transpose(const KernelArgs& a) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const OpAttrs& at = attrs_of(a);
  const Shape& is = a.in_shapes[0];
  if (at.dims.size() != is.size()) fail(a, "permutation length differs from the rank");
  std::vector<int> perm(is.size());
  std::vector<bool> used(is.size(), false);
  for (std::size_t i = 0; i < perm.size(); ++i) {
    const int64_t d = normalize_dim(a, at.dims[i], is.size(), "permutation entry");
    if (used[d]) fail(a, "permutation repeats dim " + std::to_string(d));
    used[d] = true;
    perm[i] = static_cast<int>(d);
    if (a.out_shape.size() != is.size() || a.out_shape[i] != is[d])
      fail(a, "result shape does not match the permuted operand shape");
  }
  by_elem_size(a, a.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    permute_copy<T>(static_cast<const T*>(a.in[0]), is, perm, static_cast<T*>(a.out));
  });
}

void k_broadcast(const KernelArgs& a) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const auto st = broadcast_strides(a, a.in_shapes[0], a.out_shape, "operand");
  by_elem_size(a, a.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    copy_strided<T>(static_cast<const T*>(a.in[0]), st, static_cast<T*>(a.out),
                    contiguous_strides(a.out_shape), a.out_shape);
  });
}

void k_slice(const KernelArgs& a) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const OpAttrs& at = attrs_of(a);
  const Shape& is = a.in_shapes[0];
  if (at.starts.size() != is.size() || at.limits.size() != is.size())
    fail(a, "slice starts/limits must have one entry per dim");
  if (a.out_shape.size() != is.size()) fail(a, "result rank differs from the operand rank");
  const auto cs = contiguous_strides(is);
  int64_t base = 0;
  for (std::size_t d = 0; d < is.size(); ++d) {
    const int64_t s = at.starts[d], l = at.limits[d];
    if (s < 0 || l < s || l > is[d])
      fail(a, "slice [" + std::to_string(s) + ", " + std::to_string(l) + ") of dim " +
                  std::to_string(d) + " is out of range for size " + std::to_string(is[d]));
    if (a.out_shape[d] != l - s) fail(a, "result shape does not match starts/limits");
    base += s * cs[d];
  }
  if (num_elements(a.out_shape) == 0) return;
  by_elem_size(a, a.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    copy_strided<T>(static_cast<const T*>(a.in[0]) + base, cs, static_cast<T*>(a.out),
                    contiguous_strides(a.out_shape), a.out_shape);
  });
}

void k_concat(const KernelArgs& a) {
  check_arity(a, 1, std::size_t(-1));
  check_same_dtype(a);
  const OpAttrs& at = attrs_of(a);
  const Shape& os = a.out_shape;
  const int64_t axis = normalize_dim(a, at.axis, os.size(), "concat axis");
  int64_t total = 0;
  for (std::size_t i = 0; i < a.in.size(); ++i) {
    const Shape& s = a.in_shapes[i];
    if (s.size() != os.size()) fail(a, "operand " + std::to_string(i) + " rank differs");
    for (std::size_t d = 0; d < s.size(); ++d)
      if (int64_t(d) != axis && s[d] != os[d])
        fail(a, "operand " + std::to_string(i) + " differs from the result off the axis");
    total += s[axis];
  }
  if (total != os[axis]) fail(a, "operand extents along the axis do not add up");
  const auto ostr = contiguous_strides(os);
  by_elem_size(a, a.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    int64_t at_axis = 0;
    for (std::size_t i = 0; i < a.in.size(); ++i) {
      const Shape& s = a.in_shapes[i];
      if (num_elements(s) > 0)
        copy_strided<T>(static_cast<const T*>(a.in[i]), contiguous_strides(s),
                        static_cast<T*>(a.out) + at_axis * ostr[axis], ostr, s);
      at_axis += s[axis];
    }
  });
}

}  // namespace tessel::cpu_detail
