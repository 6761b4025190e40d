// src/runtime/cpu/cpu_kernel_util.cpp — the CPU kernels' shared argument checks, with the
// error message every kernel throws ("cpu kernel <op>(<operand types>) -> <result type>:
// <why>"), and the conversions between float operands and their f32 views
// (cpu_kernel_util.hpp).
#include "cpu_kernel_util.hpp"

#include <string>
#include <vector>

#include "tessel/ops/registry.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel::cpu_detail {
namespace {

std::string describe_args(const KernelArgs& a) {
  std::string s = op_name(a.kind);
  s += "(";
  for (std::size_t i = 0; i < a.in_shapes.size(); ++i) {
    if (i) s += ", ";
    s += i < a.in_dtypes.size() ? type_str(a.in_dtypes[i], a.in_shapes[i])
                                : "?" + shape_str(a.in_shapes[i]);
  }
  s += ") -> " + type_str(a.out_dtype, a.out_shape);
  return s;
}

}  // namespace

[[noreturn]] void fail(const KernelArgs& a, const std::string& why) {
  throw RuntimeError("cpu kernel " + describe_args(a) + ": " + why);
}

void check_arity(const KernelArgs& a, std::size_t lo, std::size_t hi) {
  if (a.in_shapes.size() != a.in.size() || a.in_dtypes.size() != a.in.size())
    fail(a, "KernelArgs has " + std::to_string(a.in.size()) + " operand pointers but " +
                std::to_string(a.in_shapes.size()) + " shapes and " +
                std::to_string(a.in_dtypes.size()) + " dtypes");
  if (a.in.size() < lo || a.in.size() > hi)
    fail(a, "expected " +
                (lo == hi ? std::to_string(lo)
                          : std::to_string(lo) + ".." +
                                (hi == std::size_t(-1) ? std::string("n") : std::to_string(hi))) +
                " operands, got " + std::to_string(a.in.size()));
  for (std::size_t i = 0; i < a.in.size(); ++i) {
    for (int64_t d : a.in_shapes[i])
      if (d < 0) fail(a, "operand " + std::to_string(i) + " has a negative dim");
    if (!a.in[i] && num_elements(a.in_shapes[i]) > 0)
      fail(a, "operand " + std::to_string(i) + " has a null data pointer");
  }
  for (int64_t d : a.out_shape)
    if (d < 0) fail(a, "result has a negative dim");
  if (!a.out && num_elements(a.out_shape) > 0) fail(a, "result has a null data pointer");
}

const OpAttrs& attrs_of(const KernelArgs& a) {
  if (!a.attrs) fail(a, "KernelArgs.attrs is null but this op needs its attributes");
  return *a.attrs;
}

int64_t normalize_dim(const KernelArgs& a, int64_t d, std::size_t rank, const char* what) {
  const int64_t r = static_cast<int64_t>(rank);
  if (d < 0) d += r;
  if (d < 0 || d >= r)
    fail(a, std::string(what) + " " + std::to_string(d) + " is out of range for rank " +
                std::to_string(r));
  return d;
}


std::vector<int64_t> broadcast_strides(const KernelArgs& a, const Shape& in, const Shape& out,
                                       const char* what) {
  if (in.size() > out.size())
    fail(a, std::string(what) + " " + shape_str(in) + " has a higher rank than the result " +
                shape_str(out));
  const auto cs = contiguous_strides(in);
  const std::size_t lead = out.size() - in.size();
  std::vector<int64_t> st(out.size(), 0);
  for (std::size_t d = lead; d < out.size(); ++d) {
    const int64_t n = in[d - lead];
    if (n == out[d]) st[d] = n == 1 ? 0 : cs[d - lead];
    else if (n == 1) st[d] = 0;
    else
      fail(a, std::string(what) + " " + shape_str(in) + " does not broadcast to " +
                  shape_str(out));
  }
  return st;
}

void check_same_dtype(const KernelArgs& a) {
  for (std::size_t i = 0; i < a.in_dtypes.size(); ++i)
    if (a.in_dtypes[i] != a.out_dtype)
      fail(a, "operand " + std::to_string(i) + " dtype " + dtype_name(a.in_dtypes[i]) +
                  " differs from the result dtype " + dtype_name(a.out_dtype));
}

// ---- f32 views of float operands -----------------------------------------------------------

const float* in_f32(const KernelArgs& a, std::size_t i, FVec& buf) {
  const DType t = a.in_dtypes[i];
  const int64_t n = num_elements(a.in_shapes[i]);
  switch (t) {
    case DType::f32: return static_cast<const float*>(a.in[i]);
    case DType::bf16: {
      buf.resize(static_cast<std::size_t>(n));
      const uint16_t* p = static_cast<const uint16_t*>(a.in[i]);
      for (int64_t j = 0; j < n; ++j) buf[j] = bf16_to_f32(p[j]);
      return buf.data();
    }
    case DType::f16: {
      buf.resize(static_cast<std::size_t>(n));
      const uint16_t* p = static_cast<const uint16_t*>(a.in[i]);
      for (int64_t j = 0; j < n; ++j) buf[j] = f16_to_f32(p[j]);
      return buf.data();
    }
    case DType::i32: break;
  }
  fail(a, "operand " + std::to_string(i) + " is i32 but this op needs a float type");
}


float* result_f32(const KernelArgs& a, void* out, const Shape& shape, DType dt, FVec& buf) {
  switch (dt) {
    case DType::f32: return static_cast<float*>(out);
    case DType::bf16:
    case DType::f16: buf.resize(static_cast<std::size_t>(num_elements(shape))); return buf.data();
    case DType::i32: break;
  }
  fail(a, "result is i32 but this op produces a float type");
}

void finish_result(void* out, const Shape& shape, DType dt, const FVec& buf) {
  const int64_t n = num_elements(shape);
  if (dt == DType::bf16) {
    uint16_t* p = static_cast<uint16_t*>(out);
    for (int64_t j = 0; j < n; ++j) p[j] = f32_to_bf16(buf[j]);
  } else if (dt == DType::f16) {
    uint16_t* p = static_cast<uint16_t*>(out);
    for (int64_t j = 0; j < n; ++j) p[j] = f32_to_f16(buf[j]);
  }
}

}  // namespace tessel::cpu_detail
