// tessel/ops.hpp — the op table: for every OpKind its name, shape function, sharding rule
// and flops. The same rule drives propagation, partitioning and the cost model.
//
// A sharding rule (Shardy's idea) maps every dim of every operand and of the result onto
// *factors*. An einsum letter is a factor; an elementwise op has one factor per result dim;
// a reshape decomposes dims into compound factors ([B,S,H*D] -> [B,S,H,D] gives factors
// B,S,H,D with operand dim 2 = (H, D), major→minor). A factor present in operands but not in
// the result is a *reduction* factor: sharding it leaves the result partial (a sum over the
// axes). A *replicated* factor must not be sharded (softmax axis, layer-norm feature dim,
// sliced dims): its operands are gathered on it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/common.hpp"
#include "tessel/graph.hpp"

namespace tessel {

enum class FactorKind {
  Pass,        // appears in the result: sharding it shards the result
  Reduction,   // only in operands, summed over: sharding it makes the result partial
  Replicated,  // must stay unsharded (the op needs the whole extent locally)
};

struct Factor {
  std::string name;  // einsum letter or "d0".. for display in --why
  int64_t size = 1;
  FactorKind kind = FactorKind::Pass;
};

// Dim -> factors composing it, major→minor. An empty list means the dim has no factor
// (a broadcast size-1 dim, or a dim the rule cannot express): it stays unsharded.
using DimFactors = std::vector<int>;

struct OpRule {
  std::vector<Factor> factors;
  std::vector<std::vector<DimFactors>> operands;  // [operand][dim]
  std::vector<DimFactors> result;                 // [dim]
  std::string to_string() const;  // e.g. "(b,s,d),(d,f) -> (b,s,f) reduction{d}"
};

enum class PartialFlow {
  None,         // operands must be reduced first
  Multilinear,  // linear in each operand separately: at most one operand may be partial
                // (einsum, mul, neg, reshape, transpose, reduce_sum, ...)
  Additive,     // all operands partial over the same axes (add, sub, concat)
};

struct OpDef {
  OpKind kind;
  const char* name;  // text-form name, e.g. "einsum", "layer_norm"
  int min_inputs;
  int max_inputs;    // -1: variadic
  // Infers the result type. Throws ShapeError naming the op, operands and shapes.
  void (*infer)(const OpAttrs& attrs, const std::vector<const Value*>& in, Shape& out,
                DType& out_dtype);
  // Sharding rule for these operand/result shapes (global or local).
  OpRule (*rule)(const OpAttrs& attrs, const std::vector<Shape>& in, const Shape& out);
  // Floating-point operations for these shapes (global or local).
  double (*flops)(const OpAttrs& attrs, const std::vector<Shape>& in, const Shape& out);
  // How a partial (unreduced-sum) operand may flow through the op without being reduced
  // first; the result is then partial over the same axes.
  PartialFlow partial_flow;
};

const OpDef& op_def(OpKind kind);
const char* op_name(OpKind kind);
std::optional<OpKind> op_kind_from_name(std::string_view name);
bool is_unary_elementwise(OpKind k);
bool is_binary_elementwise(OpKind k);

// Rule for a concrete op of a graph (shapes from the graph).
OpRule op_rule(const Graph& g, const Op& op);

// Parsed einsum equation: operand subscripts and result subscripts.
struct EinsumSpec {
  std::vector<std::string> operands;
  std::string result;
};
// Throws ShapeError for malformed equations (repeated letter in one operand, result letter
// absent from the operands, wrong operand count).
EinsumSpec parse_einsum(std::string_view equation, int num_operands);

}  // namespace tessel
