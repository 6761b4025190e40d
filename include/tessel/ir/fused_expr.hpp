// tessel/ir/fused_expr.hpp — the expression of a `fused_elementwise` op: a small DAG of
// elementwise ops of the registry over the op's operands and scalar literals, evaluated per
// element (what XLA calls a loop fusion's computation). The fuse-elementwise pass
// (program_passes.hpp) builds it from a chain of kernels; the CPU kernel evaluates it in one
// pass over memory; the registry entry types it with the ops' own shape functions, so a fused
// op has exactly the shapes, dtypes and errors of the chain it replaces.
//
// Text (the op's `expr=` attribute, docs/program-ir.md "Fused elementwise"):
//
//   expr       = statement { ";" statement }        the last statement is the result
//   statement  = term
//   term       = NAME "(" term { "," term } ")"     an elementwise op: neg, exp, ..., add, ...,
//                                                    eq, ..., where, gelu_grad; causal_mask in a
//                                                    fused_softmax only (it reads positions)
//              | "cast" "<" DTYPE ">" "(" term ")"  cast to DTYPE
//              | "$" INT                             operand INT of the op
//              | "#" INT                             the result of an earlier statement
//              | NUMBER ":" TYPE                     a literal: a scalar of TYPE, e.g. 0.5:f32[]
//                                                    (every dim of TYPE is 1; inf, -inf, nan)
//
// e.g. `gelu(add($0,$1))` (bias + GELU), `add(#0,mul(#0,$1))` after `exp($0)` as
// `exp($0);add(#0,mul(#0,$1))` — a node read twice is a statement of its own, read as `#k`.
// The printer writes a node inline where it has one reader and as a statement where it has
// several, with no spaces; print(parse(print(e))) == print(e).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/ops/registry.hpp"

namespace tessel {

struct FusedNode {
  enum class Kind { Operand, Literal, Op };
  Kind kind = Kind::Op;
  OpKind op = OpKind::Input;  // Op: the elementwise op
  std::vector<int> args;      // Op: earlier nodes
  int operand = -1;           // Operand: index into the fused op's operands
  double value = 0;           // Literal
  DType dtype = DType::f32;   // Literal: its dtype; Cast: the target; others: set by type_fused_expr
  Shape shape;                // Literal: its (all-ones) shape; others: set by type_fused_expr
};

// Nodes in topological order (arguments before their readers); the root is the last.
struct FusedExpr {
  std::vector<FusedNode> nodes;
  int root() const { return static_cast<int>(nodes.size()) - 1; }
  int num_ops() const;  // nodes of Kind::Op
};

// Whether a kernel of this kind may be a node of a fused expression: the unary and binary
// elementwise ops, comparisons, where, cast and gelu_grad (constants become literals).
bool is_fusible_elementwise(OpKind kind);

// fused_softmax (softmax along `axis` of such an expression: the attention's scale + causal
// mask + softmax in one kernel) uses the same text for its prologue.
//
// Parses the `expr=` text. Throws ParseError "fused_elementwise: expr \"...\": <what> at
// column N" for malformed text, an unknown or non-elementwise op, a wrong argument count, a
// reference to a later statement or a literal whose shape is not all ones.
FusedExpr parse_fused_expr(std::string_view text);
std::string print_fused_expr(const FusedExpr& e);

// Types every node with the registry's shape functions on the operand types `in` (shapes
// broadcast, dtypes as the unfused ops would have them) and returns the root's type. Throws
// ShapeError naming fused_elementwise, the node and the operands (an operand index out of
// range, shapes that do not broadcast, an i32 operand of a float op, ...).
// `positional`: the expression may hold causal_mask (fused_softmax's prologue), whose
// positions are the result's elements' (the mask must have the result's shape).
ResultType type_fused_expr(FusedExpr& e, const std::vector<const Value*>& in, bool positional = false);
// The same on a kernel's operand types (operand i is named in<i> in messages).
ResultType type_fused_expr(FusedExpr& e, const std::vector<Shape>& shapes, const std::vector<DType>& dtypes,
                           bool positional = false);

// fused_einsum (an einsum with an epilogue: the matmul's bias, GELU, residual add and scale
// applied to the product before it is stored, oneDNN's post-ops) uses the same text for its
// epilogue: there `$0` is the einsum's product and `$k` (k >= 1) the op's operand
// fused_einsum_operands(equation) - 1 + k, the operands that follow the einsum's own.
// The number of the einsum's own operands: the terms left of "->" (1 or 2 for a valid
// equation; the registry's shape function checks the rest).
int fused_einsum_operands(std::string_view equation);

}  // namespace tessel
