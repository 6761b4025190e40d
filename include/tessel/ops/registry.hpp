// tessel/ops/registry.hpp — the op registry: everything tessel knows about an op, in one entry.
//
// An op exists in exactly one place: its OpDef (src/ops/*.cpp) says its name, attribute
// schema (which drives parsing, printing and validating its attributes), shape function,
// sharding rule, flops and bytes, how partial sums flow through it, how its attributes change
// when the op is localised to a device's block, whether its kernel reads global positions, a
// sample generator for the property tests, and its vector-Jacobian product (a slot the
// training work fills). Backends register one kernel per op kind (runtime/kernel_table.hpp).
// Propagation, partitioning, the cost model, the text forms and the property tests all read
// the registry and nothing else. docs/adding-an-op.md is the walkthrough.
//
// A sharding rule (Shardy's idea) maps every dim of every operand and of the result onto
// *factors*. An einsum letter is a factor; an elementwise op has one factor per result dim;
// a reshape decomposes dims into compound factors ([B,S,H*D] -> [B,S,H,D] gives factors
// B,S,H,D with operand dim 2 = (H, D), major→minor). A factor present in operands but not in
// the result is a *reduction* factor: sharding it leaves the result partial (a sum over the
// axes). A *replicated* factor must not be sharded (softmax axis, layer-norm feature dim,
// sliced dims): its operands are gathered on it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/ops/op_attrs.hpp"

namespace tessel {

enum class FactorKind {
  Pass,        // appears in the result: sharding it shards the result
  Reduction,   // only in operands, summed over: sharding it makes the result partial
  Replicated,  // must stay unsharded (the op needs the whole extent locally)
  Combined,    // reduced by the op itself (softmax axis, layer-norm features, cross-entropy
               // classes, reduce_max dims): when sharded, each device reduces its block and
               // the op's `distribute` combines the per-row statistics with all-reduces —
               // bytes proportional to the rows, not the tensor. Otherwise it is gathered.
};

struct Factor {
  std::string name;  // einsum letter or "d0".. for display in --why
  int64_t size = 1;
  FactorKind kind = FactorKind::Pass;
};

// Dim -> factors composing it, major→minor. An empty list means the dim has no factor
// (a broadcast size-1 dim, or a dim the rule cannot express): it stays unsharded.
using DimFactors = std::vector<int>;

// An op with several results gives each result its dims. A factor of the operands that one
// result lacks is summed over for that result (a Pass factor of dx is a reduction factor of
// layer_norm_grad's dgamma): when it is sharded, that result is partial over its axes while
// the others are sharded on it.
struct OpRule {
  std::vector<Factor> factors;
  std::vector<std::vector<DimFactors>> operands;  // [operand][dim]
  std::vector<DimFactors> result;                 // [dim] of result 0
  std::vector<std::vector<DimFactors>> extra_results;  // [result - 1][dim]
  int num_results() const { return 1 + static_cast<int>(extra_results.size()); }
  const std::vector<DimFactors>& result_dims(int r) const {
    return r == 0 ? result : extra_results.at(static_cast<std::size_t>(r - 1));
  }
  // Whether factor f composes some dim of result r.
  bool in_result(int r, int f) const;
  std::string to_string() const;  // e.g. "(b,s,d),(d,f) -> (b,s,f) reduction{d}"
};

enum class PartialFlow {
  None,         // operands must be reduced first
  Multilinear,  // linear in each operand separately: at most one operand may be partial
                // (einsum, mul, neg, reshape, transpose, reduce_sum, ...)
  Additive,     // all operands partial over the same axes (add, sub, concat)
};

// What localize() sees: the op's global and local (one device's block) shapes.
struct LocalizeArgs {
  const std::vector<Shape>& global_in;
  const Shape& global_out;
  const std::vector<Shape>& local_in;
  const Shape& local_out;
  const Sharding& out_sharding;  // the local result's layout (may be partial)
};

// Random draws for an op's sample generator (the property tests' op builder).
struct SampleGen {
  std::mt19937_64& rng;
  // A random layout for a value of this shape on the test's mesh (set by the test).
  std::function<Sharding(const Shape&)> random_sharding;

  int64_t below(int64_t n) { return n <= 0 ? 0 : static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); }
  int64_t pick(std::initializer_list<int64_t> xs) {
    return *(xs.begin() + below(static_cast<int64_t>(xs.size())));
  }
  int64_t dim() { return pick({2, 4, 6, 8, 12, 16}); }
  int rank() { return 1 + static_cast<int>(below(3)); }
  Shape shape(int rank) {
    Shape s;
    for (int i = 0; i < rank; ++i) s.push_back(dim());
    return s;
  }
  bool coin(double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  // A fresh graph input "in<k>".
  Tensor input(Graph& g, Shape s, DType t = DType::f32);
};

// What an op's vector-Jacobian product sees: the forward op (a copy: the vjp adds ops to the
// graph), its operands and result as handles of the graph being differentiated, and the
// gradient of the result (same type as the result). It returns one gradient per operand, of
// the operand's type, or a default Tensor where the operand gets none (integer ids, labels,
// conditions). autodiff.hpp's grad() calls it.
// An op with several results and a vjp (attention) also sees every result and each one's
// gradient (a default Tensor where none reaches it; grad_output too may then be default).
struct VjpArgs {
  Graph& graph;
  Op op;
  std::vector<Tensor> inputs;
  Tensor output;
  Tensor grad_output;
  std::vector<Tensor> outputs = {};       // every result, output first
  std::vector<Tensor> grad_outputs = {};  // their gradients, as grad_output
};

// The partitioner's side of a distributed reduction (OpDef::distribute): local kernels on
// local values of one device's program, and all-reduces over the axes the op's combined
// factors are split on.
class LocalEmitter {
 public:
  virtual ~LocalEmitter() = default;
  // A local kernel; its result's shape and dtype come from the op's shape function on the
  // local shapes.
  virtual int kernel(OpKind kind, const OpAttrs& attrs, const std::vector<int>& ins) = 0;
  // A local kernel whose result is the block of a value of global shape `global` laid out
  // as `layout` (kernels that read positions see where the block lies).
  virtual int kernel_block(OpKind kind, const OpAttrs& attrs, const std::vector<int>& ins,
                           const Shape& global, const Sharding& layout) = 0;
  // All-reduce of a local value over the combined axes.
  virtual int all_reduce(int v, ReduceOp op) = 0;
  virtual int scalar(double value, DType dtype) = 0;
  virtual const Shape& shape(int v) const = 0;
  virtual DType dtype(int v) const = 0;
};

struct DistributeArgs {
  LocalEmitter& emit;
  const OpAttrs& attrs;             // the op's global attributes
  std::vector<int> ins;             // local operands in the chosen factor sharding
  std::vector<Shape> global_in;     // their global shapes
  std::vector<Sharding> in_layouts; // their layouts
  Shape global_out;
  DType out_dtype = DType::f32;
};

using InferFn = void (*)(const OpAttrs& attrs, const std::vector<const Value*>& in, Shape& out,
                         DType& out_dtype);
// The type of one result.
struct ResultType {
  Shape shape;
  DType dtype = DType::f32;
  bool operator==(const ResultType& o) const { return shape == o.shape && dtype == o.dtype; }
};
// Shape function of an op with several results: one type per result (OpDef::num_results).
using InferResultsFn = std::vector<ResultType> (*)(const OpAttrs& attrs,
                                                   const std::vector<const Value*>& in);
using RuleFn = OpRule (*)(const OpAttrs& attrs, const std::vector<Shape>& in, const Shape& out);
using FlopsFn = double (*)(const OpAttrs& attrs, const std::vector<Shape>& in, const Shape& out);
using BytesFn = double (*)(const OpAttrs& attrs, const std::vector<Shape>& in,
                           const std::vector<DType>& in_dtypes, const Shape& out, DType out_dtype);
using NormalizeFn = void (*)(OpAttrs& attrs, const std::vector<const Value*>& in);
using LocalizeFn = void (*)(OpAttrs& attrs, const LocalizeArgs& x);
using SampleFn = Tensor (*)(Graph& g, SampleGen& r);
using IndexBoundFn = int64_t (*)(const OpAttrs& attrs, const std::vector<Shape>& in, int operand);
using VjpFn = std::vector<Tensor> (*)(const VjpArgs& x);
// Emits the distributed form of an op whose combined factor is sharded; returns the local
// result (in the layout of the op's result).
using DistributeFn = int (*)(const DistributeArgs& x);

struct OpDef {
  OpKind kind = OpKind::kCount;
  const char* name = nullptr;  // text-form name, e.g. "einsum", "layer_norm"
  int min_inputs = 0;
  int max_inputs = 0;          // -1: variadic
  std::vector<AttrSpec> attrs;  // attribute schema (text keys, fields, required)
  // Makes attributes canonical before inference (negative axes → positive, sorted dims).
  // Throws ShapeError. Optional.
  NormalizeFn normalize = nullptr;
  // Infers the result type. Throws ShapeError naming the op, operands and shapes.
  InferFn infer = nullptr;
  // Ops with several results (a layer norm's backward: dx, dgamma, dbeta): how many, and
  // their shape function (which replaces `infer`; infer_op() calls whichever is set). Such an
  // op's rule fills OpRule::extra_results, its flops and bytes see result 0's shape, it has
  // no distributed form, and its kernel writes KernelArgs::out and extra_out.
  int num_results = 1;
  InferResultsFn infer_results = nullptr;
  // Sharding rule for these operand/result shapes (global or local); `out` is result 0's.
  RuleFn rule = nullptr;
  // Floating-point operations for these shapes (global or local).
  FlopsFn flops = nullptr;
  // Bytes moved through memory; nullptr: every operand read once, the result written once
  // (required for ops with several results).
  BytesFn bytes = nullptr;
  // How a partial (unreduced-sum) operand may flow through the op without being reduced
  // first; the result is then partial over the same axes.
  PartialFlow partial_flow = PartialFlow::None;
  // Rewrites attributes that name global extents for a device's block (reshape's shape,
  // slice bounds). nullptr: the attributes hold for any block.
  LocalizeFn localize = nullptr;
  // The kernel reads the global position of its blocks (KernelArgs::in_offsets/out_offset).
  bool needs_offsets = false;
  // For an op that reads integer indices: the exclusive upper bound of valid values of
  // operand `operand` (0: not an index operand). Test inputs are drawn inside it
  // (random_inputs); kernels report values outside it as errors.
  IndexBoundFn index_bound = nullptr;
  // Builds a small random graph around one op of this kind (property tests). Returns the
  // op's result. nullptr: the kind is not sampled (Input).
  SampleFn sample = nullptr;
  // The distributed form when a Combined factor is sharded, and how many all-reduces of
  // per-row f32 statistics it issues (the partitioner weighs that against gathering the
  // factor). nullptr: Combined factors are gathered.
  DistributeFn distribute = nullptr;
  int distribute_stats = 0;
  // Vector-Jacobian product; nullptr until the op is differentiable.
  VjpFn vjp = nullptr;
};

// The registry entry of a kind. Throws Error for a value outside the enum (e.g. a cast int).
const OpDef& op_def(OpKind kind);
const char* op_name(OpKind kind);
std::optional<OpKind> op_kind_from_name(std::string_view name);
// Every kind in enum order (Input first).
std::vector<OpKind> all_op_kinds();

// The types of an op's results for these operands (OpDef::infer or infer_results); throws
// ShapeError naming the op, operands and shapes.
std::vector<ResultType> infer_op(OpKind kind, const OpAttrs& attrs,
                                 const std::vector<const Value*>& in);

// Rule for a concrete op of a graph (shapes from the graph).
OpRule op_rule(const Graph& g, const Op& op);
// Bytes an op moves (OpDef::bytes or the read-once/write-once default).
double op_bytes(OpKind kind, const OpAttrs& attrs, const std::vector<Shape>& in,
                const std::vector<DType>& in_dtypes, const Shape& out, DType out_dtype);
// The schema-driven text of an op's attributes, " key=value ..." (graphs and programs);
// Input, Constant type/value and ShardingConstraint's sharding are printed by their callers.
std::string attrs_text(OpKind kind, const OpAttrs& attrs);
// One attribute value in the text syntax of its field.
std::string attr_value_text(AttrField f, const OpAttrs& attrs);

// Parsed einsum equation: operand subscripts and result subscripts.
struct EinsumSpec {
  std::vector<std::string> operands;
  std::string result;
};
// Throws ShapeError for malformed equations (repeated letter in one operand, result letter
// absent from the operands, wrong operand count).
EinsumSpec parse_einsum(std::string_view equation, int num_operands);

}  // namespace tessel
