// tessel/autoshard/auto_shard.hpp — automatic layouts: tessel chooses the sharding of every value
// of a graph (Alpa's intra-operator search) instead of the user annotating it.
//
//   tessel::AutoShardOptions o;
//   o.memory_budget_bytes = 8ll << 30;                  // per device
//   tessel::AutoShardResult r = tessel::auto_shard(g, mesh, o);
//   tessel::Graph annotated = r.annotated(g);          // every value laid out as chosen
//   tessel::Executable exe = tessel::compile(annotated, mesh);
//   // or: CompileOptions::auto_shard = o; compile(g, mesh, copts)
//
// The formulation (docs/auto-sharding.md) is a strategy-selection problem (problem.hpp):
//  - a node per graph input: its strategies are its layouts (each mesh axis on one dim, or
//    unused, dims split evenly); a user annotation fixes it;
//  - a node per op: its strategies come from the op's factor rule (ops/registry.hpp): each mesh
//    axis on one factor the rule lets be split (pass, reduction, or a combined factor of an op
//    with a distributed form), or unused. A sharded reduction factor leaves the result partial:
//    the strategy then reduces it at once, with an all-reduce, or with a reduce-scatter onto a
//    result dim (the second variant). Node cost: the local kernel's roofline time
//    (CostModel::op_seconds) plus those collectives and a combined factor's statistics;
//  - an edge per operand: the reshard planner's time (plan_reshard, the collectives the
//    partitioner emits) from the producer's layout to the layout the consumer's strategy
//    needs;
//  - memory: each value's local bytes, live from its op to its last use in program order
//    (inputs from the start, outputs to the end; a tied output is written into its input, which
//    stays live to the end in its stead).
// Costs are integer picoseconds. The solver is autoshard::solve (solver.hpp): exact on CBC when
// the problem is small, anytime otherwise. The result's layouts are closed annotations on every
// value the user did not annotate; compile() partitions them as it does hand annotations.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessel/autoshard/problem.hpp"
#include "tessel/core/cost.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/core/sharding.hpp"
#include "tessel/ir/graph.hpp"

namespace tessel {

class Runtime;  // tessel/runtime/runtime.hpp

struct AutoShardOptions {
  // Per device; 0: no limit. The solver's memory is an estimate (values live from their op to
  // their last use in graph order, before fusion): with a budget the plan is compiled and its
  // lowered program's peak decides, the solver's limit rescaled and the problem solved again
  // (at most six solves, each with a compile) while the two disagree.
  int64_t memory_budget_bytes = 0;
  // Seconds of wall clock for the whole call (formulation, solves, and with a budget the
  // compiles that check it): each solve gets 90% of what is left, at least 5% of the limit; a
  // budget check is made only when it fits in what is left (else `solver` says it was not). It
  // holds within 1.5x + 1 s unless the formulation alone takes longer (then `solver` says so;
  // the 96-layer GPT-3 step on 64 devices needs 1.2 s of formulation on a 2-core Xeon).
  // 0: automatic, the solver gets 0.5 s or 0.15 ms per node of the problem, whichever is
  // longer, on top of the formulation (the anytime method needs time in proportion to the graph).
  double time_limit_s = 0;  // (so the plan can differ by run: max_iterations fixes it)
  uint64_t seed = 1;
  // With a budget the plan depends only on the graph, the options and this count (solver.hpp).
  int64_t max_iterations = -1;
  CostModel cost;  // compute and link figures (docs/links.md)
  // Where a caller that holds the runtime (the Trainer, gpt --layouts auto) takes `cost` from.
  // Backend: while `cost` holds the defaults (CostModel{}, an H100's figures), the figures of
  // the backend the program runs on (runtime/backend_cost.hpp: this machine's, measured and
  // cached, for CPU devices; the GPU's for CUDA); figures you set are kept. Given: `cost` as
  // it is, also when it holds the defaults (e.g. to plan for an H100 while running on CPU
  // threads). auto_shard() itself has no runtime: it always plans with `cost`.
  enum class CostFigures { Backend, Given };
  CostFigures cost_figures = CostFigures::Backend;
  // Axes that may only split the dims connected to the listed ones ("tokens:0": dim 0 of input
  // %tokens): e.g. {"data": {"tokens:0", "labels:0"}} keeps `data` on the batch. Dims are
  // connected through the ops' factors (an einsum letter, an elementwise dim).
  std::map<std::string, std::vector<std::string>> axis_only_on;
  // (input, output) pairs whose layouts must agree, e.g. a training step's donations
  // (TrainStep::donations(): the updated parameter is written over the parameter): the
  // output's reshard to the input's layout is part of the cost, and the annotated graph gives
  // the output the input's layout (so a Trainer can donate one to the other).
  std::vector<std::pair<std::string, std::string>> tied;
  // Tail values (no einsum or attention downstream: a training step's weight gradients) have
  // their reductions combined by the lowering (combine-collectives), so each is priced with a
  // share of one collective's latency (alpha / the count of such einsum results) instead of a
  // whole one. false: every reduction pays its own, as in the program before lowering.
  bool combined_tail_reductions = true;
};

// For `tessel-explain --auto`: the best strategy the solver did not take for an op, everything
// else as chosen.
struct RejectedAlternative {
  int op = -1;
  Sharding chosen, alternative;  // the op's result layout
  double chosen_s = 0, alternative_s = 0;  // the op's node cost + its edges, each way
};

struct AutoShardResult {
  std::vector<Sharding> shardings;  // per value of the graph
  std::vector<bool> from_user;      // per value: the user's annotation, kept
  double compute_s = 0;             // predicted: the ops' local roofline time, with their dispatch
  double dispatch_s = 0;            // of compute_s: CostModel::dispatch_seconds per op priced
  double comm_s = 0;                // predicted: the collectives (reshards, reductions)
  int64_t peak_bytes = 0;           // predicted per device (live values' local bytes)
  // With a memory budget: the peak of the program that runs (compiled, lowered, each tied
  // output counted once in its input), which decides `fits`; 0 without a budget.
  int64_t program_peak_bytes = 0;
  std::string solver;               // "exact (CBC)" / "anytime", and its status
  double solve_s = 0, formulate_s = 0;
  int64_t nodes = 0, edges = 0, strategies = 0;
  bool fits = true;  // within memory_budget_bytes: the program's peak (program_peak_bytes)
  std::vector<RejectedAlternative> alternatives;  // the costliest ops, costliest first
  // Tied outputs (AutoShardOptions::tied) the plan computes in another layout than their
  // input's: (the output's value id, the input's layout). annotated() reshards each into it.
  std::vector<std::pair<int, Sharding>> tied_layouts;
  // Per op of the graph, its chosen strategy: per factor of its rule, the mesh axes it is split
  // over (empty for inputs). annotated() sets Op::factor_axes from it.
  std::vector<std::vector<std::vector<std::string>>> op_factors;
  // Which figures priced the plan, in words ("this machine's measured figures (...)"): set by
  // the caller that chose them (the Trainer); "" from auto_shard() itself. Not in to_json.
  std::string cost_source;
  CostModel cost;  // the figures that priced the plan (AutoShardOptions::cost as used); not in to_json

  // The graph with every value the user did not annotate annotated with its chosen layout and
  // every op given its chosen strategy (Op::factor_axes);
  // a tied output computed in another layout than its input's is renamed `<name>.computed`,
  // and an identity (reshape to the same shape) in the input's layout takes its name and its
  // place among the graph's outputs.
  Graph annotated(const Graph& g) const;
  // "%name sharding=[...]" lines, one per input the user did not annotate and one per op
  // result: the layouts as annotations, in the text form (graph_text.hpp).
  std::string layouts_text(const Graph& g) const;
  // The whole result as JSON and back, e.g. to agree on one plan across the processes of a
  // multi-process run (a Trainer adopts rank 0's: a time-limited search can end differently in
  // each process). from_json throws Error when the text is not such a plan or does not fit `g`
  // (value and op counts, layout ranks), naming what differs.
  std::string to_json() const;
  static AutoShardResult from_json(const std::string& text, const Graph& g);
};

// The formulation alone (for tests and tools): the problem, and per node which value it lays
// out and the layout of each strategy.
struct AutoShardProblem {
  autoshard::Problem problem;
  std::vector<int> node_value;                       // per node: the value (input or op result 0)
  std::vector<int> node_op;                          // per node: the op (-1: an input)
  std::vector<std::vector<Sharding>> node_layouts;   // per node, per strategy: the value's layout
};
AutoShardProblem formulate_auto_shard(const Graph& g, const Mesh& mesh, const AutoShardOptions& options);

// Throws Error naming the option (an unknown axis or input, a bad dim) or the graph's problem.
// A memory budget no plan meets is not an error here (the result says so: fits == false, and
// tessel-explain prints that plan); the callers that would run the plan refuse it with
// check_fits.
AutoShardResult auto_shard(const Graph& g, const Mesh& mesh, const AutoShardOptions& options = {});

// Throws Error when `result` does not fit `options.memory_budget_bytes`: "`who`: no plan within
// the memory budget of B bytes per device on mesh M: the least found needs P bytes per device
// (...); give a larger budget, more devices, or recompute activations". compile() with
// CompileOptions::auto_shard and the Trainer call it, so a budget is never dropped silently.
void check_fits(const AutoShardResult& result, const AutoShardOptions& options, const Mesh& mesh,
                const std::string& who);

// The automatic-sharding plan every process of a job uses: rank 0's (this header).
// Each process searches alone, and a time-limited search can end differently in each; the
// processes of one SPMD program need the same layouts. `runtime` nullptr or a single process:
// `mine` itself. Collective over the processes; throws Error when rank 0's plan does not fit
// `g` (AutoShardResult::from_json).
AutoShardResult agree_on_plan(Runtime* runtime, const AutoShardResult& mine, const Graph& g);


}  // namespace tessel
