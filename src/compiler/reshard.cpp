// Reshard planner: candidate plans from A to B, the cheapest by the cost model wins.
#include "tessel/compiler/reshard.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace tessel {
namespace {

using Axes = std::vector<std::string>;

bool is_prefix(const Axes& a, const Axes& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

bool contains(const Axes& a, const std::string& x) {
  return std::find(a.begin(), a.end(), x) != a.end();
}

struct Builder {
  const Mesh& mesh;
  const Shape& global;
  DType dtype;
  const CostModel& cost;
  Sharding cur;
  ReshardPlan plan;

  int64_t local_bytes(const Sharding& s) const {
    return num_elements(s.local_shape(mesh, global)) * static_cast<int64_t>(dtype_size(dtype));
  }
  void push(ReshardStep st) {
    // A collective over a group of one device moves nothing: it only relabels the layout
    // (e.g. an axis of size 1 moving between dims), so it becomes a free local step.
    if (st.kind == InstrKind::Collective && st.collective != CollectiveKind::CollectivePermute &&
        mesh.axes_size(st.axes) == 1) {
      st.kind = InstrKind::ShardSlice;
      st.axes.clear();
      st.dim = 0;
      st.dim2 = -1;
      st.bytes = 0;
    }
    if (st.kind == InstrKind::Collective)
      st.seconds = st.collective == CollectiveKind::CollectivePermute
                       ? cost.link(st.axes).alpha_s +
                             static_cast<double>(st.bytes) / cost.link(st.axes).bandwidth
                       : cost.collective_seconds(st.collective, mesh, st.axes, st.bytes);
    plan.seconds += st.seconds;
    cur = st.after;
    plan.steps.push_back(std::move(st));
  }
  void slice(int dim, const Axes& axes) {
    ReshardStep st;
    st.kind = InstrKind::ShardSlice;
    st.axes = axes;
    st.dim = dim;
    st.after = cur;
    for (const auto& a : axes) st.after.dims[dim].axes.push_back(a);
    push(std::move(st));
  }
  void all_gather(int dim, const Axes& suffix) {
    ReshardStep st;
    st.collective = CollectiveKind::AllGather;
    st.axes = suffix;
    st.dim = dim;
    st.after = cur;
    auto& ax = st.after.dims[dim].axes;
    ax.resize(ax.size() - suffix.size());
    st.bytes = local_bytes(st.after);
    push(std::move(st));
  }
  void reduce_scatter(int dim, const Axes& axes) {
    ReshardStep st;
    st.collective = CollectiveKind::ReduceScatter;
    st.axes = axes;
    st.dim = dim;
    st.bytes = local_bytes(cur);
    st.after = cur;
    for (const auto& a : axes) {
      st.after.dims[dim].axes.push_back(a);
      st.after.partial.erase(std::find(st.after.partial.begin(), st.after.partial.end(), a));
    }
    push(std::move(st));
  }
  void all_reduce(const Axes& axes) {
    ReshardStep st;
    st.collective = CollectiveKind::AllReduce;
    st.axes = axes;
    st.bytes = local_bytes(cur);
    st.after = cur;
    for (const auto& a : axes)
      st.after.partial.erase(std::find(st.after.partial.begin(), st.after.partial.end(), a));
    push(std::move(st));
  }
  void all_to_all(const std::string& x, int split_dim, int concat_dim) {
    ReshardStep st;
    st.collective = CollectiveKind::AllToAll;
    st.axes = {x};
    st.dim = split_dim;
    st.dim2 = concat_dim;
    st.bytes = local_bytes(cur);
    st.after = cur;
    st.after.dims[concat_dim].axes.pop_back();
    st.after.dims[split_dim].axes.push_back(x);
    push(std::move(st));
  }
};

// Mesh axes in mesh order, for stable partial lists.
Axes mesh_order(const Mesh& mesh, Axes axes) {
  std::sort(axes.begin(), axes.end(), [&](const std::string& a, const std::string& b) {
    return mesh.axis_index(a) < mesh.axis_index(b);
  });
  return axes;
}

ReshardPlan greedy(const Mesh& mesh, const Shape& global, DType dtype, const Sharding& from,
                   const Sharding& to, const CostModel& cost, bool use_all_to_all) {
  Builder b{mesh, global, dtype, cost, from, {}};
  const int rank = to.rank();
  for (int iter = 0; iter < 256 && !b.cur.same_layout(to); ++iter) {
    bool progressed = false;
    // 1. Free local slices of axes the target adds and nobody uses yet.
    for (int e = 0; e < rank; ++e) {
      const Axes& ce = b.cur.dims[e].axes;
      const Axes& te = to.dims[e].axes;
      if (!is_prefix(ce, te)) continue;
      Axes add;
      Sharding probe = b.cur;
      for (std::size_t i = ce.size(); i < te.size(); ++i) {
        if (probe.uses_axis(te[i])) break;
        add.push_back(te[i]);
        probe.dims[e].axes.push_back(te[i]);
      }
      if (!add.empty()) {
        b.slice(e, add);
        progressed = true;
      }
    }
    if (progressed) continue;
    // 2. Reduce partial axes: reduce-scatter into a dim that wants them next, else all-reduce.
    Axes pending;
    for (const auto& p : b.cur.partial)
      if (!contains(to.partial, p)) pending.push_back(p);
    if (!pending.empty()) {
      for (int e = 0; e < rank && !progressed; ++e) {
        const Axes& ce = b.cur.dims[e].axes;
        const Axes& te = to.dims[e].axes;
        if (!is_prefix(ce, te)) continue;
        Axes rs;
        for (std::size_t i = ce.size(); i < te.size() && contains(pending, te[i]); ++i)
          rs.push_back(te[i]);
        if (!rs.empty()) {
          b.reduce_scatter(e, rs);
          progressed = true;
        }
      }
      if (progressed) continue;
      b.all_reduce(mesh_order(mesh, pending));
      continue;
    }
    // 3. Remove misplaced axes: all-to-all into the dim that wants them next, else gather.
    for (int e = 0; e < rank && !progressed; ++e) {
      const Axes& ce = b.cur.dims[e].axes;
      const Axes& te = to.dims[e].axes;
      if (is_prefix(ce, te)) continue;
      const std::string x = ce.back();
      if (use_all_to_all) {
        for (int f = 0; f < rank; ++f) {
          if (f == e) continue;
          const Axes& cf = b.cur.dims[f].axes;
          const Axes& tf = to.dims[f].axes;
          if (is_prefix(cf, tf) && cf.size() < tf.size() && tf[cf.size()] == x) {
            b.all_to_all(x, f, e);
            progressed = true;
            break;
          }
        }
        if (progressed) break;
      }
      std::size_t k = 0;
      while (k < ce.size() && k < te.size() && ce[k] == te[k]) ++k;
      Axes suffix(ce.begin() + static_cast<std::ptrdiff_t>(k), ce.end());
      if (use_all_to_all) {
        // Gather only the trailing run that no other dim wants (those may move by all-to-all).
        Axes wanted_elsewhere;
        for (int f = 0; f < rank; ++f)
          if (f != e) wanted_elsewhere.insert(wanted_elsewhere.end(), to.dims[f].axes.begin(), to.dims[f].axes.end());
        std::size_t start = suffix.size();
        while (start > 0 && !contains(wanted_elsewhere, suffix[start - 1])) --start;
        if (start == suffix.size()) start = suffix.size() - 1;  // gather at least the last axis
        suffix.erase(suffix.begin(), suffix.begin() + static_cast<std::ptrdiff_t>(start));
      }
      b.all_gather(e, suffix);
      progressed = true;
    }
    if (!progressed) break;
  }
  if (!b.cur.same_layout(to))
    throw PartitionError(fmt::format("reshard planner could not take {} to {} on mesh {} for "
                                     "shape {}; this is a bug in tessel", from.to_string(),
                                     to.to_string(), mesh.to_string(), shape_str(global)));
  return b.plan;
}

// One collective-permute when every device's target block is held by some device now.
bool permute_plan(const Mesh& mesh, const Shape& global, DType dtype, const Sharding& from,
                  const Sharding& to, const CostModel& cost, ReshardPlan& out) {
  if (!from.partial.empty() || !to.partial.empty()) return false;
  if (from.local_shape(mesh, global) != to.local_shape(mesh, global)) return false;
  int64_t n = mesh.num_devices();
  std::map<std::vector<int64_t>, std::vector<int64_t>> holders;
  for (int64_t q = 0; q < n; ++q) holders[from.local_offset(mesh, global, q)].push_back(q);
  std::vector<bool> used(static_cast<std::size_t>(n), false);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  std::vector<int64_t> need;
  for (int64_t p = 0; p < n; ++p) {
    auto it = holders.find(to.local_offset(mesh, global, p));
    if (it == holders.end()) return false;
    if (std::find(it->second.begin(), it->second.end(), p) != it->second.end()) continue;
    need.push_back(p);
  }
  for (int64_t p : need) {
    auto& hs = holders[to.local_offset(mesh, global, p)];
    bool found = false;
    for (int64_t q : hs)
      if (!used[q]) {
        used[q] = true;
        pairs.push_back({q, p});
        found = true;
        break;
      }
    if (!found) return false;
  }
  out = ReshardPlan{};
  if (pairs.empty()) return true;  // the layouts place the same data on every device
  ReshardStep st;
  st.collective = CollectiveKind::CollectivePermute;
  for (const auto& a : mesh.axes()) st.axes.push_back(a.name);
  st.pairs = std::move(pairs);
  st.after = to.without_partial();
  st.bytes = num_elements(to.local_shape(mesh, global)) * static_cast<int64_t>(dtype_size(dtype));
  LinkSpec l = cost.link(st.axes);
  st.seconds = l.alpha_s + static_cast<double>(st.bytes) / l.bandwidth;
  out.seconds = st.seconds;
  out.steps.push_back(std::move(st));
  return true;
}

}  // namespace

ReshardPlan plan_reshard(const Mesh& mesh, const Shape& global, DType dtype, const Sharding& from,
                         const Sharding& to, const CostModel& cost) {
  if (from.same_layout(to) && to.rank() == static_cast<int>(global.size())) {
    to.validate(mesh, global, "reshard target");
    return {};  // nothing moves (the common case when the partitioner weighs candidates)
  }
  to.validate(mesh, global, "reshard target");
  from.validate(mesh, global, "reshard source");
  for (const auto& p : to.partial)
    if (!contains(from.partial, p))
      throw PartitionError(fmt::format("reshard {} -> {}: cannot make a materialized value "
                                       "partial over '{}'", from.to_string(), to.to_string(), p));
  if (from.same_layout(to)) return {};
  std::vector<ReshardPlan> cands;
  cands.push_back(greedy(mesh, global, dtype, from, to, cost, true));
  cands.push_back(greedy(mesh, global, dtype, from, to, cost, false));
  ReshardPlan perm;
  if (permute_plan(mesh, global, dtype, from, to, cost, perm)) cands.push_back(std::move(perm));
  std::size_t best = 0;
  for (std::size_t i = 1; i < cands.size(); ++i) {
    const auto& c = cands[i];
    const auto& bst = cands[best];
    if (c.seconds < bst.seconds - 1e-15 ||
        (c.seconds <= bst.seconds + 1e-15 && c.steps.size() < bst.steps.size()))
      best = i;
  }
  // Keep the target's open/closed flags on the final layout.
  ReshardPlan out = std::move(cands[best]);
  if (!out.steps.empty()) {
    Sharding fin = to;
    out.steps.back().after = fin;
  }
  return out;
}

std::string ReshardPlan::to_string() const {
  std::vector<std::string> parts;
  for (const auto& s : steps) {
    if (s.kind == InstrKind::ShardSlice)
      parts.push_back(fmt::format("slice(dim {} over {{{}}})", s.dim, join(s.axes, ",")));
    else if (s.collective == CollectiveKind::AllToAll)
      parts.push_back(fmt::format("all-to-all({{{}}} split {} concat {})", join(s.axes, ","), s.dim, s.dim2));
    else
      parts.push_back(fmt::format("{}({{{}}}{})", collective_name(s.collective), join(s.axes, ","),
                                  s.dim >= 0 ? fmt::format(" dim {}", s.dim) : std::string()));
  }
  return parts.empty() ? "no-op" : join(parts, " -> ");
}

}  // namespace tessel
