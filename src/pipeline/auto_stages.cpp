// choose_stage_cuts (pipeline/auto_stages.hpp): the pieces priced by the cost model, then the
// linear-partition dynamic program over them.
#include "tessel/pipeline/auto_stages.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "tessel/executable.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/pipeline/stages.hpp"

namespace tessel {

namespace {

// A piece's program as load() runs it (lowered: fused kernels, combined collectives), priced as
// the planner prices a step: roofline compute, collectives, and a dispatch per instruction.
double predicted_seconds(const Graph& g, const Mesh& mesh, const CostModel& cost) {
  const Executable exe = compile(g, mesh);
  const Program low = lower_program(exe.program());
  return low.compute_seconds(cost) + low.comm_seconds(cost) + low.dispatch_seconds(cost);
}

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

StageCut choose_stage_cuts(const Graph& g, Tensor loss, const std::vector<Tensor>& params,
                           const std::vector<Tensor>& candidates, int64_t stages, int64_t micro,
                           const Mesh& stage_mesh, const CostModel& cost) {
  const int64_t n = static_cast<int64_t>(candidates.size()) + 1;  // pieces
  if (stages < 1 || micro < 1)
    throw Error(fmt::format("choose_stage_cuts: {} stages and {} micro-batches (give at least 1 of each)", stages, micro));
  if (n < stages)
    throw Error(fmt::format("choose_stage_cuts: {} candidate cuts make {} pieces, fewer than the {} stages", n - 1, n,
                            stages));
  StageCut out;
  std::vector<PipelineStage> pieces = split_stages(g, loss, params, candidates);
  for (PipelineStage& p : pieces) {
    p.forward.mesh = stage_mesh;
    p.backward.mesh = stage_mesh;
    out.piece_s.push_back(predicted_seconds(p.forward, stage_mesh, cost) + predicted_seconds(p.backward, stage_mesh, cost));
  }
  // best[k][j]: the least max stage time of pieces [0, j) in k stages; from[k][j]: where its last
  // stage starts.
  std::vector<double> prefix(static_cast<std::size_t>(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[static_cast<std::size_t>(i) + 1] = prefix[static_cast<std::size_t>(i)] + out.piece_s[static_cast<std::size_t>(i)];
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<std::size_t>(stages) + 1,
                                        std::vector<double>(static_cast<std::size_t>(n) + 1, inf));
  std::vector<std::vector<int64_t>> from(best.size(), std::vector<int64_t>(static_cast<std::size_t>(n) + 1, -1));
  best[0][0] = 0;
  for (int64_t k = 1; k <= stages; ++k)
    for (int64_t j = k; j <= n; ++j)
      for (int64_t i = k - 1; i < j; ++i) {
        const double prev = best[static_cast<std::size_t>(k - 1)][static_cast<std::size_t>(i)];
        if (prev == inf) continue;
        const double v = std::max(prev, prefix[static_cast<std::size_t>(j)] - prefix[static_cast<std::size_t>(i)]);
        if (v < best[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)]) {
          best[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)] = v;
          from[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)] = i;
        }
      }
  std::vector<int64_t> bounds(static_cast<std::size_t>(stages) + 1);
  bounds.back() = n;
  for (int64_t k = stages; k >= 1; --k)
    bounds[static_cast<std::size_t>(k - 1)] = from[static_cast<std::size_t>(k)][static_cast<std::size_t>(bounds[static_cast<std::size_t>(k)])];
  for (int64_t k = 1; k < stages; ++k) out.cuts.push_back(candidates[static_cast<std::size_t>(bounds[static_cast<std::size_t>(k)] - 1)]);
  out.pieces = counts(bounds);
  out.stage_s = stage_times(out.piece_s, bounds);
  out.step_s = step_of(out.stage_s, micro);
  // The equal cut: at candidate s·(n - 1)/stages (a transformer's equal-layers cut when the
  // candidates are x0 and every block's output but the last).
  std::vector<int64_t> eq(static_cast<std::size_t>(stages) + 1, n);
  eq[0] = 0;
  for (int64_t s = 1; s < stages; ++s) eq[static_cast<std::size_t>(s)] = s * (n - 1) / stages + 1;
  out.equal_pieces = counts(eq);
  out.equal_step_s = step_of(stage_times(out.piece_s, eq), micro);
  out.why = fmt::format("chosen {}; equal cut {}", describe(out.pieces, out.stage_s, out.step_s),
                        describe(out.equal_pieces, stage_times(out.piece_s, eq), out.equal_step_s));
  return out;
}

}  // namespace tessel
