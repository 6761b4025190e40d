// tessel/planner/model_job.hpp — a plan per device count for a model job (issue 25, item 2):
// the job's training step laid out every way that makes sense on g devices, each layout priced
// by the cost model, the best one or two confirmed by timing a few real steps, the result a
// JobProfile (jobs.hpp) the joint schedule can use.
//
// A model job is a job-file entry with a "gpt" key (docs/planner.md):
//   {"name": "small", "steps": 500,
//    "gpt": {"batch": 8, "seq": 64, "d_model": 128, "heads": 4, "layers": 2, "vocab": 512},
//    "device_counts": [1, 2, 4], "seed": 1, "lr": 0.001}
// "gpt" takes GptConfig's sizes (batch, seq, d_model, heads, layers, vocab, ffn_mult) and
// "mixed": true (bf16 activations, f32 master weights); missing sizes keep GptConfig's
// defaults. "device_counts" defaults to 1, 2, 4, ... up to the pool's devices_per_node (and whole
// nodes beyond when the job may span nodes). A "train_step" job (a training-step text file) is
// not supported yet: it is an error saying so.
//
// What profile_model_job does for each device count g (docs/planner.md, "Model jobs"):
//  1. Candidates (enumerate_layouts): every mesh data=a x model=b with a * b = g where the batch
//     splits over a and the heads and the MLP width over b (data=g and model=g included), ZeRO
//     stage 0..3 where data > 1, rematerialisation none and all. A layout whose predicted peak
//     exceeds the pool's memory gets an activation-offload variant when offloading moves
//     anything.
//  2. Prediction: each candidate's training step (build_gpt + add_train_step) is compiled for its
//     mesh exactly as the Trainer compiles it, lowered as load() lowers it (fused kernels,
//     combined all-reduces) and priced by the cost model: compute (Program::compute_seconds) +
//     communication (every collective at the options' links) + dispatch (the cost model's
//     dispatch_s per instruction) + an offload's host copies; peak bytes per device from the
//     memory plan of that program with the Trainer's donations (parameters and moments updated
//     in place).
//     A candidate above pool.memory_bytes (when > 0) is never chosen.
//  3. Trials: the fitting candidate of least prediction and, when trials_per_count is 2, the next
//     one predicted within second_trial_margin of it that is neither a remat or offload variant
//     of a layout that fits without them (it would only trade time for memory the pool has) nor
//     the same program (equal prediction and peak), each run on g CPU virtual devices (a
//     ThreadRuntime and the Trainer): warm-up steps, then timed steps whose median is the
//     measured step time. The chosen layout is the trial of least measured time (without trials:
//     the least prediction); JobProfile::step_time_s[g] is its measured time (without trials its
//     prediction), peak_bytes[g] the larger of its predicted and measured peak, plan[g] its
//     layout text (Layout::parse reads it back).
// A count with no fitting candidate is left out of the profile (the report says why); when no
// count fits, profile_model_job throws PlanError naming the job, the least peak and the memory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessel/core/cost.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/planner/jobs.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/train/trainer.hpp"

namespace tessel::planner {

struct ModelJob {
  std::string name;
  int64_t steps = 0;
  GptConfig gpt;                        // annotate stays true: the layouts need the Megatron annotations
  std::vector<int32_t> device_counts;   // ascending, no repeats; empty: the default (see above)
  uint64_t seed = 1;                    // initial weights and the synthetic batches
  double lr = 1e-3;                     // constant learning rate of the trials and runs
  bool may_span_nodes = false;
  int32_t requested_devices = 0;
};

// One job-file entry (JobEntry::model_json, or any JSON object of the form above). Throws
// PlanError naming `origin`, the job and the field on a missing or bad field or an unknown key
// (the unknown key with the known ones and a close match: "devices_count" -> "device_counts").
ModelJob parse_model_job(const std::string& json_text, const std::string& origin);
// The same for entry `index` (from 0) of a job file: errors name the job "job 3 'gpt-a'"
// (counted from 1). read_job_file checks every model entry so.
ModelJob parse_model_job(const std::string& json_text, const std::string& origin, std::size_t index);

// A layout of the training step: mesh data x model, ZeRO stage, rematerialisation, offload; or
// a pipeline of `pipe` stages of data x model devices each over `micro` micro-batches (1F1B,
// the model cut into equal layers: pipeline/runner.hpp).
// Text form (JobProfile::plan): "data=2,model=2 zero=1 remat=none", " offload" appended when on;
// a pipeline's begins "pipe=2 micro=4 " (its data x model is one stage's).
struct Layout {
  int32_t data = 1, model = 1;
  int zero = 0;
  RematPolicy remat = RematPolicy::none;
  bool offload = false;
  int32_t pipe = 1;   // stages (1: no pipeline)
  int32_t micro = 1;  // micro-batches of a pipeline step
  int32_t devices() const { return pipe * data * model; }
  std::string mesh_spec() const;        // "data=2,model=2" (Mesh::parse reads it): a stage's with pipe > 1
  std::string to_string() const;
  // Reads to_string()'s form; PlanError naming the text and the part it could not read.
  static Layout parse(const std::string& text);
  bool operator==(const Layout& o) const;
};

// The layouts profile_model_job prices on `devices` devices (step 1 above, without offload
// variants), in a fixed order: meshes by data size descending, then ZeRO stage, then remat.
// `remat` lists the policies to try. Empty when nothing divides (e.g. batch 3 on 2 devices).
// With `pipeline`, then the pipelines: every pipe = P >= 2 dividing the devices with P <= the
// layers, each stage's data x model as above over the micro-batch (micro = 2P, else P, micro-
// batches of batch / micro rows that data divides), ZeRO 0..2 (0 without data), and of `remat`
// none (each stage keeps the activations its backward reads) and all (each stage's backward
// recomputes its forward: the least memory); none when `remat` lists neither (einsums is not
// taken within a stage).
std::vector<Layout> enumerate_layouts(const GptConfig& gpt, int32_t devices,
                                      const std::vector<RematPolicy>& remat = {RematPolicy::none, RematPolicy::all},
                                      bool pipeline = false);

struct Candidate {
  Layout layout;
  double predicted_step_s = 0;          // compute + communication + dispatch + host copies
  double predicted_compute_s = 0;       // the kernels' roofline time (CostModel::op_seconds)
  double predicted_comm_s = 0;          // the collectives (CostModel::collective_seconds)
  double predicted_dispatch_s = 0;      // CostModel::dispatch_seconds() per instruction run
  double peak_bytes = 0;                // predicted per device (memory plan, with donation)
  bool fits = true;                     // peak_bytes <= pool.memory_bytes (or no limit)
  double measured_step_s = -1;          // the median of the timed steps; -1: not tried
  double measured_peak_bytes = -1;      // the allocators' high-water mark in the trial; -1: not tried
  double trial_seconds = 0;             // the trial's wall time: compile, load, warm-up and timed steps
  bool chosen = false;
  std::string note;                     // why it was left out, when it was
};

struct ModelJobReport {
  std::string job;
  std::vector<Candidate> candidates;    // by device count, then in enumeration order
  std::map<int32_t, std::string> notes; // device count -> why it is not in the profile
  double predict_seconds = 0;           // wall time of building and pricing every candidate
  double trial_seconds = 0;             // wall time of every trial together (issue 25: <= 5% of the batch)
  int32_t trials = 0;
  // One line per candidate: count, layout, predicted (compute, comm, dispatch), peak, fits,
  // measured, the chosen mark and the note; then the notes per count.
  std::string table() const;
};

struct ProfileOptions {
  // The devices' figures for the prediction (docs/links.md). Default: the library's (an H100
  // node). The pool's intra_node_gbps (GB/s, > 0) replaces default_link's bandwidth, and its
  // inter_node_gbps the data axis's link when a count spans nodes.
  CostModel cost;
  // > 0: the devices are CPU threads sharing this many cores: the compute of g devices is priced
  // at compute_sharing(g, shared_cores) (cost.hpp). 0: each device computes on its own.
  int32_t shared_cores = 0;
  std::vector<RematPolicy> remat = {RematPolicy::none, RematPolicy::all};
  bool try_offload = true;              // offload variants (activations >= 16 KiB) of layouts that do not fit
  double host_bandwidth = 25e9;         // bytes/s of an offload's copies to and from the host (PCIe 4 x16)
  bool measure = true;                  // run trials; false: the predictions only
  int trials_per_count = 2;             // 1 or 2 (issue 25: at most 2 per job and device count)
  // The second trial is run only when its candidate's prediction is within this fraction of the
  // best's (a clear loser by the cost model is not worth timing); infinity: always.
  double second_trial_margin = 0.5;
  int warmup_steps = 1;
  int timed_steps = 3;
  int kernel_threads = 1;               // ThreadRuntimeOptions::kernel_threads of the trials
  // Pipelines among the candidates (enumerate_layouts' pipeline layouts), priced by the stage
  // cut's prediction (pipeline/auto_stages.hpp: sum(t) + (M - 1) max(t) of the stages' forward
  // and backward, the peak the largest stage's bytes) and timed through the Trainer over a pipeline (pipeline_trainer).
  // tessel-plan sets it off under mpirun and on CUDA, where the pool does not run them yet.
  bool pipeline = true;
};

// The profile of `job` on `pool` (steps 1-3 above): name, steps, step_time_s, peak_bytes and
// plan per usable device count. Fills `report` when given. Throws PlanError naming the job when
// no count has a fitting candidate, or on bad options. It is price_model_job then
// time_model_job.
JobProfile profile_model_job(const ModelJob& job, const Pool& pool, const ProfileOptions& options = {},
                             ModelJobReport* report = nullptr);

// The halves of profile_model_job, so that a batch can be refused before any trial (tessel-plan
// prices every job, then times them: a trial takes a second or more, the pricing a fraction):
//  - check_model_job: what needs no compiling. Throws profile_model_job's PlanError when no
//    device count of the job is placeable in the pool (too wide for a node, and it may not span
//    nodes) or has a layout (the batch, heads and MLP width split over no mesh of that count).
//  - price_model_job: steps 1 and 2 for every count, into `report` (candidates, notes,
//    predict_seconds). Throws the same PlanError when no count has a fitting candidate.
//  - time_model_job: step 3 on that report (trials when options.measure), the choice, the
//    profile. Throws it when every trial of every count measured a peak above the memory.
void check_model_job(const ModelJob& job, const Pool& pool);
void price_model_job(const ModelJob& job, const Pool& pool, const ProfileOptions& options, ModelJobReport& report);
JobProfile time_model_job(const ModelJob& job, const Pool& pool, const ProfileOptions& options,
                          ModelJobReport& report);

// The device counts profile_model_job tries: job.device_counts, or the default, limited to the
// pool (a count above devices_per_node only when the job or pool allows spanning).
std::vector<int32_t> candidate_counts(const ModelJob& job, const Pool& pool);

// What runs a layout (the pool runtime, issue 25 item 4):
//   ModelJobStep s = build_model_step(job, Layout::parse(profile.plan.at(g)));
//   Trainer tr(s.model.graph, s.model.loss, s.model.weights, s.mesh, runtime, s.options);
//   tr.init(initial_params(job, s.model));
//   for (int64_t k = 1; ...; ++k) tr.step(model_job_batch(job, k));
// Any layout of the same job takes the state of another (Trainer::state / set_state, or a
// checkpoint): the parameters and their names are the same.
struct ModelJobStep {
  GptGraph model;            // the forward graph and its handles (the checkpoints remat needs); a pipeline's: of one micro-batch
  Mesh mesh;                 // data x model (a pipeline's: one stage's)
  TrainerOptions options;    // the layout's ZeRO stage, remat and offload; the job's learning rate
};
ModelJobStep build_model_step(const ModelJob& job, const Layout& layout);
// GPT-2 initialisation (gpt_init) of the parameters, drawn from job.seed.
std::map<std::string, HostTensor> initial_params(const ModelJob& job, const GptGraph& model);
// Batch k (k >= 1) as {tokens, labels}, a pure function of (job.seed, k): each row a window of
// a fixed token sequence with a learnable next-token rule (the loss falls), its start drawn
// per row; a resumed run draws the batches of the uninterrupted one.
std::vector<HostTensor> model_job_batch(const ModelJob& job, int64_t k);

}  // namespace tessel::planner
