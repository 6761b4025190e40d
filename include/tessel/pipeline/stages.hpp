// tessel/pipeline/stages.hpp — a training graph cut into pipeline stages (issue 39 item 1):
// the forward and backward program of each stage, from one global graph of one micro-batch and
// the values where the user cuts it (a transformer's residual stream between blocks:
// build_gpt's GptGraph::checkpoints).
//
//   GptGraph m = build_gpt(cfg);                          // cfg.batch: one micro-batch's rows
//   std::vector<PipelineStage> st = split_stages(m.graph, m.loss, m.weights,
//                                                {m.checkpoints[2]});  // two stages
//
// Stage i holds the ops after cut i (cut 0 is the graph's inputs) up to cut i+1: an op belongs
// to the latest stage among its operands', a cut value is made by the stage before it. An op
// computed from graph inputs alone (a weight's cast, a constant) is copied into every stage
// that uses it. The values a stage makes and the next one uses are sent; they are the cuts for
// a transformer, but may be several. A value used two or more stages after the one that makes
// it is an Error (stages exchange values with their neighbours only), as is a loss made before
// the last stage.
#pragma once

#include <string>
#include <vector>

#include "tessel/ir/graph.hpp"

namespace tessel {

struct PipelineStage {
  // Inputs: the stage's parameters and data inputs (the global graph's inputs it uses, same
  // names and user layouts), then `recv` (the values it gets from the stage before, by their
  // global names). Outputs: `send` (by their global names), and for the last stage the loss.
  Graph forward;
  // The forward recomputed from the same inputs, then its vector-Jacobian product. Inputs
  // after the forward's: "grad.<v>" per sent value v (the next stage's gradient of it, v's
  // type), then "grad.acc.<p>" per parameter p (f32, p's shape: the gradient summed over the
  // earlier micro-batches). Outputs: "grad.<v>" per received float value v (its gradient, v's
  // type), then "next.grad.acc.<p>" per parameter (= grad.acc.<p> + this micro-batch's
  // gradient of the stage's share of the loss, to be donated to grad.acc.<p>).
  Graph backward;
  std::vector<std::string> params;  // the parameters the stage uses (of the `params` given)
  std::vector<std::string> data;    // the other graph inputs it uses (tokens, labels, ...)
  std::vector<std::string> recv;    // values from the stage before (empty for the first)
  std::vector<std::string> send;    // values to the stage after (empty for the last)
  std::string loss;                 // the last stage: the loss's name; else empty
  // keep_activations(): the forward's values the backward reads, output by the forward after
  // its sends (and loss) and inputs of the backward, which then does not recompute the forward.
  // Empty: the backward recomputes the forward from the stage's inputs.
  std::vector<std::string> saved;
  bool activations_kept = false;  // keep_activations() made it (its backward has no forward ops)
};

// The stages of `g` (one micro-batch's forward ending in the scalar float `loss`) cut at `cuts`
// (values of g, in the order they are made: cuts.size() + 1 stages). `params` are the inputs
// the backward differentiates (the weights). A parameter used by several stages (a tied
// embedding) is in each one's `params`: its gradient is the sum of theirs. Throws Error naming
// the cut or value when a cut is not a value of g made by an op, the cuts are out of order, a
// value skips a stage, or the loss is not made by the last stage.
std::vector<PipelineStage> split_stages(const Graph& g, Tensor loss, const std::vector<Tensor>& params,
                                        const std::vector<Tensor>& cuts);

// The stage with its activations kept instead of recomputed (RematPolicy::none within a
// pipeline stage): the forward also outputs every value of its own the backward reads
// (`saved`), and the backward takes them as inputs and keeps only the gradient ops its outputs
// need. A stage it made already (`activations_kept`) is returned as it is.
PipelineStage keep_activations(PipelineStage stage);

// A stage's backward in two programs, for a schedule that splits it (ScheduleKind::ZeroBubbleH1):
// B, the ops its "grad.<v>" outputs (the gradients of the received values, which the stage before
// waits for) need, and W, the ops only its "next.grad.acc.<p>" outputs (the weights' gradients)
// need. W reads B's values it needs (`stash`, outputs of B after its gradients) and whichever of
// the backward's inputs it uses (parameters, data, received values, "grad.<sent>",
// "grad.acc.<p>"), by name; B reads the backward's inputs it uses. A stage that receives no float
// value (the first) has an empty B (no op, no output): its W is the whole backward.
struct SplitBackward {
  Graph input_grad;                // B
  Graph weight_grad;               // W
  std::vector<std::string> stash;  // B's outputs after its gradients, W's inputs
};
SplitBackward split_backward(const PipelineStage& stage);

// The cuts of a transformer into `pieces` stages of equal layers: `checkpoints` are its residual
// stream (x0, then each of its `layers` blocks' output: GptGraph::checkpoints), and cut k (1 <=
// k < pieces) is checkpoints[k * layers / pieces]. Throws Error when pieces is not in 1..layers
// or a checkpoint is missing.
std::vector<Tensor> equal_layer_cuts(const std::vector<Tensor>& checkpoints, int64_t layers, int64_t pieces);

}  // namespace tessel
