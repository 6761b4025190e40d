// A training step as one global graph (train.hpp): gradients, global-norm clipping, AdamW and
// the ZeRO layouts as annotations.
#include "tessel/train/train_step.hpp"

#include <fmt/format.h>

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

TrainStep add_train_step(Graph& g, Tensor loss, const std::vector<Tensor>& params, const Mesh& mesh,
                         const TrainOptions& o) {
  if (o.zero < 0 || o.zero > 3) throw Error(fmt::format("add_train_step: zero={} is not a ZeRO stage (0..3)", o.zero));
  if (o.zero > 0 && !mesh.has_axis(o.data_axis))
    throw Error(fmt::format("add_train_step: zero={} splits over '{}', which mesh {} lacks", o.zero, o.data_axis,
                            mesh.to_string()));
  const AdamWConfig& a = o.adamw;
  if (!(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1) || !(a.eps > 0) || !(a.weight_decay >= 0) ||
      !(a.clip_norm >= 0))
    throw Error(fmt::format("add_train_step: AdamW needs 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0 and "
                            "clip_norm >= 0 (got beta1={} beta2={} eps={} weight_decay={} clip_norm={})",
                            a.beta1, a.beta2, a.eps, a.weight_decay, a.clip_norm));
  for (const Tensor& p : params) {
    p.value();
    if (p.graph() != &g || g.values[static_cast<std::size_t>(p.id)].producer < 0 ||
        g.ops[static_cast<std::size_t>(g.values[static_cast<std::size_t>(p.id)].producer)].kind != OpKind::Input ||
        p.dtype() == DType::i32)
      throw Error(fmt::format("add_train_step: parameter %{} must be a float input of the graph", p.name()));
  }
  TrainStep s;
  s.params = params;
  GradOptions go;
  go.remat = o.remat;
  go.checkpoints = o.checkpoints;
  s.grads = grad(loss, params, go);

  // Global-norm clipping: every gradient scaled by min(1, clip / norm).
  Tensor sq;
  for (const Tensor& gr : s.grads) {
    Tensor gf = gr.dtype() == DType::f32 ? gr : cast(gr, DType::f32);
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
  s.lr = input(g, "adam.lr", DType::f32, {});
  s.bc1 = input(g, "adam.bc1", DType::f32, {});
  s.bc2 = input(g, "adam.bc2", DType::f32, {});
  g.mark_output(s.grad_norm);

  auto layout_of = [&](const Tensor& t) {
    auto it = g.annotations.find(t.id);
    return it != g.annotations.end() ? it->second.sharding.closed_copy() : Sharding::replicated(t.rank());
  };
  const Tensor one = constant(g, 1.0);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const Sharding base = layout_of(p);
    const Sharding zl = zero_layout(base, p.shape(), mesh, o.data_axis);
    const Sharding state = o.zero >= 1 ? zl : base;
    const Sharding param = o.zero >= 3 ? zl : base;
    Tensor m = input(g, "adam.m." + p.name(), DType::f32, p.shape());
    Tensor v = input(g, "adam.v." + p.name(), DType::f32, p.shape());
    g.annotate(m, state);
    g.annotate(v, state);
    // Parameters are fixed in a layout across steps (the update is donated in place): an
    // unannotated one is replicated.
    if (o.zero >= 3 || !g.annotations.count(p.id)) g.annotate(p, param);
    // FSDP: the stored shards are gathered for every use, by design (no warning).
    if (o.zero >= 3) g.expect_gathers(p);
    // Stage 1 keeps whole gradients (all-reduced), stage 2 and 3 split them like the state.
    Tensor gr = s.grads[i];
    g.annotate(gr, o.zero >= 2 ? zl : base, /*priority=*/1);
    // One fused op per parameter (builders.hpp adamw): clipping scale, moments, bias
    // correction and decoupled decay (rank >= 2 only) in one pass.
    AdamWResults r = adamw(p, gr, m, v, s.lr, s.bc1, s.bc2, clip_scale.anchor ? clip_scale : one, a.beta1, a.beta2,
                           a.eps, p.rank() >= 2 ? a.weight_decay : 0.0);
    Tensor p2 = r.param.named("next." + p.name());
    Tensor m2 = r.m.named("next.adam.m." + p.name());
    Tensor v2 = r.v.named("next.adam.v." + p.name());
    g.annotate(p2, param);
    // ZeRO 1-2: each device updates its shard and the update is all-gathered, by design.
    if (o.zero >= 1) g.expect_gathers(p2);
    g.annotate(m2, state);
    g.annotate(v2, state);
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
  return s;
}

}  // namespace tessel
