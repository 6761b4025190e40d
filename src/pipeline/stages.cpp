// split_stages (pipeline/stages.hpp): each op placed in a stage, each stage's ops copied into a
// graph of its own (inputs and copied free values as needed), and its backward by grad().
#include "tessel/pipeline/stages.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "tessel/ops/builders.hpp"
#include "tessel/train/autodiff.hpp"

namespace tessel {

namespace {

constexpr int kFree = -1;  // computed from graph inputs alone: copied where used

bool is_input(const Graph& g, int v) {
  const int p = g.values[static_cast<std::size_t>(v)].producer;
  return p < 0 || g.ops[static_cast<std::size_t>(p)].kind == OpKind::Input;
}

Tensor as_f32(Tensor t) { return t.dtype() == DType::f32 ? t : cast(t, DType::f32); }

Tensor sum_all(Tensor t) {
  std::vector<int64_t> all;
  for (int64_t d = 0; d < t.rank(); ++d) all.push_back(d);
  return all.empty() ? t : reduce_sum(t, all);
}

// Builds one stage's forward graph from the global graph's ops of that stage.
class StageCopier {
 public:
  StageCopier(const Graph& g, const std::vector<int>& made, const std::set<int>& params)
      : g_(g), made_(made), params_(params) {}

  // The stage's value for global value v.
  int get(int v, PipelineStage& out) {
    auto it = map_.find(v);
    if (it != map_.end()) return it->second;
    const Value& val = g_.values[static_cast<std::size_t>(v)];
    int id;
    if (is_input(g_, v)) {  // a graph input
      id = sg_.add_input(val.name, val.dtype, val.shape).id;
      (params_.count(v) ? out.params : out.data).push_back(val.name);
    } else if (made_[static_cast<std::size_t>(v)] == kFree) {
      id = copy_op(val.producer, out).at(static_cast<std::size_t>(val.result));
    } else {  // made by the stage before (split_stages checked it): received
      id = sg_.add_input(val.name, val.dtype, val.shape).id;
      out.recv.push_back(val.name);
    }
    copy_annotation(v, id);
    map_[v] = id;
    return id;
  }

  // Copies op `o` (its operands first) and maps its results; returns the stage's result ids.
  std::vector<int> copy_op(int o, PipelineStage& out) {
    const Op& op = g_.ops[static_cast<std::size_t>(o)];
    if (map_.count(op.output)) {
      std::vector<int> r;
      for (int v : op.results()) r.push_back(map_.at(v));
      return r;
    }
    std::vector<int> ins;
    for (int v : op.inputs) ins.push_back(get(v, out));
    std::vector<std::string> names;
    for (int v : op.results()) names.push_back(g_.values[static_cast<std::size_t>(v)].name);
    std::vector<Tensor> res = sg_.add_op_results(op.kind, ins, op.attrs, names);
    std::vector<int> r;
    for (std::size_t i = 0; i < res.size(); ++i) {
      const int v = op.results()[i];
      map_[v] = res[i].id;
      copy_annotation(v, res[i].id);
      r.push_back(res[i].id);
    }
    return r;
  }

  Graph& graph() { return sg_; }

 private:
  void copy_annotation(int v, int id) {
    auto a = g_.annotations.find(v);
    if (a != g_.annotations.end()) sg_.annotations[id] = a->second;
  }

  const Graph& g_;
  const std::vector<int>& made_;
  const std::set<int>& params_;
  Graph sg_;
  std::map<int, int> map_;
};

}  // namespace

std::vector<PipelineStage> split_stages(const Graph& g, Tensor loss, const std::vector<Tensor>& params,
                                        const std::vector<Tensor>& cuts) {
  auto ours = [&](const Tensor& t, const std::string& what) {
    if (t.graph() != &g || t.id < 0 || t.id >= static_cast<int>(g.values.size()))
      throw Error(fmt::format("split_stages: {} is not a value of the graph", what));
  };
  ours(loss, "the loss");
  const int P = static_cast<int>(cuts.size()) + 1;
  std::map<int, int> cut_stage;  // cut value -> the stage that receives it
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    ours(cuts[i], fmt::format("cut {}", i));
    if (is_input(g, cuts[i].id))
      throw Error(fmt::format("split_stages: cut {} ({}) is a graph input; cut at a value an op makes", i,
                              g.describe(cuts[i].id)));
    if (!cut_stage.emplace(cuts[i].id, static_cast<int>(i) + 1).second)
      throw Error(fmt::format("split_stages: cut {} ({}) is given twice", i, g.describe(cuts[i].id)));
  }
  std::set<int> param_ids;
  for (const Tensor& p : params) {
    ours(p, "a parameter");
    if (!is_input(g, p.id))
      throw Error(fmt::format("split_stages: parameter {} is not a graph input", g.describe(p.id)));
    param_ids.insert(p.id);
  }

  // made[v]: the stage whose op makes v (kFree for inputs and values of inputs alone); seen[v]:
  // the stage v counts as when it is used (a cut: the stage after it).
  std::vector<int> made(g.values.size(), kFree), seen(g.values.size(), kFree), op_stage(g.ops.size(), kFree);
  for (std::size_t o = 0; o < g.ops.size(); ++o) {
    const Op& op = g.ops[o];
    if (op.kind == OpKind::Input) continue;
    int st = kFree;
    for (int v : op.inputs) st = std::max(st, seen[static_cast<std::size_t>(v)]);
    for (int v : op.results()) {
      auto c = cut_stage.find(v);
      if (c == cut_stage.end()) continue;
      if (st > c->second - 1)
        throw Error(fmt::format("split_stages: cut {} ({}) is made after cut {}: give the cuts in the order the "
                                "graph makes them",
                                c->second - 1, g.describe(v), st - 1));
      st = c->second - 1;  // a cut is made by the stage before the one it starts
    }
    op_stage[o] = st;
    for (int v : op.results()) {
      made[static_cast<std::size_t>(v)] = st;
      auto c = cut_stage.find(v);
      seen[static_cast<std::size_t>(v)] = c == cut_stage.end() ? st : c->second;
    }
  }
  if (made[static_cast<std::size_t>(loss.id)] != P - 1)
    throw Error(fmt::format("split_stages: the loss {} is made by stage {}, not the last ({}): every cut must come "
                            "before the loss",
                            g.describe(loss.id), made[static_cast<std::size_t>(loss.id)], P - 1));
  // Every value made by one stage and used by another: the next one only.
  for (std::size_t o = 0; o < g.ops.size(); ++o)
    for (int v : g.ops[o].inputs) {
      const int m = made[static_cast<std::size_t>(v)];
      if (m == kFree || op_stage[o] == m || op_stage[o] == m + 1) continue;
      throw Error(fmt::format("split_stages: {} is made by stage {} and used by stage {} ({}): stages exchange "
                              "values with their neighbours only; cut so that it is used by the stage after the one "
                              "that makes it",
                              g.describe(v), m, op_stage[o], g.describe_op(static_cast<int>(o))));
    }

  std::vector<PipelineStage> out(static_cast<std::size_t>(P));
  for (int s = 0; s < P; ++s) {
    PipelineStage& st = out[static_cast<std::size_t>(s)];
    StageCopier c(g, made, param_ids);
    for (std::size_t o = 0; o < g.ops.size(); ++o)
      if (op_stage[o] == s) c.copy_op(static_cast<int>(o), st);
    // Sent: what this stage makes and the next one uses.
    if (s + 1 < P)
      for (std::size_t o = 0; o < g.ops.size(); ++o) {
        if (op_stage[o] != s + 1) continue;
        for (int v : g.ops[o].inputs) {
          const std::string& n = g.values[static_cast<std::size_t>(v)].name;
          if (made[static_cast<std::size_t>(v)] == s && std::find(st.send.begin(), st.send.end(), n) == st.send.end())
            st.send.push_back(n);
        }
      }
    Graph& fg = c.graph();
    for (const std::string& n : st.send) fg.mark_output(fg.tensor(fg.find(n)));
    if (s == P - 1) {
      st.loss = loss.name();
      fg.mark_output(fg.tensor(fg.find(st.loss)));
    }
    fg.mesh = g.mesh;
    st.forward = std::move(fg);

    // The backward: the forward again, then the gradient of the stage's share of the loss.
    Graph bg = st.forward.clone();
    bg.outputs.clear();
    Tensor share;
    for (const std::string& n : st.send) {
      Tensor v = bg.tensor(bg.find(n));
      Tensor dv = input(bg, "grad." + n, v.dtype(), v.shape());
      auto a = bg.annotations.find(v.id);
      if (a != bg.annotations.end()) bg.annotate(dv, a->second.sharding, a->second.priority);
      Tensor part = sum_all(mul(as_f32(v), as_f32(dv)));
      share = share.anchor ? add(share, part) : part;
    }
    if (s == P - 1) {
      Tensor l = as_f32(bg.tensor(bg.find(st.loss)));
      share = share.anchor ? add(share, l) : l;
    }
    std::vector<Tensor> wrt;
    for (const std::string& n : st.params) wrt.push_back(bg.tensor(bg.find(n)));
    std::vector<std::string> float_recv;
    for (const std::string& n : st.recv)
      if (bg.values[static_cast<std::size_t>(bg.find(n))].dtype != DType::i32) float_recv.push_back(n);
    for (const std::string& n : float_recv) wrt.push_back(bg.tensor(bg.find(n)));
    GradOptions go;
    go.name_prefix = "d.";
    const std::vector<Tensor> grads = share.anchor ? grad(share, wrt, go) : std::vector<Tensor>{};
    for (std::size_t i = 0; i < float_recv.size(); ++i) {
      Tensor gr = grads[st.params.size() + i];
      const Tensor r = bg.tensor(bg.find(float_recv[i]));
      if (gr.dtype() != r.dtype()) gr = cast(gr, r.dtype());
      bg.mark_output(gr.named("grad." + float_recv[i]));
    }
    for (std::size_t i = 0; i < st.params.size(); ++i) {
      const Tensor p = bg.tensor(bg.find(st.params[i]));
      Tensor acc = input(bg, "grad.acc." + st.params[i], DType::f32, p.shape());
      auto a = bg.annotations.find(p.id);
      if (a != bg.annotations.end()) bg.annotate(acc, a->second.sharding, a->second.priority);
      Tensor next = add(acc, as_f32(grads[i])).named("next.grad.acc." + st.params[i]);
      bg.mark_output(next);
    }
    st.backward = std::move(bg);
  }
  return out;
}

namespace {

// The ops of `g` that `want` (value ids) need, transitively: take[o].
std::vector<char> needed_ops(const Graph& g, const std::vector<int>& want) {
  std::vector<char> take(g.ops.size(), 0), seen(g.values.size(), 0);
  std::vector<int> stack(want.begin(), want.end());
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    if (seen[static_cast<std::size_t>(v)]) continue;
    seen[static_cast<std::size_t>(v)] = 1;
    const int p = g.values[static_cast<std::size_t>(v)].producer;
    if (p < 0 || g.ops[static_cast<std::size_t>(p)].kind == OpKind::Input || take[static_cast<std::size_t>(p)]) continue;
    take[static_cast<std::size_t>(p)] = 1;
    for (int in : g.ops[static_cast<std::size_t>(p)].inputs) stack.push_back(in);
  }
  return take;
}

// A graph of the ops of `g` in `take` (in order): a value they read that no taken op makes is
// an input of the same name, type and annotation; `outputs` (value ids of g) marked in order.
Graph extract(const Graph& g, const std::vector<char>& take, const std::vector<int>& outputs) {
  Graph out;
  std::map<int, int> map;
  auto annotate = [&](int v, int id) {
    auto a = g.annotations.find(v);
    if (a != g.annotations.end()) out.annotations[id] = a->second;
  };
  auto get = [&](int v) {
    auto it = map.find(v);
    if (it != map.end()) return it->second;
    const Value& val = g.values[static_cast<std::size_t>(v)];
    const int id = out.add_input(val.name, val.dtype, val.shape).id;
    annotate(v, id);
    map[v] = id;
    return id;
  };
  for (std::size_t o = 0; o < g.ops.size(); ++o) {
    if (!take[o]) continue;
    const Op& op = g.ops[o];
    std::vector<int> ins;
    for (int v : op.inputs) ins.push_back(get(v));
    std::vector<std::string> names;
    for (int v : op.results()) names.push_back(g.values[static_cast<std::size_t>(v)].name);
    const std::vector<Tensor> res = out.add_op_results(op.kind, ins, op.attrs, names);
    for (std::size_t i = 0; i < res.size(); ++i) {
      map[op.results()[i]] = res[i].id;
      annotate(op.results()[i], res[i].id);
    }
  }
  for (int v : outputs) out.mark_output(out.tensor(get(v)));
  out.mesh = g.mesh;
  return out;
}

}  // namespace

PipelineStage keep_activations(PipelineStage stage) {
  if (stage.activations_kept) return stage;
  const Graph& bg = stage.backward;  // the forward's ops first (a clone), then the gradient's
  const std::size_t n_fwd = stage.forward.ops.size();
  // The gradient's ops its outputs need (split_stages' seed of the stage's share of the loss,
  // sum(sent · grad.sent), is not read: autodiff seeds with a constant).
  const std::vector<char> needed = needed_ops(bg, bg.outputs);
  std::vector<char> fwd_ops(bg.ops.size(), 0), grad_ops(bg.ops.size(), 0);
  for (std::size_t o = 0; o < bg.ops.size(); ++o) {
    if (bg.ops[o].kind == OpKind::Input) continue;
    if (o < n_fwd) fwd_ops[o] = 1;
    else if (needed[o]) grad_ops[o] = 1;
  }
  // The forward's values a gradient op reads (not inputs of the graph), in value order.
  std::vector<char> read(bg.values.size(), 0);
  for (std::size_t o = 0; o < bg.ops.size(); ++o)
    if (grad_ops[o])
      for (int v : bg.ops[o].inputs) {
        const int p = bg.values[static_cast<std::size_t>(v)].producer;
        if (p >= 0 && fwd_ops[static_cast<std::size_t>(p)]) read[static_cast<std::size_t>(v)] = 1;
      }
  std::vector<std::string> saved;
  std::vector<int> f_outputs;
  std::vector<char> listed(bg.values.size(), 0);
  for (int v : stage.forward.outputs) {  // the sends and the loss, by name, as the forward has them
    const int id = bg.find(stage.forward.values[static_cast<std::size_t>(v)].name);
    f_outputs.push_back(id);
    listed[static_cast<std::size_t>(id)] = 1;
  }
  for (std::size_t v = 0; v < bg.values.size(); ++v)
    if (read[v]) {
      saved.push_back(bg.values[v].name);
      if (!listed[v]) f_outputs.push_back(static_cast<int>(v));
    }
  Graph f = extract(bg, fwd_ops, f_outputs), b = extract(bg, grad_ops, bg.outputs);
  stage.forward = std::move(f);
  stage.backward = std::move(b);
  stage.saved = std::move(saved);
  stage.activations_kept = true;
  return stage;
}

SplitBackward split_backward(const PipelineStage& stage) {
  const Graph& g = stage.backward;
  std::vector<int> grads, accs;  // the outputs: gradients of received values, accumulators
  for (int v : g.outputs) {
    const std::string& n = g.values[static_cast<std::size_t>(v)].name;
    (n.rfind("next.grad.acc.", 0) == 0 ? accs : grads).push_back(v);
  }
  const std::vector<char> in_b = needed_ops(g, grads), for_w = needed_ops(g, accs);
  std::vector<char> in_w(g.ops.size(), 0);
  for (std::size_t o = 0; o < g.ops.size(); ++o) in_w[o] = for_w[o] && !in_b[o];
  // B's values W reads (in value order): the stash.
  std::vector<int> stash;
  std::vector<char> stashed(g.values.size(), 0);
  auto stash_if_b = [&](int v) {
    const int p = g.values[static_cast<std::size_t>(v)].producer;
    if (p >= 0 && in_b[static_cast<std::size_t>(p)] && !stashed[static_cast<std::size_t>(v)]) {
      stashed[static_cast<std::size_t>(v)] = 1;
      stash.push_back(v);
    }
  };
  for (std::size_t o = 0; o < g.ops.size(); ++o)
    if (in_w[o])
      for (int v : g.ops[o].inputs) stash_if_b(v);
  for (int v : accs) stash_if_b(v);  // (an accumulator B makes itself: W passes it on)
  std::sort(stash.begin(), stash.end());
  SplitBackward out;
  std::vector<int> b_outputs = grads;
  for (int v : stash)  // (a gradient W reads too is output once)
    if (std::find(grads.begin(), grads.end(), v) == grads.end()) b_outputs.push_back(v);
  out.input_grad = extract(g, in_b, b_outputs);
  out.weight_grad = extract(g, in_w, accs);
  for (int v : stash) out.stash.push_back(g.values[static_cast<std::size_t>(v)].name);
  return out;
}

std::vector<Tensor> equal_layer_cuts(const std::vector<Tensor>& checkpoints, int64_t layers, int64_t pieces) {
  if (pieces < 1 || pieces > layers)
    throw Error(fmt::format("equal_layer_cuts: {} stages of {} layers (each stage needs a layer)", pieces, layers));
  std::vector<Tensor> cuts;
  for (int64_t k = 1; k < pieces; ++k) {
    const int64_t at = k * layers / pieces;
    if (at >= static_cast<int64_t>(checkpoints.size()))
      throw Error(fmt::format("equal_layer_cuts: no checkpoint {} ({} given for {} layers)", at, checkpoints.size(), layers));
    cuts.push_back(checkpoints[static_cast<std::size_t>(at)]);
  }
  return cuts;
}

}  // namespace tessel
