// src/ir/fused_expr.cpp — the expression of a fused_elementwise op: parser, printer and typing
// (tessel/ir/fused_expr.hpp). Typing runs each node through its op's registry shape function,
// so a fused op accepts exactly the operands its unfused chain accepted.
#include "tessel/ir/fused_expr.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>

namespace tessel {

bool is_fusible_elementwise(OpKind k) {
  return op_in(kUnaryOps, k) || op_in(kBinaryOps, k) || op_in(kCompareOps, k) || k == OpKind::Cast ||
         k == OpKind::Where;
}

int FusedExpr::num_ops() const {
  int n = 0;
  for (const FusedNode& x : nodes) n += x.kind == FusedNode::Kind::Op;
  return n;
}

namespace {

class ExprParser {
 public:
  explicit ExprParser(std::string_view s) : s_(s) {}

  FusedExpr run() {
    std::vector<int> statements;  // node of each statement
    for (;;) {
      statements.push_back(term(statements));
      skip_space();
      if (at_end()) break;
      expect(';');
    }
    // The root must be the last node: a trailing `#k` or literal statement is copied there.
    const int root = statements.back();
    if (root != e_.root()) {
      FusedNode copy = e_.nodes[static_cast<std::size_t>(root)];
      e_.nodes.push_back(std::move(copy));
    }
    if (e_.num_ops() == 0) fail("the expression has no op (a fused op computes at least one)");
    return std::move(e_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ParseError(fmt::format("fused_elementwise: expr {}: {} at column {}", quote_text(s_), what, pos_ + 1));
  }
  bool at_end() const { return pos_ >= s_.size(); }
  void skip_space() {
    while (!at_end() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (at_end() || s_[pos_] != c)
      fail(fmt::format("expected '{}' but found {}", c, at_end() ? std::string("the end") : fmt::format("'{}'", s_[pos_])));
    ++pos_;
  }
  // Consumes `c` when it comes next.
  bool accept(char c) {
    skip_space();
    if (at_end() || s_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  std::string_view word() {
    skip_space();
    const std::size_t b = pos_;
    while (!at_end() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    return s_.substr(b, pos_ - b);
  }
  int64_t integer() {
    skip_space();
    const std::size_t b = pos_;
    while (!at_end() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (b == pos_) fail("expected a number");
    if (pos_ - b > 9) fail("index too large");
    return std::stoll(std::string(s_.substr(b, pos_ - b)));
  }
  int add(FusedNode n) {
    e_.nodes.push_back(std::move(n));
    return e_.root();
  }

  int term(const std::vector<int>& statements) {
    skip_space();
    if (at_end()) fail("expected an operand, a literal or an op");
    const char c = s_[pos_];
    if (c == '$') {
      ++pos_;
      FusedNode n;
      n.kind = FusedNode::Kind::Operand;
      n.operand = static_cast<int>(integer());
      return add(std::move(n));
    }
    if (c == '#') {
      ++pos_;
      const int64_t k = integer();
      if (k >= static_cast<int64_t>(statements.size()))
        fail(fmt::format("#{} names no earlier statement ({} so far)", k, statements.size()));
      return statements[static_cast<std::size_t>(k)];
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.' ||
        s_.substr(pos_, 3) == "inf" || s_.substr(pos_, 3) == "nan")
      return literal();
    const std::size_t name_at = pos_;
    const std::string_view name = word();
    if (name.empty()) fail(fmt::format("unexpected '{}'", c));
    FusedNode n;
    n.kind = FusedNode::Kind::Op;
    if (name == "cast") {
      n.op = OpKind::Cast;
      expect('<');
      const std::string_view t = word();
      try {
        n.dtype = parse_dtype(t);
      } catch (const ParseError& err) {
        fail(err.what());
      }
      expect('>');
    } else {
      const auto k = op_kind_from_name(name);
      if (!k) {
        pos_ = name_at;
        fail(fmt::format("unknown op '{}'", name));
      }
      if (!is_fusible_elementwise(*k) && *k != OpKind::CausalMask) {
        pos_ = name_at;
        fail(fmt::format("'{}' is not an elementwise op a fused expression may hold", name));
      }
      n.op = *k;
    }
    expect('(');
    do n.args.push_back(term(statements));
    while (accept(','));
    expect(')');
    const OpDef& d = op_def(n.op);
    const int nargs = static_cast<int>(n.args.size());
    if (nargs < d.min_inputs || (d.max_inputs >= 0 && nargs > d.max_inputs)) {
      pos_ = name_at;
      fail(fmt::format("'{}' takes {} argument(s), given {}", d.name, d.min_inputs, nargs));
    }
    return add(std::move(n));
  }

  int literal() {
    skip_space();
    const std::size_t b = pos_;
    while (!at_end() && s_[pos_] != ':' && s_[pos_] != ',' && s_[pos_] != ')' && s_[pos_] != ';' &&
           !std::isspace(static_cast<unsigned char>(s_[pos_])))
      ++pos_;
    const std::string num(s_.substr(b, pos_ - b));
    FusedNode n;
    n.kind = FusedNode::Kind::Literal;
    if (num == "inf" || num == "+inf") n.value = std::numeric_limits<double>::infinity();
    else if (num == "-inf") n.value = -std::numeric_limits<double>::infinity();
    else if (num == "nan") n.value = std::numeric_limits<double>::quiet_NaN();
    else {
      char* end = nullptr;
      n.value = std::strtod(num.c_str(), &end);
      if (num.empty() || end != num.c_str() + num.size()) {
        pos_ = b;
        fail(fmt::format("'{}' is not a number", num));
      }
    }
    expect(':');
    n.dtype = [&] {
      try {
        return parse_dtype(word());
      } catch (const ParseError& err) {
        fail(err.what());
      }
    }();
    expect('[');
    if (!accept(']')) {
      do {
        const int64_t d = integer();
        if (d != 1) fail(fmt::format("a literal's dims must all be 1 (it is one scalar), got {}", d));
        n.shape.push_back(d);
      } while (accept(','));
      expect(']');
    }
    return add(std::move(n));
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  FusedExpr e_;
};

std::string literal_text(const FusedNode& n) {
  std::string v;
  if (std::isnan(n.value)) v = "nan";
  else if (std::isinf(n.value)) v = n.value > 0 ? "inf" : "-inf";
  else v = fmt::format("{}", n.value);  // shortest form that reads back to the same double
  return v + ":" + type_str(n.dtype, n.shape);
}

}  // namespace

FusedExpr parse_fused_expr(std::string_view text) { return ExprParser(text).run(); }

std::string print_fused_expr(const FusedExpr& e) {
  std::vector<int> readers(e.nodes.size(), 0);
  for (const FusedNode& n : e.nodes)
    for (int a : n.args) ++readers[static_cast<std::size_t>(a)];
  std::vector<int> statement(e.nodes.size(), -1);  // node -> its statement, when it has one
  std::vector<std::string> statements;
  // Text of node i where it is read.
  std::function<std::string(int)> text = [&](int i) -> std::string {
    const FusedNode& n = e.nodes[static_cast<std::size_t>(i)];
    if (statement[static_cast<std::size_t>(i)] >= 0) return fmt::format("#{}", statement[static_cast<std::size_t>(i)]);
    switch (n.kind) {
      case FusedNode::Kind::Operand: return fmt::format("${}", n.operand);
      case FusedNode::Kind::Literal: return literal_text(n);
      case FusedNode::Kind::Op: break;
    }
    std::vector<std::string> args;
    for (int a : n.args) args.push_back(text(a));
    const std::string head = n.op == OpKind::Cast ? fmt::format("cast<{}>", dtype_name(n.dtype)) : op_name(n.op);
    return fmt::format("{}({})", head, join(args, ","));
  };
  for (std::size_t i = 0; i < e.nodes.size(); ++i) {
    const FusedNode& n = e.nodes[i];
    const bool root = static_cast<int>(i) == e.root();
    if (n.kind == FusedNode::Kind::Op && (readers[i] > 1 || root)) {
      statements.push_back(text(static_cast<int>(i)));
      statement[i] = static_cast<int>(statements.size()) - 1;
    }
  }
  if (statement[static_cast<std::size_t>(e.root())] < 0) statements.push_back(text(e.root()));
  return join(statements, ";");
}

ResultType type_fused_expr(FusedExpr& e, const std::vector<const Value*>& in, bool positional) {
  auto fail = [&](std::size_t node, const std::string& why) {
    std::vector<std::string> ops;
    for (const Value* v : in) ops.push_back(fmt::format("%{}: {}", v->name, type_str(v->dtype, v->shape)));
    throw ShapeError(fmt::format("fused_elementwise({}) expr {}: node {}: {}", join(ops, ", "),
                                 quote_text(print_fused_expr(e)), node, why));
  };
  if (e.nodes.empty()) throw ShapeError("fused_elementwise: empty expression");
  // Each node's type as a Value, so the ops' own shape functions can read it.
  std::vector<Value> vals(e.nodes.size());
  for (std::size_t i = 0; i < e.nodes.size(); ++i) {
    FusedNode& n = e.nodes[i];
    Value& v = vals[i];
    v.name = fmt::format("node{}", i);
    switch (n.kind) {
      case FusedNode::Kind::Operand:
        if (n.operand < 0 || static_cast<std::size_t>(n.operand) >= in.size())
          fail(i, fmt::format("${} names no operand (the op has {})", n.operand, in.size()));
        n.shape = in[static_cast<std::size_t>(n.operand)]->shape;
        n.dtype = in[static_cast<std::size_t>(n.operand)]->dtype;
        break;
      case FusedNode::Kind::Literal:
        if (n.dtype == DType::i32 && !(n.value >= -2147483648.0 && n.value <= 2147483647.0 &&
                                      n.value == std::trunc(n.value)))
          fail(i, fmt::format("literal {} is not an i32 value", n.value));
        break;
      case FusedNode::Kind::Op: {
        if (n.op == OpKind::CausalMask && !positional)
          fail(i, "causal_mask reads positions: only a fused_softmax's expression may hold it");
        std::vector<const Value*> args;
        for (int a : n.args) {
          if (a < 0 || static_cast<std::size_t>(a) >= i) fail(i, fmt::format("argument node {} is not an earlier node", a));
          args.push_back(&vals[static_cast<std::size_t>(a)]);
        }
        OpAttrs attrs;
        attrs.dtype = n.dtype;  // cast's target
        try {
          const std::vector<ResultType> r = infer_op(n.op, attrs, args);
          n.shape = r[0].shape;
          n.dtype = r[0].dtype;
        } catch (const ShapeError& err) {
          fail(i, err.what());
        }
        break;
      }
    }
    v.shape = n.shape;
    v.dtype = n.dtype;
  }
  // A causal mask's positions are the result's: it must cover the whole result.
  for (std::size_t i = 0; i < e.nodes.size(); ++i)
    if (e.nodes[i].kind == FusedNode::Kind::Op && e.nodes[i].op == OpKind::CausalMask &&
        e.nodes[i].shape != e.nodes.back().shape)
      fail(i, fmt::format("causal_mask of {} inside a result of {}: the mask must have the result's shape",
                          shape_str(e.nodes[i].shape), shape_str(e.nodes.back().shape)));
  // Every operand is read and reaches the result: the fused op's shape is the broadcast of
  // them all (which the partitioner's elementwise rule assumes).
  const FusedNode& r = e.nodes.back();
  for (std::size_t k = 0; k < in.size(); ++k) {
    bool used = false;
    for (const FusedNode& n : e.nodes) used = used || (n.kind == FusedNode::Kind::Operand && n.operand == static_cast<int>(k));
    if (!used) fail(e.nodes.size() - 1, fmt::format("operand ${} is not read by the expression", k));
    const Shape& s = in[k]->shape;
    bool ok = s.size() <= r.shape.size();
    for (std::size_t d = 0; ok && d < s.size(); ++d) {
      const int64_t o = r.shape[r.shape.size() - s.size() + d];
      ok = s[d] == o || s[d] == 1;
    }
    if (!ok) fail(e.nodes.size() - 1, fmt::format("operand ${} {} does not broadcast to the result {}", k,
                                                  shape_str(s), shape_str(r.shape)));
  }
  return {r.shape, r.dtype};
}

int fused_einsum_operands(std::string_view equation) {
  const std::string_view lhs = equation.substr(0, equation.find("->"));
  return 1 + static_cast<int>(std::count(lhs.begin(), lhs.end(), ','));
}

ResultType type_fused_expr(FusedExpr& e, const std::vector<Shape>& shapes, const std::vector<DType>& dtypes,
                           bool positional) {
  if (shapes.size() != dtypes.size())
    throw ShapeError(fmt::format("fused_elementwise: {} operand shapes but {} dtypes", shapes.size(), dtypes.size()));
  std::vector<Value> vals(shapes.size());
  std::vector<const Value*> ins;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    vals[i].name = fmt::format("in{}", i);
    vals[i].shape = shapes[i];
    vals[i].dtype = dtypes[i];
    ins.push_back(&vals[i]);
  }
  return type_fused_expr(e, ins, positional);
}

}  // namespace tessel
