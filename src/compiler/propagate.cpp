// Sharding propagation through factor rules, to a fixed point (policy in propagate.hpp).
#include "tessel/compiler/propagate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>
#include <climits>
#include <map>
#include <optional>
#include <set>

#include "tessel/compiler/factor_choice.hpp"
#include "tessel/ops/registry.hpp"

namespace tessel {

std::vector<std::vector<std::string>> project_onto_factors(const Mesh& mesh,
                                                           const std::vector<DimFactors>& dims,
                                                           const std::vector<Factor>& factors,
                                                           const Sharding& s) {
  std::vector<std::vector<std::string>> out(factors.size());
  for (std::size_t d = 0; d < dims.size() && d < s.dims.size(); ++d) {
    const auto& axes = s.dims[d].axes;
    std::size_t idx = 0;
    for (int f : dims[d]) {
      int64_t prod = 1;
      while (idx < axes.size() && factors[f].size % (prod * mesh.axis_size(axes[idx])) == 0) {
        prod *= mesh.axis_size(axes[idx]);
        out[f].push_back(axes[idx]);
        ++idx;
      }
      if (prod != factors[f].size) break;  // a minor factor cannot be split now
    }
  }
  return out;
}

std::vector<std::string> compose_dim(const Mesh& mesh, const DimFactors& dim,
                                     const std::vector<Factor>& factors,
                                     const std::vector<std::vector<std::string>>& fs) {
  std::vector<std::string> axes;
  for (int f : dim) {
    axes.insert(axes.end(), fs[f].begin(), fs[f].end());
    if (mesh.axes_size(fs[f]) != factors[f].size) break;
  }
  return axes;
}

namespace {

bool is_prefix(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

struct Propagator {
  const Graph& g;
  const Mesh& mesh;
  PropagationResult& res;
  std::vector<bool> annotated;
  // Every pass meets the same conflicts again: each decision is recorded once.
  std::unordered_set<std::string> decided;
  void decide(std::string text) {
    if (decided.insert(text).second) res.decisions.push_back(std::move(text));
  }
  // Each op's rule, computed on first use: rules depend on shapes and attributes only, and
  // every op is visited twice per pass.
  std::vector<std::optional<OpRule>> rules;

  const OpRule& rule_of(int op_index) {
    if (rules.empty()) rules.resize(g.ops.size());
    auto& r = rules[static_cast<std::size_t>(op_index)];
    if (!r) r = op_rule(g, g.ops[static_cast<std::size_t>(op_index)]);
    return *r;
  }

  double bytes(int v) const {
    return static_cast<double>(num_elements(g.values[v].shape)) *
           static_cast<double>(dtype_size(g.values[v].dtype));
  }
  // "%w (from the annotation on %w, priority 0)" for decision lines.
  std::string source_text(int v, int dim) const {
    int origin = -1;
    if (dim >= 0 && dim < static_cast<int>(res.why[v].size())) origin = res.why[v][dim].origin;
    const int p = res.source_priority[v];
    if (origin == v) return fmt::format("%{} (annotated, priority {})", g.values[v].name, p);
    if (origin >= 0)
      return fmt::format("%{} (from the annotation on %{}, priority {})", g.values[v].name,
                         g.values[origin].name, p);
    return fmt::format("%{} (priority {})", g.values[v].name, p);
  }
  std::string why_won(int winner, int loser) const {
    const int pw = res.source_priority[winner], pl = res.source_priority[loser];
    if (pw != pl) return fmt::format("stronger priority ({} < {})", pw, pl);
    return fmt::format("equal priority {}: the larger tensor stays put ({} vs {} bytes)", pw,
                       bytes(winner), bytes(loser));
  }
  int dim_of_factor(const std::vector<DimFactors>& dims, int f) const {
    for (std::size_t d = 0; d < dims.size(); ++d)
      if (std::find(dims[d].begin(), dims[d].end(), f) != dims[d].end()) return static_cast<int>(d);
    return -1;
  }

  // One op, in round p. Returns true when a value changed.
  bool step(int op_index, int round) {
    const Op& op = g.ops[op_index];
    if (op.kind == OpKind::Input || op.kind == OpKind::Constant) return false;
    const OpRule& rule = rule_of(op_index);
    std::vector<int> tensors = op.inputs;
    std::vector<const std::vector<DimFactors>*> tdims;
    for (std::size_t i = 0; i < op.inputs.size(); ++i) tdims.push_back(&rule.operands[i]);
    for (int r = 0; r < op.num_results(); ++r) {
      tensors.push_back(op.result(r));
      tdims.push_back(&rule.result_dims(r));
    }

    // Every active tensor's wish, merged by the one factor policy (factor_choice.hpp).
    std::vector<FactorWish> wishes;
    std::vector<std::size_t> wish_tensor;  // per wish: its index in `tensors`
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      int v = tensors[t];
      if (res.source_priority[v] > round) continue;  // not active in this round
      bool any_axis = false;
      for (const auto& d : res.shardings[v].dims) any_axis = any_axis || !d.axes.empty();
      if (!any_axis) continue;  // nothing to project
      FactorWish w;
      w.value = v;
      w.priority = res.source_priority[v];
      w.bytes = bytes(v);
      w.axes = project_onto_factors(mesh, *tdims[t], rule.factors, res.shardings[v]);
      wishes.push_back(std::move(w));
      wish_tensor.push_back(t);
    }
    auto dim_in = [&](int wish, int f) {
      return wish < 0 ? -1 : dim_of_factor(*tdims[wish_tensor[static_cast<std::size_t>(wish)]], f);
    };
    auto on_conflict = [&](const FactorConflict& c) {
      const int w = wishes[static_cast<std::size_t>(c.winner)].value;
      const int l = wishes[static_cast<std::size_t>(c.loser)].value;
      if (c.axis.empty()) {
        const auto& f = static_cast<std::size_t>(c.factor);
        decide(fmt::format("{} factor '{}': {{{}}} of {} wins over {{{}}} of {}: {}", g.describe_op(op_index),
                           rule.factors[f].name, fmt::join(wishes[static_cast<std::size_t>(c.winner)].axes[f], ","),
                           source_text(w, dim_in(c.winner, c.factor)),
                           fmt::join(wishes[static_cast<std::size_t>(c.loser)].axes[f], ","),
                           source_text(l, dim_in(c.loser, c.factor)), why_won(w, l)));
        return;
      }
      decide(fmt::format("{} factor '{}': axis '{}' goes to factor '{}' of {} over factor '{}' of {}: {}",
                         g.describe_op(op_index), rule.factors[static_cast<std::size_t>(c.factor)].name, c.axis,
                         rule.factors[static_cast<std::size_t>(c.holder)].name,
                         source_text(w, dim_in(c.winner, c.holder)),
                         rule.factors[static_cast<std::size_t>(c.factor)].name,
                         source_text(l, dim_in(c.loser, c.factor)),
                         w == l ? std::string("one tensor's dims are split in order") : why_won(w, l)));
    };
    const FactorChoice choice = choose_factor_axes(rule, wishes, on_conflict, &op);
    const FactorAxes& chosen = choice.axes;
    // Write back to open dims that the factor shardings extend.
    bool changed = false;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      int v = tensors[t];
      Sharding& s = res.shardings[v];
      for (std::size_t d = 0; d < tdims[t]->size(); ++d) {
        if (s.dims[d].closed) continue;
        auto want = compose_dim(mesh, (*tdims[t])[d], rule.factors, chosen);
        const auto& cur = s.dims[d].axes;
        if (want.size() <= cur.size() || !is_prefix(cur, want)) continue;
        // Truncate at an axis the tensor already uses on another dim.
        std::vector<std::string> ext = cur;
        for (std::size_t i = cur.size(); i < want.size(); ++i) {
          if (s.dim_of_axis(want[i]) >= 0 || s.uses_axis(want[i])) break;
          ext.push_back(want[i]);
        }
        if (ext.size() == cur.size()) continue;
        if (g.values[v].shape[d] % mesh.axes_size(ext) != 0) continue;
        s.dims[d].axes = ext;
        // provenance: the factor that contributed the last axis
        int contributing = -1;
        for (int f : (*tdims[t])[d])
          if (!chosen[f].empty() && std::find(chosen[f].begin(), chosen[f].end(), ext.back()) != chosen[f].end())
            contributing = f;
        DimProvenance pv;
        pv.op = op_index;
        pv.round = round;
        if (contributing >= 0 && choice.source[static_cast<std::size_t>(contributing)] >= 0) {
          const int sw = choice.source[static_cast<std::size_t>(contributing)];
          pv.from_value = wishes[static_cast<std::size_t>(sw)].value;
          int sd = dim_in(sw, contributing);
          if (sd >= 0 && sd < static_cast<int>(res.why[pv.from_value].size()))
            pv.origin = res.why[pv.from_value][sd].origin;
        }
        res.why[v][d] = pv;
        res.source_priority[v] = std::min(res.source_priority[v], round);
        changed = true;
      }
    }
    return changed;
  }
};

}  // namespace

PropagationResult propagate(const Graph& g, const Mesh& mesh, const PropagationOptions& opts) {
  PropagationResult res;
  std::size_t nv = g.values.size();
  res.shardings.resize(nv);
  res.why.resize(nv);
  res.source_priority.assign(nv, INT_MAX);
  for (std::size_t v = 0; v < nv; ++v) {
    res.shardings[v] = Sharding::open(static_cast<int>(g.values[v].shape.size()));
    res.why[v].assign(g.values[v].shape.size(), DimProvenance{});
  }
  std::set<int> rounds;
  auto seed = [&](int v, const Sharding& s, int priority, const std::string& what) {
    s.validate(mesh, g.values[v].shape, what);
    if (!s.partial.empty())
      throw ShardingError(fmt::format("{}: sharding {} is partial; annotate materialized "
                                      "layouts only", what, s.to_string()));
    res.shardings[v] = s;
    res.source_priority[v] = priority;
    for (std::size_t d = 0; d < s.dims.size(); ++d) {
      DimProvenance pv;
      pv.origin = v;
      pv.round = priority;
      res.why[v][d] = pv;
    }
    rounds.insert(priority);
  };
  for (const auto& [v, ann] : g.annotations)
    seed(v, ann.sharding, ann.priority, fmt::format("annotation on {}", g.describe(v)));
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.kind == OpKind::ShardingConstraint)
      seed(op.output, op.attrs.sharding->closed_copy(), op.attrs.priority,
           fmt::format("sharding_constraint {}", g.describe(op.output)));
  }
  Propagator pr{g, mesh, res, {}, {}, {}};
  int passes = 0;
  for (int round : rounds) {
    bool changed = true;
    while (changed) {
      if (++passes > opts.max_passes)
        throw PartitionError(fmt::format("sharding propagation did not converge in {} passes; "
                                         "this is a bug in tessel, please report the graph",
                                         opts.max_passes));
      changed = false;
      for (std::size_t i = 0; i < g.ops.size(); ++i) changed |= pr.step(static_cast<int>(i), round);
      for (std::size_t i = g.ops.size(); i-- > 0;) changed |= pr.step(static_cast<int>(i), round);
    }
  }
  res.passes = passes;
  return res;
}

std::string PropagationResult::explain(const Graph& g, int value) const {
  std::string out = fmt::format("%{} : {} {}\n", g.values[value].name,
                                type_str(g.values[value].dtype, g.values[value].shape),
                                shardings[value].to_string());
  for (std::size_t d = 0; d < why[value].size(); ++d) {
    const DimProvenance& pv = why[value][d];
    const auto& axes = shardings[value].dims[d].axes;
    std::string axes_s = axes.empty() ? "replicated" : "{" + join(axes, ", ") + "}";
    if (pv.op < 0 && pv.origin == value) {
      auto it = g.annotations.find(value);
      int prio = it != g.annotations.end() ? it->second.priority : pv.round;
      out += fmt::format("  dim {}: {} — user annotation (priority {})\n", d, axes_s, prio);
    } else if (pv.op < 0) {
      out += fmt::format("  dim {}: {} — no annotation reaches this dim\n", d, axes_s);
    } else {
      int v = pv.from_value;
      std::string chain = fmt::format("from %{} through {}", v >= 0 ? g.values[v].name : "?",
                          g.describe_op(pv.op));
      std::string origin = pv.origin >= 0
                               ? fmt::format("; derives from the annotation on %{}",
                                             g.values[pv.origin].name)
                               : std::string();
      out += fmt::format("  dim {}: {} — {}{} (round {})\n", d, axes_s, chain, origin, pv.round);
    }
  }
  return out;
}

}  // namespace tessel
