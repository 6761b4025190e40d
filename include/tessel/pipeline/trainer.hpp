// tessel/pipeline/trainer.hpp — a Trainer (train/trainer.hpp) whose steps run as a pipeline
// (issue 39 item 3): the loop of a single-program Trainer (learning-rate schedule, step counter,
// non-finite policy, history, checkpoints, the reference step against one device) over the
// stages of a PipelineTrainer (runner.hpp).
//
//   GptConfig c = cfg;  c.batch = cfg.batch / M;               // the model of one micro-batch
//   GptGraph m = build_gpt(c);
//   ThreadRuntime r0(2), r1(2);                                 // pipe=2 of data=2
//   PipelineOptions po;  po.schedule = ScheduleKind::OneFOneB;  po.micro = M;
//   Trainer tr = pipeline_trainer(m.graph, m.loss, m.weights,
//                                 equal_layer_cuts(m.checkpoints, c.layers, 2),
//                                 Mesh::parse("pipe=2,data=2,model=1"), {&r0, &r1}, {}, po);
//   tr.init(weights);
//   StepRecord r = tr.step(micro_batches);                      // exactly M micro-batches
//
// The model is built for one micro-batch's rows; a step takes exactly PipelineOptions::micro
// micro-batches and is the step of their mean gradient (Trainer::step's accumulation over them,
// Trainer::reference_step its oracle). From TrainerOptions the trainer takes the learning-rate
// schedule, the non-finite policy, tokens_per_batch and TrainOptions::adamw, zero (0 to 3 within
// each stage), data_axis and remat (none, the Trainer's default: each stage keeps the
// activations its backward reads; all: each stage's backward recomputes its forward), which
// replace PipelineOptions' own; TrainerOptions::load and run
// are not used (each stage loads its programs itself). Checkpoints go through the host: the state
// gathered, saved as one block per array by one process (any mesh, pipelined or not, restores
// it), and read whole on restore. A non-finite step updates nothing (PipelineStepReport::applied)
// and then stops or is skipped as TrainerOptions::non_finite says.
#pragma once

#include <vector>

#include "tessel/core/mesh.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/pipeline/runner.hpp"
#include "tessel/pipeline/stages.hpp"
#include "tessel/runtime/runtime.hpp"
#include "tessel/train/trainer.hpp"

namespace tessel {

// `mesh`: the pipeline's mesh, with an axis `pipe` of runtimes.size() stages (the others are
// each stage's mesh); `cuts`: the pipe x chunks - 1 values of `model` the stages are cut at, in
// order (split_stages; e.g. equal_layer_cuts). `runtimes` as PipelineTrainer's (one per stage,
// or across processes this process's stage's and null for the others). Throws Error naming what
// does not fit: no pipe axis or one of another size than the runtimes, a cut count that is not
// pipe x chunks - 1, TrainerOptions asking for what a pipeline does not run (auto_shard: use
// StageCutOptions::auto_shard and the overload below; remat einsums), a ZeRO stage outside 0..3, and what
// split_stages and PipelineTrainer throw.
Trainer pipeline_trainer(const Graph& model, Tensor loss, const std::vector<Tensor>& params,
                         const std::vector<Tensor>& cuts, const Mesh& mesh, std::vector<Runtime*> runtimes,
                         TrainerOptions options = {}, PipelineOptions pipeline = {});

// The same from stages already made (split_stages, or stages_with_layouts of an automatic cut),
// each stage on its own mesh (StageCut::stage_meshes).
Trainer pipeline_trainer(const Graph& model, Tensor loss, const std::vector<Tensor>& params,
                         std::vector<PipelineStage> stages, const std::vector<Mesh>& stage_meshes,
                         std::vector<Runtime*> runtimes, TrainerOptions options = {}, PipelineOptions pipeline = {});

}  // namespace tessel
