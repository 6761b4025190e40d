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
// chosen cut gives it fewer layers. What it does not do yet: choose each stage's sub-mesh
// shape, plan each stage's layouts by automatic sharding (the stages keep the graph's own), or
// bound a stage's memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/cost.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/ir/graph.hpp"

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

}  // namespace tessel
