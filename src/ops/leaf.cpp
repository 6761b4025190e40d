// src/ops/leaf.cpp — registry entries of the ops that make or pin values: input, constant,
// and sharding_constraint (JAX's with_sharding_constraint).
#include "tessel/ops/builders.hpp"
#include "op_helpers.hpp"

namespace tessel {
namespace ops_detail {
namespace {

void infer_none(const OpAttrs&, const Ins& in, Shape&, DType&) {
  shape_fail("input", in, "inputs are created with Graph::add_input, not add_op");
}

void infer_constant(const OpAttrs& a, const Ins&, Shape& out, DType& dt) {
  for (int64_t d : a.shape)
    if (d < 1) throw ShapeError(fmt::format("constant: shape {} has a dim < 1", shape_str(a.shape)));
  if (a.dtype == DType::i32 &&
      !(a.scalar >= -2147483648.0 && a.scalar <= 2147483647.0 && a.scalar == static_cast<double>(static_cast<int64_t>(a.scalar))))
    throw ShapeError(fmt::format("constant: value {} is not an i32 (an integer in "
                                 "[-2147483648, 2147483647]); use a float dtype", a.scalar));
  out = a.shape;
  dt = a.dtype;
}

void infer_constraint(const OpAttrs& a, const Ins& in, Shape& out, DType& dt) {
  if (!a.sharding) shape_fail("sharding_constraint", in, "needs a sharding");
  if (a.sharding->rank() != static_cast<int>(in[0]->shape.size()))
    shape_fail("sharding_constraint", in, fmt::format("sharding {} has {} dims for rank {}",
                                                      a.sharding->to_string(), a.sharding->rank(),
                                                      in[0]->shape.size()));
  out = in[0]->shape;
  dt = in[0]->dtype;
}

void localize_constant(OpAttrs& a, const LocalizeArgs& x) { a.shape = x.local_out; }

Tensor sample_input(Graph& g, SampleGen& r) { return r.input(g, r.shape(r.rank())); }
Tensor sample_constant(Graph& g, SampleGen& r) {
  return add(r.input(g, r.shape(r.rank())), constant(g, 0.25));
}
Tensor sample_constraint(Graph& g, SampleGen& r) {
  Tensor x = tanh(r.input(g, r.shape(r.rank())));
  Sharding s = r.random_sharding ? r.random_sharding(x.shape()) : Sharding::replicated(x.rank());
  return shard(x, std::move(s));
}

}  // namespace

namespace {
// The gradient keeps the constraint's layout (as JAX transposes with_sharding_constraint).
std::vector<Tensor> vjp_constraint(const VjpArgs& a) {
  return {shard(a.grad_output, *a.op.attrs.sharding, a.op.attrs.priority)};
}
}  // namespace

void register_leaf_ops(std::vector<OpDef>& t) {
  put(t, entry(OpKind::Input, "input", 0, 0, infer_none, rule_none, flops_zero, sample_input));

  OpDef c = entry(OpKind::Constant, "constant", 0, 0, infer_constant, rule_none, flops_zero,
                  sample_constant);
  c.attrs = {{"value", AttrField::Scalar}};
  c.localize = localize_constant;
  put(t, std::move(c));

  // sharding= and priority= of a constraint are parsed and printed by the text form itself.
  put(t, with_vjp(entry(OpKind::ShardingConstraint, "sharding_constraint", 1, 1, infer_constraint,
                        rule_unary, flops_zero, sample_constraint),
                  vjp_constraint));
}

}  // namespace ops_detail

Tensor input(Graph& g, std::string name, DType dtype, Shape shape) {
  return g.add_input(std::move(name), dtype, std::move(shape));
}

Tensor constant(Graph& g, double value, DType dtype, Shape shape) {
  OpAttrs a;
  a.scalar = value;
  a.dtype = dtype;
  a.shape = std::move(shape);
  return g.add_op(OpKind::Constant, {}, std::move(a));
}

Tensor shard(Tensor x, Sharding s, int priority) {
  OpAttrs a;
  a.sharding = std::move(s);
  a.priority = priority;
  return ops_detail::build(OpKind::ShardingConstraint, {x}, std::move(a));
}

}  // namespace tessel
