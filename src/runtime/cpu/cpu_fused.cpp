// src/runtime/cpu/cpu_fused.cpp — the CPU kernel of fused_elementwise: evaluates the op's
// expression (tessel/ir/fused_expr.hpp) in one pass over memory.
//
// The result is walked in blocks of kBlock elements. Per block, every node of the expression
// is evaluated in order into its own small buffer (4 KiB each: L1 and L2): operands are read
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
#include <memory>
#include <new>
#include <vector>

#include "cpu_elementwise.hpp"
#include "onednn_einsum.hpp"
#include "tessel/ir/fused_expr.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/cpu/cpu_kernels.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

namespace {
// "f32[4,8], f32[8] -> f32[4,8]": a kernel call's operand and result types, for messages.
std::string call_types(const KernelArgs& a) {
  std::vector<std::string> ins;
  for (std::size_t i = 0; i < a.in_shapes.size() && i < a.in_dtypes.size(); ++i)
    ins.push_back(type_str(a.in_dtypes[i], a.in_shapes[i]));
  return fmt::format("{}) -> {}", join(ins, ", "), type_str(a.out_dtype, a.out_shape));
}

[[noreturn]] void fail_fused_einsum(const KernelArgs& a, const std::string& why) {
  throw RuntimeError(fmt::format("kernel fused_einsum({} eq {} epilogue {}: {}", call_types(a),
                                 quote_text(a.attrs ? a.attrs->equation : std::string()),
                                 quote_text(a.attrs ? a.attrs->epilogue : std::string()), why));
}
}  // namespace

KernelArgs fused_einsum_product_args(const KernelArgs& a) {
  if (!a.attrs) fail_fused_einsum(a, "no attributes (the equation and the epilogue) were given");
  if (a.in.size() != a.in_shapes.size() || a.in.size() != a.in_dtypes.size())
    fail_fused_einsum(a, "operand pointers, shapes and dtypes differ in number");
  const int n = fused_einsum_operands(a.attrs->equation);
  if (n < 1 || n > 2 || static_cast<std::size_t>(n) > a.in.size())
    fail_fused_einsum(a, fmt::format("the equation names {} einsum operands, the kernel has {} operands", n, a.in.size()));
  KernelArgs e = a;
  e.kind = OpKind::Einsum;
  const auto cut = [n](auto& v) {
    if (v.size() > static_cast<std::size_t>(n)) v.resize(static_cast<std::size_t>(n));
  };
  cut(e.in);
  cut(e.in_shapes);
  cut(e.in_dtypes);
  cut(e.in_offsets);
  cut(e.in_global_shapes);
  return e;
}


KernelArgs fused_einsum_epilogue_args(const KernelArgs& a, OpAttrs& attrs) {
  const std::size_t n = fused_einsum_product_args(a).in.size();
  attrs = OpAttrs{};
  attrs.equation = a.attrs->epilogue;
  KernelArgs ep;
  ep.kind = OpKind::FusedElementwise;
  ep.attrs = &attrs;
  ep.in.push_back(a.out);
  ep.in_shapes.push_back(a.out_shape);
  ep.in_dtypes.push_back(a.out_dtype);
  ep.in.insert(ep.in.end(), a.in.begin() + static_cast<long>(n), a.in.end());
  ep.in_shapes.insert(ep.in_shapes.end(), a.in_shapes.begin() + static_cast<long>(n), a.in_shapes.end());
  ep.in_dtypes.insert(ep.in_dtypes.end(), a.in_dtypes.begin() + static_cast<long>(n), a.in_dtypes.end());
  ep.out = a.out;
  ep.out_shape = a.out_shape;
  ep.out_dtype = a.out_dtype;
  ep.num_threads = a.num_threads;
  return ep;
}

}  // namespace tessel

namespace tessel::cpu_detail {
namespace {

// Elements per block: 4 KiB per node, a multiple of 64 bytes. 512 measured up to 30% slower
// on cheap chains in L2 (per-block dispatch), 1024 on par with the unfused kernels there.
constexpr int64_t kBlock = 1024;
static_assert(kBlock % kGeluGradChunk == 0, "gelu_grad_f32 must see the chunks of a whole-buffer call");

// f32 and i32 share the buffers: every node's element is 4 bytes.
union Elem {
  float f;
  int32_t i;
};

[[noreturn]] void fail(const KernelArgs& a, const std::string& why) {
  throw RuntimeError(fmt::format("cpu kernel fused_elementwise({} expr {}: {}", call_types(a),
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
  // Moves to element `flat` of the result (row-major) when the walk is elsewhere.
  void seek(int64_t flat) {
    if (flat == pos_) return;
    pos_ = flat;
    off_ = 0;
    for (std::size_t d = shape_.size(); d-- > 0;) {
      idx_[d] = flat % shape_[d];
      flat /= shape_[d];
      off_ += idx_[d] * stride_[d];
    }
  }
  // Back to element 0 (a walker kept between kernel calls).
  void reset() {
    std::fill(idx_.begin(), idx_.end(), 0);
    off_ = 0;
    pos_ = 0;
  }
  // Whether the operand is read in result order, element for element (no broadcast).
  bool contiguous() const { return shape_.size() == 1 && stride_[0] == 1; }

  // dst[0..m) = the next m elements (as f32, or as i32 for an i32 operand).
  void next(const void* src, DType t, Elem* dst, int64_t m) {
    const std::size_t r = shape_.size() - 1;
    pos_ += m;
    while (m > 0) {
      const int64_t run = std::min(m, shape_[r] - idx_[r]);
      const int64_t s = stride_[r];
      if (t == DType::i32 || t == DType::f32) {  // 4-byte elements: copy the bits
        const Elem* p = static_cast<const Elem*>(src) + off_;
        if (s == 1) std::memcpy(dst, p, static_cast<std::size_t>(run) * sizeof(Elem));
        else if (s == 0) std::fill(dst, dst + run, *p);
        else
          for (int64_t j = 0; j < run; ++j) dst[j] = p[j * s];
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
  int64_t pos_ = 0;  // the result element the walk is at
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
  if (op_in(kUnaryOps, n.op)) {
    if (int_result && (n.op == OpKind::Neg || n.op == OpKind::Relu)) {
      for (int64_t j = 0; j < m; ++j)
        o[j].i = n.op == OpKind::Neg ? static_cast<int32_t>(0u - static_cast<uint32_t>(x[0][j].i))
                                     : (x[0][j].i > 0 ? x[0][j].i : 0);
      return;
    }
    if (int_result) fail(a, fmt::format("{} of an i32 value", op_name(n.op)));
    unary_f32(n.op, &x[0][0].f, &o[0].f, m);
    return;
  }
  if (op_in(kBinaryOps, n.op)) {
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
      default: gelu_grad_f32(&x[0][0].f, &x[1][0].f, &o[0].f, m); return;
    }
  }
  if (op_in(kCompareOps, n.op)) {
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
  switch (n.op) {
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


struct AlignedDelete {
  void operator()(Elem* p) const { ::operator delete[](p, std::align_val_t(64)); }
};

// An expression parsed and typed for one list of operand types, with what evaluating it needs
// (operand walkers, a scratch block per node, per-node bookkeeping), made once: a kernel call
// then allocates nothing. Entries live in a per-thread cache and one evaluator uses an entry
// at a time (fused kernels do not nest), so the workspace is reset, not shared.
struct Typed {
  std::string text;
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  bool positional = false;
  FusedExpr expr;
  ResultType type;
  // Workspace.
  std::vector<Walker> walkers;  // per operand, over the expression's result
  std::unique_ptr<Elem[], AlignedDelete> scratch;  // kBlock elements per node
  std::vector<const Elem*> at;
  std::vector<char> filled;
  std::vector<int64_t> operand_block;
  std::vector<const Elem*> operand_at;
  std::vector<const Elem*> args;
  std::vector<DType> arg_types;
};

// Parsing and typing cost a few microseconds, as much as the kernel itself on a small block,
// and a loaded program calls the same kernel with the same expression and types every run: a
// small per-thread cache of this pure function (each device thread keeps its own, so nothing
// is shared and nothing locks) makes that cost once per thread and kernel.
Typed& typed(const KernelArgs& a, bool positional) {
  thread_local PlanCache<Typed, 64> cache;
  const std::string& text = a.attrs->equation;
  if (Typed* hit = cache.find([&](const Typed& t) {
        return t.positional == positional && t.text == text && t.shapes == a.in_shapes && t.dtypes == a.in_dtypes;
      }))
    return *hit;
  Typed t;
  t.text = text;
  t.shapes = a.in_shapes;
  t.dtypes = a.in_dtypes;
  t.positional = positional;
  try {
    t.expr = parse_fused_expr(text);
    t.type = type_fused_expr(t.expr, a.in_shapes, a.in_dtypes, positional);
  } catch (const Error& err) {
    fail(a, err.what());
  }
  for (const Shape& in : a.in_shapes) t.walkers.emplace_back(in, t.type.shape);
  const std::size_t nn = t.expr.nodes.size();
  // Uninitialised: every node's block is written before it is read.
  t.scratch.reset(static_cast<Elem*>(::operator new[](nn * static_cast<std::size_t>(kBlock) * sizeof(Elem), std::align_val_t(64))));
  t.at.assign(nn, nullptr);
  t.filled.assign(nn, 0);
  t.operand_block.assign(a.in.size(), -1);
  t.operand_at.assign(a.in.size(), nullptr);
  return cache.insert(std::move(t));
}

// The expression of a fused kernel, parsed and typed against the kernel's operands, and
// evaluated a block of result elements at a time.
class Evaluator {
 public:
  Evaluator(const KernelArgs& a, bool positional)
      : a_(a), t_(checked_typed(a, positional)), e_(t_.expr), type_(t_.type), walkers_(t_.walkers),
        scratch_(t_.scratch), at_(t_.at), filled_(t_.filled), operand_block_(t_.operand_block),
        operand_at_(t_.operand_at), args_(t_.args), arg_types_(t_.arg_types) {
    if (type_.shape != a.out_shape)
      fail(a, fmt::format("the expression computes {}, the result buffer is {}", type_str(type_.dtype, type_.shape),
                          type_str(a.out_dtype, a.out_shape)));
    for (Walker& w : walkers_) w.reset();
    std::fill(filled_.begin(), filled_.end(), 0);
    std::fill(operand_block_.begin(), operand_block_.end(), -1);
    const Shape& os = a.out_shape;
    if (os.size() >= 2) {  // causal_mask: the result block's [.., Q, K] position
      const std::size_t r = os.size();
      q_ = os[r - 2];
      k_ = os[r - 1];
      if (a.out_offset.size() == r) {
        qoff_ = a.out_offset[r - 2];
        koff_ = a.out_offset[r - 1];
      }
    }
  }
  const ResultType& type() const { return type_; }

  // Elements [i0, i0 + m) of the result (m <= kBlock) into `root` (4-byte f32 or i32 values,
  // rounded to the result's dtype). `root` may alias an operand of the result's shape.
  void block(int64_t i0, int64_t m, Elem* root) {
    const std::size_t nn = e_.nodes.size(), last = nn - 1;
    for (std::size_t k = 0; k < nn; ++k) {
      const FusedNode& node = e_.nodes[k];
      Elem* buf = k == last ? root : scratch_.get() + k * static_cast<std::size_t>(kBlock);
      switch (node.kind) {
        case FusedNode::Kind::Operand: {
          // An operand read at several places of the text is several nodes: its block is
          // read (walked) once, by the first, and shared.
          const std::size_t op = static_cast<std::size_t>(node.operand);
          const DType t = a_.in_dtypes[op];
          if (operand_block_[op] != i0) {
            if (walkers_[op].contiguous() && (t == DType::f32 || t == DType::i32)) {
              operand_at_[op] = static_cast<const Elem*>(a_.in[op]) + i0;
            } else {
              walkers_[op].seek(i0);
              walkers_[op].next(a_.in[op], t, buf, m);
              operand_at_[op] = buf;
            }
            operand_block_[op] = i0;
          }
          at_[k] = operand_at_[op];
          if (k == last && at_[k] != buf) {  // a result that is an operand (parseable, if pointless)
            std::memmove(buf, at_[k], static_cast<std::size_t>(m) * sizeof(Elem));
            at_[k] = buf;
          }
          break;
        }
        case FusedNode::Kind::Literal:
          if (!filled_[k] || k == last) {
            Elem v;
            if (node.dtype == DType::i32) v.i = static_cast<int32_t>(node.value);
            else {
              v.f = static_cast<float>(node.value);
              round_to(node.dtype, &v.f, 1);
            }
            std::fill(buf, buf + (k == last ? m : kBlock), v);
            filled_[k] = true;
          }
          at_[k] = buf;
          break;
        case FusedNode::Kind::Op:
          args_.clear();
          arg_types_.clear();
          for (int x : node.args) {
            args_.push_back(at_[static_cast<std::size_t>(x)]);
            arg_types_.push_back(e_.nodes[static_cast<std::size_t>(x)].dtype);
          }
          if (node.op == OpKind::CausalMask) causal(args_[0], buf, i0, m);
          else eval_op(a_, node, args_, arg_types_, buf, m);
          if (node.dtype != DType::i32) round_to(node.dtype, &buf[0].f, m);
          at_[k] = buf;
          break;
      }
    }
  }

 private:
  static Typed& checked_typed(const KernelArgs& a, bool positional) {
    if (!a.attrs) fail(a, "no attributes (the expression) were given");
    if (a.in.size() != a.in_shapes.size() || a.in.size() != a.in_dtypes.size())
      fail(a, "operand pointers, shapes and dtypes differ in number");
    return typed(a, positional);
  }
  // -inf where key > query (global positions), as the causal_mask kernel; elements i0.. of
  // the result, whose shape the mask has.
  void causal(const Elem* x, Elem* o, int64_t i0, int64_t m) const {
    // Row segment by row segment: the kept keys [.., k0) are copied, the rest filled.
    Elem neg_inf;
    neg_inf.f = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < m;) {
      const int64_t flat = i0 + j, kk = flat % k_, qq = (flat / k_) % q_;
      const int64_t run = std::min(m - j, k_ - kk);
      // Masked where key + koff > query + qoff: keys from k0 on.
      const int64_t k0 = std::max<int64_t>(0, std::min<int64_t>(k_, qq + qoff_ - koff_ + 1));
      const int64_t keep = std::max<int64_t>(0, std::min(run, k0 - kk));
      if (x + j != o + j) std::memmove(o + j, x + j, static_cast<std::size_t>(keep) * sizeof(Elem));
      std::fill(o + j + keep, o + j + run, neg_inf);
      j += run;
    }
  }

  const KernelArgs& a_;
  Typed& t_;  // the expression and the workspace (this thread's cache entry)
  const FusedExpr& e_;
  const ResultType& type_;
  std::vector<Walker>& walkers_;
  std::unique_ptr<Elem[], AlignedDelete>& scratch_;
  std::vector<const Elem*>& at_;  // node -> its block: its buffer, an operand's, or the result
  std::vector<char>& filled_;     // literals: filled once
  std::vector<int64_t>& operand_block_;  // the block each operand was last read for
  std::vector<const Elem*>& operand_at_;
  std::vector<const Elem*>& args_;
  std::vector<DType>& arg_types_;
  int64_t q_ = 1, k_ = 1, qoff_ = 0, koff_ = 0;
};

// A float result's f32 values: the buffer itself, or `tmp` (bf16/f16), converted by finish().
float* f32_result(const KernelArgs& a, std::vector<float, AlignedAllocator<float>>& tmp) {
  if (a.out_dtype == DType::f32) return static_cast<float*>(a.out);
  tmp.resize(static_cast<std::size_t>(num_elements(a.out_shape)));
  return tmp.data();
}
// Result elements [i0, i0 + m) of a bf16/f16 result from their f32 values `r` (nothing for f32).
void finish(const KernelArgs& a, const float* r, int64_t i0, int64_t m) {
  uint16_t* out = static_cast<uint16_t*>(a.out) + i0;
  if (a.out_dtype == DType::bf16)
    for (int64_t j = 0; j < m; ++j) out[j] = f32_to_bf16(r[j]);
  else if (a.out_dtype == DType::f16)
    for (int64_t j = 0; j < m; ++j) out[j] = f32_to_f16(r[j]);
}

}  // namespace

void fused_elementwise_kernel(const KernelArgs& a) {
  Evaluator ev(a, /*positional=*/false);
  if (ev.type().dtype != a.out_dtype)
    fail(a, fmt::format("the expression computes {}, the result buffer is {}", dtype_name(ev.type().dtype),
                        dtype_name(a.out_dtype)));
  const int64_t n = num_elements(a.out_shape);
  if (a.out_dtype == DType::f32 || a.out_dtype == DType::i32) {
    for (int64_t i0 = 0; i0 < n; i0 += kBlock) ev.block(i0, std::min(kBlock, n - i0), static_cast<Elem*>(a.out) + i0);
    return;
  }
  std::vector<Elem, AlignedAllocator<Elem>> root(static_cast<std::size_t>(kBlock));
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t m = std::min(kBlock, n - i0);
    ev.block(i0, m, root.data());
    finish(a, &root[0].f, i0, m);
  }
}

// softmax(expr, axis): the expression is evaluated into the result a block at a time (the
// blocks of fused_elementwise, so its values are the unfused chain's bits), and each row of the
// softmax axis is normalised in place as soon as its last block is written, while it is still
// in cache: the operands are read once and the result written once. For an axis that is not
// the last, the whole expression is evaluated first, then the strided softmax runs in place.
void fused_softmax_kernel(const KernelArgs& a) {
  Evaluator ev(a, /*positional=*/true);
  if (ev.type().dtype != a.out_dtype || a.out_dtype == DType::i32)
    fail(a, fmt::format("the expression computes {}, the result buffer is {} (a float type)",
                        dtype_name(ev.type().dtype), dtype_name(a.out_dtype)));
  const Shape& s = a.out_shape;
  const int64_t axis = a.attrs->axis;
  if (axis < 0 || axis >= static_cast<int64_t>(s.size())) fail(a, fmt::format("axis {} is out of range", axis));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t len = s[static_cast<std::size_t>(axis)], n = num_elements(s);
  if (n == 0) return;
  std::vector<float, AlignedAllocator<float>> tmp;
  float* y = f32_result(a, tmp);
  int64_t rows_done = 0;  // inner == 1: rows [0, rows_done) are normalised
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t m = std::min(kBlock, n - i0);
    ev.block(i0, m, reinterpret_cast<Elem*>(y + i0));
    if (inner != 1) continue;
    const int64_t rows = (i0 + m) / len;
    if (rows > rows_done) {
      softmax_f32(y + rows_done * len, y + rows_done * len, rows - rows_done, len, 1);
      finish(a, y + rows_done * len, rows_done * len, (rows - rows_done) * len);
      rows_done = rows;
    }
  }
  if (inner != 1) {
    softmax_f32(y, y, outer, len, inner);
    finish(a, y, 0, n);
  }
}

bool fused_einsum_post_ops(const KernelArgs& a, EinsumEpilogue& ep) {
  if (!a.attrs) return false;
  // Parsed epilogues per device thread (a loaded program has a handful): text -> steps.
  struct Parsed {
    std::string text;
    bool ok = false;
    std::vector<EinsumEpilogue::Step> steps;
  };
  thread_local PlanCache<Parsed, 32> cache;
  const std::string& text = a.attrs->epilogue;
  const Parsed* hit = cache.find([&](const Parsed& p) { return p.text == text; });
  if (!hit) {
    Parsed p;
    p.text = text;
    try {
      p.ok = einsum_epilogue_steps(parse_fused_expr(text), p.steps);
    } catch (const Error&) {
      p.ok = false;  // the fallback path reports it
    }
    hit = &cache.insert(std::move(p));
  }
  if (!hit->ok) return false;
  const std::size_t n = static_cast<std::size_t>(std::max(1, fused_einsum_operands(a.attrs->equation)));
  if (n > a.in.size()) return false;
  ep.steps = hit->steps;
  ep.in.assign(1, nullptr);
  ep.in_shapes.assign(1, a.out_shape);
  for (std::size_t i = n; i < a.in.size(); ++i) {
    if (a.in_dtypes[i] != DType::f32) return false;
    ep.in.push_back(a.in[i]);
    ep.in_shapes.push_back(a.in_shapes[i]);
  }
  for (const EinsumEpilogue::Step& st : ep.steps)
    if (st.kind == EinsumEpilogue::Step::Kind::Add && static_cast<std::size_t>(st.operand) >= ep.in.size()) return false;
  return true;
}

// With oneDNN: the matmul with the epilogue as post-ops, where it maps (onednn_einsum.hpp).
// Otherwise the product is written into the result, then the epilogue runs over it in place as
// a fused_elementwise over {result, the other operands}: its blocks read every operand's
// elements before writing them, so the result may be its own operand $0 (cpu_fused's
// in-place rule), and its values are the unfused chain's bits.
void fused_einsum_kernel(const KernelArgs& a) { run_fused_einsum(a); }

void fused_einsum_loop(const KernelArgs& a, const KernelArgs& e) {
  cpu_einsum(e, EinsumImpl::Auto);
  OpAttrs at;
  const KernelArgs ep = fused_einsum_epilogue_args(a, at);
  try {
    fused_elementwise_kernel(ep);
  } catch (const RuntimeError& err) {
    fail_fused_einsum(a, fmt::format("epilogue ($0 is the product): {}", err.what()));
  }
}

}  // namespace tessel::cpu_detail

namespace tessel {

bool einsum_epilogue_steps(const FusedExpr& e, std::vector<EinsumEpilogue::Step>& steps) {
  using Step = EinsumEpilogue::Step;
  steps.clear();
  if (e.nodes.empty()) return false;
  auto node = [&](int k) -> const FusedNode& { return e.nodes[static_cast<std::size_t>(k)]; };
  auto is_operand = [&](int k) { return node(k).kind == FusedNode::Kind::Operand && node(k).operand >= 1; };
  auto is_f32_literal = [&](int k) { return node(k).kind == FusedNode::Kind::Literal && node(k).dtype == DType::f32; };
  // From the root down to the product, one step per node.
  for (int k = e.root();;) {
    const FusedNode& n = node(k);
    if (n.kind == FusedNode::Kind::Operand && n.operand == 0) break;
    if (n.kind != FusedNode::Kind::Op) return false;
    Step st;
    if (n.op == OpKind::Gelu) {
      st.kind = Step::Kind::Gelu;
      k = n.args[0];
    } else if (n.op == OpKind::Add && n.args.size() == 2 && (is_operand(n.args[1]) || is_operand(n.args[0]))) {
      const bool right = is_operand(n.args[1]);
      st.kind = Step::Kind::Add;
      st.operand = node(n.args[right ? 1 : 0]).operand;
      k = n.args[right ? 0 : 1];
    } else if (n.op == OpKind::Mul && n.args.size() == 2 && (is_f32_literal(n.args[1]) || is_f32_literal(n.args[0]))) {
      const bool right = is_f32_literal(n.args[1]);
      st.kind = Step::Kind::Scale;
      st.scale = static_cast<float>(node(n.args[right ? 1 : 0]).value);
      k = n.args[right ? 0 : 1];
    } else {
      return false;
    }
    steps.push_back(st);
  }
  std::reverse(steps.begin(), steps.end());
  return !steps.empty();
}

bool run_fused_einsum(const KernelArgs& a) {
  const KernelArgs e = fused_einsum_product_args(a);
  EinsumEpilogue ep;
  if (e.in.size() == 2 && a.out_dtype == DType::f32 && cpu_detail::fused_einsum_post_ops(a, ep) &&
      cpu_einsum(e, EinsumImpl::Auto, &ep))
    return true;
  cpu_detail::fused_einsum_loop(a, e);
  return false;
}

void run_fused_einsum_fallback(const KernelArgs& args) {
  cpu_detail::fused_einsum_loop(args, fused_einsum_product_args(args));
}

}  // namespace tessel
