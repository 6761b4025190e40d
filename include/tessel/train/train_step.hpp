// tessel/train/train_step.hpp — a training step as one global graph: the loss's gradients (autodiff.hpp),
// global-norm clipping, AdamW, and ZeRO stages expressed as annotations.
//
//   GptGraph m = build_gpt(cfg);                                   // forward + loss
//   TrainStep s = add_train_step(m.graph, m.loss, m.weights, mesh, {});
//   Executable exe = compile(m.graph, mesh);                       // forward, backward, update
//   // each step: inputs params, m, v, batch, lr, bias corrections -> loss, next params, m, v
//
// The step is ordinary ops, so propagation and the partitioner place its collectives:
//   zero = 0: moments laid out like their parameters; gradients all-reduced over `data`.
//   zero = 1: moments (the optimizer state) split over `data` (first free dim that divides);
//             gradients annotated whole (at priority 1); each device updates its block of
//             the parameters, which are all-gathered. The partitioner reduces a partial
//             gradient lazily, where it is consumed, so a consumer split over `data` gets it
//             reduce-scattered even here (less traffic than DeepSpeed's stage 1).
//   zero = 2: gradients split like the moments too: partial gradients are reduce-scattered.
//   zero = 3: parameters split like the moments as well (FSDP): the forward and backward
//             all-gather each weight where it is used. With rematerialisation (remat and
//             checkpoints) a weight is gathered once in its segment's forward and once in its
//             backward, and freed in between (the regions grad() records, the ops after the
//             gradients being the "update" region); without, a gathered copy is reused while its
//             last use is near (PartitionOptions::regather_distance).
// Every stage computes the same update as stage 0 (the sums may be ordered differently).
// The learning rate and the bias corrections are inputs, so schedules need no recompile.
#pragma once

#include <string>
#include <vector>

#include "tessel/train/autodiff.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;  // decoupled (AdamW); applied to parameters of rank >= 2
  double clip_norm = 1.0;      // global gradient-norm clipping; 0 turns it off
};

struct TrainOptions {
  AdamWConfig adamw;
  int zero = 0;                    // ZeRO stage 0..3
  std::string data_axis = "data";  // the axis the batch is split over
  // Rematerialisation (autodiff.hpp): which activations the backward saves or recomputes, and
  // the segment boundaries always saved (build_gpt's GptGraph::checkpoints: the residual stream
  // between blocks).
  RematPolicy remat = RematPolicy::none;
  std::vector<Tensor> checkpoints;
  // Gradient accumulation (the last micro-batch's step; trainer.hpp): inputs `grad.scale`
  // (f32 scalar, 1/K) and `grad.acc.<p>` per parameter (f32, the sum of the earlier
  // micro-batches' gradients, laid out like the gradient), and the update applies
  // (grad.acc.<p> + gradient) * grad.scale. add_grad_accumulation builds the other micro-batches.
  bool accumulated = false;
  // When the loss or the gradient norm is NaN or infinite, every `next` output equals its input
  // (the parameters and moments keep their values): the caller then stops or skips the step.
  bool guard_non_finite = false;
};

// What add_train_step added. Inputs, in this order after the graph's own: `adam.lr`,
// `adam.bc1` = 1/(1 - beta1^t) and `adam.bc2` = 1/(1 - beta2^t) (f32 scalars, t the step
// from 1), then for each parameter p `adam.m.<p>` and `adam.v.<p>` (f32 moments, zeros at
// step 1). Outputs after the graph's own: `grad_norm`, `next.<p>` per parameter, then
// `next.adam.m.<p>` and `next.adam.v.<p>` per parameter; each `next` value has its input's
// type and layout, so it can be donated to it.
struct TrainStep {
  std::vector<Tensor> params, grads, m, v;
  std::vector<Tensor> next_params, next_m, next_v;
  Tensor lr, bc1, bc2;
  Tensor grad_norm;  // the global gradient norm before clipping (an output too)
  std::vector<Tensor> grad_acc;  // accumulated: the `grad.acc.<p>` inputs
  Tensor grad_scale;             // accumulated: the `grad.scale` input
  // (input name, output name) pairs for LoadOptions::donate: parameters and moments updated
  // in place.
  std::vector<std::pair<std::string, std::string>> donations() const;
};

// Appends the backward, clipping and AdamW update for `loss` (a float scalar of g) and
// `params` (float inputs of g), and the ZeRO layouts for `mesh` (which must have
// options.data_axis when zero > 0). Throws Error naming a parameter that is not a float input
// of g, or a stage outside 0..3.
TrainStep add_train_step(Graph& g, Tensor loss, const std::vector<Tensor>& params, const Mesh& mesh,
                         const TrainOptions& options = {});

// The other micro-batches of gradient accumulation: the forward and backward of `loss`, and per
// parameter an input `grad.acc.<p>` (f32, laid out like the gradient at this ZeRO stage) and an
// output `next.grad.acc.<p>` = grad.acc.<p> + the gradient; no update. The parameters get the
// layouts add_train_step gives them (same options), so the same arrays feed both programs.
struct GradAccumulation {
  std::vector<Tensor> params, grads, acc, next_acc;
  std::vector<std::pair<std::string, std::string>> donations() const;  // acc -> next_acc
};
GradAccumulation add_grad_accumulation(Graph& g, Tensor loss, const std::vector<Tensor>& params, const Mesh& mesh,
                                       const TrainOptions& options = {});

// Random inputs (random_inputs) of a graph with a training step made valid as a state: the
// second moments `adam.v.<p>` non-negative, `adam.lr` 1e-3, the bias corrections of step 1
// for `adamw`'s betas (or AdamWConfig's defaults), `grad.scale` 1. Inputs by name; others are
// left as drawn. (tessel-explain --run uses it on training-step files: a random negative
// second moment makes NaN on both sides, not a real mismatch.)
void make_train_inputs_valid(const Graph& g, std::vector<HostTensor>& inputs);

// The layout ZeRO gives a value of `shape` laid out as `layout` on `mesh`: `layout` with
// `axis` added to the first dim it can split evenly (a dim with no axes first, then one whose
// axes it can extend); `layout` itself when none can take it or it already uses `axis`.
Sharding zero_layout(const Sharding& layout, const Shape& shape, const Mesh& mesh, const std::string& axis);

}  // namespace tessel
