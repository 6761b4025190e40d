// tessel/pipeline/runner.hpp — pipeline-parallel training (issue 39 items 1–3): the stages of
// split_stages (stages.hpp), each compiled for its own sub-mesh and loaded on its own runtime,
// run at once by a schedule (schedule.hpp) over M micro-batches, then one AdamW step.
//
//   GptConfig c = cfg;  c.batch = cfg.batch / M;           // one micro-batch's rows
//   GptGraph m = build_gpt(c);
//   auto stages = split_stages(m.graph, m.loss, m.weights, {m.checkpoints[2]});
//   ThreadRuntime r0(4), r1(4);                            // pipe=2 of data=2,model=2
//   PipelineOptions o;  o.schedule = ScheduleKind::OneFOneB;  o.micro = M;
//   PipelineTrainer t(std::move(stages), stage_mesh, {&r0, &r1}, init, o);
//   PipelineStepReport r = t.step(micro_batches, /*lr=*/1e-3, /*t=*/1);
//
// Each stage runs on a host thread of its own, the ops of the schedule in order: a forward
// takes the previous stage's sent values (through the host, put on this stage's devices in
// its program's layouts: so two stages may lay a value out differently) and keeps its inputs
// (with remat none also the activations its backward reads) until its backward, which
// recomputes the forward (remat all) and adds this micro-batch's gradients into the stage's
// accumulators (donated buffers) and sends the gradients of its inputs back. A split schedule
// (zb-h1) runs the backward as B, which sends the gradients back, and W, which adds the weights'
// gradients, keeping what W reads of B's values between them.
// The step is then the single-program step's (train_step.hpp): the mean gradient over
// the micro-batches, one global norm over every stage (each stage's sum of squares, summed),
// clipping, AdamW with decay on parameters of rank >= 2. A parameter used by several stages (a
// tied embedding) is updated once with the sum of their gradients. With v chunks per stage the
// stages are P·v virtual stages, chunk c of stage s being virtual stage c·P + s.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/mesh.hpp"
#include "tessel/pipeline/schedule.hpp"
#include "tessel/pipeline/stages.hpp"
#include "tessel/runtime/process_group.hpp"
#include "tessel/runtime/runtime.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/train/train_step.hpp"

namespace tessel {

struct PipelineOptions {
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int64_t micro = 4;   // micro-batches per step
  int64_t chunks = 1;  // model chunks per stage (Interleaved)
  AdamWConfig adamw;
  // ZeRO within each stage, over `data_axis` of the stage mesh (train_step.hpp's zero_layout):
  // 1 splits the AdamW moments, 2 also the gradient accumulators (each micro-batch's partial
  // gradients reduce-scattered into them), 3 also the parameters (stored split, gathered for
  // each use in the forward and backward). Outside 0..3: Error.
  int zero = 0;
  std::string data_axis = "data";
  // Activations within each stage: RematPolicy::all (the default) recomputes the stage's
  // forward in its backward from the stage's inputs, the only values kept between a
  // micro-batch's forward and backward; none keeps the forward's values the backward reads
  // (keep_activations: more memory, no recomputation). einsums is not supported (Error).
  RematPolicy remat = RematPolicy::all;
  // Stages over the processes of an mpirun job: the processes of the whole pipeline, P·k of them
  // for P stages, stage s on processes [s·k, (s+1)·k) (pipeline_stage_ranks). Each process gives
  // its own stage's runtime (over that stage's k processes: RuntimeRequest::mpi_ranks) as
  // runtimes[s] and null for the others; values between stages travel as host messages between
  // the processes of equal index within their stages. Null: every stage runs in this process.
  std::shared_ptr<ProcessGroup> processes;
  // Across processes: a stage waiting longer than this for another stage's values fails (a dead
  // or stuck process) instead of waiting forever. <= 0: no limit.
  double timeout_s = 300;
};

// The ranks (of PipelineOptions::processes) of stage `stage` when `processes` processes run
// `stages` stages: processes / stages of them, in a block. Throws Error when the stages do not
// split the processes evenly, naming both counts.
std::vector<int> pipeline_stage_ranks(int processes, int64_t stages, int64_t stage);

struct PipelineStepReport {
  double loss = 0;       // the mean of the micro-batches' losses (the batch's mean loss)
  double grad_norm = 0;  // the global norm of the mean gradient, before clipping
  double span_s = 0;     // wall seconds from the first op of the schedule to the last
  std::vector<double> busy_s;           // per stage: seconds in its ops (programs and transfers)
  double bubble = 0;                    // 1 - sum(busy_s) / (stages · span_s)
  std::vector<int64_t> peak_in_flight;  // per stage: most micro-batch chunks forwarded, not yet backwarded
  // Per stage: the most bytes per device kept for the backwards at once: the forwards' inputs,
  // with remat none the activations the backwards read, and with zb-h1 B's values W reads
  // until its W.
  std::vector<int64_t> peak_kept_bytes;
  double update_s = 0;                  // wall seconds of the update after the schedule
  // False when the loss or the gradient norm was NaN or infinite: the update was not run, every
  // parameter and moment keeps its value from before the step (the caller stops or skips).
  bool applied = true;
};

class PipelineTrainer {
 public:
  // `stages`: P·chunks virtual stages (split_stages). `stage_mesh`: the mesh of every stage (the
  // pipeline mesh without its pipe axis). `runtimes`: one per stage (P), each of
  // stage_mesh.num_devices() devices (across processes: this process's stage's only, the others
  // null). `params`: every stage parameter's initial value by name. Compiles and loads every
  // program of this process's stages. Throws Error naming what does not fit: a stage count that
  // is not runtimes.size() · chunks, a missing runtime (or, across processes, one given for
  // another process's stage, or spanning other processes than its stage's), a runtime spanning
  // processes without PipelineOptions::processes, a missing or mistyped parameter, a ZeRO stage
  // outside 0..3, a schedule that cannot be built (micro-batches not a multiple of P for
  // Interleaved).
  PipelineTrainer(std::vector<PipelineStage> stages, const Mesh& stage_mesh, std::vector<Runtime*> runtimes,
                  const std::map<std::string, HostTensor>& params, PipelineOptions options);
  // The same with a mesh per stage (stage_meshes[s] for stage s and its chunks: e.g. the shapes
  // choose_stage_cuts chose, StageCut::stage_meshes). Also an Error: not one mesh per stage.
  PipelineTrainer(std::vector<PipelineStage> stages, const std::vector<Mesh>& stage_meshes,
                  std::vector<Runtime*> runtimes, const std::map<std::string, HostTensor>& params,
                  PipelineOptions options);
  ~PipelineTrainer();
  PipelineTrainer(const PipelineTrainer&) = delete;
  PipelineTrainer& operator=(const PipelineTrainer&) = delete;

  // One step: `micro_batches[m]` holds micro-batch m's data inputs by name (every stage's
  // `data`: tokens, labels). `lr` the learning rate, `t` the step from 1 (the bias corrections).
  // Throws Error naming a missing data input or a wrong count of micro-batches; an error in a
  // stage's run stops every stage and is rethrown naming the stage and op. Across processes
  // every process calls it with the same arguments and gets the same report; an error in one
  // process's stage is rethrown by every process, and the trainer is not to be used again.
  PipelineStepReport step(const std::vector<std::map<std::string, HostTensor>>& micro_batches, double lr, int64_t t);

  // The loss of one micro-batch (every stage's `data` by name) with the current parameters: each
  // virtual stage's forward in turn, the values between them as in a step; nothing is updated
  // or kept. Across processes it is collective and every process gets the loss. Throws Error
  // naming a missing data input, or the stage whose forward failed.
  double evaluate(const std::map<std::string, HostTensor>& micro_batch);

  // The parameters now, by name (each once). Across processes params() and state() are
  // collective (every process calls them; each gets every stage's values) and set_state takes
  // the same values on every process.
  std::map<std::string, HostTensor> params() const;
  // The training state as Trainer::state's values (train/trainer.hpp): each parameter and its
  // AdamW moments "adam.m.<p>", "adam.v.<p>", by name; Trainer::reference_step takes it.
  std::map<std::string, HostTensor> state() const;
  // Sets the state from such values (a checkpoint's, saved on any mesh, pipelined or not). Throws
  // Error naming a value that is missing or of another dtype or shape than the model's, or one
  // that is not part of the state.
  void set_state(const std::map<std::string, HostTensor>& values);
  // Each state value's layout on its stage's mesh (as Trainer::state_shardings): the parameter's
  // and its moments' in the update program of the stage that owns it (across processes: of this
  // process's stage's values only).
  std::map<std::string, Sharding> state_shardings() const;
  const Schedule& schedule() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

}  // namespace tessel
