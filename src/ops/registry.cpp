// src/ops/registry.cpp — the op registry's table and the functions every pass uses to read
// it (lookup by kind or name, rules of graph ops, bytes, schema-driven attribute text).
// The entries themselves live in one file per op family beside this one.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <set>

#include "op_helpers.hpp"

namespace tessel {
namespace {

constexpr std::size_t kNumKinds = static_cast<std::size_t>(OpKind::kCount);

const std::vector<OpDef>& table() {
  static const std::vector<OpDef> t = [] {
    std::vector<OpDef> v(kNumKinds);
    ops_detail::register_leaf_ops(v);
    ops_detail::register_einsum_ops(v);
    ops_detail::register_elementwise_ops(v);
    ops_detail::register_reduction_ops(v);
    ops_detail::register_layout_ops(v);
    ops_detail::register_nn_ops(v);
    ops_detail::register_index_ops(v);
    ops_detail::register_optim_ops(v);
    ops_detail::register_fused_ops(v);
    ops_detail::register_attention_ops(v);
    // Every kind has exactly its own entry, with the functions every pass calls: a missing
    // entry is a programming error in the registry, caught by the first lookup (and by the
    // registry test).
    for (std::size_t k = 0; k < kNumKinds; ++k)
      if (v[k].kind != static_cast<OpKind>(k) || !v[k].name || !v[k].rule || !v[k].flops ||
          (v[k].num_results == 1 ? !v[k].infer
                                 : (v[k].num_results < 1 || !v[k].infer_results || !v[k].bytes ||
                                    v[k].distribute || v[k].needs_offsets || v[k].localize)))
        throw Error(fmt::format("tessel op registry: op kind #{} has no complete entry "
                                "(src/ops/)", k));
    return v;
  }();
  return t;
}

std::string ints_text(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ",")); }

bool is_default(AttrField f, const OpAttrs& a) {
  static const OpAttrs d;
  switch (f) {
    case AttrField::Equation: return a.equation == d.equation;
    case AttrField::Epilogue: return a.epilogue == d.epilogue;
    case AttrField::Dims: return a.dims == d.dims;
    case AttrField::Shape: return a.shape == d.shape;
    case AttrField::Starts: return a.starts == d.starts;
    case AttrField::Limits: return a.limits == d.limits;
    case AttrField::Axis: return a.axis == d.axis;
    case AttrField::Depth: return a.depth == d.depth;
    case AttrField::Scalar: return a.scalar == d.scalar;
    case AttrField::Eps: return a.eps == d.eps;
    case AttrField::Beta1: return a.beta1 == d.beta1;
    case AttrField::Beta2: return a.beta2 == d.beta2;
    case AttrField::WeightDecay: return a.weight_decay == d.weight_decay;
    case AttrField::Keepdims: return a.keepdims == d.keepdims;
    case AttrField::Causal: return a.causal == d.causal;
    case AttrField::DType: return a.dtype == d.dtype;
  }
  return false;
}

}  // namespace

const OpDef& op_def(OpKind kind) {
  const auto k = static_cast<std::size_t>(kind);
  if (static_cast<int>(kind) < 0 || k >= kNumKinds)
    throw Error(fmt::format("op kind #{} is not an op of tessel (valid kinds are 0..{}); was an "
                            "integer cast to OpKind?", static_cast<int>(kind), kNumKinds - 1));
  return table()[k];
}

const char* op_name(OpKind kind) { return op_def(kind).name; }

std::optional<OpKind> op_kind_from_name(std::string_view name) {
  for (const OpDef& d : table())
    if (name == d.name) return d.kind;
  return std::nullopt;
}

std::vector<OpKind> all_op_kinds() {
  std::vector<OpKind> ks;
  for (std::size_t k = 0; k < kNumKinds; ++k) ks.push_back(static_cast<OpKind>(k));
  return ks;
}

std::vector<ResultType> infer_op(OpKind kind, const OpAttrs& attrs,
                                 const std::vector<const Value*>& in) {
  const OpDef& d = op_def(kind);
  if (d.infer_results) {
    std::vector<ResultType> r = d.infer_results(attrs, in);
    if (static_cast<int>(r.size()) != d.num_results)
      throw Error(fmt::format("tessel op registry: {} inferred {} results, its entry says {}",
                              d.name, r.size(), d.num_results));
    return r;
  }
  ResultType r;
  d.infer(attrs, in, r.shape, r.dtype);
  return {std::move(r)};
}

OpRule op_rule(const Graph& g, const Op& op) {
  std::vector<Shape> in;
  for (int v : op.inputs) in.push_back(g.values[v].shape);
  return op_def(op.kind).rule(op.attrs, in, g.values[op.output].shape);
}

bool OpRule::in_result(int r, int f) const {
  for (const DimFactors& d : result_dims(r))
    if (std::find(d.begin(), d.end(), f) != d.end()) return true;
  return false;
}

double op_bytes(OpKind kind, const OpAttrs& attrs, const std::vector<Shape>& in,
                const std::vector<DType>& in_dtypes, const Shape& out, DType out_dtype) {
  const OpDef& d = op_def(kind);
  if (d.bytes) return d.bytes(attrs, in, in_dtypes, out, out_dtype);
  double b = static_cast<double>(num_elements(out)) * static_cast<double>(dtype_size(out_dtype));
  for (std::size_t i = 0; i < in.size() && i < in_dtypes.size(); ++i)
    b += static_cast<double>(num_elements(in[i])) * static_cast<double>(dtype_size(in_dtypes[i]));
  return b;
}

std::string attr_value_text(AttrField f, const OpAttrs& a) {
  switch (f) {
    case AttrField::Equation: return quote_text(a.equation);
    case AttrField::Epilogue: return quote_text(a.epilogue);
    case AttrField::Dims: return ints_text(a.dims);
    case AttrField::Shape: return ints_text(a.shape);
    case AttrField::Starts: return ints_text(a.starts);
    case AttrField::Limits: return ints_text(a.limits);
    case AttrField::Axis: return std::to_string(a.axis);
    case AttrField::Depth: return std::to_string(a.depth);
    case AttrField::Scalar: return fmt::format("{}", a.scalar);  // shortest round-trip form
    case AttrField::Eps: return fmt::format("{}", a.eps);
    case AttrField::Beta1: return fmt::format("{}", a.beta1);
    case AttrField::Beta2: return fmt::format("{}", a.beta2);
    case AttrField::WeightDecay: return fmt::format("{}", a.weight_decay);
    case AttrField::Keepdims: return a.keepdims ? "true" : "false";
    case AttrField::Causal: return a.causal ? "true" : "false";
    case AttrField::DType: return dtype_name(a.dtype);
  }
  return "?";
}

std::string attrs_text(OpKind kind, const OpAttrs& a) {
  std::string s;
  for (const AttrSpec& spec : op_def(kind).attrs)
    if (spec.required || spec.always_print || !is_default(spec.field, a))
      s += fmt::format(" {}={}", spec.key, attr_value_text(spec.field, a));
  return s;
}

std::string OpRule::to_string() const {
  auto dims_str = [&](const std::vector<DimFactors>& dims) {
    std::vector<std::string> parts;
    for (const auto& d : dims) {
      std::vector<std::string> fs;
      for (int f : d) fs.push_back(factors[f].name);
      parts.push_back(fs.empty() ? "1" : join(fs, "*"));
    }
    return "(" + join(parts, ",") + ")";
  };
  std::vector<std::string> ops;
  for (const auto& o : operands) ops.push_back(dims_str(o));
  std::string s = join(ops, ",") + " -> " + dims_str(result);
  for (const auto& r : extra_results) s += ", " + dims_str(r);
  std::vector<std::string> red, rep;
  for (const auto& f : factors) {
    if (f.kind == FactorKind::Reduction) red.push_back(f.name);
    if (f.kind == FactorKind::Replicated) rep.push_back(f.name);
  }
  if (!red.empty()) s += " reduction{" + join(red, ",") + "}";
  if (!rep.empty()) s += " replicated{" + join(rep, ",") + "}";
  return s;
}

Tensor SampleGen::input(Graph& g, Shape s, DType t) {
  return g.add_input(fmt::format("in{}", g.inputs.size()), t, std::move(s));
}

namespace ops_detail {

Graph& graph_of(const Tensor& t) {
  t.value();
  return *t.graph();
}

Graph& graph_of(const std::vector<Tensor>& ts) {
  if (ts.empty()) throw Error("an op builder was given no operands");
  Graph& g = graph_of(ts[0]);
  for (const Tensor& t : ts) {
    t.value();
    if (t.graph() != &g)
      throw Error(fmt::format("operands belong to different graphs (%{} and %{}); build every "
                              "operand of an op in the same Graph", ts[0].name(), t.name()));
  }
  return g;
}

}  // namespace ops_detail
}  // namespace tessel
