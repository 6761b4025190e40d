// Reverse-mode differentiation of the global graph (autodiff.hpp): the ops between the
// arguments and the loss, walked backwards, each contributing its registry vjp.
#include "tessel/ops/builders.hpp"
#include "tessel/train/autodiff.hpp"

#include <fmt/format.h>

#include <map>
#include <set>

#include "tessel/ops/registry.hpp"

namespace tessel {

RematPolicy parse_remat_policy(const std::string& text) {
  if (text == "none") return RematPolicy::none;
  if (text == "einsums") return RematPolicy::einsums;
  if (text == "all") return RematPolicy::all;
  throw Error(fmt::format("unknown rematerialisation policy '{}': use none (save every activation), einsums "
                          "(save einsum results, recompute the rest) or all (recompute each segment)", text));
}

const char* remat_policy_name(RematPolicy p) {
  switch (p) {
    case RematPolicy::none: return "none";
    case RematPolicy::einsums: return "einsums";
    case RematPolicy::all: return "all";
  }
  return "?";
}

namespace {

// Rewrites the backward ops (g.ops[n_fwd_ops..]) to read recomputed clones of the forward
// values that are not `saved`, and reorders the op list so that each clone stands just before
// the first backward op that reads it (clones are made on first use, in backward order, and
// shared by later readers). A clone is in the region of the backward op it is made for. The
// forward ops keep their places and results; only the values' producer indices of the moved
// ops change.
void rematerialise(Graph& g, std::size_t n_fwd_ops, std::size_t n_fwd_values, const std::vector<bool>& saved) {
  const std::size_t n_end = g.ops.size();
  std::vector<int> order;
  order.reserve(n_end * 2);
  for (std::size_t i = 0; i < n_fwd_ops; ++i) order.push_back(static_cast<int>(i));
  std::map<int, int> clone_of;  // forward value -> its recomputed clone
  int clone_region = -1;        // the region of the backward op the clones are made for
  auto recomputed = [&](int v) {
    const auto u = static_cast<std::size_t>(v);
    if (u >= n_fwd_values || saved[u]) return false;
    const int p = g.values[u].producer;
    return p >= 0 && static_cast<std::size_t>(p) < n_fwd_ops;
  };
  // Iterative depth-first clone (a chain of recomputed values can be as long as the forward).
  auto clone = [&](int root) {
    std::vector<int> stack{root};
    while (!stack.empty()) {
      const int v = stack.back();
      if (clone_of.count(v)) {
        stack.pop_back();
        continue;
      }
      const Op op = g.ops[static_cast<std::size_t>(g.values[static_cast<std::size_t>(v)].producer)];
      bool ready = true;
      for (int u : op.inputs)
        if (recomputed(u) && !clone_of.count(u)) {
          stack.push_back(u);
          ready = false;
        }
      if (!ready) continue;
      stack.pop_back();
      std::vector<int> ins;
      for (int u : op.inputs) ins.push_back(recomputed(u) ? clone_of.at(u) : u);
      std::vector<std::string> names;
      for (int r : op.results()) {
        std::string nm = "remat." + g.values[static_cast<std::size_t>(r)].name;
        names.push_back(g.find(nm) < 0 ? nm : std::string{});
      }
      bool all_named = true;
      for (const std::string& nm : names) all_named = all_named && !nm.empty();
      if (!all_named) names.clear();
      const std::vector<Tensor> res = g.add_op_results(op.kind, ins, op.attrs, names);
      g.ops.back().region = clone_region;
      order.push_back(static_cast<int>(g.ops.size()) - 1);
      const std::vector<int> rs = op.results();
      for (std::size_t k = 0; k < rs.size(); ++k) {
        clone_of[rs[k]] = res[k].id;
        // The clone is laid out as the user laid out the original (the same sharding).
        auto a = g.annotations.find(rs[k]);
        if (a != g.annotations.end()) {
          const Annotation ann = a->second;
          g.annotate(res[k].id, ann.sharding, ann.priority);
        }
      }
    }
  };
  for (std::size_t b = n_fwd_ops; b < n_end; ++b) {
    const std::vector<int> ins = g.ops[b].inputs;
    clone_region = g.ops[b].region;
    for (std::size_t k = 0; k < ins.size(); ++k) {
      if (!recomputed(ins[k])) continue;
      clone(ins[k]);
      g.ops[b].inputs[k] = clone_of.at(ins[k]);
    }
    order.push_back(static_cast<int>(b));
  }
  std::vector<Op> ops;
  ops.reserve(order.size());
  for (int i : order) ops.push_back(std::move(g.ops[static_cast<std::size_t>(i)]));
  g.ops = std::move(ops);
  for (std::size_t i = 0; i < g.ops.size(); ++i)
    for (int r : g.ops[i].results()) g.values[static_cast<std::size_t>(r)].producer = static_cast<int>(i);
}

}  // namespace

std::vector<Tensor> grad(Tensor loss, const std::vector<Tensor>& wrt, const GradOptions& options) {
  loss.value();
  Graph& g = *loss.graph();
  const Value lv = loss.value();  // a copy: the graph grows below
  if (!lv.shape.empty() || lv.dtype == DType::i32)
    throw Error(fmt::format("grad: the loss must be a float scalar, got {}; reduce it first (reduce_sum or "
                            "reduce_mean over every dim)", g.describe(loss.id)));
  for (const Tensor& w : wrt) {
    w.value();
    if (w.graph() != &g)
      throw Error(fmt::format("grad: %{} belongs to another graph than the loss %{}", w.name(), lv.name));
    if (w.dtype() == DType::i32)
      throw Error(fmt::format("grad: {} is an integer value and has no gradient", g.describe(w.id)));
  }
  for (const Tensor& c : options.checkpoints) {
    c.value();
    if (c.graph() != &g)
      throw Error(fmt::format("grad: the checkpoint %{} belongs to another graph than the loss %{}", c.name(), lv.name));
  }
  const std::size_t nv = g.values.size();
  const std::size_t n_fwd_ops = g.ops.size();
  const std::size_t n_ops = static_cast<std::size_t>(g.values[static_cast<std::size_t>(loss.id)].producer) + 1;
  // Values the loss depends on, and values that depend on an argument: an op is on the path
  // when both hold for one of its results.
  std::vector<bool> reaches(nv, false), depends(nv, false);
  reaches[static_cast<std::size_t>(loss.id)] = true;
  for (const Tensor& w : wrt) depends[static_cast<std::size_t>(w.id)] = true;
  for (std::size_t i = 0; i < n_ops; ++i) {
    bool d = false;
    for (int v : g.ops[i].inputs) d = d || depends[static_cast<std::size_t>(v)];
    if (d)
      for (int r : g.ops[i].results()) depends[static_cast<std::size_t>(r)] = true;
  }
  for (std::size_t i = n_ops; i-- > 0;) {
    bool r = false;
    for (int v : g.ops[i].results()) r = r || reaches[static_cast<std::size_t>(v)];
    if (r)
      for (int v : g.ops[i].inputs) reaches[static_cast<std::size_t>(v)] = true;
  }

  // Regions (Graph::regions) when recomputing, for the partitioner's re-gathering of ZeRO-3
  // weights: the forward ops of segment k (after the op that makes the k-th checkpoint, up to
  // the one that makes the next, in op order) are in "forward k"; the ops of their vjps, and the
  // clones recomputed for those, in "backward k". Forward ops already in a region keep it.
  const bool regions = options.remat != RematPolicy::none;
  std::vector<int> segment(n_fwd_ops, 0);
  if (regions) {
    std::set<int> boundary;
    for (const Tensor& c : options.checkpoints) boundary.insert(c.id);
    int k = 0;
    for (std::size_t i = 0; i < n_fwd_ops; ++i) {
      segment[i] = k;
      if (g.ops[i].region < 0) g.ops[i].region = g.region_id(fmt::format("forward {}", k));
      for (int r : g.ops[i].results())
        if (boundary.count(r)) {
          ++k;
          break;
        }
    }
  }
  // Puts the ops added since ops.size() was `first` in the backward of forward op i's segment.
  auto backward_of = [&](std::size_t first, std::size_t i) {
    if (regions) g.set_region(first, g.region_id(fmt::format("backward {}", segment[i])));
  };

  std::map<int, Tensor> cot;  // value -> its gradient so far
  auto accumulate = [&](int v, Tensor t) {
    auto it = cot.find(v);
    if (it == cot.end()) cot.emplace(v, t);
    else it->second = add(it->second, t);  // a value used twice (a tied weight) sums its gradients
  };
  const std::size_t seed_op = g.ops.size();
  cot.emplace(loss.id, constant(g, 1.0, lv.dtype));
  backward_of(seed_op, n_ops - 1);

  for (std::size_t i = n_ops; i-- > 0;) {
    const Op op = g.ops[i];  // a copy: the vjps below add ops
    if (op.kind == OpKind::Input || op.kind == OpKind::Constant) continue;
    bool on_path = false;
    for (int r : op.results())
      on_path = on_path || (reaches[static_cast<std::size_t>(r)] && depends[static_cast<std::size_t>(r)]);
    if (!on_path) continue;
    bool any_float_in = false;
    for (int v : op.inputs)
      any_float_in = any_float_in || (depends[static_cast<std::size_t>(v)] && g.values[static_cast<std::size_t>(v)].dtype != DType::i32);
    if (!any_float_in) continue;
    const OpDef& def = op_def(op.kind);
    if (op.num_results() > 1 && !def.vjp)
      throw Error(fmt::format("grad: {} has several results and no vector-Jacobian product (the gradient of %{} "
                              "passes through it)", g.describe_op(static_cast<int>(i)), lv.name));
    // Each result's gradient (a default Tensor where none reaches it: only integer paths).
    std::vector<Tensor> result_grads;
    bool any_grad = false;
    for (int r : op.results()) {
      auto it = cot.find(r);
      result_grads.push_back(it == cot.end() ? Tensor{} : it->second);
      any_grad = any_grad || it != cot.end();
    }
    if (!any_grad) continue;
    if (!def.vjp)
      throw Error(fmt::format("grad: {} has no vector-Jacobian product yet, and the gradient of %{} passes "
                              "through it (its result {})", g.describe_op(static_cast<int>(i)), lv.name,
                              g.describe(op.output)));
    const std::size_t first_op = g.ops.size();
    VjpArgs args{g, op, {}, g.tensor(op.output), result_grads[0]};
    for (int v : op.inputs) args.inputs.push_back(g.tensor(v));
    for (int r : op.results()) args.outputs.push_back(g.tensor(r));
    args.grad_outputs = result_grads;
    const std::vector<Tensor> grads = def.vjp(args);
    if (grads.size() != op.inputs.size())
      throw Error(fmt::format("grad: the vjp of {} returned {} gradients for {} operands (a bug in its registry "
                              "entry)", def.name, grads.size(), op.inputs.size()));
    for (std::size_t k = 0; k < grads.size(); ++k) {
      const int v = op.inputs[k];
      const Value& in = g.values[static_cast<std::size_t>(v)];
      if (!depends[static_cast<std::size_t>(v)] || in.dtype == DType::i32 || !grads[k].anchor) continue;
      if (grads[k].shape() != in.shape || grads[k].dtype() != in.dtype)
        throw Error(fmt::format("grad: the vjp of {} gave operand {} a gradient {} for {} (a bug in its registry "
                                "entry)", def.name, k, type_str(grads[k].dtype(), grads[k].shape()), g.describe(v)));
      accumulate(v, grads[k]);
    }
    backward_of(first_op, i);
  }

  if (options.remat != RematPolicy::none) {
    // What the backward may read without recomputing it.
    std::vector<bool> saved(nv, false);
    for (std::size_t i = 0; i < n_fwd_ops; ++i) {
      const Op& op = g.ops[i];
      const bool keep = op.kind == OpKind::Input || op.kind == OpKind::Constant ||
                        (options.remat == RematPolicy::einsums && op.kind == OpKind::Einsum);
      if (keep)
        for (int r : op.results()) saved[static_cast<std::size_t>(r)] = true;
    }
    for (int o : g.outputs) saved[static_cast<std::size_t>(o)] = true;
    for (const Tensor& c : options.checkpoints) saved[static_cast<std::size_t>(c.id)] = true;
    rematerialise(g, n_fwd_ops, nv, saved);
  }

  const std::size_t tail_op = g.ops.size();  // zero gradients: in the last backward region
  std::vector<Tensor> out;
  std::set<int> named;
  for (const Tensor& w : wrt) {
    auto it = cot.find(w.id);
    Tensor t;
    if (it != cot.end()) {
      t = it->second;
    } else {
      t = constant(g, 0.0, w.dtype());
      if (!w.shape().empty()) t = broadcast_to(t, w.shape());
    }
    // Name the gradient after its argument when the value is new and the name is free.
    const std::string name = options.name_prefix + w.name();
    if (!options.name_prefix.empty() && t.id >= static_cast<int>(nv) && g.find(name) < 0 && named.insert(t.id).second)
      t = t.named(name);
    out.push_back(t);
  }
  if (regions && tail_op > 0) g.set_region(tail_op, g.ops[tail_op - 1].region);
  return out;
}

}  // namespace tessel
