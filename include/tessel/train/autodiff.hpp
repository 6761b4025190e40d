// tessel/train/autodiff.hpp — reverse-mode differentiation of the global graph.
//
//   tessel::Tensor loss = reduce_mean(cross_entropy(logits, labels), {0, 1});
//   std::vector<tessel::Tensor> grads = tessel::grad(loss, {w1, w2});
//   g.mark_output(grads[0]);  ...
//
// grad() appends the backward ops to the same graph, before propagation and partitioning:
// the backward is ordinary ops with ordinary factor rules, so its collectives come out of the
// same machinery as the forward's (a weight gradient summed over a `data`-split batch is a
// partial value, all-reduced or reduce-scattered where it is consumed; nothing in propagation
// or the partitioner knows about gradients). Each op's vector-Jacobian product lives in its
// registry entry (OpDef::vjp, ops.hpp). Conventions (docs/autodiff.md): a value used twice
// gets the sum of its gradients; integer values get none; max and reduce_max split the
// gradient equally among ties (as JAX); the gradient of a mean divides by the global count.
#pragma once

#include <string>
#include <vector>

#include "tessel/ir/graph.hpp"

namespace tessel {

// Which forward values the backward keeps (saves) and which it recomputes (rematerialises),
// modelled on JAX's checkpoint policies (docs/autodiff.md, "Rematerialisation"):
//   none     every forward value the backward reads is saved (JAX: everything_saveable);
//   einsums  only einsum results are saved, everything else the backward reads is recomputed
//            from them (JAX: checkpoint_dots / dots_saveable);
//   all      nothing inside a segment is saved: each segment's forward is recomputed from its
//            inputs (the `checkpoints`) in the backward (JAX: nothing_saveable under
//            jax.checkpoint per layer).
// Inputs, constants, graph outputs and GradOptions::checkpoints are always saved.
enum class RematPolicy { none, einsums, all };

// "none" | "einsums" | "all" -> the policy; Error naming the text and the choices otherwise.
RematPolicy parse_remat_policy(const std::string& text);
const char* remat_policy_name(RematPolicy p);

struct GradOptions {
  // Names of the gradients: prefix + the value's name (e.g. "grad.w1"), when free.
  std::string name_prefix = "grad.";
  RematPolicy remat = RematPolicy::none;
  // Segment boundaries (a transformer's residual stream between blocks): saved whatever the
  // policy, so a recomputation stops there and covers one segment. Values of the loss's graph.
  std::vector<Tensor> checkpoints;
};

// Recomputation (remat != none) clones the forward ops of the values the backward reads and
// does not save, with the same attributes and user layouts, and places each clone just before
// the first backward op that reads it, so the saved values' live ranges, not the recomputed
// ones', span the step; the original forward values are then read by the forward only.
//   It also records the segments as regions (Graph::regions, Op::region): the forward ops
// after the op that makes the k-th checkpoint (in op order) up to the one that makes the next
// are in "forward k", the ops of their vjps and the clones recomputed for those in
// "backward k". The partitioner gathers a ZeRO-3/FSDP weight once per region
// (PartitionOptions::regather_by_region). With remat none no regions are recorded.
//
// The gradients of the scalar float `loss` with respect to each of `wrt` (values of the
// same graph, float), as handles of new values of that graph, in order. A value of `wrt`
// that `loss` does not depend on gets zeros. Throws Error naming the op when an op on the
// path has no vjp, when loss is not a float scalar, or when a handle belongs to another graph.
std::vector<Tensor> grad(Tensor loss, const std::vector<Tensor>& wrt, const GradOptions& options = {});

}  // namespace tessel
