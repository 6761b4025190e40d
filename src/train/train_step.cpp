// A training step as one global graph (train.hpp): gradients, global-norm clipping, AdamW and
// the ZeRO layouts as annotations.
#include "tessel/ops/builders.hpp"
#include "tessel/train/train_step.hpp"

#include <fmt/format.h>

#include <cmath>

#include "tessel/train/autodiff.hpp"

namespace tessel {

Sharding zero_layout(const Sharding& layout, const Shape& shape, const Mesh& mesh, const std::string& axis) {
  if (!mesh.has_axis(axis) || layout.uses_axis(axis) || mesh.axis_size(axis) == 1) return layout;
  const int64_t k = mesh.axis_size(axis);
  auto fits = [&](std::size_t d) { return shape[d] % (mesh.axes_size(layout.dims[d].axes) * k) == 0; };
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if ((pass == 0) != layout.dims[d].axes.empty() || !fits(d)) continue;
      Sharding s = layout.closed_copy();
      s.dims[d].axes.push_back(axis);
      return s;
    }
  return layout;
}

std::vector<std::pair<std::string, std::string>> TrainStep::donations() const {
  std::vector<std::pair<std::string, std::string>> d;
  for (std::size_t i = 0; i < params.size(); ++i) {
    d.emplace_back(params[i].name(), next_params[i].name());
    d.emplace_back(m[i].name(), next_m[i].name());
    d.emplace_back(v[i].name(), next_v[i].name());
  }
  return d;
}

namespace {

void check_options(const char* what, Graph& g, const std::vector<Tensor>& params, const Mesh& mesh,
                   const TrainOptions& o) {
  if (o.zero < 0 || o.zero > 3) throw Error(fmt::format("{}: zero={} is not a ZeRO stage (0..3)", what, o.zero));
  if (o.zero > 0 && !mesh.has_axis(o.data_axis))
    throw Error(fmt::format("{}: zero={} splits over '{}', which mesh {} lacks", what, o.zero, o.data_axis,
                            mesh.to_string()));
  const AdamWConfig& a = o.adamw;
  if (!(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1) || !(a.eps > 0) || !(a.weight_decay >= 0) ||
      !(a.clip_norm >= 0))
    throw Error(fmt::format("{}: AdamW needs 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0 and "
                            "clip_norm >= 0 (got beta1={} beta2={} eps={} weight_decay={} clip_norm={})",
                            what, a.beta1, a.beta2, a.eps, a.weight_decay, a.clip_norm));
  for (const Tensor& p : params) {
    p.value();
    if (p.graph() != &g || g.values[static_cast<std::size_t>(p.id)].producer < 0 ||
        g.ops[static_cast<std::size_t>(g.values[static_cast<std::size_t>(p.id)].producer)].kind != OpKind::Input ||
        p.dtype() == DType::i32)
      throw Error(fmt::format("{}: parameter %{} must be a float input of the graph", what, p.name()));
  }
}

// The layouts of one parameter's step at ZeRO stage o.zero.
struct ParamLayouts {
  Sharding base;   // the user's layout of the parameter (replicated when unannotated)
  Sharding state;  // the moments (and accumulated gradients at stage >= 2)
  Sharding param;  // the stored parameter
  Sharding grad;   // the gradient
};

ParamLayouts param_layouts(Graph& g, const Tensor& p, const Mesh& mesh, const TrainOptions& o) {
  auto it = g.annotations.find(p.id);
  ParamLayouts l;
  l.base = it != g.annotations.end() ? it->second.sharding.closed_copy() : Sharding::replicated(p.rank());
  const Sharding zl = zero_layout(l.base, p.shape(), mesh, o.data_axis);
  l.state = o.zero >= 1 ? zl : l.base;
  l.param = o.zero >= 3 ? zl : l.base;
  // Stages 1-3 split the gradients like the state: each device's update needs only its block,
  // so the partial sums are reduce-scattered once and the norm is taken from the blocks (one
  // scalar all-reduce). A whole gradient at stage 1 (DeepSpeed's all-reduce) would be reduced
  // twice: all-reduced for the norm, then reduce-scattered again for the update.
  l.grad = o.zero >= 1 ? zl : l.base;
  // Parameters are fixed in a layout across steps (the update is donated in place): an
  // unannotated one is replicated.
  if (o.zero >= 3 || it == g.annotations.end()) g.annotate(p, l.param);
  // FSDP: the stored shards are gathered for every use, by design (no warning).
  if (o.zero >= 3) g.expect_gathers(p);
  return l;
}

std::vector<Tensor> gradients(Tensor loss, const std::vector<Tensor>& params, const TrainOptions& o) {
  GradOptions go;
  go.remat = o.remat;
  go.checkpoints = o.checkpoints;
  return grad(loss, params, go);
}

// With rematerialisation grad() divided the graph into regions (Graph::regions): the ops added
// after the gradients since ops.size() was `first` (accumulation, clipping, the update) are the
// "update" region.
void mark_update_region(Graph& g, std::size_t first, const TrainOptions& o) {
  if (o.remat != RematPolicy::none) g.set_region(first, g.region_id("update"));
}

Tensor as_f32(const Tensor& t) { return t.dtype() == DType::f32 ? t : cast(t, DType::f32); }

}  // namespace

void make_train_inputs_valid(const Graph& g, std::vector<HostTensor>& inputs) {
  // The betas of the graph's adamw ops (the first one's), else the defaults.
  AdamWConfig a;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::AdamW) {
      a.beta1 = op.attrs.beta1;
      a.beta2 = op.attrs.beta2;
      break;
    }
  auto fill = [](HostTensor& t, double v) {
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v);
  };
  for (std::size_t i = 0; i < g.inputs.size() && i < inputs.size(); ++i) {
    const std::string& name = g.values[static_cast<std::size_t>(g.inputs[i])].name;
    HostTensor& t = inputs[i];
    if (name.rfind("adam.v.", 0) == 0)
      for (int64_t j = 0; j < t.numel(); ++j) t.set(j, std::fabs(t.get(j)));
    else if (name == "adam.lr") fill(t, 1e-3);
    else if (name == "adam.bc1") fill(t, 1.0 / (1.0 - a.beta1));
    else if (name == "adam.bc2") fill(t, 1.0 / (1.0 - a.beta2));
    else if (name == "grad.scale") fill(t, 1.0);
  }
}

std::vector<std::pair<std::string, std::string>> GradAccumulation::donations() const {
  std::vector<std::pair<std::string, std::string>> d;
  for (std::size_t i = 0; i < acc.size(); ++i) d.emplace_back(acc[i].name(), next_acc[i].name());
  return d;
}

GradAccumulation add_grad_accumulation(Graph& g, Tensor loss, const std::vector<Tensor>& params, const Mesh& mesh,
                                       const TrainOptions& o) {
  check_options("add_grad_accumulation", g, params, mesh, o);
  GradAccumulation s;
  s.params = params;
  std::vector<ParamLayouts> layouts;
  for (const Tensor& p : params) layouts.push_back(param_layouts(g, p, mesh, o));
  s.grads = gradients(loss, params, o);
  const std::size_t update_from = g.ops.size();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    Tensor acc = input(g, "grad.acc." + p.name(), DType::f32, p.shape());
    g.annotate(acc, layouts[i].grad);
    g.annotate(s.grads[i], layouts[i].grad, /*priority=*/1);
    Tensor next = add(acc, as_f32(s.grads[i])).named("next.grad.acc." + p.name());
    g.annotate(next, layouts[i].grad);
    g.mark_output(next);
    s.acc.push_back(acc);
    s.next_acc.push_back(next);
  }
  mark_update_region(g, update_from, o);
  return s;
}

TrainStep add_train_step(Graph& g, Tensor loss, const std::vector<Tensor>& params, const Mesh& mesh,
                         const TrainOptions& o) {
  check_options("add_train_step", g, params, mesh, o);
  const AdamWConfig& a = o.adamw;
  TrainStep s;
  s.params = params;
  std::vector<ParamLayouts> layouts;
  for (const Tensor& p : params) layouts.push_back(param_layouts(g, p, mesh, o));
  s.grads = gradients(loss, params, o);
  const std::size_t update_from = g.ops.size();
  if (o.accumulated) {
    // The update's gradient: (the earlier micro-batches' sum + this one's) / K.
    s.grad_scale = input(g, "grad.scale", DType::f32, {});
    for (std::size_t i = 0; i < params.size(); ++i) {
      Tensor acc = input(g, "grad.acc." + params[i].name(), DType::f32, params[i].shape());
      g.annotate(acc, layouts[i].grad);
      g.annotate(s.grads[i], layouts[i].grad, /*priority=*/1);
      s.grad_acc.push_back(acc);
      s.grads[i] = mul(add(acc, as_f32(s.grads[i])), s.grad_scale);
    }
  }

  // Global-norm clipping: every gradient scaled by min(1, clip / norm).
  Tensor sq;
  for (const Tensor& gr : s.grads) {
    Tensor gf = as_f32(gr);
    std::vector<int64_t> all;
    for (int64_t d = 0; d < gf.rank(); ++d) all.push_back(d);
    Tensor part = all.empty() ? mul(gf, gf) : reduce_sum(mul(gf, gf), all);
    sq = sq.anchor ? add(sq, part) : part;
  }
  s.grad_norm = (sq.anchor ? sqrt(sq) : constant(g, 0.0)).named("grad_norm");
  Tensor clip_scale;
  if (a.clip_norm > 0) {
    Tensor c = constant(g, a.clip_norm);
    clip_scale = where(gt(s.grad_norm, c), div(c, add(s.grad_norm, constant(g, 1e-6))), constant(g, 1.0));
  }
  // apply: 1 when the loss and the norm are finite (x * 0 == 0 exactly when x is neither NaN
  // nor infinite), else 0: the update then keeps every value (adamw's `apply`).
  Tensor apply;
  if (o.guard_non_finite) {
    const Tensor zero = constant(g, 0.0);
    apply = cast(eq(add(mul(s.grad_norm, zero), mul(as_f32(loss), zero)), zero), DType::f32);
  }
  s.lr = input(g, "adam.lr", DType::f32, {});
  s.bc1 = input(g, "adam.bc1", DType::f32, {});
  s.bc2 = input(g, "adam.bc2", DType::f32, {});
  g.mark_output(s.grad_norm);

  const Tensor one = constant(g, 1.0);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const ParamLayouts& l = layouts[i];
    Tensor m = input(g, "adam.m." + p.name(), DType::f32, p.shape());
    Tensor v = input(g, "adam.v." + p.name(), DType::f32, p.shape());
    g.annotate(m, l.state);
    g.annotate(v, l.state);
    Tensor gr = s.grads[i];
    g.annotate(gr, l.grad, /*priority=*/1);
    // One fused op per parameter (builders.hpp adamw): clipping scale, moments, bias
    // correction and decoupled decay (rank >= 2 only) in one pass.
    AdamWResults r = adamw(p, gr, m, v, s.lr, s.bc1, s.bc2, clip_scale.anchor ? clip_scale : one, a.beta1, a.beta2,
                           a.eps, p.rank() >= 2 ? a.weight_decay : 0.0, apply);
    Tensor p2 = r.param.named("next." + p.name());
    Tensor m2 = r.m.named("next.adam.m." + p.name());
    Tensor v2 = r.v.named("next.adam.v." + p.name());
    g.annotate(p2, l.param);
    // ZeRO 1-2: each device updates its shard and the update is all-gathered, by design.
    if (o.zero >= 1) g.expect_gathers(p2);
    g.annotate(m2, l.state);
    g.annotate(v2, l.state);
    s.m.push_back(m);
    s.v.push_back(v);
    s.next_params.push_back(p2);
    s.next_m.push_back(m2);
    s.next_v.push_back(v2);
  }
  for (const Tensor& t : s.next_params) g.mark_output(t);
  for (std::size_t i = 0; i < params.size(); ++i) {
    g.mark_output(s.next_m[i]);
    g.mark_output(s.next_v[i]);
  }
  mark_update_region(g, update_from, o);
  return s;
}

}  // namespace tessel
