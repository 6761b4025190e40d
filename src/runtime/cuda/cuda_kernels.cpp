// The CUDA kernel of every op kind: argument checks and shape arithmetic on the host (as the
// CPU kernels do, src/runtime/cpu/cpu_kernels_<family>.cpp), then one or two launches of kernels/.
//
// Float ops take one float dtype for every float operand and result (f32, bf16 or f16; f32
// accumulation inside the kernels). A mix of float dtypes — which the graph builders do not
// produce but KernelArgs can express — goes through f32: operands are cast to f32 scratch,
// the op runs in f32 and the results are cast back, the CPU kernels' own approach.
#include <fmt/format.h>

#include <cstring>
#include <limits>

#include "../attention_params.hpp"
#include "../sample_tokens_params.hpp"
#include "../write_at_params.hpp"
#include "cuda_backend.hpp"
#include "cuda_loop.hpp"
#include "fused_jit.hpp"
#include "fused_program.hpp"
#include "tessel/ir/fused_expr.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel::cuda {
namespace {

namespace ck = cuda_kernels;

std::string describe(const KernelArgs& a) {
  std::string s = std::string("cuda kernel ") + op_name(a.kind) + "(";
  for (std::size_t i = 0; i < a.in_shapes.size(); ++i) {
    if (i) s += ", ";
    s += i < a.in_dtypes.size() ? type_str(a.in_dtypes[i], a.in_shapes[i]) : shape_str(a.in_shapes[i]);
  }
  return s + ") -> " + type_str(a.out_dtype, a.out_shape);
}

[[noreturn]] void fail(const KernelArgs& a, const std::string& why) { throw RuntimeError(describe(a) + ": " + why); }

void check_arity(const KernelArgs& a, std::size_t lo, std::size_t hi) {
  if (a.in_shapes.size() != a.in.size() || a.in_dtypes.size() != a.in.size())
    fail(a, "KernelArgs has mismatched operand pointers, shapes and dtypes");
  if (a.in.size() < lo || a.in.size() > hi) fail(a, fmt::format("expected {}..{} operands, got {}", lo, hi, a.in.size()));
}

const OpAttrs& attrs_of(const KernelArgs& a) {
  if (!a.attrs) fail(a, "KernelArgs.attrs is null but this op needs its attributes");
  return *a.attrs;
}

int64_t normalize_dim(const KernelArgs& a, int64_t d, std::size_t rank, const char* what) {
  const int64_t r = static_cast<int64_t>(rank);
  if (d < 0) d += r;
  if (d < 0 || d >= r) fail(a, fmt::format("{} {} is out of range for rank {}", what, d, r));
  return d;
}

bool is_float(DType t) { return t != DType::i32; }

// Runs f with args whose float operands/results all have one dtype (see the file comment).
template <class F>
void with_uniform_floats(CudaBackend& be, const KernelArgs& a, CudaStream& s, F&& f) {
  DType common = DType::i32;
  bool mixed = false;
  auto see = [&](DType t) {
    if (!is_float(t)) return;
    if (common == DType::i32) common = t;
    else if (common != t) mixed = true;
  };
  for (DType t : a.in_dtypes) see(t);
  see(a.out_dtype);
  for (DType t : a.extra_out_dtypes) see(t);
  if (!mixed) {
    f(a);
    return;
  }
  KernelArgs b = a;
  std::vector<void*> temps;
  try {
    for (std::size_t i = 0; i < a.in.size(); ++i)
      if (is_float(a.in_dtypes[i]) && a.in_dtypes[i] != DType::f32) {
        const int64_t n = num_elements(a.in_shapes[i]);
        void* t = be.scratch(static_cast<std::size_t>(n) * 4, s);
        temps.push_back(t);
        ck::cast(a.in[i], a.in_dtypes[i], t, DType::f32, n, s.handle());
        b.in[i] = t;
        b.in_dtypes[i] = DType::f32;
      }
    auto result = [&](void*& ptr, DType& dt, const Shape& shape) -> void* {
      if (!is_float(dt) || dt == DType::f32) return nullptr;
      void* t = be.scratch(static_cast<std::size_t>(num_elements(shape)) * 4, s);
      temps.push_back(t);
      ptr = t;
      dt = DType::f32;
      return t;
    };
    void* out_tmp = result(b.out, b.out_dtype, a.out_shape);
    std::vector<void*> extra_tmp;
    for (std::size_t r = 0; r < b.extra_out.size(); ++r)
      extra_tmp.push_back(result(b.extra_out[r], b.extra_out_dtypes[r], a.extra_out_shapes[r]));
    f(b);
    if (out_tmp) ck::cast(out_tmp, DType::f32, a.out, a.out_dtype, num_elements(a.out_shape), s.handle());
    for (std::size_t r = 0; r < extra_tmp.size(); ++r)
      if (extra_tmp[r])
        ck::cast(extra_tmp[r], DType::f32, a.extra_out[r], a.extra_out_dtypes[r], num_elements(a.extra_out_shapes[r]),
                 s.handle());
  } catch (...) {
    for (void* t : temps) be.free_scratch(t, s);
    throw;
  }
  for (void* t : temps) be.free_scratch(t, s);
}

// ---- the kernels -------------------------------------------------------------------------------

void k_constant(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 0, 0);
  const double v = attrs_of(a).scalar;
  if (a.out_dtype == DType::i32 && !(v >= -2147483648.0 && v <= 2147483647.0))
    fail(a, fmt::format("constant {} does not fit in i32", v));
  const std::size_t es = dtype_size(a.out_dtype);
  ck::fill_bits(a.out, num_elements(a.out_shape), es, scalar_bits(a.out_dtype, v), s.handle());
}

void k_unary(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 1, 1);
  const int64_t n = num_elements(a.out_shape);
  if (num_elements(a.in_shapes[0]) != n) fail(a, "operand and result sizes differ");
  if ((a.in_dtypes[0] == DType::i32) != (a.out_dtype == DType::i32))
    fail(a, "operand and result dtypes must both be i32 or both float");
  for (const auto& [kind, op] : kUnaryCodes)
    if (kind == a.kind) {
      ck::unary(op, a.in[0], a.out, a.out_dtype, n, s.handle());
      return;
    }
  fail(a, "not a unary op");
}

void k_binary(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 2, 2);
  const bool i0 = a.in_dtypes[0] == DType::i32, i1 = a.in_dtypes[1] == DType::i32;
  if (i0 != i1) fail(a, "i32 and float operands cannot be mixed");
  ck::Binary op = ck::Binary::Add;
  bool found = false;
  for (const auto& [kind, o] : kBinaryCodes)
    if (kind == a.kind) op = o, found = true;
  if (!found) fail(a, "not a binary op");
  const bool cmp = op >= ck::Binary::Eq;
  if (cmp && a.out_dtype != DType::i32) fail(a, "a comparison produces i32");
  if (!cmp && (a.out_dtype == DType::i32) != i0) fail(a, "i32 and float operands cannot be mixed");
  const Shape& os = a.out_shape;
  const auto loop = make_loop(os, {contiguous_strides(os), broadcast_strides(a.in_shapes[0], os),
                                   broadcast_strides(a.in_shapes[1], os)});
  ck::binary(op, a.in[0], a.in[1], a.out, a.in_dtypes[0], loop, s.handle());
}

void k_reduce(CudaBackend& be, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 1, 1);
  const OpAttrs& at = attrs_of(a);
  const Shape& is = a.in_shapes[0];
  std::vector<bool> reduced(is.size(), false);
  for (int64_t d : at.dims) {
    const int64_t nd = normalize_dim(a, d, is.size(), "reduced dim");
    if (reduced[nd]) fail(a, fmt::format("reduced dim {} is listed twice", d));
    reduced[nd] = true;
  }
  if (a.in_dtypes[0] != a.out_dtype) fail(a, "operand and result dtypes differ");
  const auto cs = contiguous_strides(is);
  Shape kept_shape, red_shape;
  std::vector<int64_t> kept_st, red_st;
  for (std::size_t d = 0; d < is.size(); ++d) {
    (reduced[d] ? red_shape : kept_shape).push_back(is[d]);
    (reduced[d] ? red_st : kept_st).push_back(cs[d]);
  }
  if (num_elements(kept_shape) != num_elements(a.out_shape))
    fail(a, "the result size does not match the kept dims of " + shape_str(is));
  const ck::Reduce op = a.kind == OpKind::ReduceMax ? ck::Reduce::Max
                        : a.kind == OpKind::ReduceMean ? ck::Reduce::Mean
                                                       : ck::Reduce::Sum;
  if (op == ck::Reduce::Mean && a.out_dtype == DType::i32) fail(a, "reduce_mean needs a float type");
  const ScopedScratch scratch(be, s, ck::reduce_scratch_bytes(a.out_dtype, num_elements(kept_shape),
                                                               num_elements(red_shape)));
  ck::reduce(op, a.in[0], a.out, a.out_dtype, make_loop(kept_shape, {kept_st}), make_loop(red_shape, {red_st}),
             scratch.get(), s.handle());
}

void check_same_dtype(const KernelArgs& a) {
  for (std::size_t i = 0; i < a.in_dtypes.size(); ++i)
    if (a.in_dtypes[i] != a.out_dtype)
      fail(a, fmt::format("operand {} dtype {} differs from the result dtype {}", i, dtype_name(a.in_dtypes[i]),
                          dtype_name(a.out_dtype)));
}

void k_copy(CudaBackend&, const KernelArgs& a, CudaStream& s) {  // reshape, sharding_constraint
  check_arity(a, 1, 1);
  check_same_dtype(a);
  if (num_elements(a.in_shapes[0]) != num_elements(a.out_shape)) fail(a, "operand and result element counts differ");
  const std::size_t bytes = static_cast<std::size_t>(num_elements(a.out_shape)) * dtype_size(a.out_dtype);
  if (bytes && a.out != a.in[0])
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(a.out, a.in[0], bytes, cudaMemcpyDeviceToDevice, s.handle()));
}

void k_transpose(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const OpAttrs& at = attrs_of(a);
  const Shape& is = a.in_shapes[0];
  if (at.dims.size() != is.size() || a.out_shape.size() != is.size()) fail(a, "permutation length differs from the rank");
  const auto cs = contiguous_strides(is);
  std::vector<int64_t> st(is.size());
  for (std::size_t i = 0; i < is.size(); ++i) {
    const int64_t d = normalize_dim(a, at.dims[i], is.size(), "permutation entry");
    if (a.out_shape[i] != is[d]) fail(a, "result shape does not match the permuted operand shape");
    st[i] = cs[d];
  }
  ck::strided_copy(a.in[0], a.out, dtype_size(a.out_dtype),
                   make_loop(a.out_shape, {contiguous_strides(a.out_shape), st}), s.handle());
}

void k_broadcast(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  ck::strided_copy(a.in[0], a.out, dtype_size(a.out_dtype),
                   make_loop(a.out_shape, {contiguous_strides(a.out_shape), broadcast_strides(a.in_shapes[0], a.out_shape)}),
                   s.handle());
}

void k_slice(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const OpAttrs& at = attrs_of(a);
  const Shape& is = a.in_shapes[0];
  if (at.starts.size() != is.size() || at.limits.size() != is.size() || a.out_shape.size() != is.size())
    fail(a, "slice starts/limits must have one entry per dim");
  const auto cs = contiguous_strides(is);
  int64_t base = 0;
  for (std::size_t d = 0; d < is.size(); ++d) {
    const int64_t st = at.starts[d], l = at.limits[d];
    if (st < 0 || l < st || l > is[d] || a.out_shape[d] != l - st)
      fail(a, fmt::format("slice [{}, {}) of dim {} does not fit size {} / the result", st, l, d, is[d]));
    base += st * cs[d];
  }
  const std::size_t es = dtype_size(a.out_dtype);
  ck::strided_copy(static_cast<const char*>(a.in[0]) + base * int64_t(es), a.out, es,
                   make_loop(a.out_shape, {contiguous_strides(a.out_shape), cs}), s.handle());
}

void k_concat(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 1, std::size_t(-1));
  check_same_dtype(a);
  const Shape& os = a.out_shape;
  const int64_t axis = normalize_dim(a, attrs_of(a).axis, os.size(), "concat axis");
  const auto ostr = contiguous_strides(os);
  const std::size_t es = dtype_size(a.out_dtype);
  int64_t at_axis = 0;
  for (std::size_t i = 0; i < a.in.size(); ++i) {
    const Shape& sh = a.in_shapes[i];
    if (sh.size() != os.size()) fail(a, fmt::format("operand {} rank differs", i));
    ck::strided_copy(a.in[i], static_cast<char*>(a.out) + at_axis * ostr[axis] * int64_t(es), es,
                     make_loop(sh, {ostr, contiguous_strides(sh)}), s.handle());
    at_axis += sh[axis];
  }
  if (at_axis != os[axis]) fail(a, "operand extents along the axis do not add up");
}

void k_softmax(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 1, 1);
  const Shape& sh = a.in_shapes[0];
  if (sh != a.out_shape) fail(a, "operand and result shapes differ");
  const int64_t axis = normalize_dim(a, attrs_of(a).axis, sh.size(), "softmax axis");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= sh[d];
  for (std::size_t d = axis + 1; d < sh.size(); ++d) inner *= sh[d];
  ck::softmax(a.in[0], a.out, a.out_dtype, outer, sh[axis], inner, s.handle());
}

void k_layer_norm(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 3, 3);
  const Shape& sh = a.in_shapes[0];
  if (sh.empty() || sh != a.out_shape) fail(a, "layer_norm needs rank >= 1 and equal operand and result shapes");
  const int64_t D = sh.back();
  if (num_elements(a.in_shapes[1]) != D || num_elements(a.in_shapes[2]) != D)
    fail(a, fmt::format("gamma and beta must have {} elements (the last dim)", D));
  const int64_t rows = D > 0 ? num_elements(sh) / D : 0;
  ck::layer_norm(a.in[0], a.in[1], a.in[2], a.out, a.out_dtype, rows, D, static_cast<float>(attrs_of(a).eps),
                 s.handle());
}

void k_layer_norm_grad(CudaBackend& be, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 3, 3);
  const Shape& sh = a.in_shapes[0];
  if (sh.empty()) fail(a, "layer_norm_grad needs rank >= 1");
  if (a.extra_out.size() != 2 || a.extra_out_shapes.size() != 2 || a.extra_out_dtypes.size() != 2)
    fail(a, "layer_norm_grad writes three results (dx, dgamma, dbeta)");
  const int64_t D = sh.back();
  if (a.in_shapes[2] != sh || a.out_shape != sh) fail(a, "x, dy and dx must have one shape");
  if (num_elements(a.in_shapes[1]) != D || num_elements(a.extra_out_shapes[0]) != D ||
      num_elements(a.extra_out_shapes[1]) != D)
    fail(a, fmt::format("gamma, dgamma and dbeta must have {} elements (the last dim)", D));
  const int64_t rows = D > 0 ? num_elements(sh) / D : 0;
  const ScopedScratch scratch(be, s, ck::layer_norm_grad_scratch_bytes(rows, D));
  ck::layer_norm_grad(a.in[0], a.in[1], a.in[2], a.out, a.extra_out[0], a.extra_out[1], a.out_dtype, rows, D,
                      static_cast<float>(attrs_of(a).eps), scratch.get(), s.handle());
}

void k_adamw(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 8, 9);
  const Shape& sh = a.in_shapes[0];
  if (a.extra_out.size() != 2 || a.extra_out_shapes.size() != 2 || a.extra_out_dtypes.size() != 2)
    fail(a, "adamw writes three results (the parameter, m and v)");
  for (std::size_t i = 1; i <= 3; ++i)
    if (a.in_shapes[i] != sh) fail(a, "g, m and v must have the parameter's shape");
  if (a.in_dtypes[1] != a.in_dtypes[0] || a.out_dtype != a.in_dtypes[0])
    fail(a, "on CUDA the gradient and the result have the parameter's dtype; cast the gradient first");
  if (a.in_dtypes[2] != DType::f32 || a.in_dtypes[3] != DType::f32 || a.extra_out_dtypes[0] != DType::f32 ||
      a.extra_out_dtypes[1] != DType::f32)
    fail(a, "the moments must be f32");
  for (std::size_t i = 4; i < a.in.size(); ++i)
    if (num_elements(a.in_shapes[i]) != 1 || a.in_dtypes[i] != DType::f32)
      fail(a, "lr, bc1, bc2, gscale (and apply) must be f32 scalars");
  const OpAttrs& at = attrs_of(a);
  auto f = [&](std::size_t i) { return static_cast<const float*>(a.in[i]); };
  ck::adamw(a.in[0], a.in[1], f(2), f(3), f(4), f(5), f(6), f(7), a.in.size() == 9 ? f(8) : nullptr, a.out,
            static_cast<float*>(a.extra_out[0]),
            static_cast<float*>(a.extra_out[1]), a.out_dtype, num_elements(sh), static_cast<float>(at.beta1),
            static_cast<float>(at.beta2), static_cast<float>(at.eps), static_cast<float>(at.weight_decay), s.handle());
}

int64_t in_offset(const KernelArgs& a, std::size_t operand, std::size_t dim, std::size_t rank) {
  if (operand < a.in_offsets.size() && a.in_offsets[operand].size() == rank) return a.in_offsets[operand][dim];
  return 0;
}

void k_embedding(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 2, 2);
  const Shape& ts = a.in_shapes[0];
  if (ts.size() != 2) fail(a, "the table must be rank 2 [V, D]");
  if (a.in_dtypes[1] != DType::i32) fail(a, "ids must be i32");
  if (a.in_dtypes[0] != a.out_dtype) fail(a, "the result dtype must be the table dtype");
  Shape expect = a.in_shapes[1];
  expect.push_back(ts[1]);
  if (a.out_shape != expect) fail(a, "the result shape must be ids shape + [D] = " + shape_str(expect));
  const int64_t off = in_offset(a, 0, 0, 2);
  const int64_t V = ts[0];
  const int64_t V_global = !a.in_global_shapes.empty() && !a.in_global_shapes[0].empty() ? a.in_global_shapes[0][0]
                           : off == 0 ? V
                                      : std::numeric_limits<int64_t>::max();
  const unsigned seq = s.next_checked_launch(describe(a));
  ck::embedding(a.in[0], dtype_size(a.out_dtype), static_cast<const int32_t*>(a.in[1]), a.out,
                num_elements(a.in_shapes[1]), V, ts[1], off, V_global, s.device_error(), seq, s.handle());
}

void k_cross_entropy(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 2, 2);
  const Shape& ls = a.in_shapes[0];
  if (ls.empty()) fail(a, "logits must have rank >= 1");
  if (a.in_dtypes[1] != DType::i32) fail(a, "labels must be i32");
  const Shape prefix(ls.begin(), ls.end() - 1);
  if (a.in_shapes[1] != prefix || a.out_shape != prefix)
    fail(a, "labels and result shapes must be the logits shape without its last dim");
  const int64_t off = in_offset(a, 0, ls.size() - 1, ls.size());
  const unsigned seq = s.next_checked_launch(describe(a));
  ck::cross_entropy(a.in[0], a.in_dtypes[0], static_cast<const int32_t*>(a.in[1]), a.out, a.out_dtype,
                    num_elements(prefix), ls.back(), off, s.device_error(), seq, s.handle());
}

void k_softmax_grad(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 2, 2);
  const Shape& sh = a.in_shapes[0];
  if (a.in_shapes[1] != sh || sh != a.out_shape) fail(a, "y, dy and the result must have the same shape");
  const int64_t axis = normalize_dim(a, attrs_of(a).axis, sh.size(), "softmax_grad axis");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= sh[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < sh.size(); ++d) inner *= sh[d];
  ck::softmax_grad(a.in[0], a.in[1], a.out, a.out_dtype, outer, sh[static_cast<std::size_t>(axis)], inner, s.handle());
}

void k_cross_entropy_grad(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 3, 3);
  const Shape& ls = a.in_shapes[0];
  if (ls.empty()) fail(a, "logits must have rank >= 1");
  if (a.in_dtypes[1] != DType::i32 || a.in_dtypes[2] != DType::f32) fail(a, "labels must be i32 and g f32");
  // The kernel writes the gradient in the logits' dtype.
  if (a.in_dtypes[0] == DType::i32 || a.out_dtype != a.in_dtypes[0])
    fail(a, "logits must be floating-point and the result of the logits' dtype");
  const Shape prefix(ls.begin(), ls.end() - 1);
  if (a.in_shapes[1] != prefix || a.in_shapes[2] != prefix || a.out_shape != ls)
    fail(a, "labels and g must have the logits shape without its last dim, the result the logits'");
  const int64_t off = in_offset(a, 0, ls.size() - 1, ls.size());
  const unsigned seq = s.next_checked_launch(describe(a));
  ck::cross_entropy_grad(a.in[0], a.in_dtypes[0], static_cast<const int32_t*>(a.in[1]),
                         static_cast<const float*>(a.in[2]), a.out, num_elements(prefix), ls.back(), off,
                         s.device_error(), seq, s.handle());
}

void k_causal_mask(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const Shape& sh = a.in_shapes[0];
  if (sh.size() < 2 || sh != a.out_shape) fail(a, "causal_mask needs rank >= 2 [..., Q, K] and equal shapes");
  if (a.out_dtype == DType::i32) fail(a, "causal_mask needs a float type");
  const std::size_t r = sh.size();
  const int64_t qoff = in_offset(a, 0, r - 2, r), koff = in_offset(a, 0, r - 1, r);
  const int64_t Q = sh[r - 2], K = sh[r - 1];
  const int64_t mats = (Q > 0 && K > 0) ? num_elements(sh) / (Q * K) : 0;
  const uint64_t neg_inf = a.out_dtype == DType::f32 ? 0xff800000u : a.out_dtype == DType::bf16 ? 0xff80u : 0xfc00u;
  ck::causal_mask(a.in[0], a.out, dtype_size(a.out_dtype), neg_inf, mats, Q, K, qoff, koff, s.handle());
}

void k_cast(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 1, 1);
  const int64_t n = num_elements(a.out_shape);
  if (num_elements(a.in_shapes[0]) != n) fail(a, "operand and result sizes differ");
  ck::cast(a.in[0], a.in_dtypes[0], a.out, a.out_dtype, n, s.handle());
}

void k_where(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 3, 3);
  if (a.in_dtypes[0] != DType::i32) fail(a, "the condition must be i32");
  if (a.in_dtypes[1] != a.out_dtype || a.in_dtypes[2] != a.out_dtype)
    fail(a, "both branches must have the result's dtype");
  const Shape& os = a.out_shape;
  const auto loop = make_loop(os, {contiguous_strides(os), broadcast_strides(a.in_shapes[0], os),
                                   broadcast_strides(a.in_shapes[1], os), broadcast_strides(a.in_shapes[2], os)});
  ck::where(static_cast<const int32_t*>(a.in[0]), a.in[1], a.in[2], a.out, dtype_size(a.out_dtype), loop, s.handle());
}

void k_one_hot(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 1, 1);
  if (a.in_dtypes[0] != DType::i32) fail(a, "ids must be i32");
  if (a.out_shape.empty()) fail(a, "the result must be [..., depth]");
  Shape expect = a.in_shapes[0];
  expect.push_back(a.out_shape.back());
  if (a.out_shape != expect) fail(a, "the result shape must be the ids shape + [classes]");
  const int64_t C = a.out_shape.back();
  const std::size_t last = a.out_shape.size() - 1;
  const int64_t coff = last < a.out_offset.size() ? a.out_offset[last] : 0;
  if (coff < 0 || coff + C > attrs_of(a).depth) fail(a, "the result block lies outside [0, depth)");
  ck::one_hot(static_cast<const int32_t*>(a.in[0]), a.out, dtype_size(a.out_dtype), scalar_bits(a.out_dtype, 1.0),
              num_elements(a.in_shapes[0]), C, coff, s.handle());
}

void k_gather(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 2, 2);
  const Shape& t = a.in_shapes[0];
  const Shape& ix = a.in_shapes[1];
  if (a.in_dtypes[1] != DType::i32) fail(a, "indices must be i32");
  if (a.in_dtypes[0] != a.out_dtype) fail(a, "the result dtype must be the table's");
  const std::size_t ax = static_cast<std::size_t>(normalize_dim(a, attrs_of(a).axis, t.size(), "axis"));
  Shape expect(t.begin(), t.begin() + static_cast<long>(ax));
  expect.insert(expect.end(), ix.begin(), ix.end());
  expect.insert(expect.end(), t.begin() + static_cast<long>(ax) + 1, t.end());
  if (a.out_shape != expect) fail(a, "the result shape must be " + shape_str(expect));
  int64_t P = 1, S = 1;
  for (std::size_t d = 0; d < ax; ++d) P *= t[d];
  for (std::size_t d = ax + 1; d < t.size(); ++d) S *= t[d];
  const int64_t off = in_offset(a, 0, ax, t.size());
  const int64_t N = !a.in_global_shapes.empty() && a.in_global_shapes[0].size() == t.size() ? a.in_global_shapes[0][ax]
                    : off == 0 ? t[ax]
                               : std::numeric_limits<int64_t>::max();
  const unsigned seq = s.next_checked_launch(describe(a));
  ck::gather(a.in[0], dtype_size(a.out_dtype), static_cast<const int32_t*>(a.in[1]), a.out, P, num_elements(ix), t[ax],
             S, off, N, s.device_error(), seq, s.handle());
}

void k_scatter_add(CudaBackend& be, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 2, 2);
  const Shape& u = a.in_shapes[0];
  const Shape& ix = a.in_shapes[1];
  const Shape& os = a.out_shape;
  if (a.in_dtypes[1] != DType::i32) fail(a, "indices must be i32");
  if (a.in_dtypes[0] != a.out_dtype) fail(a, "the result dtype must be the updates'");
  const OpAttrs& at = attrs_of(a);
  const std::size_t ax = static_cast<std::size_t>(normalize_dim(a, at.axis, os.size(), "axis"));
  if (u.size() < ax + ix.size()) fail(a, "updates have too few dims for the indices");
  Shape expect(u.begin(), u.begin() + static_cast<long>(ax));
  expect.push_back(os[ax]);
  expect.insert(expect.end(), u.begin() + static_cast<long>(ax + ix.size()), u.end());
  if (os != expect) fail(a, "the result shape must be " + shape_str(expect));
  int64_t P = 1, S = 1;
  for (std::size_t d = 0; d < ax; ++d) P *= os[d];
  for (std::size_t d = ax + 1; d < os.size(); ++d) S *= os[d];
  const int64_t off = ax < a.out_offset.size() ? a.out_offset[ax] : 0;
  const unsigned seq = s.next_checked_launch(describe(a));
  const ScopedScratch scratch(be, s, ck::scatter_add_scratch_bytes(num_elements(ix), os[ax]));
  ck::scatter_add(a.in[0], static_cast<const int32_t*>(a.in[1]), a.out, a.out_dtype, P, num_elements(ix), os[ax], S,
                  off, at.depth, s.device_error(), seq, scratch.get(), s.handle());
}

// dst copied into the result unless dst was donated to it (one buffer), then the rows written.
void k_write_at(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  const WriteAtParams w = write_at_params(a, "cuda");
  if (a.out != a.in[0])
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(a.out, a.in[0], static_cast<std::size_t>(w.P * w.n * w.S) * w.elem,
                                      cudaMemcpyDeviceToDevice, s.handle()));
  const unsigned seq = s.next_checked_launch(describe(a));
  ck::write_at(a.in[2], w.elem, static_cast<const int32_t*>(a.in[1]), a.out, w.P, w.n, w.S, w.off, w.N,
               s.device_error(), seq, s.handle());
}

void k_sample_tokens(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  const SampleTokensParams p = sample_tokens_params(a, "cuda");
  ck::sample_tokens(a.in[0], a.in_dtypes[0], static_cast<const int32_t*>(a.in[1]), static_cast<const float*>(a.in[2]),
                    static_cast<const int32_t*>(a.in[3]), static_cast<const float*>(a.in[4]),
                    static_cast<int32_t*>(a.out), p.rows, p.V, s.handle());
}

void k_mask_padding(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  check_arity(a, 1, 1);
  check_same_dtype(a);
  const OpAttrs& at = attrs_of(a);
  const Shape& sh = a.in_shapes[0];
  if (sh != a.out_shape) fail(a, "operand and result shapes differ");
  if (sh.empty()) {  // a scalar: nothing is padding
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(a.out, a.in[0], dtype_size(a.out_dtype), cudaMemcpyDeviceToDevice, s.handle()));
    return;
  }
  const std::size_t ax = static_cast<std::size_t>(normalize_dim(a, at.axis, sh.size(), "axis"));
  const int64_t off = in_offset(a, 0, ax, sh.size());
  int64_t P = 1, S = 1;
  for (std::size_t d = 0; d < ax; ++d) P *= sh[d];
  for (std::size_t d = ax + 1; d < sh.size(); ++d) S *= sh[d];
  const int64_t n = sh[ax];
  const int64_t keep = std::max<int64_t>(0, std::min<int64_t>(n, at.depth - off));
  const double v = at.scalar;
  uint64_t bits;
  if (a.out_dtype == DType::i32) {
    const int32_t iv = v != v ? 0 : v <= -2147483648.0 ? std::numeric_limits<int32_t>::min()
                                  : v >= 2147483647.0 ? std::numeric_limits<int32_t>::max()
                                                      : static_cast<int32_t>(v);
    bits = static_cast<uint32_t>(iv);
  } else {
    bits = scalar_bits(a.out_dtype, v);
  }
  ck::mask_padding(a.in[0], a.out, dtype_size(a.out_dtype), bits, P, n, S, keep, s.handle());
}

void k_einsum(CudaBackend& be, const KernelArgs& a, CudaStream& s) { run_cuda_einsum(be, a, &s); }

// Fused attention (src/runtime/cuda/kernels/attention.cu): the checks and strides every backend shares
// (attention_params.hpp), then FlashAttention-2's kernels on the stream. q, k, v (out, dout, dq,
// dk, dv) of one float dtype, lse f32 (so not through with_uniform_floats).
void k_attention(CudaBackend&, const KernelArgs& a, CudaStream& s) {
  const AttentionParams p = attention_params(a, "cuda");
  ck::attention_forward(a.in[0], a.in[1], a.in[2], a.out, static_cast<float*>(a.extra_out[0]), p.dtype,
                        ck::attention_dims(p), s.handle());
}

// The backward: D_i = rowsum(dout * out) into scratch, then the dK/dV and the dQ kernels
// (deterministic: no atomics).
void k_attention_grad(CudaBackend& be, const KernelArgs& a, CudaStream& s) {
  const AttentionParams p = attention_params(a, "cuda");
  const ck::AttentionDims d = ck::attention_dims(p);
  const ScopedScratch scratch(be, s, ck::attention_backward_scratch_bytes(d));
  ck::attention_backward(a.in[0], a.in[1], a.in[2], a.in[3], static_cast<const float*>(a.in[4]), a.in[5], a.out,
                         a.extra_out[0], a.extra_out[1], p.dtype, d, scratch.get(), s.handle());
}

// ---- fused expressions -----------------------------------------------------------------------------

// The expression of a fused kernel as the device program's steps, for one list of operand types
// (everything but the pointers and the causal offsets). Parsing and typing cost microseconds,
// as much as a small kernel's launch, and a loaded program makes the same calls every step: each
// host thread (one per device) keeps a small cache of this pure function.
struct FusedPlan {
  std::string text;
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  Shape out_shape;
  bool positional = false;
  ResultType type;
  ck::FusedProgram prog;  // pointers unset
};

ck::FusedProgram plan_fused(const KernelArgs& a, FusedExpr& e, bool positional, ResultType& type) {
  try {
    e = parse_fused_expr(attrs_of(a).equation);
    type = type_fused_expr(e, a.in_shapes, a.in_dtypes, positional);
  } catch (const Error& err) {
    fail(a, err.what());
  }
  if (type.shape != a.out_shape || type.dtype != a.out_dtype)
    fail(a, fmt::format("the expression computes {}, the result buffer is {}", type_str(type.dtype, type.shape),
                        type_str(a.out_dtype, a.out_shape)));
  const Shape& os = a.out_shape;
  if (e.nodes.size() > static_cast<std::size_t>(ck::kMaxFusedSteps) || a.in.size() > ck::kMaxFusedOperands ||
      os.size() > static_cast<std::size_t>(ck::kMaxRank))
    fail(a, fmt::format("{} nodes, {} operands, rank {}: above the CUDA kernel's limits ({}, {}, {}); lower with "
                        "fuse_elementwise off",
                        e.nodes.size(), a.in.size(), os.size(), ck::kMaxFusedSteps, ck::kMaxFusedOperands,
                        ck::kMaxRank));
  try {
    return fused_program_of(e, a.in_shapes, a.in_dtypes, os);
  } catch (const RuntimeError& err) {
    fail(a, err.what());
  }
}

// The device program of a fused kernel's args: planned (or found in this thread's cache), then
// its pointers and the causal offsets set.
ck::FusedProgram fused_program(const KernelArgs& a, bool positional) {
  check_arity(a, 1, ck::kMaxFusedOperands);
  thread_local PlanCache<FusedPlan, 64> cache;
  const std::string& text = attrs_of(a).equation;
  const FusedPlan* hit = cache.find([&](const FusedPlan& f) {
    return f.positional == positional && f.text == text && f.shapes == a.in_shapes && f.dtypes == a.in_dtypes &&
           f.out_shape == a.out_shape && f.type.dtype == a.out_dtype;
  });
  if (!hit) {
    FusedPlan f;
    f.text = text;
    f.shapes = a.in_shapes;
    f.dtypes = a.in_dtypes;
    f.out_shape = a.out_shape;
    f.positional = positional;
    FusedExpr e;
    f.prog = plan_fused(a, e, positional, f.type);
    hit = &cache.insert(std::move(f));
  }
  ck::FusedProgram p = hit->prog;
  for (std::size_t i = 0; i < a.in.size(); ++i) p.in[i] = a.in[i];
  const std::size_t r = a.out_shape.size();
  if (positional && r >= 2 && a.out_offset.size() == r) {
    p.qoff = a.out_offset[r - 2];
    p.koff = a.out_offset[r - 1];
  }
  return p;
}

// A JIT kernel when the backend has them on (fused_jit.hpp), else (or when the program did not
// compile) the interpreter kernel: the same bits either way.
void k_fused_elementwise(CudaBackend& be, const KernelArgs& a, CudaStream& s) {
  const ck::FusedProgram p = fused_program(a, /*positional=*/false);
  if (be.options().fused_jit && FusedJit::shared(be.device()).elementwise(p, a.out, a.out_dtype, s.handle())) return;
  ck::fused_elementwise(p, a.out, a.out_dtype, s.handle());
}

// softmax(expr, axis): over the last axis with rows of at most 1024, one pass (each row's
// values evaluated into registers, rounded to the result's dtype as the unfused chain's softmax
// operand); else the expression into the result, then the softmax kernel in place (each row's
// elements are read before they are written).
void k_fused_softmax(CudaBackend& be, const KernelArgs& a, CudaStream& s) {
  if (a.out_dtype == DType::i32) fail(a, "fused_softmax needs a float result");
  const ck::FusedProgram p = fused_program(a, /*positional=*/true);
  const Shape& sh = a.out_shape;
  const int64_t axis = normalize_dim(a, attrs_of(a).axis, sh.size(), "softmax axis");
  if (axis == static_cast<int64_t>(sh.size()) - 1) {
    if (be.options().fused_jit && FusedJit::shared(be.device()).softmax_last_axis(p, a.out, a.out_dtype, s.handle()))
      return;
    if (ck::fused_softmax_last_axis(p, a.out, a.out_dtype, s.handle())) return;
  }
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= sh[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < sh.size(); ++d) inner *= sh[d];
  ck::fused_elementwise(p, a.out, a.out_dtype, s.handle());
  if (num_elements(sh) > 0)
    ck::softmax(a.out, a.out, a.out_dtype, outer, sh[static_cast<std::size_t>(axis)], inner, s.handle());
}

// einsum + epilogue: the product into the result through cuBLASLt, then the epilogue as a
// fused_elementwise over {result, the other operands} in place (each element is read before
// it is written, at its own index). Two passes over the result: a cuBLASLt epilogue (bias,
// GELU) would save the second, later work.
void k_fused_einsum(CudaBackend& be, const KernelArgs& a, CudaStream& s) {
  if (!a.attrs) fail(a, "no attributes (the equation and the epilogue) were given");
  run_cuda_einsum(be, fused_einsum_product_args(a), &s);
  OpAttrs at;
  k_fused_elementwise(be, fused_einsum_epilogue_args(a, at), s);
}

using CudaKernelFn = void (*)(CudaBackend&, const KernelArgs&, CudaStream&);

const KernelTable<CudaKernelFn>& cuda_kernel_table() {
  static const KernelTable<CudaKernelFn> t = [] {
    KernelTable<CudaKernelFn> k("cuda");
    k.add(OpKind::Constant, k_constant);
    k.add(OpKind::Einsum, k_einsum);
    for (const auto& [kind, op] : kUnaryCodes) k.add(kind, k_unary);
    for (const auto& [kind, op] : kBinaryCodes) k.add(kind, k_binary);
    for (OpKind r : {OpKind::ReduceSum, OpKind::ReduceMax, OpKind::ReduceMean}) k.add(r, k_reduce);
    k.add(OpKind::Reshape, k_copy);
    k.add(OpKind::ShardingConstraint, k_copy);
    k.add(OpKind::Transpose, k_transpose);
    k.add(OpKind::Broadcast, k_broadcast);
    k.add(OpKind::Slice, k_slice);
    k.add(OpKind::Concat, k_concat);
    k.add(OpKind::Softmax, k_softmax);
    k.add(OpKind::LayerNorm, k_layer_norm);
    k.add(OpKind::LayerNormGrad, k_layer_norm_grad);
    k.add(OpKind::AdamW, k_adamw);
    k.add(OpKind::Embedding, k_embedding);
    k.add(OpKind::CrossEntropy, k_cross_entropy);
    k.add(OpKind::SoftmaxGrad, k_softmax_grad);
    k.add(OpKind::CrossEntropyGrad, k_cross_entropy_grad);
    k.add(OpKind::CausalMask, k_causal_mask);
    k.add(OpKind::Cast, k_cast);
    k.add(OpKind::Where, k_where);
    k.add(OpKind::OneHot, k_one_hot);
    k.add(OpKind::Gather, k_gather);
    k.add(OpKind::ScatterAdd, k_scatter_add);
    k.add(OpKind::WriteAt, k_write_at);
    k.add(OpKind::SampleTokens, k_sample_tokens);
    k.add(OpKind::MaskPadding, k_mask_padding);
    k.add(OpKind::FusedElementwise, k_fused_elementwise);
    k.add(OpKind::FusedSoftmax, k_fused_softmax);
    k.add(OpKind::FusedEinsum, k_fused_einsum);
    k.add(OpKind::Attention, k_attention);
    k.add(OpKind::AttentionGrad, k_attention_grad);
    return k;
  }();
  return t;
}

// Ops whose kernels take one float dtype for every float operand and result.
bool needs_uniform_floats(OpKind k) {
  switch (k) {
    case OpKind::Cast:
    case OpKind::CrossEntropy:  // logits and result dtypes are independent in its kernel
    case OpKind::CrossEntropyGrad:  // g is f32 whatever the logits' dtype
    case OpKind::FusedElementwise:  // each operand read in its own dtype, each node rounded to its own
    case OpKind::FusedSoftmax:
    case OpKind::Attention:  // lse is f32 whatever q's dtype; the kernels take bf16/f16 as they are
    case OpKind::AttentionGrad:
      return false;
    default: return true;
  }
}

}  // namespace

void run_cuda_kernel(CudaBackend& be, const KernelArgs& args, CudaStream& s) {
  const CudaKernelFn fn = cuda_kernel_table().get(args.kind);
  if (needs_uniform_floats(args.kind)) {
    with_uniform_floats(be, args, s, [&](const KernelArgs& a) { fn(be, a, s); });
  } else {
    fn(be, args, s);
  }
}

bool has_cuda_kernel(OpKind kind) { return cuda_kernel_table().has(kind); }

ck::FusedProgram cuda_fused_program(const KernelArgs& a, bool positional) { return fused_program(a, positional); }

}  // namespace tessel::cuda
