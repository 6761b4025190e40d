// tessel/pipeline/auto_stages.hpp — pipeline stage boundaries chosen by the cost model (issue 39
// item 4, after Alpa's inter-operator pass): the graph is cut at every candidate value into
// pieces (split_stages), each piece's forward and backward programs are compiled for the stage
// mesh, lowered as load() lowers them and priced as the planner prices a step (the kernels'
// roofline, the collectives and a dispatch per instruction, by `cost`), and a dynamic program
// over the pieces
// picks the `stages` - 1 cuts that minimise the pipeline's step, sum(t) + (M - 1) · max(t)
// (t: a stage's forward and backward per micro-batch, the sum of its pieces'). As sum(t) is the
// same for every cut, that is the cut with the least max(t).
//
//   GptGraph m = build_gpt(cfg);
//   std::vector<Tensor> candidates(m.checkpoints.begin(), m.checkpoints.end() - 1);
//   StageCut c = choose_stage_cuts(m.graph, m.loss, m.weights, candidates, 2, 8, mesh, cost);
//   auto stages = split_stages(m.graph, m.loss, m.weights, c.cuts);
//
// A GPT's first stage carries the embedding and its last the final layer norm, the LM head and
// the loss: with a large vocabulary the equal-layers cut overloads the last stage, and the
// chosen cut gives it fewer layers.
//
// With StageCutOptions, each stage also gets its own sub-mesh shape (Alpa's per-stage submesh,
// among shapes of the same device count: data=4 / data=2,model=2 / model=4), the one of least
// time for its pieces, and a stage must fit a memory budget per device: its parameters,
// gradient accumulators and AdamW moments, the kept inputs (with StageCutOptions::remat none also
// the kept activations) of the micro-batches the schedule holds in flight on it (1F1B: P - s on
// stage s; GPipe: all M), and its largest piece's working
// memory (the backward's planned arena). With StageCutOptions::auto_shard each piece is planned by
// automatic sharding on each shape, and a stage takes the plans of its shape.
// With StageCutOptions::runtime the pieces are timed on the devices instead of priced: the cost
// model's roofline misses the kernels' real rates at small shapes, and a cut between two close
// candidates is then chosen by what the machine does (bench/results: the measured cut is the
// faster one where the modelled cut was not).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <map>
#include <optional>

#include "tessel/autoshard/auto_shard.hpp"
#include "tessel/core/cost.hpp"
#include "tessel/core/sharding.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/pipeline/schedule.hpp"
#include "tessel/pipeline/stages.hpp"
#include "tessel/runtime/runtime.hpp"
#include "tessel/train/autodiff.hpp"

namespace tessel {

struct StageCut {
  std::vector<Tensor> cuts;           // the chosen values, in order (stages - 1 of them)
  std::vector<int64_t> pieces;        // per stage: how many pieces (between candidates) it holds
  std::vector<double> stage_s;        // per stage: predicted forward + backward seconds per micro-batch
  std::vector<double> piece_s;        // per piece: its predicted seconds
  double step_s = 0;                  // sum(stage_s) + (micro - 1) · max(stage_s)
  // The same prediction for the cut into pieces as equal as the candidates allow (the
  // equal-layers cut of a transformer), for comparison.
  double equal_step_s = 0;
  std::vector<int64_t> equal_pieces;
  std::string why;                    // both, in words
  std::vector<Mesh> stage_meshes;     // per stage: its sub-mesh shape (StageCutOptions::meshes)
  std::vector<int64_t> stage_bytes;   // per stage: its predicted peak bytes per device (see above)
  // With StageCutOptions::auto_shard: per stage, the layout of every value its pieces hold (by
  // the graph's value names), chosen by automatic sharding for its mesh shape, or an empty map
  // where the graph's own layouts priced lower. Empty without auto_shard. stages_with_layouts()
  // builds the stages with them.
  std::vector<std::map<std::string, Sharding>> stage_layouts;
};

struct StageCutOptions {
  // The shapes a stage's devices may take, each of the same device count (the first is the
  // shape of the equal cut it is compared with). Empty: the stage mesh alone.
  std::vector<Mesh> meshes;
  // The most bytes per device a stage may hold (0: no bound). No cut fitting it is an Error
  // naming the budget and the least a stage needed.
  int64_t memory_budget_bytes = 0;
  // How many micro-batches' kept inputs stage s holds: GPipe all M, 1F1B and interleaved P - s
  // (at most M).
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  // As the stages will run (PipelineOptions::remat): all, each stage's backward recomputes its
  // forward and keeps only a micro-batch's inputs; none, the forward keeps what its backward
  // reads (keep_activations: priced in the kept bytes of every micro-batch in flight) and the
  // backward is the gradient ops alone. einsums is refused (a pipeline stage does not take it).
  RematPolicy remat = RematPolicy::all;
  // Measure instead of model (Alpa profiles its stage candidates the same way): when set, each
  // piece's forward and backward are loaded on this runtime and run on random inputs (a
  // warm-up, then `measure_runs` timed runs of each; the median of their sums is the piece's
  // seconds). The runtime must run the stage meshes (a ThreadRuntime of their device count, or
  // an MpiRuntime every process of which calls choose_stage_cuts alike). What the cost model
  // leaves out, the kernels' real rates at the piece's shapes and the runtime's overhead per
  // instruction and per run, is then in the times. Null: priced by the cost model.
  Runtime* runtime = nullptr;
  int measure_runs = 5;
  // Automatic sharding within each stage (Alpa's intra-operator pass per stage): each piece's
  // forward is planned by auto_shard on every mesh shape (these options: their cost figures,
  // time limit, ...; the graph's own annotations are kept), the whole graph laid out by the
  // pieces' plans, and the pieces priced (or timed) in those layouts beside the graph's own: a
  // stage takes a shape in its plan or in the graph's own layouts, whichever is faster
  // (StageCut::stage_layouts; an empty map: the graph's own). A shape auto_shard refuses (the
  // graph's own annotation uneven there) keeps the graph's layouts; StageCut::why says which.
  // With `runtime` over several processes, every plan is that runtime's rank 0's
  // (agree_on_plan), so its processes time one program; across a pipeline's stages the caller
  // takes one process's answer (gpt_train: rank 0's). Unset: the graph's own layouts.
  std::optional<AutoShardOptions> auto_shard;
};

// The values a graph can be cut at with nothing else crossing: v such that every value an op
// made up to v's op and an op after it reads is v itself (or made from `params` and constants
// alone: a weight's cast, copied into each stage that uses it), and an op after it reads v. In
// op order. For a GPT: the embedding's output, the residual stream between and within blocks
// (after the attention's residual add), the final layer norm's output, the logits.
std::vector<Tensor> single_value_cuts(Graph& g, const std::vector<Tensor>& params);

// Throws Error naming what is wrong: fewer than `stages` pieces, stages or micro < 1, or what
// split_stages throws for the candidates.
StageCut choose_stage_cuts(const Graph& g, Tensor loss, const std::vector<Tensor>& params,
                           const std::vector<Tensor>& candidates, int64_t stages, int64_t micro,
                           const Mesh& stage_mesh, const CostModel& cost);
// The same with each stage's sub-mesh shape chosen among options.meshes and a memory budget.
// Also an Error: meshes of different device counts, or none fitting the budget.
StageCut choose_stage_cuts(const Graph& g, Tensor loss, const std::vector<Tensor>& params,
                           const std::vector<Tensor>& candidates, int64_t stages, int64_t micro,
                           const StageCutOptions& options, const CostModel& cost);

// The stages of `g` cut at `cut.cuts` (split_stages), each in the layouts automatic sharding chose
// for its mesh shape (cut.stage_layouts; with none, the graph's own: split_stages itself). A
// value's gradient takes its layout, as split_stages gives it.
std::vector<PipelineStage> stages_with_layouts(const Graph& g, Tensor loss, const std::vector<Tensor>& params,
                                               const StageCut& cut);

// The shapes of `mesh`'s devices over its axes of `axes` (the other axes kept): every way to
// write the product of those axes' sizes as a product of sizes in that order (data=2,model=2
// gives data=4,model=1; data=2,model=2; data=1,model=4). `mesh` itself first.
std::vector<Mesh> mesh_shapes(const Mesh& mesh, const std::vector<std::string>& axes);

}  // namespace tessel
