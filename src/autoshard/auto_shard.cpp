// Automatic layouts: the formulation of a graph as a strategy-selection problem and the plan
// back as layouts (tessel/autoshard/auto_shard.hpp).
#include "tessel/autoshard/auto_shard.hpp"

#include <algorithm>
#include <limits>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "tessel/autoshard/solver.hpp"
#include "tessel/compiler/compiled_program.hpp"
#include "tessel/compiler/factor_choice.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/compiler/reshard.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/ops/registry.hpp"
#include "../compiler/dim_classes.hpp"
#include "repeats.hpp"

namespace tessel {

namespace {

int64_t picoseconds(double s) { return static_cast<int64_t>(std::llround(std::max(0.0, s) * 1e12)); }

int64_t local_bytes(const Mesh& mesh, const Shape& shape, DType dt, const Sharding& s) {
  return num_elements(s.without_partial().local_shape(mesh, shape)) * static_cast<int64_t>(dtype_size(dt));
}

// One strategy of a node.
struct Strategy {
  Sharding out;                   // the value's layout (result 0)
  std::vector<Sharding> extra;    // results 1..
  std::vector<Sharding> operands; // what the op needs of each operand (ops only)
  std::vector<std::vector<std::string>> factors;  // per factor of the op's rule: its axes
  double compute_s = 0, comm_s = 0;
  double dispatch_s = 0;  // of compute_s: the op's dispatch
  int64_t usage = 0;
};

std::string layout_key(const Strategy& s) {
  std::string k = s.out.to_string();
  for (const Sharding& e : s.extra) k += "|" + e.to_string();
  for (const Sharding& o : s.operands) k += "#" + o.to_string();
  return k;
}

// Closed dims of `want` equal in `got` (open dims are free), partial axes ignored.
bool matches(const Sharding& want, const Sharding& got) {
  if (want.rank() != got.rank()) return false;
  for (int d = 0; d < want.rank(); ++d)
    if (want.dims[static_cast<std::size_t>(d)].closed &&
        want.dims[static_cast<std::size_t>(d)].axes != got.dims[static_cast<std::size_t>(d)].axes)
      return false;
  return true;
}

class Formulation {
 public:
  Formulation(const Graph& g, const Mesh& mesh, const AutoShardOptions& o) : g_(g), mesh_(mesh), o_(o), sets_(g) {}

  AutoShardProblem run(std::vector<std::vector<Strategy>>& strategies) {
    find_tails();
    connect_dims();
    resolve_restrictions();
    AutoShardProblem out;
    node_of_value_.assign(g_.values.size(), -1);
    result_of_value_.assign(g_.values.size(), 0);
    // Time: op k runs at step k + 1; inputs are live from step 0; outputs to the end.
    const int64_t end = static_cast<int64_t>(g_.ops.size()) + 1;
    std::vector<int64_t> last(g_.values.size(), -1);
    for (std::size_t k = 0; k < g_.ops.size(); ++k)
      for (int v : g_.ops[k].inputs) last[static_cast<std::size_t>(v)] = static_cast<int64_t>(k) + 1;
    for (int v : g_.outputs) last[static_cast<std::size_t>(v)] = end;
    // A tied output is written into its input's buffer (a Trainer donates one to the other):
    // the input's bytes stay live to the end and the output adds none (the result gives it the
    // input's layout).
    std::vector<bool> tied_out(g_.values.size(), false);
    for (const auto& [in_name, out_name] : o_.tied) {
      const int vi = g_.find(in_name), vo = g_.find(out_name);
      if (vi < 0 || vo < 0) continue;  // (named in the error below)
      last[static_cast<std::size_t>(vi)] = end;
      tied_out[static_cast<std::size_t>(vo)] = true;
    }
    auto add_node = [&](int value, int op, std::vector<Strategy> s, int64_t start, int64_t stop) {
      const int n = static_cast<int>(out.problem.nodes.size());
      autoshard::Node node;
      node.live = {start, stop};
      std::vector<Sharding> layouts;
      for (const Strategy& st : s) {
        node.cost.push_back(picoseconds(st.compute_s + st.comm_s));
        node.usage.push_back(st.usage);
        layouts.push_back(st.out);
      }
      out.problem.nodes.push_back(std::move(node));
      out.node_value.push_back(value);
      out.node_op.push_back(op);
      out.node_layouts.push_back(std::move(layouts));
      strategies.push_back(std::move(s));
      return n;
    };
    for (int v : g_.inputs) {
      const int n = add_node(v, -1, input_strategies(v), 0, std::max<int64_t>(1, last[static_cast<std::size_t>(v)] + 1));
      node_of_value_[static_cast<std::size_t>(v)] = n;
    }
    for (std::size_t k = 0; k < g_.ops.size(); ++k) {
      const Op& op = g_.ops[k];
      if (op.kind == OpKind::Input) continue;
      std::vector<Strategy> s = op_strategies(static_cast<int>(k));
      int64_t stop = 0;
      bool all_tied = true;
      for (int r = 0; r < op.num_results(); ++r) {
        stop = std::max(stop, last[static_cast<std::size_t>(op.result(r))]);
        all_tied = all_tied && tied_out[static_cast<std::size_t>(op.result(r))];
      }
      const int64_t start = static_cast<int64_t>(k) + 1;
      const int n = add_node(op.output, static_cast<int>(k), std::move(s), start,
                             all_tied ? start : std::max<int64_t>(start + 1, stop + 1));
      for (int r = 0; r < op.num_results(); ++r) {
        node_of_value_[static_cast<std::size_t>(op.result(r))] = n;
        result_of_value_[static_cast<std::size_t>(op.result(r))] = r;
      }
      // An edge per operand: the producer's layout -> what this strategy needs.
      const auto& mine = strategies[static_cast<std::size_t>(n)];
      for (std::size_t i = 0; i < op.inputs.size(); ++i) {
        const int u = op.inputs[i];
        const int p = node_of_value_[static_cast<std::size_t>(u)];
        if (p < 0) throw Error(fmt::format("auto_shard: value %{} is used before it is made", g_.values[static_cast<std::size_t>(u)].name));
        const int r = result_of_value_[static_cast<std::size_t>(u)];
        const auto& theirs = strategies[static_cast<std::size_t>(p)];
        autoshard::Edge e;
        e.a = p;
        e.b = n;
        const Value& val = g_.values[static_cast<std::size_t>(u)];
        std::vector<const Sharding*> from(theirs.size()), to(mine.size());
        for (std::size_t a = 0; a < theirs.size(); ++a)
          from[a] = r == 0 ? &theirs[a].out : &theirs[a].extra[static_cast<std::size_t>(r - 1)];
        for (std::size_t b = 0; b < mine.size(); ++b) to[b] = &mine[b].operands[i];
        e.cost = cost_matrix(val, from, to);
        out.problem.edges.push_back(std::move(e));
      }
    }
    // Tied pairs: the output's layout resharded to the input's.
    for (const auto& [in_name, out_name] : o_.tied) {
      const int vi = g_.find(in_name), vo = g_.find(out_name);
      if (vi < 0 || vo < 0 || node_of_value_[static_cast<std::size_t>(vi)] < 0 ||
          out.node_op[static_cast<std::size_t>(node_of_value_[static_cast<std::size_t>(vi)])] >= 0)
        throw Error(fmt::format("auto_shard: tied pair ('{}', '{}'): the first must be an input of the graph and the "
                                "second a value of it",
                                in_name, out_name));
      const int p = node_of_value_[static_cast<std::size_t>(vo)], q = node_of_value_[static_cast<std::size_t>(vi)];
      const int r = result_of_value_[static_cast<std::size_t>(vo)];
      const auto& from = strategies[static_cast<std::size_t>(p)];
      const auto& to = strategies[static_cast<std::size_t>(q)];
      const Value& val = g_.values[static_cast<std::size_t>(vo)];
      autoshard::Edge e;
      e.a = p;
      e.b = q;
      std::vector<const Sharding*> fl(from.size()), tl(to.size());
      for (std::size_t a = 0; a < from.size(); ++a)
        fl[a] = r == 0 ? &from[a].out : &from[a].extra[static_cast<std::size_t>(r - 1)];
      for (std::size_t b = 0; b < to.size(); ++b) tl[b] = &to[b].out;
      e.cost = cost_matrix(val, fl, tl);
      out.problem.edges.push_back(std::move(e));
    }
    out.problem.name = "auto_shard";
    if (o_.memory_budget_bytes > 0) out.problem.usage_limit = o_.memory_budget_bytes;
    return out;
  }

  // The edge matrix from layouts `from` to `to` of one value: the reshard of each distinct pair
  // once (strategies share layouts), row-major picoseconds. Layouts and value types are
  // interned to integers, so a pair seen before (a repeated layer's) costs one hash lookup
  // rather than building and hashing its text (which was most of the formulation's time).
  std::vector<int64_t> cost_matrix(const Value& val, const std::vector<const Sharding*>& from,
                                   const std::vector<const Sharding*>& to) {
    auto distinct = [&](const std::vector<const Sharding*>& ls, std::vector<const Sharding*>& uniq,
                        std::vector<int>& ids) {
      std::unordered_map<int, int> id;  // interned layout -> index in uniq
      std::vector<int> of(ls.size());
      for (std::size_t i = 0; i < ls.size(); ++i) {
        const int lid = intern(layout_ids_, ls[i]->to_string());
        auto [it, fresh] = id.emplace(lid, static_cast<int>(uniq.size()));
        if (fresh) {
          uniq.push_back(ls[i]);
          ids.push_back(lid);
        }
        of[i] = it->second;
      }
      return of;
    };
    std::vector<const Sharding*> uf, ut;
    std::vector<int> fids, tids;
    const std::vector<int> fi = distinct(from, uf, fids), ti = distinct(to, ut, tids);
    const int type_id = intern(type_ids_, shape_str(val.shape) + dtype_name(val.dtype));
    std::vector<int64_t> m(uf.size() * ut.size());
    for (std::size_t a = 0; a < uf.size(); ++a)
      for (std::size_t b = 0; b < ut.size(); ++b)
        m[a * ut.size() + b] = picoseconds(reshard_s(type_id, fids[a], tids[b], val.shape, val.dtype, *uf[a], *ut[b]));
    std::vector<int64_t> cost(from.size() * to.size());
    for (std::size_t a = 0; a < from.size(); ++a)
      for (std::size_t b = 0; b < to.size(); ++b)
        cost[a * to.size() + b] = m[static_cast<std::size_t>(fi[a]) * ut.size() + static_cast<std::size_t>(ti[b])];
    return cost;
  }

  static int intern(std::unordered_map<std::string, int>& ids, std::string key) {
    const int id = ids.emplace(std::move(key), static_cast<int>(ids.size())).first->second;
    if (id >= (1 << 21))
      throw Error("auto_shard: more than 2^21 distinct layouts or value types in one formulation (internal limit)");
    return id;
  }

  // The reshard of a value of type `type_id` from layout `from_id` to `to_id` (interned ids of
  // the shape and dtype, and of the layouts' text), planned once per distinct triple.
  double reshard_s(int type_id, int from_id, int to_id, const Shape& shape, DType dt, const Sharding& from,
                   const Sharding& to) {
    if (from_id == to_id || from.same_layout(to)) return 0;
    const uint64_t key = (static_cast<uint64_t>(type_id) << 42) ^ (static_cast<uint64_t>(from_id) << 21) ^
                         static_cast<uint64_t>(to_id);
    auto it = reshard_cache_.find(key);
    if (it != reshard_cache_.end()) return it->second;
    double s = 0;
    try {
      s = plan_reshard(mesh_, shape, dt, from.closed_copy(), to.closed_copy(), o_.cost).seconds;
    } catch (const Error&) {
      s = 1e6;  // not reachable: an "infinite" cost (a million seconds)
    }
    reshard_cache_.emplace(key, s);
    return s;
  }

 private:
  const Graph& g_;
  const Mesh& mesh_;
  const AutoShardOptions& o_;
  DimClasses sets_;  // dims joined by the ops' factors (axis_only_on)
  std::vector<int> node_of_value_, result_of_value_;
  // Interned layouts and value types (cost_matrix), and the reshard of each (type, from, to):
  // ids below 2^21 each, so the three fit one 64-bit key (checked where they are made).
  std::unordered_map<std::string, int> layout_ids_, type_ids_;
  std::unordered_map<uint64_t, double> reshard_cache_;
  std::map<std::string, std::set<int>> allowed_;  // axis -> dim components it may split
  std::vector<std::optional<OpRule>> rules_;

  // Tail values: no einsum or attention (forward or backward) is reachable from them, as a
  // training step's weight gradients, which feed only the optimizer's elementwise update and
  // norm. The lowering combines their reductions (combine-collectives: the all-reduces and
  // reduce-scatters of independent values into one per axis group), so each pays a share of
  // one collective's latency rather than a whole one: priced here as alpha / n_tail_, n_tail_
  // the tail results of einsums (the weight gradients).
  std::vector<bool> tail_;
  int64_t n_tail_ = 1;

  void find_tails() {
    std::vector<bool> reaches_heavy(g_.values.size(), false);
    for (std::size_t k = g_.ops.size(); k-- > 0;) {
      const Op& op = g_.ops[k];
      bool down = op.kind == OpKind::Einsum || op.kind == OpKind::FusedEinsum || op.kind == OpKind::Attention ||
                  op.kind == OpKind::AttentionGrad;
      for (int r = 0; r < op.num_results() && !down; ++r) down = reaches_heavy[static_cast<std::size_t>(op.result(r))];
      for (int v : op.inputs)
        if (down) reaches_heavy[static_cast<std::size_t>(v)] = true;
    }
    tail_.assign(g_.values.size(), false);
    int64_t n = 0;
    for (const Op& op : g_.ops)
      for (int r = 0; r < op.num_results(); ++r) {
        const auto v = static_cast<std::size_t>(op.result(r));
        tail_[v] = !reaches_heavy[v];
        if (tail_[v] && (op.kind == OpKind::Einsum || op.kind == OpKind::FusedEinsum)) ++n;
      }
    n_tail_ = std::max<int64_t>(1, n);
  }

  // A reduction of value `v` over `axes` moving `bytes`: a tail value's shares a latency.
  double reduction_seconds(CollectiveKind k, int v, const std::vector<std::string>& axes, int64_t bytes) const {
    const double full = o_.cost.collective_seconds(k, mesh_, axes, bytes);
    if (!o_.combined_tail_reductions || !tail_[static_cast<std::size_t>(v)] || n_tail_ <= 1) return full;
    const double alpha = o_.cost.link(axes).alpha_s;
    return std::max(0.0, full - alpha * (1.0 - 1.0 / static_cast<double>(n_tail_)));
  }

  const OpRule& rule(int k) {
    if (rules_.empty()) rules_.resize(g_.ops.size());
    auto& r = rules_[static_cast<std::size_t>(k)];
    if (!r) r = op_rule(g_, g_.ops[static_cast<std::size_t>(k)]);
    return *r;
  }

  void connect_dims() {
    for (std::size_t k = 0; k < g_.ops.size(); ++k) {
      const Op& op = g_.ops[k];
      if (op.kind == OpKind::Input) continue;
      const OpRule& rl = rule(static_cast<int>(k));
      std::vector<int> first(rl.factors.size(), -1);  // a slot holding each factor
      auto visit = [&](int v, const std::vector<DimFactors>& dims) {
        for (std::size_t d = 0; d < dims.size(); ++d)
          for (int f : dims[d]) {
            const int s = sets_.node(v, d);
            if (first[static_cast<std::size_t>(f)] < 0) first[static_cast<std::size_t>(f)] = s;
            else sets_.unite(first[static_cast<std::size_t>(f)], s);
          }
      };
      for (std::size_t i = 0; i < op.inputs.size() && i < rl.operands.size(); ++i) visit(op.inputs[i], rl.operands[i]);
      for (int r = 0; r < op.num_results(); ++r) visit(op.result(r), rl.result_dims(r));
    }
  }

  void resolve_restrictions() {
    for (const auto& [axis, dims] : o_.axis_only_on) {
      if (!mesh_.has_axis(axis))
        throw Error(fmt::format("auto_shard: axis_only_on names axis '{}', which mesh {} does not have", axis,
                                mesh_.to_string()));
      auto& comp = allowed_[axis];
      for (const std::string& spec : dims) {
        const std::size_t colon = spec.rfind(':');
        const std::string name = colon == std::string::npos ? spec : spec.substr(0, colon);
        int v = -1;
        for (std::size_t i = 0; i < g_.values.size(); ++i)
          if (g_.values[i].name == name) v = static_cast<int>(i);
        int64_t d = -1;
        if (colon != std::string::npos) {
          try {
            d = std::stoll(spec.substr(colon + 1));
          } catch (const std::exception&) {
            d = -1;
          }
        }
        if (v < 0 || d < 0 || d >= static_cast<int64_t>(g_.values[static_cast<std::size_t>(v)].shape.size()))
          throw Error(fmt::format("auto_shard: axis_only_on['{}'] entry '{}' is not VALUE:DIM of a value of the graph "
                                  "(e.g. tokens:0)",
                                  axis, spec));
        comp.insert(sets_.find(sets_.node(v, static_cast<std::size_t>(d))));
      }
    }
  }

  std::vector<std::string> axis_names() const {
    std::vector<std::string> out;
    for (const MeshAxis& a : mesh_.axes()) out.push_back(a.name);
    return out;
  }

  bool axis_allowed(const std::string& axis, int v, std::size_t d) {
    auto it = allowed_.find(axis);
    return it == allowed_.end() || it->second.count(sets_.find(sets_.node(v, d)));
  }

  std::vector<Strategy> input_strategies(int v) {
    const Value& val = g_.values[static_cast<std::size_t>(v)];
    std::vector<Strategy> out;
    auto ann = g_.annotations.find(v);
    if (ann != g_.annotations.end()) {
      Strategy s;
      s.out = ann->second.sharding.closed_copy();
      s.usage = local_bytes(mesh_, val.shape, val.dtype, s.out);
      out.push_back(std::move(s));
      return out;
    }
    const std::size_t r = val.shape.size();
    const std::vector<std::string> axes = axis_names();
    std::vector<int> choice(axes.size(), -1);  // per axis: its dim, -1 unused
    while (true) {
      Sharding sh = Sharding::replicated(static_cast<int>(r));
      bool ok = true;
      for (std::size_t a = 0; a < axes.size() && ok; ++a) {
        if (choice[a] < 0) continue;
        const std::size_t d = static_cast<std::size_t>(choice[a]);
        ok = axis_allowed(axes[a], v, d);
        sh.dims[d].axes.push_back(axes[a]);
      }
      for (std::size_t d = 0; d < r && ok; ++d) ok = val.shape[d] % mesh_.axes_size(sh.dims[d].axes) == 0;
      if (ok) {
        Strategy s;
        s.out = sh;
        s.usage = local_bytes(mesh_, val.shape, val.dtype, sh);
        out.push_back(std::move(s));
      }
      std::size_t a = 0;
      for (; a < axes.size(); ++a) {
        if (++choice[a] < static_cast<int>(r)) break;
        choice[a] = -1;
      }
      if (a == axes.size()) break;
    }
    return out;
  }

  std::vector<Strategy> op_strategies(int k) {
    const Op& op = g_.ops[static_cast<std::size_t>(k)];
    const OpDef& def = op_def(op.kind);
    const OpRule& rl = rule(k);
    const std::vector<std::string> axes = axis_names();
    // Per factor: a tensor dim holding it (for axis_only_on) and whether it may be split.
    std::vector<bool> splittable(rl.factors.size(), false);
    std::vector<std::pair<int, std::size_t>> where(rl.factors.size(), {-1, 0});
    auto note = [&](int v, const std::vector<DimFactors>& dims) {
      for (std::size_t d = 0; d < dims.size(); ++d)
        for (int f : dims[d])
          if (where[static_cast<std::size_t>(f)].first < 0) where[static_cast<std::size_t>(f)] = {v, d};
    };
    for (std::size_t i = 0; i < op.inputs.size() && i < rl.operands.size(); ++i) note(op.inputs[i], rl.operands[i]);
    for (int r = 0; r < op.num_results(); ++r) note(op.result(r), rl.result_dims(r));
    for (std::size_t f = 0; f < rl.factors.size(); ++f) splittable[f] = factor_may_split(op, rl, static_cast<int>(f));
    std::vector<Shape> in_shapes;
    std::vector<DType> in_dtypes;
    for (int v : op.inputs) {
      in_shapes.push_back(g_.values[static_cast<std::size_t>(v)].shape);
      in_dtypes.push_back(g_.values[static_cast<std::size_t>(v)].dtype);
    }
    const Value& res0 = g_.values[static_cast<std::size_t>(op.output)];
    // A user's layout for the result (an annotation, or a sharding_constraint) keeps only the
    // strategies that give it, when there are some.
    std::optional<Sharding> want;
    if (auto a = g_.annotations.find(op.output); a != g_.annotations.end()) want = a->second.sharding;
    if (op.kind == OpKind::ShardingConstraint && op.attrs.sharding) want = *op.attrs.sharding;

    std::vector<Strategy> out;
    std::map<std::string, std::size_t> seen;
    auto keep = [&](Strategy s) {
      const std::string key = layout_key(s);
      auto it = seen.find(key);
      if (it == seen.end()) {
        seen.emplace(key, out.size());
        out.push_back(std::move(s));
      } else if (s.compute_s + s.comm_s < out[it->second].compute_s + out[it->second].comm_s) {
        out[it->second] = std::move(s);
      }
    };
    std::vector<int> choice(axes.size(), -1);  // per axis: its factor, -1 unused
    while (true) {
      std::vector<std::vector<std::string>> fs(rl.factors.size());
      bool ok = true;
      for (std::size_t a = 0; a < axes.size() && ok; ++a) {
        const int f = choice[a];
        if (f < 0) continue;
        ok = splittable[static_cast<std::size_t>(f)] &&
             (where[static_cast<std::size_t>(f)].first < 0 ||
              axis_allowed(axes[a], where[static_cast<std::size_t>(f)].first, where[static_cast<std::size_t>(f)].second));
        fs[static_cast<std::size_t>(f)].push_back(axes[a]);
      }
      // Every assignment the one factor policy calls computable (compiler/factor_choice.hpp).
      ok = ok && factor_axes_valid(mesh_, op, rl, fs);
      if (ok) build(op, def, rl, fs, in_shapes, in_dtypes, res0, keep, ok);
      std::size_t a = 0;
      for (; a < axes.size(); ++a) {
        if (++choice[a] < static_cast<int>(rl.factors.size())) break;
        choice[a] = -1;
      }
      if (a == axes.size()) break;
    }
    if (want) {
      std::vector<Strategy> kept;
      for (const Strategy& s : out)
        if (matches(*want, s.out)) kept.push_back(s);
      if (!kept.empty()) out = std::move(kept);
    }
    if (out.empty())
      throw Error(fmt::format("auto_shard: op #{} {} has no strategy on mesh {} (not even replicated)", k,
                              op_name(op.kind), mesh_.to_string()));
    return out;
  }

  // The layouts of one factor assignment `fs`; adds its strategy (and its reduce-scatter
  // variants) through keep().
  template <class Keep>
  void build(const Op& op, const OpDef& def, const OpRule& rl, const std::vector<std::vector<std::string>>& fs,
             const std::vector<Shape>& in_shapes, const std::vector<DType>& in_dtypes, const Value& res0, Keep& keep,
             bool& ok) {
    // A tensor's layout: every dim takes all the axes of its factors, or the assignment is not
    // expressible (a minor factor split while the major one is not whole).
    auto layout = [&](const std::vector<DimFactors>& dims) -> std::optional<Sharding> {
      Sharding s = Sharding::replicated(static_cast<int>(dims.size()));
      for (std::size_t d = 0; d < dims.size(); ++d) {
        std::size_t want_axes = 0;
        for (int f : dims[d]) want_axes += fs[static_cast<std::size_t>(f)].size();
        s.dims[d].axes = compose_dim(mesh_, dims[d], rl.factors, fs);
        if (s.dims[d].axes.size() != want_axes) return std::nullopt;
      }
      return s;
    };
    Strategy st;
    st.factors = fs;
    for (std::size_t i = 0; i < op.inputs.size(); ++i) {
      if (i >= rl.operands.size()) {
        st.operands.push_back(Sharding::replicated(static_cast<int>(in_shapes[i].size())));
        continue;
      }
      auto l = layout(rl.operands[i]);
      if (!l) {
        ok = false;
        return;
      }
      st.operands.push_back(*l);
    }
    std::vector<Sharding> results;
    std::vector<std::vector<std::string>> partials;
    for (int r = 0; r < op.num_results(); ++r) {
      auto l = layout(rl.result_dims(r));
      if (!l) {
        ok = false;
        return;
      }
      std::vector<std::string> partial;
      for (const std::string& a : axis_names())
        for (std::size_t f = 0; f < fs.size(); ++f)
          if (std::find(fs[f].begin(), fs[f].end(), a) != fs[f].end() && !rl.in_result(r, static_cast<int>(f)) &&
              rl.factors[f].kind != FactorKind::Combined)
            partial.push_back(a);
      results.push_back(*l);
      partials.push_back(partial);
    }
    // Compute: the local kernel.
    std::vector<Shape> local_in;
    for (std::size_t i = 0; i < in_shapes.size(); ++i) local_in.push_back(st.operands[i].local_shape(mesh_, in_shapes[i]));
    const Shape local_out = results[0].local_shape(mesh_, res0.shape);
    const double flops = def.flops ? def.flops(op.attrs, local_in, local_out) : 0;
    const double bytes = op_bytes(op.kind, op.attrs, local_in, in_dtypes, local_out, res0.dtype);
    st.dispatch_s = o_.cost.dispatch_seconds();
    st.compute_s = o_.cost.op_seconds(flops, bytes) + st.dispatch_s;
    // A combined factor split: the op's distributed form all-reduces per-row statistics.
    for (std::size_t f = 0; f < fs.size(); ++f)
      if (!fs[f].empty() && rl.factors[f].kind == FactorKind::Combined) {
        const int64_t rows = num_elements(local_out) / std::max<int64_t>(1, rl.factors[f].size / mesh_.axes_size(fs[f]));
        st.comm_s += def.distribute_stats *
                     o_.cost.collective_seconds(CollectiveKind::AllReduce, mesh_, fs[f], rows * 4);
      }
    // The results' partial sums, reduced at once: an all-reduce each.
    for (int r = 0; r < op.num_results(); ++r) {
      const Value& rv = g_.values[static_cast<std::size_t>(op.result(r))];
      const int64_t b = local_bytes(mesh_, rv.shape, rv.dtype, results[static_cast<std::size_t>(r)]);
      st.usage += b;
      if (!partials[static_cast<std::size_t>(r)].empty())
        st.comm_s += reduction_seconds(CollectiveKind::AllReduce, op.result(r), partials[static_cast<std::size_t>(r)], b);
    }
    st.out = results[0];
    st.extra.assign(results.begin() + 1, results.end());
    keep(st);
    // Result 0 reduce-scattered onto one of its dims over one partial axis (the others
    // all-reduced): the layout a ZeRO-2 gradient or a row-parallel einsum feeding a split
    // consumer wants.
    const auto& p0 = partials[0];
    for (std::size_t pa = 0; pa < p0.size(); ++pa)
      for (std::size_t d = 0; d < res0.shape.size(); ++d) {
        Sharding scattered = results[0];
        const int64_t local = res0.shape[d] / std::max<int64_t>(1, mesh_.axes_size(scattered.dims[d].axes));
        if (local % mesh_.axis_size(p0[pa]) != 0) continue;
        scattered.dims[d].axes.push_back(p0[pa]);
        Strategy v = st;
        v.out = scattered;
        const int64_t full = local_bytes(mesh_, res0.shape, res0.dtype, results[0]);
        std::vector<std::string> rest = p0;
        rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(pa));
        const int v0 = op.result(0);
        v.comm_s = st.comm_s - reduction_seconds(CollectiveKind::AllReduce, v0, p0, full) +
                   reduction_seconds(CollectiveKind::ReduceScatter, v0, {p0[pa]}, full) +
                   (rest.empty() ? 0 : reduction_seconds(CollectiveKind::AllReduce, v0, rest, full));
        v.usage = st.usage - full + local_bytes(mesh_, res0.shape, res0.dtype, scattered);
        keep(v);
      }
  }
};

}  // namespace

namespace {

// What auto_shard and formulate_auto_shard refuse before formulating.
void check_auto_shard_input(const Graph& g, const Mesh& mesh, const AutoShardOptions& options) {
  options.cost.validate();
  // The search plans even layouts (compile pads an uneven one, but the reshard planner and so
  // the prices assume even blocks): an annotation that splits a dim unevenly is refused here
  // rather than priced as unreachable (issue 37 D10: the plan printed "1e+06 s" and left the
  // rest replicated).
  for (const auto& [v, a] : g.annotations) {
    const Value& val = g.values[static_cast<std::size_t>(v)];
    for (std::size_t d = 0; d < a.sharding.dims.size() && d < val.shape.size(); ++d) {
      const int64_t n = mesh.axes_size(a.sharding.dims[d].axes);
      if (n > 1 && val.shape[d] % n != 0)
        throw Error(fmt::format("auto_shard: the annotation of %{} ({}) splits dim {} ({}) over {{{}}} ({} devices) "
                                "unevenly; automatic sharding plans even layouts only: give that dim a size the "
                                "axes divide (pad the batch), or annotate it over axes whose sizes divide {}, or "
                                "compile without auto_shard (compile pads uneven layouts)",
                                val.name, a.sharding.to_string(), d, val.shape[d], join(a.sharding.dims[d].axes, ", "),
                                n, val.shape[d]));
    }
  }
}

}  // namespace

AutoShardProblem formulate_auto_shard(const Graph& g, const Mesh& mesh, const AutoShardOptions& options) {
  check_auto_shard_input(g, mesh, options);
  std::vector<std::vector<Strategy>> strategies;
  Formulation f(g, mesh, options);
  return f.run(strategies);
}

namespace {

// The solver's share of AutoShardOptions::time_limit_s. Set (> 0), the limit is the whole call's:
// each solve gets 90% of what the formulation and the solves before it left (what follows a
// solve, building the result and compiling for a budget, takes the rest), and at least 5% of
// the limit (a plan needs a search, however short), so an answer may come late only by the
// formulation's overrun. Not set: the automatic solver limit, 0.5 s or 0.15 ms per node.
struct SolveLimit {
  using Clock = std::chrono::steady_clock;
  Clock::time_point start;
  double limit_s = 0;
  double automatic_s = 0.5;
  bool timed() const { return limit_s > 0; }
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
  double left() const { return limit_s - elapsed(); }
  double next_solve() const { return timed() ? std::max(0.05 * limit_s, 0.9 * left()) : automatic_s; }
};

// Solves a formulated problem (at its usage limit as set) and builds the result from the plan:
// the search over every node and, where nodes repeat, the one over their classes, the better
// kept.
// `limit_s`: the solver's wall clock (SolveLimit).
AutoShardResult solve_formulated(const Graph& g, const AutoShardOptions& options, const AutoShardProblem& ap,
                                 const std::vector<std::vector<Strategy>>& strategies,
                                 const autoshard::RepeatClasses& classes, double limit_s) {
  autoshard::SolveOptions so;
  so.time_limit_s = limit_s;
  so.seed = options.seed;
  so.max_iterations = options.max_iterations;
  // CBC checks its time limit only between the steps of its search: beyond a few ten thousand
  // variables one step can overrun the limit many times over, so larger graphs stay with the
  // anytime method (measured: a 2-layer GPT training step, 340 nodes, took 63 s on CBC with a
  // 2 s limit).
  so.exact_max_variables = 20000;
  std::optional<autoshard::SolveResult> tied;
  const bool repeats = classes.count * 10 < static_cast<int32_t>(ap.problem.nodes.size()) * 9;
  if (repeats) {
    autoshard::SolveOptions to = so;
    to.time_limit_s = 0.3 * so.time_limit_s;
    so.time_limit_s -= to.time_limit_s;
    const autoshard::Problem tp = autoshard::tied_problem(ap.problem, classes);
    tied = autoshard::solve(tp, to);
    tied->plan = autoshard::expand(classes, tied->plan);
    tied->evaluation = autoshard::evaluate(ap.problem, tied->plan);
  }
  autoshard::SolveResult sr = autoshard::solve(ap.problem, so);
  if (tied) {
    // Feasible first, then the lower cost; of two plans over the budget, the one of less memory.
    auto rank = [](const autoshard::Evaluation& e) {
      const bool bad = !e.within_memory || e.uses_infinite;
      return std::make_tuple(bad, bad && !e.within_memory ? e.peak_usage : 0, e.cost);
    };
    const double both = sr.seconds + tied->seconds;
    if (rank(tied->evaluation) < rank(sr.evaluation)) {
      sr.plan = tied->plan;
      sr.evaluation = tied->evaluation;
      sr.status = !tied->evaluation.within_memory ? autoshard::SolveStatus::infeasible
                  : tied->evaluation.uses_infinite ? autoshard::SolveStatus::unknown
                                                   : autoshard::SolveStatus::feasible;
      sr.method = fmt::format("{} over {} classes of repeated nodes", tied->method, classes.count);
    } else {
      sr.method += fmt::format(" (beside {} classes of repeated nodes)", classes.count);
    }
    sr.seconds = both;
  }
  AutoShardResult res;
  res.solve_s = sr.seconds;
  res.solver = fmt::format("{} ({})", sr.method, autoshard::status_name(sr.status));
  res.nodes = static_cast<int64_t>(ap.problem.nodes.size());
  res.edges = static_cast<int64_t>(ap.problem.edges.size());
  for (const auto& s : strategies) res.strategies += static_cast<int64_t>(s.size());
  res.fits = sr.evaluation.within_memory;
  res.peak_bytes = sr.evaluation.peak_usage;
  res.shardings.assign(g.values.size(), Sharding());
  res.from_user.assign(g.values.size(), false);
  res.op_factors.assign(g.ops.size(), {});
  for (const auto& [v, a] : g.annotations) res.from_user[static_cast<std::size_t>(v)] = true;
  for (std::size_t n = 0; n < ap.problem.nodes.size(); ++n) {
    const Strategy& s = strategies[n][static_cast<std::size_t>(sr.plan[n])];
    res.compute_s += s.compute_s;
    res.dispatch_s += s.dispatch_s;
    res.comm_s += s.comm_s;
    const int op = ap.node_op[n];
    if (op < 0) {
      res.shardings[static_cast<std::size_t>(ap.node_value[n])] = s.out;
      continue;
    }
    const Op& o = g.ops[static_cast<std::size_t>(op)];
    res.op_factors[static_cast<std::size_t>(op)] = s.factors;
    res.shardings[static_cast<std::size_t>(o.output)] = s.out;
    for (std::size_t r = 0; r < s.extra.size(); ++r) res.shardings[static_cast<std::size_t>(o.result(static_cast<int>(r) + 1))] = s.extra[r];
  }
  // A tied output must leave in its input's layout (so the pair can be donated: the same global
  // type and sharding); the reshard to it is priced on the tied edge. annotated() makes that
  // reshard explicit where the op computes the output in another layout.
  for (const auto& [in_name, out_name] : options.tied) {
    const std::size_t vi = static_cast<std::size_t>(g.find(in_name)), vo = static_cast<std::size_t>(g.find(out_name));
    if (res.from_user[vo]) continue;
    const Sharding& want = res.from_user[vi] ? g.annotations.at(static_cast<int>(vi)).sharding : res.shardings[vi];
    if (want.closed_copy().to_string() != res.shardings[vo].closed_copy().to_string())
      res.tied_layouts.push_back({static_cast<int>(vo), want});
  }
  // Edges: the reshards between the chosen layouts.
  std::vector<double> node_total(ap.problem.nodes.size(), 0);
  for (std::size_t n = 0; n < ap.problem.nodes.size(); ++n)
    node_total[n] = static_cast<double>(ap.problem.nodes[n].cost[static_cast<std::size_t>(sr.plan[n])]) * 1e-12;
  for (const autoshard::Edge& e : ap.problem.edges) {
    const std::size_t nb = ap.problem.nodes[static_cast<std::size_t>(e.b)].cost.size();
    const double s = static_cast<double>(e.cost[static_cast<std::size_t>(sr.plan[static_cast<std::size_t>(e.a)]) * nb +
                                                static_cast<std::size_t>(sr.plan[static_cast<std::size_t>(e.b)])]) * 1e-12;
    res.comm_s += s;
    node_total[static_cast<std::size_t>(e.b)] += s;
  }
  // For the costliest ops: the best strategy not taken, with the rest of the plan as chosen.
  std::vector<std::vector<const autoshard::Edge*>> touching(ap.problem.nodes.size());
  for (const autoshard::Edge& e : ap.problem.edges) {
    touching[static_cast<std::size_t>(e.a)].push_back(&e);
    touching[static_cast<std::size_t>(e.b)].push_back(&e);
  }
  std::vector<std::size_t> order;
  for (std::size_t n = 0; n < ap.problem.nodes.size(); ++n)
    if (ap.node_op[n] >= 0) order.push_back(n);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return node_total[a] > node_total[b]; });
  if (order.size() > 8) order.resize(8);
  for (std::size_t n : order) {
    const auto& node = ap.problem.nodes[n];
    auto cost_with = [&](std::size_t s) {
      double c = static_cast<double>(node.cost[s]);
      for (const autoshard::Edge* e : touching[n]) {
        const std::size_t nb = ap.problem.nodes[static_cast<std::size_t>(e->b)].cost.size();
        const std::size_t sa = static_cast<std::size_t>(e->a) == n ? s : static_cast<std::size_t>(sr.plan[static_cast<std::size_t>(e->a)]);
        const std::size_t sb = static_cast<std::size_t>(e->b) == n ? s : static_cast<std::size_t>(sr.plan[static_cast<std::size_t>(e->b)]);
        c += static_cast<double>(e->cost[sa * nb + sb]);
      }
      return c * 1e-12;
    };
    const std::size_t chosen = static_cast<std::size_t>(sr.plan[n]);
    RejectedAlternative alt;
    alt.op = ap.node_op[n];
    alt.chosen = strategies[n][chosen].out;
    alt.chosen_s = cost_with(chosen);
    double best = -1;
    for (std::size_t s = 0; s < node.cost.size(); ++s) {
      if (s == chosen) continue;
      const double c = cost_with(s);
      if (best < 0 || c < best) {
        best = c;
        alt.alternative = strategies[n][s].out;
      }
    }
    alt.alternative_s = best;
    if (best >= 0) res.alternatives.push_back(alt);
  }
  return res;
}

// The peak bytes per device of the program load() runs for `annotated` (lowered, each tied
// output written into its input counted once, as a Trainer loads it).
int64_t program_peak(const Graph& annotated, const Mesh& mesh, const AutoShardOptions& options) {
  const Compilation exe = compile_graph(annotated, mesh);
  Program low = lower_program(exe.compiled.program, false, {});
  plan_donations(low, exe.graph, options.tied);
  return low.memory_plan().peak_bytes();
}

// With a budget, the formulation's memory (each value from its op to its last use in graph
// order, before fusion and scheduling) is an estimate; the lowered program's memory plan is
// what runs. So the plan is checked there, and while the two disagree about the budget the
// solver's limit is rescaled by this plan's ratio of estimate to program (never to a limit
// whose plan's program was over the budget) and the problem solved again (at most five more
// times: under load a search cut short ended the gpt_train model 0.05% over 2 MB after four;
// with a time limit, only while a solve and a check of its program still fit in what is left).
// Kept: the cheapest plan whose program fits, else the one of least program memory.
void fit_budget(const Graph& g, const Mesh& mesh, const AutoShardOptions& options, AutoShardProblem& ap,
                const std::vector<std::vector<Strategy>>& strategies, const autoshard::RepeatClasses& classes,
                const SolveLimit& clock, AutoShardResult& res) {
  const int64_t budget = options.memory_budget_bytes;
  auto cost = [](const AutoShardResult& r) { return r.compute_s + r.comm_s; };
  std::optional<AutoShardResult> best, least;
  AutoShardResult cur = res;
  double solve_s = 0;
  int solves = 1;
  bool out_of_time = false;
  int64_t ceiling = std::numeric_limits<int64_t>::max();  // the least limit whose plan's program was over the budget
  // A check compiles and lowers the whole program: on large graphs it takes far longer than
  // the formulation (the 96-layer GPT-3 step on 64 devices on a 2-core Xeon: about 12x, once).
  // With a time limit a check is made only when it fits in what is left: predicted from the
  // formulation's time before the first, from the last one's after.
  constexpr double kCheckOverFormulation = 15;
  constexpr int kMaxSolves = 6;
  double check_s = kCheckOverFormulation * res.formulate_s;
  auto check_fits_in_time = [&] { return !clock.timed() || clock.left() >= check_s; };
  if (!check_fits_in_time()) {
    res.solver += fmt::format(
        "; the program's peak was not checked against the budget (a check would take about {:.1f} s, beyond the "
        "{} s time limit): `fits` is the solver's estimate, and compile() checks the program it builds",
        check_s, clock.limit_s);
    return;
  }
  while (true) {
    solve_s += cur.solve_s;
    double check_start = clock.elapsed();
    cur.program_peak_bytes = program_peak(cur.annotated(g), mesh, options);
    check_s = clock.elapsed() - check_start;
    // The solver's memory leaves out the copies an op's operands are resharded into while it
    // runs, so the plan's own strategies can need more than the partitioner's choice of each
    // op's factors for the same layouts (the gpt_train model's least plan: 1.65 against 1.45
    // MB). Over the budget, the plan without its strategies is tried too and kept if smaller
    // (with a time limit, when that check fits in what is left).
    if (cur.program_peak_bytes > budget && check_fits_in_time()) {
      AutoShardResult own = cur;
      for (auto& f : own.op_factors) f.clear();
      check_start = clock.elapsed();
      own.program_peak_bytes = program_peak(own.annotated(g), mesh, options);
      check_s = std::max(check_s, clock.elapsed() - check_start);
      if (own.program_peak_bytes < cur.program_peak_bytes) cur = std::move(own);
    }
    const bool fits = cur.program_peak_bytes <= budget;
    if (fits && (!best || cost(cur) < cost(*best))) best = cur;
    if (!least || cur.program_peak_bytes < least->program_peak_bytes) least = cur;
    // Done when the estimate and the program agree about the budget (both over it: even the
    // least memory the solver found does not fit the program), or after kMaxSolves solves.
    if (fits == cur.fits || solves == kMaxSolves) break;
    // Another solve and its check must fit in what is left of the limit (the check as long as
    // the last one took), else the best plan so far is the answer.
    if (clock.timed() && clock.left() < 0.05 * clock.limit_s + check_s) {
      out_of_time = true;
      break;
    }
    const double program = static_cast<double>(std::max<int64_t>(1, cur.program_peak_bytes));
    const int64_t limit = *ap.problem.usage_limit;
    if (!fits) ceiling = std::min(ceiling, limit);
    // Rescaled by this plan's ratio of estimate to program, but never back to a limit whose plan's
    // program was over the budget: the ratio differs from plan to plan, and a plan whose program
    // fits with its estimate over the limit rescales the limit up.
    const int64_t next = std::min(
        ceiling - 1, static_cast<int64_t>(static_cast<double>(budget) * static_cast<double>(cur.peak_bytes) / program));
    if (next == limit || next <= 0) break;
    ap.problem.usage_limit = next;
    cur = solve_formulated(g, options, ap, strategies, classes, clock.next_solve());
    ++solves;
  }
  ap.problem.usage_limit = budget;
  AutoShardResult out = best ? *best : *least;
  out.formulate_s = res.formulate_s;
  out.solve_s = solve_s;
  out.fits = best.has_value();
  if (solves > 1) out.solver += fmt::format("; {} solves to fit the budget in the lowered program", solves);
  if (out_of_time)
    out.solver += fmt::format("; stopped fitting the budget at the {} s time limit after {} solve{}", clock.limit_s,
                              solves, solves == 1 ? "" : "s");
  res = std::move(out);
}

}  // namespace

AutoShardResult auto_shard(const Graph& g, const Mesh& mesh, const AutoShardOptions& options) {
  check_auto_shard_input(g, mesh, options);
  SolveLimit clock;
  clock.start = SolveLimit::Clock::now();
  clock.limit_s = options.time_limit_s;
  const auto t0 = clock.start;
  std::vector<std::vector<Strategy>> strategies;
  Formulation f(g, mesh, options);
  AutoShardProblem ap = f.run(strategies);
  const auto t1 = std::chrono::steady_clock::now();
  // Repeated layers: one decision per class of alike nodes (repeats.hpp), solved on its own
  // and checked on the whole problem, beside the search over every node; the better is kept.
  // The classes start from what makes two nodes interchangeable: the op, the value's type and
  // the strategies' costs and memory.
  std::vector<uint64_t> colors(ap.problem.nodes.size());
  for (std::size_t n = 0; n < colors.size(); ++n) {
    const Value& v = g.values[static_cast<std::size_t>(ap.node_value[n])];
    std::string key = fmt::format("{}|{}|{}|", ap.node_op[n] < 0 ? -1 : static_cast<int>(g.ops[static_cast<std::size_t>(ap.node_op[n])].kind),
                                  dtype_name(v.dtype), fmt::join(v.shape, ","));
    uint64_t h = std::hash<std::string>{}(key);
    for (int64_t c : ap.problem.nodes[n].cost) h = h * 1000003ULL ^ static_cast<uint64_t>(c);
    for (int64_t u : ap.problem.nodes[n].usage) h = h * 1000003ULL ^ static_cast<uint64_t>(u);
    colors[n] = h;
  }
  const autoshard::RepeatClasses classes = autoshard::repeat_classes(ap.problem, std::move(colors), 4);
  clock.automatic_s = std::max(0.5, 1.5e-4 * static_cast<double>(ap.problem.nodes.size()));
  AutoShardResult res = solve_formulated(g, options, ap, strategies, classes, clock.next_solve());
  res.formulate_s = std::chrono::duration<double>(t1 - t0).count();
  if (options.memory_budget_bytes > 0) fit_budget(g, mesh, options, ap, strategies, classes, clock, res);
  res.cost = options.cost;
  // Over the limit only when the formulation (which a plan cannot do without) took most of it:
  // said, never silent.
  if (clock.timed() && clock.elapsed() > 1.5 * clock.limit_s + 1)
    res.solver += fmt::format("; answered in {:.2f} s, over the {} s time limit (the formulation took {:.2f} s, "
                              "the solves {:.2f} s; give a longer limit)",
                              clock.elapsed(), clock.limit_s, res.formulate_s, res.solve_s);
  return res;
}

Graph AutoShardResult::annotated(const Graph& g) const {
  Graph out = g.clone();
  for (std::size_t v = 0; v < g.values.size() && v < shardings.size(); ++v)
    if (!from_user[v] && shardings[v].rank() == static_cast<int>(g.values[v].shape.size()))
      out.annotate(static_cast<int>(v), shardings[v].closed_copy());
  // Each op's chosen strategy, so that the partitioner computes it as the plan priced it.
  for (std::size_t k = 0; k < g.ops.size() && k < op_factors.size(); ++k) out.ops[k].factor_axes = op_factors[k];
  // A tied output computed in another layout than its input's: an identity (a reshape to the
  // same shape) in the input's layout takes its name and its place among the outputs, so the
  // partitioner computes the op as chosen and reshards that one value, as the plan priced it.
  for (const auto& [v, want] : tied_layouts) {
    const std::string name = out.values[static_cast<std::size_t>(v)].name;
    Tensor computed = out.tensor(v).named(name + ".computed");
    Tensor tied = reshape(computed, out.values[static_cast<std::size_t>(v)].shape).named(name);
    out.annotate(tied, want.closed_copy());
    out.expect_gathers(tied);
    for (int& o : out.outputs)
      if (o == v) o = tied.id;
  }
  return out;
}

std::string AutoShardResult::layouts_text(const Graph& g) const {
  std::string out;
  for (std::size_t v = 0; v < g.values.size() && v < shardings.size(); ++v) {
    if (from_user[v]) continue;
    out += fmt::format("%{} sharding={}\n", g.values[v].name, shardings[v].closed_copy().to_string());
  }
  return out;
}

}  // namespace tessel
