// src/runtime/cpu_fused.cpp — the CPU kernel of fused_elementwise: evaluates the op's
// expression (tessel/fused_expr.hpp) in one pass over memory.
//
// The result is walked in blocks of kBlock elements. Per block, every node of the expression
// is evaluated in order into its own small buffer (a few KiB each, in L1): operands are read
// straight from their buffer when they are f32/i32 and not broadcast, or gathered (broadcast,
// converted from bf16/f16) into their buffer; literals fill theirs once; ops run the same
// per-element code as the unfused kernels (cpu_elementwise.hpp: Eigen's vectorised math for
// the unary ops, the same functors for the binary ones), and a float node whose dtype is bf16
// or f16 is rounded to it, as the unfused chain's intermediate buffer would have been. The
// root is computed straight into the result (f32, i32) or converted into it (bf16, f16). So
// each operand is read once and the result written once, and the bits are those of the
// unfused chain: blocks start 64-byte aligned and are multiples of 64 bytes, so Eigen splits
// each into packets and a scalar tail exactly where it splits the whole buffer.
//
// In place: every element of a block of every operand is read before that block of the result
// is written, and an operand of the result's shape is read at the same elements, so the result
// may be the buffer of such an operand (the executor gives a donated input's buffer to the
// fused kernel that reads it last: an optimizer's update stays in place).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_elementwise.hpp"
#include "tessel/fused_expr.hpp"
#include "tessel/ops.hpp"
#include "tessel/runtime/kernels.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel::cpu_detail {
namespace {

constexpr int64_t kBlock = 512;  // elements per block: 2 KiB per node, a multiple of 64 bytes

// f32 and i32 share the buffers: every node's element is 4 bytes.
union Elem {
  float f;
  int32_t i;
};

[[noreturn]] void fail(const KernelArgs& a, const std::string& why) {
  std::vector<std::string> ins;
  for (std::size_t i = 0; i < a.in_shapes.size() && i < a.in_dtypes.size(); ++i)
    ins.push_back(type_str(a.in_dtypes[i], a.in_shapes[i]));
  throw RuntimeError(fmt::format("cpu kernel fused_elementwise({}) -> {} expr {}: {}", join(ins, ", "),
                                 type_str(a.out_dtype, a.out_shape),
                                 quote_text(a.attrs ? a.attrs->equation : std::string()), why));
}

float to_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::i32: break;
  }
  return 0;
}

// Rounds f32 values to a narrower float dtype and back (what storing them would do).
void round_to(DType t, float* x, int64_t m) {
  if (t == DType::bf16)
    for (int64_t j = 0; j < m; ++j) x[j] = bf16_to_f32(f32_to_bf16(x[j]));
  else if (t == DType::f16)
    for (int64_t j = 0; j < m; ++j) x[j] = f16_to_f32(f32_to_f16(x[j]));
}

// Reads an operand broadcast over the result, in result order, a block at a time. Its dims
// are collapsed on their own (size-1 result dims dropped, adjacent dims merged where the
// operand's strides allow), so a row bias over [B,S,D] is a [B*S, D] walk with strides [0, 1]
// and each block is a few contiguous copies or fills.
class Walker {
 public:
  Walker(const Shape& in, const Shape& out) {
    const std::size_t lead = out.size() - in.size();
    int64_t stride = 1;
    std::vector<int64_t> st(out.size(), 0);
    for (std::size_t d = out.size(); d-- > lead;) {
      const int64_t n = in[d - lead];
      st[d] = n == 1 ? 0 : stride;
      stride *= n;
    }
    for (std::size_t d = 0; d < out.size(); ++d) {
      if (out[d] == 1) continue;
      if (!shape_.empty() && stride_.back() == st[d] * out[d]) {
        shape_.back() *= out[d];
        stride_.back() = st[d];
        continue;
      }
      shape_.push_back(out[d]);
      stride_.push_back(st[d]);
    }
    if (shape_.empty()) {
      shape_.push_back(1);
      stride_.push_back(0);
    }
    idx_.assign(shape_.size(), 0);
  }
  // Whether the operand is read in result order, element for element (no broadcast).
  bool contiguous() const { return shape_.size() == 1 && stride_[0] == 1; }

  // dst[0..m) = the next m elements (as f32, or as i32 for an i32 operand).
  void next(const void* src, DType t, Elem* dst, int64_t m) {
    const std::size_t r = shape_.size() - 1;
    while (m > 0) {
      const int64_t run = std::min(m, shape_[r] - idx_[r]);
      const int64_t s = stride_[r];
      if (t == DType::i32) {
        const int32_t* p = static_cast<const int32_t*>(src) + off_;
        for (int64_t j = 0; j < run; ++j) dst[j].i = p[j * s];
      } else if (t == DType::f32) {
        const float* p = static_cast<const float*>(src) + off_;
        for (int64_t j = 0; j < run; ++j) dst[j].f = p[j * s];
      } else {
        for (int64_t j = 0; j < run; ++j) dst[j].f = to_f32(src, t, off_ + j * s);
      }
      dst += run;
      m -= run;
      idx_[r] += run;
      off_ += run * s;
      for (std::size_t d = r; idx_[d] == shape_[d] && d > 0; --d) {  // carry
        off_ -= shape_[d] * stride_[d];
        idx_[d] = 0;
        ++idx_[d - 1];
        off_ += stride_[d - 1];
      }
    }
  }

 private:
  Shape shape_;
  std::vector<int64_t> stride_, idx_;
  int64_t off_ = 0;
};

template <class F>
void binary_f(const Elem* x, const Elem* y, Elem* o, int64_t m, F f) {
  for (int64_t j = 0; j < m; ++j) o[j].f = f(x[j].f, y[j].f);
}
template <class F>
void binary_i(const Elem* x, const Elem* y, Elem* o, int64_t m, F f) {
  for (int64_t j = 0; j < m; ++j) o[j].i = f(x[j].i, y[j].i);
}
template <class F>
void compare(const Elem* x, const Elem* y, Elem* o, int64_t m, F f) {
  for (int64_t j = 0; j < m; ++j) o[j].i = f(x[j], y[j]) ? 1 : 0;
}

// One op node over a block: o[0..m) from its arguments' blocks (dtypes as typed).
void eval_op(const KernelArgs& a, const FusedNode& n, const std::vector<const Elem*>& x,
             const std::vector<DType>& xt, Elem* o, int64_t m) {
  const bool int_result = n.dtype == DType::i32;
  switch (n.op) {
    case OpKind::Neg: case OpKind::Relu:
      if (int_result) {
        for (int64_t j = 0; j < m; ++j)
          o[j].i = n.op == OpKind::Neg ? static_cast<int32_t>(0u - static_cast<uint32_t>(x[0][j].i))
                                       : (x[0][j].i > 0 ? x[0][j].i : 0);
        return;
      }
      [[fallthrough]];
    case OpKind::Exp: case OpKind::Log: case OpKind::Tanh: case OpKind::Gelu: case OpKind::Sqrt:
    case OpKind::Rsqrt: case OpKind::Sigmoid: case OpKind::Silu:
      if (int_result) fail(a, fmt::format("{} of an i32 value", op_name(n.op)));
      unary_f32(n.op, &x[0][0].f, &o[0].f, m);
      return;
    case OpKind::Add: case OpKind::Sub: case OpKind::Mul: case OpKind::Div: case OpKind::Max:
    case OpKind::GeluGrad: {
      const bool ints = xt[0] == DType::i32 || xt[1] == DType::i32;
      if (ints != int_result || (ints && (xt[0] != DType::i32 || xt[1] != DType::i32)))
        fail(a, fmt::format("{}: i32 and float operands cannot be mixed", op_name(n.op)));
      if (ints) {
        switch (n.op) {
          case OpKind::Add: binary_i(x[0], x[1], o, m, AddF{}); return;
          case OpKind::Sub: binary_i(x[0], x[1], o, m, SubF{}); return;
          case OpKind::Mul: binary_i(x[0], x[1], o, m, MulF{}); return;
          case OpKind::Div: binary_i(x[0], x[1], o, m, DivF{}); return;
          case OpKind::Max: binary_i(x[0], x[1], o, m, MaxF{}); return;
          default: fail(a, "gelu_grad needs float operands");
        }
      }
      switch (n.op) {
        case OpKind::Add: binary_f(x[0], x[1], o, m, AddF{}); return;
        case OpKind::Sub: binary_f(x[0], x[1], o, m, SubF{}); return;
        case OpKind::Mul: binary_f(x[0], x[1], o, m, MulF{}); return;
        case OpKind::Div: binary_f(x[0], x[1], o, m, DivF{}); return;
        case OpKind::Max: binary_f(x[0], x[1], o, m, MaxF{}); return;
        default: binary_f(x[0], x[1], o, m, GeluGradF{}); return;
      }
    }
    case OpKind::Eq: case OpKind::Ne: case OpKind::Lt: case OpKind::Le: case OpKind::Gt: case OpKind::Ge: {
      if ((xt[0] == DType::i32) != (xt[1] == DType::i32))
        fail(a, fmt::format("{}: i32 and float operands cannot be mixed", op_name(n.op)));
      const bool ints = xt[0] == DType::i32;
      auto run = [&](auto f) {
        if (ints) compare(x[0], x[1], o, m, [&](const Elem& u, const Elem& v) { return f(u.i, v.i); });
        else compare(x[0], x[1], o, m, [&](const Elem& u, const Elem& v) { return f(u.f, v.f); });
      };
      switch (n.op) {
        case OpKind::Eq: run([](auto u, auto v) { return u == v; }); break;
        case OpKind::Ne: run([](auto u, auto v) { return u != v; }); break;
        case OpKind::Lt: run([](auto u, auto v) { return u < v; }); break;
        case OpKind::Le: run([](auto u, auto v) { return u <= v; }); break;
        case OpKind::Gt: run([](auto u, auto v) { return u > v; }); break;
        default: run([](auto u, auto v) { return u >= v; }); break;
      }
      return;
    }
    case OpKind::Where:
      if (xt[0] != DType::i32) fail(a, "where: the condition must be i32");
      for (int64_t j = 0; j < m; ++j) o[j] = x[0][j].i != 0 ? x[1][j] : x[2][j];
      return;
    case OpKind::Cast: {
      const DType from = xt[0], to = n.dtype;
      if (from == to) {
        std::memcpy(o, x[0], static_cast<std::size_t>(m) * sizeof(Elem));
      } else if (from == DType::i32) {  // one rounding to f32, then to the target
        for (int64_t j = 0; j < m; ++j) o[j].f = static_cast<float>(x[0][j].i);
      } else if (to == DType::i32) {
        for (int64_t j = 0; j < m; ++j) o[j].i = f32_to_i32_sat(x[0][j].f);
      } else {
        std::memcpy(o, x[0], static_cast<std::size_t>(m) * sizeof(Elem));
      }
      return;
    }
    default:
      fail(a, fmt::format("'{}' is not an op a fused expression may hold", op_name(n.op)));
  }
}

}  // namespace

void fused_elementwise_kernel(const KernelArgs& a) {
  if (!a.attrs) fail(a, "no attributes (the expression) were given");
  if (a.in.size() != a.in_shapes.size() || a.in.size() != a.in_dtypes.size())
    fail(a, "operand pointers, shapes and dtypes differ in number");
  FusedExpr e;
  std::vector<Value> vals(a.in.size());
  std::vector<const Value*> ins;
  for (std::size_t i = 0; i < a.in.size(); ++i) {
    vals[i].name = fmt::format("in{}", i);
    vals[i].shape = a.in_shapes[i];
    vals[i].dtype = a.in_dtypes[i];
    ins.push_back(&vals[i]);
  }
  ResultType rt;
  try {
    e = parse_fused_expr(a.attrs->equation);
    rt = type_fused_expr(e, ins);
  } catch (const Error& err) {
    fail(a, err.what());
  }
  if (rt.shape != a.out_shape || rt.dtype != a.out_dtype)
    fail(a, fmt::format("the expression computes {}, the result buffer is {}", type_str(rt.dtype, rt.shape),
                        type_str(a.out_dtype, a.out_shape)));
  const Shape& os = a.out_shape;
  const int64_t n = num_elements(os);
  if (n == 0) return;

  const std::size_t nn = e.nodes.size();
  std::vector<Walker> walkers;
  walkers.reserve(a.in.size());
  for (std::size_t i = 0; i < a.in.size(); ++i) walkers.emplace_back(a.in_shapes[i], os);
  // Node -> where its block is: its own buffer, or straight into an operand or the result.
  std::vector<Elem, AlignedAllocator<Elem>> scratch(nn * static_cast<std::size_t>(kBlock));
  std::vector<const Elem*> at(nn, nullptr);
  const std::size_t root = nn - 1;
  const bool root_direct = a.out_dtype == DType::f32 || a.out_dtype == DType::i32;
  std::vector<bool> filled(nn, false);  // literals: filled once
  std::vector<int64_t> operand_block(a.in.size(), -1);  // the block each operand was last read for
  std::vector<const Elem*> operand_at(a.in.size(), nullptr);
  std::vector<const Elem*> args;
  std::vector<DType> arg_types;
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t m = std::min(kBlock, n - i0);
    for (std::size_t k = 0; k < nn; ++k) {
      const FusedNode& node = e.nodes[k];
      Elem* buf = (k == root && root_direct) ? static_cast<Elem*>(a.out) + i0
                                             : scratch.data() + k * static_cast<std::size_t>(kBlock);
      switch (node.kind) {
        case FusedNode::Kind::Operand: {
          // An operand read at several places of the text is several nodes: its block is
          // read (walked) once, by the first, and shared.
          const std::size_t op = static_cast<std::size_t>(node.operand);
          const DType t = a.in_dtypes[op];
          if (operand_block[op] != i0) {
            if (walkers[op].contiguous() && (t == DType::f32 || t == DType::i32)) {
              operand_at[op] = static_cast<const Elem*>(a.in[op]) + i0;
            } else {
              walkers[op].next(a.in[op], t, buf, m);
              operand_at[op] = buf;
            }
            operand_block[op] = i0;
          }
          at[k] = operand_at[op];
          if (k == root) {  // an expression whose result is an operand (parseable, if pointless)
            if (at[k] != buf) std::memcpy(buf, at[k], static_cast<std::size_t>(m) * sizeof(Elem));
            at[k] = buf;
          }
          break;
        }
        case FusedNode::Kind::Literal:
          if (!filled[k] || k == root) {
            Elem v;
            if (node.dtype == DType::i32) v.i = static_cast<int32_t>(node.value);
            else {
              v.f = static_cast<float>(node.value);
              round_to(node.dtype, &v.f, 1);
            }
            std::fill(buf, buf + kBlock, v);
            filled[k] = true;
          }
          at[k] = buf;
          break;
        case FusedNode::Kind::Op:
          args.clear();
          arg_types.clear();
          for (int x : node.args) {
            args.push_back(at[static_cast<std::size_t>(x)]);
            arg_types.push_back(e.nodes[static_cast<std::size_t>(x)].dtype);
          }
          eval_op(a, node, args, arg_types, buf, m);
          if (node.dtype != DType::i32) round_to(node.dtype, &buf[0].f, m);
          at[k] = buf;
          break;
      }
    }
    if (!root_direct) {
      uint16_t* out = static_cast<uint16_t*>(a.out) + i0;
      const Elem* r = at[root];
      if (a.out_dtype == DType::bf16)
        for (int64_t j = 0; j < m; ++j) out[j] = f32_to_bf16(r[j].f);
      else
        for (int64_t j = 0; j < m; ++j) out[j] = f32_to_f16(r[j].f);
    }
  }
}

}  // namespace tessel::cpu_detail
