// tessel/train/trainer.hpp — the training loop as an object: a loaded training step and its
// state on the devices, one call per batch.
//
//   tessel::TrainerOptions o;
//   o.lr = tessel::LrSchedule::warmup_cosine(3e-3, /*warmup_steps=*/100, /*total_steps=*/2000);
//   tessel::Trainer tr(model.graph, model.loss, model.weights, mesh, runtime, o);
//   tr.init(initial_weights);                    // parameters by name; moments zero; step 0
//   for (...) {
//     tessel::StepRecord r = tr.step(batch);     // the graph's other inputs, in batch_inputs() order
//     // r.loss, r.grad_norm, r.lr, r.seconds, r.tokens_per_s
//   }
//   double eval = tr.evaluate(held_out);         // the loss, no update
//
// What it owns: the training step (add_train_step) compiled for `mesh` and loaded on `runtime`,
// with the parameters and AdamW moments device-resident and donated in place every step; the
// step counter t and the bias corrections 1/(1 - beta^t); the learning rate of the schedule at
// t (an input of the step: a schedule never recompiles).
//
// Gradient accumulation: step(micro_batches) with K batches runs K - 1 gradient-only programs
// (add_grad_accumulation: the sums stay on the devices) and one update from the sum / K: the
// update of one batch K times larger, with the memory of one micro-batch. These programs, and
// evaluate's forward, are compiled on first use.
//
// Non-finite values: when a step's loss or gradient norm is NaN or infinite, the step keeps the
// parameters and moments unchanged on the devices (TrainOptions::guard_non_finite) and then,
// by TrainerOptions::non_finite, either throws an Error naming the step, the loss and the norm
// (stop, the default) or records the step as skipped and goes on (the step counter does not
// advance).
//
// Every record is kept (history()); write_history_csv (atomically: a temporary file renamed
// over the path, so it may be called after every step) and write_loss_svg save them.
// Thread safety: one thread at a time (a Trainer is a loop's state). The runtime must outlive
// the trainer. On a multi-process runtime every process makes the same calls (SPMD).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/autoshard/auto_shard.hpp"
#include "tessel/checkpoint/checkpoint.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/core/sharding.hpp"
#include "tessel/executable.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/runtime.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/train/train_step.hpp"

namespace tessel {

// The learning rate at step t = 1, 2, ...
struct LrSchedule {
  enum class Kind { Constant, WarmupCosine };
  Kind kind = Kind::Constant;
  double peak = 1e-3;         // the constant rate, or the rate at the end of the warmup
  int64_t warmup_steps = 0;   // linear from peak/warmup_steps at t = 1 to peak at t = warmup_steps
  int64_t total_steps = 0;    // cosine from peak (t = warmup_steps) to final_lr (t = total_steps)
  double final_lr = 0;        // and final_lr after total_steps

  // Both throw Error naming the rate when it is not a finite number >= 0 (inf, NaN, negative).
  static LrSchedule constant(double lr);
  static LrSchedule warmup_cosine(double peak, int64_t warmup_steps, int64_t total_steps, double final_lr = 0);
  // Throws Error for t < 1, or a peak or final_lr (set by hand) that is not a finite number >= 0;
  // the Trainer calls it when it is made and on set_schedule, so a bad rate fails before a step.
  double at(int64_t t) const;
  // "constant 0.003", "warmup 100 + cosine to 2000 (peak 0.003, final 0)".
  std::string to_string() const;
};

enum class NonFinite { Stop, Skip };

struct TrainerOptions {
  TrainOptions train;                          // ZeRO stage, AdamW, remat (add_train_step)
  LrSchedule lr = LrSchedule::constant(1e-3);
  NonFinite non_finite = NonFinite::Stop;
  LoadOptions load;                            // lowering and timeouts; the trainer adds its donations
  RunOptions run;                              // of every run (e.g. check_finite: NaN hunting)
  // Tokens per batch for tokens_per_s; 0: the element count of the first i32 batch input (the
  // token ids), else of the first batch input.
  int64_t tokens_per_batch = 0;
  // Automatic sharding of the update program (autoshard/auto_shard.hpp): the model's own
  // annotations are kept (e.g. only the batch on `data`), every other layout of the step is
  // chosen, the parameters, moments and gradients included (the ZeRO stage in `train` is then
  // not used: auto_shard picks ZeRO-like layouts itself when they pay or the memory budget asks
  // for them); each updated parameter is tied to its parameter. With gradient accumulation the
  // update that ends it and the micro-batch program are searched too, each taking the state
  // (and the accumulated gradients) in the layouts the program after it keeps them in. Under a
  // multi-process runtime every process adopts rank 0's plans (AutoShardResult::to_json).
  std::optional<AutoShardOptions> auto_shard;
};

struct StepRecord {
  int64_t step = 0;         // the update's t (the record of a skipped step has the t it would have had)
  double loss = 0;          // the mean over the micro-batches
  double grad_norm = 0;     // of the update's gradient, before clipping
  double lr = 0;
  double seconds = 0;       // wall time of the step's runs (transfers of the batch included)
  double tokens_per_s = 0;
  int micro_batches = 1;
  bool skipped = false;     // non-finite, update not applied (NonFinite::Skip)
  // Bytes per device over the step's runs, the largest over runs and devices: measured by the
  // backends' allocators (RunStats::measured_peak_bytes) and the memory plan's
  // (RunStats::planned_peak_bytes).
  int64_t measured_peak_bytes = 0;
  int64_t planned_peak_bytes = 0;
  int64_t measured_host_peak_bytes = 0;  // host memory (offloaded activations), measured
  // A pipelined step's bubble (TrainerEngine::Step::bubble: 1 - busy / (stages x span)); 0 for a
  // single program.
  double bubble = 0;
  // A pipelined step's, per stage: the most micro-batches forwarded and not yet backwarded at
  // once (1F1B: at most the stages; GPipe: all of them); empty for a single program.
  std::vector<int64_t> peak_in_flight;
};

// The whole training state on the host: the step counter and, by input name, every parameter
// and its AdamW moments (`adam.m.<p>`, `adam.v.<p>`).
struct TrainState {
  int64_t step = 0;
  std::map<std::string, HostTensor> values;
};

// What a Trainer steps when it is not its own single program: a pipeline's stages
// (pipeline/trainer.hpp: pipeline_trainer), each on its own runtime. The Trainer keeps the loop
// (learning-rate schedule, step counter, non-finite policy, history, checkpoints, the
// reference step); the engine runs the step over the micro-batches and holds the state.
class TrainerEngine {
 public:
  virtual ~TrainerEngine() = default;
  struct Step {
    double loss = 0;       // the mean over the micro-batches
    double grad_norm = 0;  // the global norm of the mean gradient, before clipping
    bool applied = true;   // false: the loss or the norm was not finite, nothing was updated
    double bubble = 0;     // the share of the step the devices waited (a pipeline's), else 0
    std::vector<int64_t> peak_in_flight;  // a pipeline's, per stage: most micro-batches held at once
  };
  // The engine's name and its layout in words, for a tool's output and Errors.
  virtual std::string describe() const = 0;
  // The micro-batches the engine runs in a step (0: any number).
  virtual int64_t micro_batches() const = 0;
  // One update from the micro-batches (each the batch inputs by name) at learning rate `lr` and
  // step `t` (from 1: the bias corrections). Across processes: collective, the same result on
  // every process.
  virtual Step step(const std::vector<std::map<std::string, HostTensor>>& micro_batches, double lr, int64_t t) = 0;
  virtual double evaluate(const std::map<std::string, HostTensor>& batch) = 0;
  // The state (parameters and AdamW moments by name) gathered to the host, and set from such
  // values; state() is collective across processes, each getting every value.
  virtual std::map<std::string, HostTensor> state() const = 0;
  virtual void set_state(const std::map<std::string, HostTensor>& values) = 0;
  // One parameter's value (collective as state(); the default gathers the whole state).
  virtual HostTensor param(const std::string& name) const { return state().at(name); }
  virtual std::map<std::string, Sharding> state_shardings() const = 0;
  // Saves the state (from state()) as step `step` of `dir`: collective, one process writes.
  virtual SaveStats save(CheckpointDir& dir, int64_t step, const SaveOptions& options) = 0;
};

class Trainer {
 public:
  // Builds the training step of `loss` for `params` (float inputs of `model`) on a copy of
  // `model`, compiles it for `mesh` and loads it on `runtime`. Throws what add_train_step,
  // compile and load throw.
  Trainer(const Graph& model, Tensor loss, const std::vector<Tensor>& params, const Mesh& mesh, Runtime& runtime,
          TrainerOptions options = {});
  // A Trainer over `engine` (e.g. pipeline_trainer's stages): `model`, `loss` and `params` as
  // above (the graph of one micro-batch), used for batch_inputs() and reference_step; the steps,
  // the state and the checkpoints go through the engine. What only a single program has
  // (executable(), program(), device_state(), set_device_state()) throws Error saying so, and
  // auto_shard_result() is nullptr. Throws Error when options ask for what the engine does not
  // run (auto_shard).
  Trainer(const Graph& model, Tensor loss, const std::vector<Tensor>& params, std::unique_ptr<TrainerEngine> engine,
          TrainerOptions options = {});
  ~Trainer();
  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;

  // The model's inputs that are not parameters, in graph input order: what a batch holds.
  const std::vector<std::string>& batch_inputs() const;
  const std::vector<std::string>& param_names() const;

  // Parameters to the devices (every parameter, by name), moments to zero, step counter to 0.
  // Throws Error naming a missing or unknown parameter, or a value of the wrong type.
  void init(const std::map<std::string, HostTensor>& params);

  // The state gathered to the host, and a state sent back to the devices (every value of the
  // state: Error naming a missing, unknown or mistyped one). With them a second trainer can
  // start from this one's state (on another mesh too), and a run can be saved and resumed.
  TrainState state() const;
  void set_state(const TrainState& state);
  // The layout of every state value (the names of state().values) on the devices: its input's
  // sharding in the loaded update program (the parameter's annotation, or the ZeRO stage's
  // layout of it and of its moments). What CheckpointDir::save records as the saving layout.
  // Over an engine: the engine's (a pipeline's: each value's layout on its stage's mesh; across
  // processes, this process's stage's values only).
  std::map<std::string, Sharding> state_shardings() const;
  // The update's layouts in words, for a tool's output: how the batch comes in, which share of
  // the bytes of the activations (every value the step computes), of the weights and of the
  // AdamW moments is split over which axes and which is whole, e.g. "the batch comes in over
  // {data}; activations: 95% split over {data, model}, 5% whole (of their bytes); weights: all
  // whole; AdamW moments: as their weights", or "every device repeats the whole step (...)"
  // when nothing is split.
  std::string strategy_in_words() const;
  // The state as it lives on the devices (by state name, arrays of program()'s update step):
  // what CheckpointDir::save(step, arrays, program) writes block by block, with no gather.
  const std::map<std::string, ShardedArray>& device_state() const;
  // A state already on the devices (e.g. CheckpointDir::restore_to_device onto program()'s
  // inputs): every value of the state, each an array of this trainer's update program with
  // its input's layout (Error naming a missing, unknown or mislaid one).
  void set_device_state(int64_t step, std::map<std::string, ShardedArray> values);

  // Checkpoints (tessel/checkpoint/checkpoint.hpp), the one implementation gpt_train and the
  // planner's pool use. save_checkpoint writes the state as it lives on the devices, block by
  // block with no gather, as step steps_done() of `dir` (collective over the runtime's
  // processes: each writes its devices' share, rank 0 commits) and returns what this process
  // wrote. restore_checkpoint reads step `step` of `dir` straight onto this trainer's devices in
  // its own layout (the step may have been saved on another mesh, ZeRO stage or layout) and sets
  // the step counter to `step`; `stats` (optional) accumulates what was read. Throws Error naming
  // the folder and step when it is not committed, and the state value it lacks or holds with
  // another dtype or shape. Over an engine both go through the host: save_checkpoint gathers the
  // state (collective) and one process writes each value as one block; restore_checkpoint reads
  // each value whole on every process (RestoreOptions' host budget does not apply) and sets it.
  SaveStats save_checkpoint(CheckpointDir& dir, const SaveOptions& options = {});
  void restore_checkpoint(const CheckpointDir& dir, int64_t step, const RestoreOptions& options = {},
                          ReadStats* stats = nullptr);

  // One update from one batch (batch_inputs() order). Throws Error naming the input on a wrong
  // count or type, and on a non-finite step with NonFinite::Stop.
  StepRecord step(const std::vector<HostTensor>& batch);
  // One update from the gradients of K >= 1 micro-batches (their mean).
  StepRecord step(const std::vector<std::vector<HostTensor>>& micro_batches);
  // The same step on the unpartitioned graph, run by the reference executor (reference.hpp) on
  // the host from the current state (gathered): the oracle a step is checked against. Returns
  // its loss and gradient norm (step, lr and micro_batches set; no timing); nothing is updated.
  StepRecord reference_step(const std::vector<std::vector<HostTensor>>& micro_batches, int threads = 1);
  // The same from a given state (e.g. state() gathered on every process of a multi-process
  // runtime, the reference then computed on one of them: this overload is not collective).
  StepRecord reference_step(const TrainState& from, const std::vector<std::vector<HostTensor>>& micro_batches,
                            int threads = 1) const;
  // The loss of a batch with the current parameters; nothing is updated.
  double evaluate(const std::vector<HostTensor>& batch);

  int64_t steps_done() const;  // updates applied: the next step's t is steps_done() + 1
  const std::vector<StepRecord>& history() const;
  HostTensor param(const std::string& name) const;  // the current value (gathered)
  const LrSchedule& schedule() const;
  void set_schedule(const LrSchedule& lr);  // from the next step on; no recompile

  // step,loss,grad_norm,lr,seconds,tokens_per_s,micro_batches,skipped — one row per record.
  void write_history_csv(const std::string& path) const;
  // The loss per step as an SVG line chart (skipped steps left out).
  void write_loss_svg(const std::string& path, const std::string& title = "training loss") const;

  // The largest planned peak bytes per device (memory plan: inputs, outputs, arena) of the
  // programs loaded so far: the update, and once used the accumulation and evaluation ones.
  int64_t planned_peak_bytes() const;

  const Executable& executable() const;  // the training step
  // TrainerOptions::auto_shard's plan of the training step (layouts, predicted cost, memory);
  // nullptr without auto_shard.
  const AutoShardResult* auto_shard_result() const;
  LoadedExecutable& program();           // ... loaded
  // The engine the steps run on (pipeline_trainer's), or nullptr for the Trainer's own program.
  TrainerEngine* engine() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel
