// choose_stage_cuts (pipeline/auto_stages.hpp): the pieces priced by the cost model, then the
// linear-partition dynamic program over them.
#include "tessel/pipeline/auto_stages.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <set>

#include "tessel/executable.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/pipeline/stages.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"

namespace tessel {

namespace {

// The stage times of the cut that gives stage s pieces [bounds[s], bounds[s + 1]).
std::vector<double> stage_times(const std::vector<double>& piece_s, const std::vector<int64_t>& bounds) {
  std::vector<double> t;
  for (std::size_t s = 0; s + 1 < bounds.size(); ++s) {
    double x = 0;
    for (int64_t i = bounds[s]; i < bounds[s + 1]; ++i) x += piece_s[static_cast<std::size_t>(i)];
    t.push_back(x);
  }
  return t;
}

double step_of(const std::vector<double>& t, int64_t micro) {
  double sum = 0, mx = 0;
  for (double x : t) {
    sum += x;
    mx = std::max(mx, x);
  }
  return sum + static_cast<double>(micro - 1) * mx;
}

std::vector<int64_t> counts(const std::vector<int64_t>& bounds) {
  std::vector<int64_t> c;
  for (std::size_t s = 0; s + 1 < bounds.size(); ++s) c.push_back(bounds[s + 1] - bounds[s]);
  return c;
}

std::string describe(const std::vector<int64_t>& pieces, const std::vector<double>& t, double step) {
  std::vector<std::string> parts;
  for (std::size_t s = 0; s < t.size(); ++s) parts.push_back(fmt::format("{} pieces {:.3g} us", pieces[s], t[s] * 1e6));
  return fmt::format("[{}] -> step {:.3g} us", fmt::join(parts, ", "), step * 1e6);
}

}  // namespace

std::vector<Tensor> single_value_cuts(Graph& g, const std::vector<Tensor>& params) {
  const std::size_t n = g.values.size();
  std::vector<int> last_use(n, -1);
  std::vector<bool> free(n, false);  // made from the parameters and constants alone
  for (const Tensor& p : params) free.at(static_cast<std::size_t>(p.id)) = true;
  for (std::size_t o = 0; o < g.ops.size(); ++o) {
    const Op& op = g.ops[o];
    bool f = true;
    for (int v : op.inputs) {
      last_use[static_cast<std::size_t>(v)] = static_cast<int>(o);
      f = f && free[static_cast<std::size_t>(v)];
    }
    if (op.kind != OpKind::Input)
      for (int v : op.results()) free[static_cast<std::size_t>(v)] = f;
  }
  std::vector<Tensor> out;
  std::vector<int> live;  // values made so far (not free) that a later op reads
  for (std::size_t o = 0; o < g.ops.size(); ++o) {
    const Op& op = g.ops[o];
    if (op.kind == OpKind::Input) continue;  // a graph input: each stage reads its own
    for (int v : op.results())
      if (!free[static_cast<std::size_t>(v)]) live.push_back(v);
    live.erase(std::remove_if(live.begin(), live.end(),
                              [&](int v) { return last_use[static_cast<std::size_t>(v)] <= static_cast<int>(o); }),
               live.end());
    if (op.num_results() == 1 && live.size() == 1 && live[0] == op.output) out.push_back(g.tensor(op.output));
  }
  return out;
}

std::vector<Mesh> mesh_shapes(const Mesh& mesh, const std::vector<std::string>& axes) {
  std::vector<int> at;
  int64_t total = 1;
  for (const std::string& a : axes) {
    at.push_back(mesh.axis_index(a));
    if (at.back() < 0) throw Error(fmt::format("mesh_shapes: the mesh {} has no axis '{}'", mesh.to_string(), a));
    total *= mesh.axis_size(a);
  }
  std::vector<Mesh> out = {mesh};
  // Every assignment of divisors of `total` to the axes whose product is `total`.
  std::vector<int64_t> sizes(axes.size(), 1);
  auto rec = [&](auto&& self, std::size_t k, int64_t left) -> void {
    if (k + 1 >= axes.size()) {
      if (!axes.empty()) sizes[k] = left;
      std::vector<MeshAxis> ax = mesh.axes();
      for (std::size_t i = 0; i < axes.size(); ++i) ax[static_cast<std::size_t>(at[i])].size = sizes[i];
      Mesh m(ax);
      if (m.to_string() != mesh.to_string()) out.push_back(std::move(m));
      return;
    }
    for (int64_t d = 1; d <= left; ++d)
      if (left % d == 0) {
        sizes[k] = d;
        self(self, k + 1, left / d);
      }
  };
  if (!axes.empty()) rec(rec, 0, total);
  return out;
}

StageCut choose_stage_cuts(const Graph& g, Tensor loss, const std::vector<Tensor>& params,
                           const std::vector<Tensor>& candidates, int64_t stages, int64_t micro,
                           const Mesh& stage_mesh, const CostModel& cost) {
  StageCutOptions o;
  o.meshes = {stage_mesh};
  return choose_stage_cuts(g, loss, params, candidates, stages, micro, o, cost);
}

namespace {

// `g` with every value named in `layouts` annotated so (the user's own annotations among them:
// auto_shard keeps them).
Graph laid_out(const Graph& g, const std::map<std::string, Sharding>& layouts) {
  Graph out = g.clone();
  for (std::size_t v = 0; v < out.values.size(); ++v) {
    auto it = layouts.find(out.values[v].name);
    if (it != layouts.end()) out.annotate(static_cast<int>(v), it->second);
  }
  return out;
}

// Each piece's forward planned by auto_shard on `mesh`: the layout of every value, by name (a
// value two pieces hold, the one they pass or a tied parameter, keeps the first piece's). With a
// runtime over several processes (the pieces timed on it), each plan is the runtime's rank 0's
// (agree_on_plan): its processes must load one program.
std::map<std::string, Sharding> plan_pieces(std::vector<PipelineStage>& pieces, const Mesh& mesh,
                                            const AutoShardOptions& ao, Runtime* rt) {
  std::map<std::string, Sharding> out;
  for (PipelineStage& p : pieces) {
    p.forward.mesh = mesh;
    const AutoShardResult r = agree_on_plan(rt, auto_shard(p.forward, mesh, ao), p.forward);
    for (std::size_t v = 0; v < p.forward.values.size() && v < r.shardings.size(); ++v)
      out.emplace(p.forward.values[v].name, r.shardings[v]);
  }
  return out;
}

// A piece on one mesh: its predicted seconds and its memory per device.
struct PiecePrice {
  double seconds = 0;
  int64_t state_bytes = 0;  // its parameters', gradient accumulators' and AdamW moments' (f32)
  int64_t kept_bytes = 0;   // one micro-batch's kept inputs (what its forward reads besides parameters)
                            // and, with remat none, its kept activations
  int64_t work_bytes = 0;   // its backward's working memory (the planned arena)
};

// The median over `runs` of the forward's and the backward's run times on `rt`, on seeded random
// inputs (in range where they feed an embedding or a loss: random_inputs), after one warm-up.
double measure_piece(const Executable& f, const Executable& b, const PipelineStage& p, Runtime& rt, int runs) {
  std::vector<LoadedExecutable> loaded;
  std::vector<std::vector<ShardedArray>> inputs;
  for (const Executable* e : {&f, &b}) {
    loaded.push_back(load(*e, rt));
    inputs.push_back(loaded.back().to_device(random_inputs(e == &f ? p.forward : p.backward, 2027)));
  }
  std::vector<double> t;
  for (int r = 0; r <= runs; ++r) {
    double s = 0;
    for (std::size_t k = 0; k < loaded.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      loaded[k].run(inputs[k]);
      s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (r > 0) t.push_back(s);  // run 0 warms up
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

PiecePrice price_piece(PipelineStage& p, const Mesh& mesh, const CostModel& cost, Runtime* rt, int runs,
                       RematPolicy remat) {
  PiecePrice out;
  // As the stage will run: with remat none the forward outputs what the backward reads and the
  // backward is the gradient ops alone.
  if (remat == RematPolicy::none) p = keep_activations(std::move(p));
  p.forward.mesh = mesh;
  p.backward.mesh = mesh;
  const Executable f = compile(p.forward, mesh), b = compile(p.backward, mesh);
  for (const Executable* e : {&f, &b}) {
    const Program low = lower_program(e->program());
    if (!rt) out.seconds += low.compute_seconds(cost) + low.comm_seconds(cost) + low.dispatch_seconds(cost);
    if (e == &b) out.work_bytes = low.memory.arena_bytes;
  }
  if (rt) out.seconds = measure_piece(f, b, p, *rt, runs);
  const std::set<std::string> ps(p.params.begin(), p.params.end());
  const Program& fp = f.program();
  for (int v : fp.inputs) {
    const LocalValue& lv = fp.values[static_cast<std::size_t>(v)];
    if (ps.count(lv.name)) {
      // The parameter, its accumulator and two moments in f32 (each in the parameter's layout).
      out.state_bytes += lv.bytes() + 3 * num_bytes(lv.shape, DType::f32);
    } else {
      out.kept_bytes += lv.bytes();
    }
  }
  // The kept activations: the forward's outputs named in `saved`, by the graph's output names
  // (the program's own value may be a reshard of it under another name).
  const std::set<std::string> saved(p.saved.begin(), p.saved.end());
  for (std::size_t o = 0; o < fp.outputs.size() && o < p.forward.outputs.size(); ++o)
    if (saved.count(p.forward.values[static_cast<std::size_t>(p.forward.outputs[o])].name))
      out.kept_bytes += fp.values[static_cast<std::size_t>(fp.outputs[o])].bytes();
  return out;
}

}  // namespace

StageCut choose_stage_cuts(const Graph& g, Tensor loss, const std::vector<Tensor>& params,
                           const std::vector<Tensor>& candidates, int64_t stages, int64_t micro,
                           const StageCutOptions& options, const CostModel& cost) {
  const int64_t n = static_cast<int64_t>(candidates.size()) + 1;  // pieces
  if (stages < 1 || micro < 1)
    throw Error(fmt::format("choose_stage_cuts: {} stages and {} micro-batches (give at least 1 of each)", stages, micro));
  if (n < stages)
    throw Error(fmt::format("choose_stage_cuts: {} candidate cuts make {} pieces, fewer than the {} stages", n - 1, n,
                            stages));
  if (options.meshes.empty()) throw Error("choose_stage_cuts: no stage mesh given (StageCutOptions::meshes)");
  if (options.remat == RematPolicy::einsums)
    throw Error("choose_stage_cuts: remat einsums is not supported within pipeline stages (StageCutOptions::remat: "
                "none keeps each stage's activations, all recomputes its forward)");
  if (options.runtime && options.measure_runs < 1)
    throw Error(fmt::format("choose_stage_cuts: measure_runs {} (give at least 1 timed run per piece)",
                            options.measure_runs));
  for (const Mesh& m : options.meshes)
    if (m.num_devices() != options.meshes[0].num_devices())
      throw Error(fmt::format("choose_stage_cuts: the stage meshes {} and {} have different device counts (a stage's "
                              "shapes must share its devices)",
                              options.meshes[0].to_string(), m.to_string()));
  StageCut out;
  std::vector<PipelineStage> pieces = split_stages(g, loss, params, candidates);
  // The configurations a stage may take: each mesh shape in the graph's own layouts and, with
  // auto_shard, each shape in the layouts planned for it (both are priced, and each stage takes
  // the faster: a plan made piece by piece may price worse than the propagated layouts).
  // price[k][i]: piece i in configuration k.
  std::vector<std::size_t> cfg_mesh;                      // per configuration: its shape
  std::vector<std::map<std::string, Sharding>> planned;   // per configuration: its plan (empty: own)
  std::vector<std::string> unplanned;  // shapes automatic sharding could not plan, and why
  for (std::size_t m = 0; m < options.meshes.size(); ++m) {
    cfg_mesh.push_back(m);
    planned.emplace_back();
    if (!options.auto_shard) continue;
    std::vector<PipelineStage> fresh = split_stages(g, loss, params, candidates);
    // A shape automatic sharding cannot plan (e.g. the graph's own annotation splits a dim
    // unevenly there, which only the partitioner's padding handles) keeps the graph's layouts.
    try {
      std::map<std::string, Sharding> plan = plan_pieces(fresh, options.meshes[m], *options.auto_shard, options.runtime);
      cfg_mesh.push_back(m);
      planned.push_back(std::move(plan));
    } catch (const Error& e) {
      unplanned.push_back(fmt::format("{} (the graph's own layouts: {})", options.meshes[m].to_string(), e.what()));
    }
  }
  const std::size_t K = cfg_mesh.size();
  std::vector<std::vector<PiecePrice>> price(K);
  auto handles = [](Graph& to, const std::vector<Tensor>& ts) {
    std::vector<Tensor> out;
    for (const Tensor& t : ts) out.push_back(to.tensor(t.id));
    return out;
  };
  for (std::size_t k = 0; k < K; ++k) {
    std::vector<PipelineStage> mine;
    if (!planned[k].empty()) {
      Graph gk = laid_out(g, planned[k]);
      mine = split_stages(gk, gk.tensor(loss.id), handles(gk, params), handles(gk, candidates));
    }
    std::vector<PipelineStage>& ps = planned[k].empty() ? pieces : mine;
    for (PipelineStage& p : ps)
      price[k].push_back(
          price_piece(p, options.meshes[cfg_mesh[k]], cost, options.runtime, options.measure_runs, options.remat));
  }
  for (const PiecePrice& pp : price[0]) out.piece_s.push_back(pp.seconds);

  // A stage of pieces [i, j) as the s-th (0-based) of the pipeline: its best mesh (least time
  // among those within the budget), its time and bytes; time infinite when none fits.
  const double inf = std::numeric_limits<double>::infinity();
  auto in_flight = [&](int64_t s) {
    return options.schedule == ScheduleKind::GPipe ? micro : std::min(micro, stages - s);
  };
  struct Choice {
    double seconds = std::numeric_limits<double>::infinity();
    int64_t bytes = 0;
    std::size_t mesh = 0;
  };
  int64_t least_bytes = std::numeric_limits<int64_t>::max();
  auto stage_on = [&](std::size_t k, int64_t i, int64_t j, int64_t s) {
    Choice c;
    c.mesh = k;
    int64_t state = 0, kept = 0, work = 0;
    double t = 0;
    for (int64_t q = i; q < j; ++q) {
      const PiecePrice& pp = price[k][static_cast<std::size_t>(q)];
      t += pp.seconds;
      state += pp.state_bytes;
      kept += pp.kept_bytes;
      work = std::max(work, pp.work_bytes);
    }
    c.bytes = state + in_flight(s) * kept + work;
    c.seconds = t;
    return c;
  };
  auto best_stage = [&](int64_t i, int64_t j, int64_t s) {
    Choice best;
    for (std::size_t k = 0; k < K; ++k) {
      const Choice c = stage_on(k, i, j, s);
      least_bytes = std::min(least_bytes, c.bytes);
      if (options.memory_budget_bytes > 0 && c.bytes > options.memory_budget_bytes) continue;
      if (c.seconds < best.seconds) best = c;
    }
    return best;
  };
  // best[s][j]: the least max stage time of pieces [0, j) in s stages; from[s][j]: where its
  // last stage starts.
  std::vector<std::vector<double>> best(static_cast<std::size_t>(stages) + 1,
                                        std::vector<double>(static_cast<std::size_t>(n) + 1, inf));
  std::vector<std::vector<int64_t>> from(best.size(), std::vector<int64_t>(static_cast<std::size_t>(n) + 1, -1));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s)
    for (int64_t j = s; j <= n; ++j)
      for (int64_t i = s - 1; i < j; ++i) {
        const double prev = best[static_cast<std::size_t>(s - 1)][static_cast<std::size_t>(i)];
        if (prev == inf) continue;
        const double v = std::max(prev, best_stage(i, j, s - 1).seconds);
        if (v < best[static_cast<std::size_t>(s)][static_cast<std::size_t>(j)]) {
          best[static_cast<std::size_t>(s)][static_cast<std::size_t>(j)] = v;
          from[static_cast<std::size_t>(s)][static_cast<std::size_t>(j)] = i;
        }
      }
  if (best[static_cast<std::size_t>(stages)][static_cast<std::size_t>(n)] == inf) {
    // The budget the least hungry cut needs: the least, over cuts and each stage's shapes, of its
    // largest stage's bytes (the same recursion on bytes).
    const int64_t big = std::numeric_limits<int64_t>::max();
    std::vector<std::vector<int64_t>> need(best.size(), std::vector<int64_t>(static_cast<std::size_t>(n) + 1, big));
    need[0][0] = 0;
    for (int64_t s = 1; s <= stages; ++s)
      for (int64_t j = s; j <= n; ++j)
        for (int64_t i = s - 1; i < j; ++i) {
          const int64_t prev = need[static_cast<std::size_t>(s - 1)][static_cast<std::size_t>(i)];
          if (prev == big) continue;
          int64_t b = big;
          for (std::size_t k = 0; k < K; ++k) b = std::min(b, stage_on(k, i, j, s - 1).bytes);
          int64_t& at = need[static_cast<std::size_t>(s)][static_cast<std::size_t>(j)];
          at = std::min(at, std::max(prev, b));
        }
    throw Error(fmt::format("choose_stage_cuts: no cut into {} stages fits the memory budget of {} bytes per device: "
                            "the least hungry cut needs {} bytes per device on its largest stage (over {} mesh "
                            "shapes; the smallest stage of any cut needs {}); raise the budget to at least that or "
                            "use more stages",
                            stages, options.memory_budget_bytes,
                            need[static_cast<std::size_t>(stages)][static_cast<std::size_t>(n)],
                            options.meshes.size(), least_bytes));
  }
  std::vector<int64_t> bounds(static_cast<std::size_t>(stages) + 1);
  bounds.back() = n;
  for (int64_t s = stages; s >= 1; --s)
    bounds[static_cast<std::size_t>(s - 1)] = from[static_cast<std::size_t>(s)][static_cast<std::size_t>(bounds[static_cast<std::size_t>(s)])];
  for (int64_t s = 1; s < stages; ++s) out.cuts.push_back(candidates[static_cast<std::size_t>(bounds[static_cast<std::size_t>(s)] - 1)]);
  out.pieces = counts(bounds);
  for (int64_t s = 0; s < stages; ++s) {
    const Choice c = best_stage(bounds[static_cast<std::size_t>(s)], bounds[static_cast<std::size_t>(s) + 1], s);
    out.stage_s.push_back(c.seconds);
    out.stage_bytes.push_back(c.bytes);
    out.stage_meshes.push_back(options.meshes[cfg_mesh[c.mesh]]);
    if (options.auto_shard) out.stage_layouts.push_back(planned[c.mesh]);
  }
  out.step_s = step_of(out.stage_s, micro);
  // The equal cut on the first mesh: at candidate s·(n - 1)/stages (a transformer's
  // equal-layers cut when the candidates are x0 and every block's output but the last).
  std::vector<int64_t> eq(static_cast<std::size_t>(stages) + 1, n);
  eq[0] = 0;
  for (int64_t s = 1; s < stages; ++s) eq[static_cast<std::size_t>(s)] = s * (n - 1) / stages + 1;
  out.equal_pieces = counts(eq);
  out.equal_step_s = step_of(stage_times(out.piece_s, eq), micro);
  std::string shapes;
  const bool several = options.meshes.size() > 1;
  if (several) {
    std::vector<std::string> ms;
    for (const Mesh& m : out.stage_meshes) ms.push_back(m.to_string());
    shapes = fmt::format(" on {}", fmt::join(ms, ", "));
  }
  out.why = fmt::format("chosen {}{}; equal cut {}{}", describe(out.pieces, out.stage_s, out.step_s), shapes,
                        describe(out.equal_pieces, stage_times(out.piece_s, eq), out.equal_step_s),
                        several ? " on " + options.meshes[0].to_string() : std::string());
  if (options.runtime)
    out.why += fmt::format(" (each piece timed on the devices: the median of {} runs)", options.measure_runs);
  if (options.auto_shard) {
    // Per stage: its plan, or the graph's own layouts where they priced lower (or no plan was made).
    std::vector<std::string> which;
    for (const auto& l : out.stage_layouts) which.push_back(l.empty() ? "the graph's own" : "planned");
    out.why += fmt::format("; each stage's layouts by automatic sharding for its shape where they price lower than "
                           "the graph's own: {}",
                           fmt::join(which, ", "));
    if (!unplanned.empty()) out.why += fmt::format("; not planned on {}", fmt::join(unplanned, "; "));
  }
  return out;
}

std::vector<PipelineStage> stages_with_layouts(const Graph& g, Tensor loss, const std::vector<Tensor>& params,
                                               const StageCut& cut) {
  if (cut.stage_layouts.empty()) return split_stages(g, loss, params, cut.cuts);
  if (cut.stage_layouts.size() != cut.cuts.size() + 1)
    throw Error(fmt::format("stages_with_layouts: {} stages' layouts for {} cuts (the StageCut of another graph?)",
                            cut.stage_layouts.size(), cut.cuts.size()));
  std::vector<PipelineStage> out;
  for (std::size_t s = 0; s < cut.stage_layouts.size(); ++s) {
    Graph gs = laid_out(g, cut.stage_layouts[s]);  // an empty plan: the graph's own layouts
    std::vector<Tensor> ps, cs;
    for (const Tensor& t : params) ps.push_back(gs.tensor(t.id));
    for (const Tensor& t : cut.cuts) cs.push_back(gs.tensor(t.id));
    std::vector<PipelineStage> all = split_stages(gs, gs.tensor(loss.id), ps, cs);
    out.push_back(std::move(all.at(s)));
  }
  return out;
}

}  // namespace tessel
