// gpt_train: trains a small GPT-2-style decoder (models/gpt.hpp) on a byte-level text corpus
// shipped in the repository (data/corpus.txt), with data × model parallelism from the Megatron
// annotations and ZeRO as annotations (train_step.hpp), written on the Trainer (trainer.hpp):
// forward, backward, clipping and AdamW are one partitioned program, loaded once; parameters and
// optimizer state stay on the devices between steps and are updated in place (donated). Every
// step is checked against the same step on one device: Trainer::reference_step, the
// unpartitioned graph run by the reference executor from the same state (the parameters and
// moments before the step, gathered to the host), so the check measures each step's error and
// not the drift of two trajectories, which training amplifies.
//
//   build/bin/gpt_train [--mesh data=2,model=2] [--zero 0..3] [--steps 20] [--lr 1.5e-3]
//                       [--warmup N] [--accumulate K] [--batch 8] [--seq 32] [--d-model 64]
//                       [--heads 4] [--layers 2] [--seed N] [--threads T] [--corpus FILE]
//                       [--tolerance 1e-4] [--no-reference] [--mixed] [--remat none|einsums|all]
//                       [--offload] [--out PREFIX] [--check-finite] [--backend cpu|cuda] [--gpus N]
//                       [--save-dir DIR] [--save-every N] [--keep N] [--resume [STEP]]
//                       [--resume-or-start] [--auto] [--memory-budget BYTES] [--links SPEC|@FILE]
//
// Prints a progress line per step (step/total, loss, the one-device loss and their relative
// difference, gradient norm, learning rate, tokens/s, time left); then peak bytes per device
// (measured and planned) and the collectives of the step; writes the loss curve to PREFIX.csv
// and PREFIX.svg (default gpt_train.csv and gpt_train.svg). Exits 1 when a step differs from
// the one-device run by more than the tolerance or the loss did not fall.
//
// --auto: the layouts are chosen by automatic sharding (autoshard/auto_shard.hpp,
// TrainerOptions::auto_shard) instead of the Megatron annotations: only the batch is placed on
// `data`, every other layout of the step (weights, activations, gradients, moments) is chosen
// by the cost model, within --memory-budget BYTES per device when given. The cost model is the
// backend's (runtime/backend_cost.hpp: this machine's measured figures for CPU devices, cached;
// the GPU's for CUDA); --links gives link figures instead (docs/links.md; e.g. the file
// tessel-bench --calibrate-links writes), `--links measured` measures now without the cache, and
// `--links default` plans with the cost model's H100 figures. It prints the chosen strategy in
// words, the predicted step of the plan and of the hand layouts (predict_on: on CPU devices each
// program's kernels timed here), trains with the plan only when it is predicted at least 10%
// faster (else with the hand layouts), prints the measured step beside the prediction, and how to
// see every layout (--write-graph FILE). --zero does not apply: auto_shard picks ZeRO-like layouts
// itself.
//
// Checkpoints (tessel/checkpoint/checkpoint.hpp): with --save-dir DIR the training state (the
// parameters and AdamW moments, each with its layout on this mesh: Trainer::state_shardings)
// is saved as DIR/step_<t> after every --save-every N-th step and after the last, t the
// Trainer's step counter; --keep N keeps the last N steps. The metadata holds the model, data
// and schedule settings, the seed and the data position. --resume continues from the latest
// committed step (--resume STEP: from that one) on any mesh and ZeRO stage, up to --steps (the
// total), with the model, data and schedule settings of the checkpoint (a flag given for one
// must agree with it; one error lists every difference): batch k is a pure function of
// (seed, k) (BatchStream), so the resumed run trains on the batches of the uninterrupted run,
// and the learning rate continues at the Trainer's t. --resume on a folder with no committed
// step is an error; --resume-or-start resumes when there is a step, else starts from step 1
// (for a job that is restarted by its scheduler with the same command).
// Saving and resuming go straight between the devices and the files: under mpirun each process
// writes and reads only blocks its devices hold.
//
// Under mpirun (e.g. `mpirun -np 2 build/bin/gpt_train --mesh data=2,model=2 --zero 2`) it
// runs on the MPI runtime: each process owns devices/np devices of the mesh, every process
// draws the same batches from rank 0's seed (agree_on_seed), and only rank 0 prints. A RANK/
// WORLD_SIZE launcher without MPI is an error saying so (make_runtime, runtime/make_runtime.hpp).
//
// A mesh with a pipe axis (--mesh pipe=2,data=2) trains with pipeline parallelism (a Trainer
// over a PipelineTrainer's stages: pipeline/trainer.hpp, runner.hpp): the model cut at its residual stream into pipe stages of equal layers
// (x --chunks V with --schedule interleaved), each on the mesh's other axes, run at once by
// --schedule gpipe|1f1b|interleaved|zb-h1 over --microbatches M micro-batches, each step checked
// against one device from the same state (docs/pipeline.md), --zero 0..3 within each stage; its
// checkpoints (the state gathered, the same metadata) resume on any mesh, and it resumes any
// mesh's; --auto chooses the stage boundaries by this machine's cost model
// (pipeline/auto_stages.hpp). Under mpirun -np N each stage runs on N/pipe processes. --remat none
// (default) keeps each stage's activations, all recomputes each stage's forward.
// --mixed trains the stages in bf16 with f32 master weights; --accumulate does not apply (the
// micro-batches are the accumulation) and --remat einsums is refused there; --backend cuda
// makes each stage a CudaRuntime in one process (not under a launcher; never yet run on a GPU).
//
// --backend cuda trains on a CudaRuntime (runtime/cuda.hpp, make_cuda_runtime): alone, one
// device per GPU when there are enough GPUs (at most --gpus N, 0 = all), else virtual devices
// on the GPUs; under mpirun or a RANK/WORLD_SIZE launcher, one NCCL world over the processes.
// Without a GPU, or built without CUDA, it stops with an error saying so.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/compiler/checks.hpp"
#include "tessel/ir/graph_text.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/train/train_step.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/checkpoint/checkpoint.hpp"
#include "tessel/cli.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/pipeline/auto_stages.hpp"
#include "tessel/runtime/backend_cost.hpp"
#include "tessel/pipeline/runner.hpp"
#include "tessel/pipeline/trainer.hpp"
#include "tessel/runtime/cuda/cuda.hpp"
#include "tessel/runtime/launch.hpp"
#include "tessel/runtime/make_runtime.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/mpi/mpi_runtime.hpp"
#include "tessel/runtime/calibrate.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/train/trainer.hpp"

namespace {


const char* kUsage =
    "usage: gpt_train [--mesh data=2,model=2] [--zero 0..3] [--steps 20] [--lr 1.5e-3] [--warmup N]\n"
    "                 [--accumulate K] [--batch 8] [--seq 32] [--d-model 64] [--heads 4] [--kv-heads H]\n"
    "                 [--layers 2]\n"
    "                 [--seed N] [--threads T] [--corpus FILE] [--tolerance 1e-4] [--no-reference]\n"
    "                 [--mixed] [--remat none|einsums|all] [--offload] [--out PREFIX] [--check-finite]\n"
    "                 [--backend cpu|cuda] [--gpus N] [--timeout S]\n"
    "                 [--save-dir DIR] [--save-every N] [--keep N] [--resume [STEP]] [--resume-or-start]\n"
    "                 [--auto] [--memory-budget BYTES] [--links SPEC|@FILE] [--write-graph FILE] [--all-warnings]\n"
    "                 [--schedule gpipe|1f1b|interleaved|zb-h1] [--microbatches M] [--chunks V]\n"
    "Trains a small GPT-2-style model on a byte-level corpus on N virtual CPU devices, each step\n"
    "checked against the same step on one device. --warmup N: the learning rate rises linearly\n"
    "over N steps, then falls along a cosine to 0 at --steps (default: constant). --accumulate K:\n"
    "each step's batch is K micro-batches of batch/K rows, their gradients summed on the devices.\n"
    "--kv-heads H: key/value heads, a divisor of --heads (1: multi-query; default: --heads, multi-head);\n"
    "below --heads the key/value projections are replicated over model (grouped-query attention).\n"
    "--out PREFIX: the loss curve goes to PREFIX.csv (after every step) and PREFIX.svg (default\n"
    "gpt_train; '' for none). --check-finite: every instruction's results are checked for NaN and infinity, and\n"
    "the first one found is named (slow; RunOptions::check_finite). --mixed: bf16 activations with f32 master\n"
    "weights and moments (tolerance 5e-3 unless given). --remat: which activations the backward\n"
    "recomputes: none (saves all), einsums (saves einsum results only), all (recomputes each block\n"
    "from its input). --offload: saved activations of 16 KiB or more move to host memory between\n"
    "their forward and backward uses (the offload-activations pass).\n"
    "Under mpirun every process owns a block of the devices; --timeout S: a collective waiting longer\n"
    "than S seconds for another process (a dead or stuck rank) fails the whole job, naming the rank\n"
    "(default: $TESSEL_MPI_TIMEOUT_S, else 300 s; 0: no limit).\n"
    "Checkpoints: --save-dir DIR saves the training state (parameters, AdamW moments, step, seed and\n"
    "data position) as DIR/step_<t> after every --save-every N-th step and after the last one;\n"
    "--keep N keeps only the last N saved steps. --resume continues from the latest committed step\n"
    "in --save-dir (an error when there is none), --resume STEP from that step, on any --mesh and\n"
    "--zero, up to --steps (the total, counted from step 1): the same batches and learning rates as\n"
    "an uninterrupted run. The model, batch, corpus, seed, --lr, --warmup and --mixed are taken from\n"
    "the checkpoint (a flag given for one must agree: one error lists every difference).\n"
    "--resume-or-start: --resume when --save-dir holds a committed step, else a fresh start.\n"
    "--auto: automatic sharding chooses every layout of the step but the batch's (on data), within\n"
    "--memory-budget BYTES per device when given, priced with the figures of the machine it runs on\n"
    "(CPU devices: this machine's links, compute and memory rates, measured once and cached in\n"
    "$TESSEL_CACHE_DIR or ~/.cache/tessel; CUDA: the GPU's). --links SPEC|@FILE: these link figures\n"
    "instead (docs/links.md); --links measured: measured now, not cached; --links default: the cost\n"
    "model's own (H100) figures. It prints the strategy in words and the predicted step of the plan\n"
    "and of the hand layouts (on CPU devices each program's kernels timed here as its devices run\n"
    "them), trains with the plan only when it is predicted at least 10% faster (else with the hand\n"
    "layouts, saying so), and prints the measured step beside the prediction. Not with --zero.\n"
    "--write-graph FILE: write the training step's graph with its layouts (text form, for\n"
    "tessel-explain FILE) and exit.\n"
    "--all-warnings: print each compiler warning (default: a kind with more than 2 becomes one line).\n"
    "Pipeline parallelism: a mesh with a pipe axis (--mesh pipe=2,data=2) cuts the model into pipe\n"
    "stages of equal layers (x --chunks V for the interleaved schedule), each on the mesh's other\n"
    "axes, run at once by --schedule (default 1f1b) over --microbatches M (default 4) micro-batches\n"
    "of batch/M rows (docs/pipeline.md), --zero 0..3 within each stage; --auto chooses the stage\n"
    "boundaries and each stage's shape over data and model instead, from each layer's forward and\n"
    "backward timed on the devices, and each stage's layouts by automatic sharding for its shape (only\n"
    "the batch placed; under mpirun every process takes rank 0's), within --memory-budget BYTES\n"
    "per device if given; checkpoints move between\n"
    "pipelined and other meshes. Under mpirun -np N each stage runs on N/pipe processes (values\n"
    "between stages as host messages). --backend cuda: each stage a CudaRuntime of its own, in one\n"
    "process only (never yet run on a GPU). --remat none (the default: each stage keeps the\n"
    "activations its backward reads) or all (each stage's backward recomputes its forward). --mixed\n"
    "applies; --accumulate does not (the micro-batches are the accumulation); not yet with --remat\n"
    "einsums, --offload, --check-finite or --write-graph.\n";

using json = nlohmann::json;

// The training batches: batch k (k = 1, 2, ...) is a pure function of (seed, k). One
// mt19937_64 stream seeded with seed ^ 0x5eed gives every row one draw (the start of its window
// of the corpus), row after row, so batch k reads draws (k - 1) * rows .. k * rows - 1 whatever
// the split into micro-batches; a resumed run seeks the stream to its data position (the
// batches already drawn) and draws the uninterrupted run's batches.
class BatchStream {
 public:
  BatchStream(const std::string& corpus, uint64_t seed, int64_t rows, int64_t seq, int64_t drawn)
      : corpus_(corpus), rows_(rows), seq_(seq), drawn_(drawn), rng_(seed ^ 0x5eed) {
    rng_.discard(static_cast<unsigned long long>(drawn * rows));
  }
  int64_t drawn() const { return drawn_; }  // batches drawn so far: the data position
  // The next batch as K micro-batches of rows / K rows: tokens and the next byte as labels.
  std::vector<std::vector<tessel::HostTensor>> next(int accumulate) {
    std::vector<std::vector<tessel::HostTensor>> micro;
    const int64_t m = rows_ / accumulate;
    for (int k = 0; k < accumulate; ++k) {
      tessel::HostTensor tokens(tessel::DType::i32, {m, seq_}), labels(tessel::DType::i32, {m, seq_});
      for (int64_t b = 0; b < m; ++b) {
        const int64_t start = static_cast<int64_t>(rng_() % static_cast<uint64_t>(corpus_.size() - static_cast<std::size_t>(seq_) - 1));
        for (int64_t s = 0; s < seq_; ++s) {
          tokens.set(b * seq_ + s, static_cast<unsigned char>(corpus_[static_cast<std::size_t>(start + s)]));
          labels.set(b * seq_ + s, static_cast<unsigned char>(corpus_[static_cast<std::size_t>(start + s + 1)]));
        }
      }
      micro.push_back({tokens, labels});
    }
    ++drawn_;
    return micro;
  }

 private:
  const std::string& corpus_;
  int64_t rows_, seq_, drawn_;
  std::mt19937_64 rng_;
};

// A mesh in the form --mesh takes ("data=2,model=2"), from Mesh::to_string's "{data=2, model=2}".
std::string mesh_flag(const tessel::Mesh& mesh) {
  std::string out;
  for (const tessel::MeshAxis& a : mesh.axes()) out += fmt::format("{}{}={}", out.empty() ? "" : ",", a.name, a.size);
  return out;
}

std::string join_steps(const std::vector<int64_t>& steps) {
  return steps.empty() ? std::string("none") : fmt::format("{}", fmt::join(steps, ", "));
}

// The settings a resumed run must share with the saved one, each with the flag that sets it:
// the model, the data (batch, corpus, seed) and the schedule. The layout (--mesh, --zero,
// --remat, --offload, --accumulate, --backend, --threads) may change.
const std::vector<std::pair<const char*, const char*>> kResumeFields = {
    {"d_model", "--d-model"}, {"layers", "--layers"}, {"heads", "--heads"},  {"kv_heads", "--kv-heads"}, {"vocab", "--vocab"},
    {"seq", "--seq"},         {"batch", "--batch"},   {"mixed", "--mixed"},  {"lr", "--lr"},
    {"warmup", "--warmup"},   {"corpus_bytes", "--corpus"}, {"corpus_crc32c", "--corpus"}};

// The flags a resumed run takes from the checkpoint when they are not given: sets the field's
// value in this run's settings (the flags' parsing is not repeated: the values were checked
// when the checkpoint's run parsed them).
struct ResumableSettings {
  tessel::GptConfig& cfg;
  double& lr;
  int& warmup;
  std::string& corpus_path;
  double& tolerance;
  bool tolerance_given;
  void take(const std::string& field, const json& v) {
    if (field == "d_model") cfg.d_model = v.get<int64_t>();
    else if (field == "layers") cfg.layers = v.get<int64_t>();
    else if (field == "heads") cfg.heads = v.get<int64_t>();
    else if (field == "kv_heads") cfg.kv_heads = v.get<int64_t>();
    else if (field == "vocab") cfg.vocab = v.get<int64_t>();
    else if (field == "seq") cfg.seq = v.get<int64_t>();
    else if (field == "batch") cfg.batch = v.get<int64_t>();
    else if (field == "lr") lr = v.get<double>();
    else if (field == "warmup") warmup = v.get<int>();
    else if (field == "corpus") corpus_path = v.get<std::string>();
    else if (field == "mixed" && v.get<bool>()) {
      cfg.compute = tessel::DType::bf16;
      if (!tolerance_given) tolerance = 5e-3;
    }
  }
};

std::string read_corpus(const std::string& path) {
  tessel::check_not_directory(path, "gpt_train --corpus");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw tessel::Error(fmt::format("cannot open the corpus '{}' (--corpus FILE)", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct PipeFlags {
  tessel::ScheduleKind kind = tessel::ScheduleKind::OneFOneB;
  int64_t micro = 4, chunks = 1;
};
struct PipeRun {
  tessel::GptConfig cfg;  // the whole batch's
  tessel::Mesh mesh;      // with its pipe axis
  const std::string& corpus;
  PipeFlags flags;
  uint64_t seed;
  int steps, threads;
  double lr;
  int warmup;
  double tolerance;
  bool reference;
  std::string out_prefix;
  tessel::CheckpointDir* ckpt;  // --save-dir, else null
  int64_t start;                // the step resumed from (0: a fresh start)
  const json& saved;            // the resumed step's metadata
  json meta;                    // what a checkpoint keeps besides the state (the model, data settings)
  int save_every, keep;
  int zero;  // within each stage
  bool auto_stages;  // --auto: the stage boundaries from the pieces' times (choose_stage_cuts)
  int64_t memory_budget;  // --memory-budget with --auto: bytes per device a stage may hold (0: none)
  double timeout_s;  // --timeout: under mpirun, a stage waiting longer for another fails (< 0: 300 s)
  tessel::RematPolicy remat;  // --remat none (activations kept) or all (each stage's forward recomputed)
  bool cuda;         // --backend cuda: each stage a CudaRuntime of its own (one process)
  int gpus;          // --gpus
};

// gpt_train on a mesh with a pipe axis: the model cut at its residual stream into pipe x chunks
// stages of equal layers, each on the mesh's other axes, trained by a PipelineTrainer, each step
// checked against one device's step from the same state (Trainer::reference_step).
int run_pipeline(const PipeRun& a) {
  const int64_t P = a.mesh.axis_size("pipe"), M = a.flags.micro, V = a.flags.chunks;
  std::vector<tessel::MeshAxis> axes;
  for (const tessel::MeshAxis& x : a.mesh.axes())
    if (x.name != "pipe") axes.push_back(x);
  const tessel::Mesh stage_mesh(axes);
  if (a.cfg.batch % M != 0)
    throw tessel::UsageError(fmt::format("--microbatches {}: the batch of {} rows does not split into {} equal "
                                         "micro-batches",
                                         M, a.cfg.batch, M));
  if (V > 1 && a.flags.kind != tessel::ScheduleKind::Interleaved)
    throw tessel::UsageError(fmt::format("--chunks {} needs --schedule interleaved", V));
  if (a.cfg.layers < P * V)
    throw tessel::UsageError(fmt::format("--layers {}: too few for {} stages{} (each needs a layer)", a.cfg.layers,
                                         P * V, V > 1 ? fmt::format(" ({} pipe x {} chunks)", P, V) : ""));
  tessel::GptConfig c = a.cfg;
  c.batch /= M;  // the stages see one micro-batch
  // --auto: only the batch placed (on data), each stage's layouts chosen by automatic sharding
  // for its shape. Under mpirun each stage's processes plan and time its pieces together (one
  // plan per piece, its stage's rank 0's) and every process takes rank 0's whole answer.
  if (a.auto_stages) c.annotate = false;
  tessel::GptGraph m = tessel::build_gpt(c);
  if (a.auto_stages) {
    m.graph.annotate(m.tokens, tessel::Sharding::of({{c.data_axis}, {}}));
    m.graph.annotate(m.labels, tessel::Sharding::of({{c.data_axis}, {}}));
  }
  // One process: every stage a runtime of its own (CPU threads). Under mpirun: N processes, N/P
  // per stage; this process makes its stage's runtime only (an MPI runtime over those processes).
  std::shared_ptr<tessel::ProcessGroup> pg = tessel::process_group_from_env();
  if (pg && a.cuda)
    throw tessel::UsageError(fmt::format("--backend cuda with a pipe axis in --mesh runs in one process (each stage a "
                                         "CudaRuntime of its own); across processes (rank {} of {} here) the stages "
                                         "run on CPU devices for now: drop --backend cuda or the launcher",
                                         pg->rank(), pg->size()));
  if (pg && pg->name() != "mpi")
    throw tessel::UsageError(fmt::format("a pipe axis in --mesh across processes needs mpirun (this process was "
                                         "started as rank {} of {} by a launcher without MPI)",
                                         pg->rank(), pg->size()));
  std::vector<std::unique_ptr<tessel::Runtime>> rts;
  std::vector<tessel::Runtime*> rp(static_cast<std::size_t>(P), nullptr);
  if (pg) {
    const int N = pg->size();
    if (N % P != 0 || stage_mesh.num_devices() % (N / P) != 0)
      throw tessel::UsageError(fmt::format(
          "mpirun -np {} with --mesh {}: each of the {} stages needs the same number of processes, each holding the "
          "same number of the stage's {} devices (run a multiple of {} processes that divides {})",
          N, mesh_flag(a.mesh), P, stage_mesh.num_devices(), P, P * stage_mesh.num_devices()));
    const int64_t mine = pg->rank() / (N / P);
    tessel::RuntimeRequest rq("cpu", stage_mesh, a.threads, a.timeout_s);
    rq.mpi_ranks = tessel::pipeline_stage_ranks(N, P, mine);
    rts.push_back(tessel::make_runtime(rq));
    rp[static_cast<std::size_t>(mine)] = rts.back().get();
  } else {
    for (int64_t s = 0; s < P; ++s) {  // CUDA: every stage's runtime on this process's GPUs
      rts.push_back(a.cuda ? tessel::make_runtime({"cuda", stage_mesh, a.threads, a.timeout_s, a.gpus})
                           : tessel::make_runtime({"threads", stage_mesh, a.threads}));
      rp[static_cast<std::size_t>(s)] = rts.back().get();
    }
  }
  const bool printer = !pg || pg->rank() == 0;
  auto say = [&](auto&&... args) {
    if (printer) fmt::print(std::forward<decltype(args)>(args)...);
  };
  // Rank 0's choice, on every process (the seed, the cut).
  auto agree = [&](std::vector<double> mine) {
    if (!pg) return mine;
    const std::string b = pg->allgather(std::string(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(double)))[0];
    std::vector<double> out(b.size() / sizeof(double));
    std::memcpy(out.data(), b.data(), b.size());
    return out;
  };
  uint64_t seed = a.seed;
  if (pg) {
    const std::string b = pg->allgather(std::string(reinterpret_cast<const char*>(&seed), sizeof seed))[0];
    std::memcpy(&seed, b.data(), sizeof seed);
  }
  // The cuts: equal layers per stage, or (--auto) the cost model's (this machine's figures).
  std::vector<tessel::Tensor> cuts;
  std::vector<tessel::Mesh> meshes(static_cast<std::size_t>(P), stage_mesh);  // per stage
  tessel::StageCut sc;  // --auto: the search's answer
  if (a.auto_stages) {
    const std::vector<tessel::Tensor> candidates(m.checkpoints.begin(), m.checkpoints.end() - 1);
    // Each stage's shape among those of its devices over data and model (one shape for all
    // with chunks: a stage's chunks share its runtime), within --memory-budget.
    tessel::StageCutOptions so;
    so.meshes = V > 1 ? std::vector<tessel::Mesh>{stage_mesh} : tessel::mesh_shapes(stage_mesh, {"data", "model"});
    so.memory_budget_bytes = a.memory_budget;
    so.schedule = a.flags.kind;
    so.remat = a.remat;  // kept activations priced in each stage's bytes, or the recomputing backward timed
    // Each piece timed on this stage's devices (the runtime of stage 0, or under mpirun this
    // process's stage's, whose processes all time alike): the machine's own rates, not the roofline's.
    so.runtime = rts[0].get();
    // Each stage's layouts planned for its shape, with this machine's figures (measured once per
    // shape, cached).
    so.auto_shard = tessel::AutoShardOptions{};
    so.auto_shard->cost = tessel::backend_cost_model(*rts[0], stage_mesh).cost;
    so.auto_shard->cost_figures = tessel::AutoShardOptions::CostFigures::Given;
    sc = tessel::choose_stage_cuts(m.graph, m.loss, m.weights, candidates, P * V, M, so, tessel::CostModel{});
    // Each process priced with its own measurements: every process takes rank 0's cut and shapes.
    std::vector<double> at;
    for (const tessel::Tensor& t : sc.cuts)
      for (std::size_t i = 0; i < m.checkpoints.size(); ++i)
        if (m.checkpoints[i].id == t.id) at.push_back(static_cast<double>(i));
    for (const tessel::Mesh& x : sc.stage_meshes)
      for (std::size_t i = 0; i < so.meshes.size(); ++i)
        if (so.meshes[i].to_string() == x.to_string()) at.push_back(static_cast<double>(i));
    const std::vector<double> agreed = agree(at);
    for (int64_t k = 0; k + 1 < P * V; ++k)
      cuts.push_back(m.checkpoints.at(static_cast<std::size_t>(agreed.at(static_cast<std::size_t>(k)))));
    if (V == 1)
      for (int64_t s = 0; s < P; ++s)
        meshes[static_cast<std::size_t>(s)] =
            so.meshes.at(static_cast<std::size_t>(agreed.at(static_cast<std::size_t>(P - 1 + s))));
    if (pg) {  // rank 0's cut, shapes and each stage's layouts (one line per value: stage, name, layout)
      std::string text;
      for (std::size_t s = 0; s < sc.stage_layouts.size(); ++s)
        for (const auto& [name, sh] : sc.stage_layouts[s]) text += fmt::format("{}\t{}\t{}\n", s, name, sh.to_string());
      text = pg->allgather(text)[0];
      sc.cuts = cuts;
      if (V == 1) sc.stage_meshes = meshes;
      for (auto& l : sc.stage_layouts) l.clear();
      std::istringstream in(text);
      std::string line;
      while (std::getline(in, line)) {
        const std::size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
        const std::size_t s = std::stoul(line.substr(0, t1));
        if (sc.stage_layouts.size() <= s) sc.stage_layouts.resize(s + 1);
        sc.stage_layouts[s][line.substr(t1 + 1, t2 - t1 - 1)] = tessel::Sharding::parse(line.substr(t2 + 1));
      }
    }
    say("stages by the pieces' times (pieces: the embedding, then a layer each, the last with the head): {}\n",
        sc.why);
    std::vector<std::string> bytes;
    for (int64_t b : sc.stage_bytes) bytes.push_back(std::to_string(b));
    say("predicted peak bytes per device by stage: {}{}\n", fmt::join(bytes, ", "),
        a.memory_budget > 0 ? fmt::format(" (budget {})", a.memory_budget) : std::string());
  } else {
    cuts = tessel::equal_layer_cuts(m.checkpoints, c.layers, P * V);
  }
  // With automatic sharding within the stages (one process: the cut is this process's own),
  // each stage in the layouts planned for its shape.
  std::vector<tessel::PipelineStage> stages = a.auto_stages ? tessel::stages_with_layouts(m.graph, m.loss, m.weights, sc)
                                                          : tessel::split_stages(m.graph, m.loss, m.weights, cuts);
  // Initial values as the single-program run draws them: GPT-2 scale weights, gains 1, biases 0.
  std::vector<tessel::HostTensor> host = tessel::random_inputs(m.graph, seed);
  tessel::gpt_init(m.graph, host);
  std::map<std::string, tessel::HostTensor> init;
  for (const tessel::Tensor& w : m.weights)
    for (std::size_t i = 0; i < m.graph.inputs.size(); ++i)
      if (m.graph.inputs[i] == w.id) init[w.name()] = host[i];
  tessel::TrainerOptions o;
  o.lr = a.warmup > 0 ? tessel::LrSchedule::warmup_cosine(a.lr, a.warmup, a.steps) : tessel::LrSchedule::constant(a.lr);
  o.train.zero = a.zero;
  o.train.remat = a.remat;
  tessel::PipelineOptions po;
  po.schedule = a.flags.kind;
  po.micro = M;
  po.chunks = V;
  po.processes = pg;
  if (a.timeout_s > 0) po.timeout_s = a.timeout_s;
  const auto t0 = std::chrono::steady_clock::now();
  // The Trainer's loop over the stages (pipeline/trainer.hpp): its steps, state, checkpoints and
  // reference step (the oracle: the same step on one device, the reference executor).
  tessel::Trainer trainer = tessel::pipeline_trainer(m.graph, m.loss, m.weights, std::move(stages), meshes, rp, o, po);
  trainer.init(init);
  const bool check = a.reference && printer;  // under mpirun rank 0 checks
  const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  say("gpt_train: batch={} ({} micro-batches of {}) seq={} d_model={} heads={} layers={} vocab={} corpus={} "
             "bytes\n",
             a.cfg.batch, M, c.batch, c.seq, c.d_model, c.heads, c.layers, c.vocab, a.corpus.size());
  std::vector<std::string> shapes;
  for (const tessel::Mesh& x : meshes) shapes.push_back(x.to_string());
  const bool alike = std::all_of(shapes.begin(), shapes.end(), [&](const std::string& x) { return x == shapes[0]; });
  say("pipeline: {} stages{} of {} ({} {} devices in all{}), schedule {}, zero={}, remat={}{}, lr {}, seed {}\n", P,
      V > 1 ? fmt::format(" x {} chunks", V) : "",
      alike ? "mesh " + shapes[0] : fmt::format("meshes {}", fmt::join(shapes, ", ")), P * stage_mesh.num_devices(),
      a.cuda ? "CUDA" : "CPU",
      pg ? fmt::format(", {} processes, {} per stage", pg->size(), pg->size() / P) : std::string(),
      tessel::schedule_kind_name(a.flags.kind), a.zero, tessel::remat_policy_name(a.remat),
      a.cfg.compute != a.cfg.dtype ? ", mixed precision (bf16 compute, f32 master weights)" : "", o.lr.to_string(), seed);
  const tessel::Schedule schedule = tessel::make_schedule(a.flags.kind, P, M, V);
  say("{}compile + load: {:.1f} ms\n", schedule.to_string(), compile_ms);

  // A resumed run: the state of the step (saved on any mesh, pipelined or not) and its data position.
  std::vector<double> first_losses;
  int64_t position = 0;
  if (a.start > 0) {
    trainer.restore_checkpoint(*a.ckpt, a.start);
    first_losses = a.saved.at("first_losses").get<std::vector<double>>();
    position = a.saved.at("data_position").get<int64_t>();
    say("resumed from step {} (saved on {}, zero {})\n", a.start, a.saved.value("mesh", std::string("?")),
               a.saved.value("zero", -1));
  }
  if (a.start >= a.steps) {
    say("step {} is already at --steps {}: nothing to train\n", a.start, a.steps);
    return 0;
  }
  json meta = a.meta;
  meta["seed"] = seed;
  meta["zero"] = a.zero;
  meta["auto_shard"] = false;
  meta["mesh"] = mesh_flag(a.mesh);
  meta["remat"] = tessel::remat_policy_name(a.remat);
  meta["accumulate"] = 1;
  meta["steps"] = a.steps;
  meta["rows_per_batch"] = a.cfg.batch;
  meta["pipeline"] = {{"schedule", tessel::schedule_kind_name(a.flags.kind)},
                      {"microbatches", M},
                      {"chunks", V},
                      {"auto_stages", a.auto_stages}};

  BatchStream batches(a.corpus, seed, a.cfg.batch, c.seq, position);
  std::vector<double> losses;
  double worst = 0, bubble_sum = 0;
  std::vector<int64_t> peak(static_cast<std::size_t>(P), 0);
  // The loss curve in Trainer::write_history_csv's columns, and the step's measured bubble.
  std::string csv = "step,loss,grad_norm,lr,seconds,tokens_per_s,micro_batches,skipped,bubble\n";
  for (int t = static_cast<int>(a.start) + 1; t <= a.steps; ++t) {
    const std::vector<std::vector<tessel::HostTensor>> micro = batches.next(static_cast<int>(M));
    double ref = 0;
    std::string ref_text;
    if (a.reference) {  // the state is gathered by every process (collective), checked by rank 0
      tessel::TrainState state = trainer.state();
      if (check) ref = trainer.reference_step(state, micro, a.threads).loss;
    }
    const double lr_t = o.lr.at(t);
    const tessel::StepRecord r = trainer.step(micro);
    const double sec = r.seconds;
    losses.push_back(r.loss);
    if (first_losses.size() < 5) first_losses.push_back(r.loss);
    bubble_sum += r.bubble;
    for (int64_t s = 0; s < P; ++s)
      peak[static_cast<std::size_t>(s)] = std::max(peak[static_cast<std::size_t>(s)], r.peak_in_flight[static_cast<std::size_t>(s)]);
    if (check) {
      const double rel = std::fabs(r.loss - ref) / std::max(std::fabs(ref), 1e-30);
      worst = std::max(worst, rel);
      ref_text = fmt::format("  one device {:.6f}  rel {:.2e}", ref, rel);
    }
    say("step {:4d}/{}  loss {:.6f}{}  grad_norm {:.4f}  lr {:.2e}  {:.1f} ms  bubble {:.2f}\n", t, a.steps,
               r.loss, ref_text, r.grad_norm, lr_t, sec * 1e3, r.bubble);
    csv += fmt::format("{},{:.9g},{:.9g},{:.9g},{:.6f},{:.1f},{},0,{:.4f}\n", t, r.loss, r.grad_norm, lr_t, sec,
                       static_cast<double>(a.cfg.batch * c.seq) / sec, M, r.bubble);
    if (a.ckpt && (t == a.steps || (a.save_every > 0 && t % a.save_every == 0))) {
      // The state gathered to the host and saved as one block per array: any mesh restores it.
      tessel::SaveOptions so;
      meta["data_position"] = batches.drawn();
      meta["first_losses"] = first_losses;
      so.metadata_json = meta.dump();
      trainer.save_checkpoint(*a.ckpt, so);  // collective: rank 0 writes, the others wait until it is committed
      if (printer && a.keep > 0) a.ckpt->keep_last(a.keep);
      if (pg) pg->allgather(std::string());
      say("saved step {} to {}\n", t, a.ckpt->step_path(t));
    }
  }
  if (!a.out_prefix.empty() && printer) {
    std::ofstream f(a.out_prefix + ".csv");
    f << csv;
    if (!f.flush()) throw tessel::Error(fmt::format("cannot write {}.csv (--out)", a.out_prefix));
    say("loss curve: {}.csv\n", a.out_prefix);
  }
  // Over the whole run (a resumed run has its first steps' losses from the checkpoint).
  const std::size_t n = static_cast<std::size_t>(a.steps), w = std::max<std::size_t>(1, std::min<std::size_t>(5, n / 2));
  const std::size_t wl = std::min(w, losses.size());
  double first = 0, last = 0;
  for (std::size_t i = 0; i < w && i < first_losses.size(); ++i) first += first_losses[i] / static_cast<double>(w);
  for (std::size_t i = 0; i < wl; ++i) last += losses[losses.size() - 1 - i] / static_cast<double>(wl);
  say("loss: mean of the first {} steps {:.4f}, of the last {} steps {:.4f} ({})\n", w, first, wl, last,
             n >= 2 && last < first ? "falling" : "NOT falling");
  if (check)
    say("largest relative difference from one device: {:.2e} ({})\n", worst,
               worst <= a.tolerance ? fmt::format("ok, <= {}", a.tolerance) : fmt::format("FAILED, > {}", a.tolerance));
  std::vector<std::string> peaks;
  for (int64_t p : peak) peaks.push_back(std::to_string(p));
  say("bubble: {:.3f} measured (mean over the steps; the schedule's with equal stages and free transfers: "
             "{:.3f}); micro-batches in flight at the peak per stage: {}\n",
             bubble_sum / static_cast<double>(losses.size()), tessel::simulate(schedule, 1, 2).bubble,
             fmt::format("{}", fmt::join(peaks, ", ")));
  const bool ok = (!check || worst <= a.tolerance) && (n < 2 || last < first) && std::isfinite(last);
  return ok ? 0 : 1;
}

int run(int argc, char** argv) {
  tessel::GptConfig cfg;
  cfg.batch = 8;
  cfg.seq = 32;
  cfg.d_model = 64;
  cfg.heads = 4;
  cfg.layers = 2;
  cfg.vocab = 256;  // bytes
  tessel::TrainOptions to;
  std::string mesh_spec = "data=2,model=2", corpus_path = std::string(TESSEL_SOURCE_DIR) + "/data/corpus.txt";
  int steps = 20, threads = 1, gpus = 0, warmup = 0, accumulate = 1;
  std::string out_prefix = "gpt_train";
  bool check_finite = false, all_warnings = false;
  double timeout_s = -1;  // < 0: $TESSEL_MPI_TIMEOUT_S, else 300 s
  bool cuda = false;
  double lr = 1.5e-3, tolerance = 1e-4;
  bool reference = true, tolerance_given = false, offload = false;
  uint64_t seed = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  bool seed_given = false;
  std::string save_dir;
  int save_every = 0, keep = 0;  // 0: save after the last step only; keep every step
  bool resume = false, resume_or_start = false;
  int64_t resume_at = -1;  // --resume STEP; -1: the latest committed step
  std::set<std::string> given;  // the flags on the command line
  bool auto_layouts = false, zero_given = false;
  int64_t memory_budget = 0;
  std::string links, write_graph;
  PipeFlags pipe;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return tessel::cli::next_value(i, argc, argv); };
    if (tessel::cli::is_help(a)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    given.insert(a);
    if (a == "--mesh") mesh_spec = next();
    else if (a == "--zero") {
      to.zero = static_cast<int>(tessel::cli::parse_i64(a, next(), 0, 3));
      zero_given = true;
    }
    else if (a == "--auto") auto_layouts = true;
    else if (a == "--memory-budget") memory_budget = tessel::cli::parse_i64(a, next(), 1, INT64_MAX);
    else if (a == "--links") links = next();
    else if (a == "--steps") steps = static_cast<int>(tessel::cli::parse_i64(a, next(), 1, 1000000));
    else if (a == "--lr") lr = tessel::cli::parse_double(a, next(), 0, 10);
    else if (a == "--warmup") warmup = static_cast<int>(tessel::cli::parse_i64(a, next(), 0, 1000000));
    else if (a == "--accumulate") accumulate = static_cast<int>(tessel::cli::parse_i64(a, next(), 1, 1024));
    else if (a == "--out") out_prefix = next();
    else if (a == "--check-finite") check_finite = true;
    else if (a == "--all-warnings") all_warnings = true;
    else if (a == "--write-graph") write_graph = next();
    else if (tessel::parse_gpt_flag(a, next, cfg)) continue;
    else if (a == "--seed") {
      seed = tessel::cli::parse_u64(a, next());
      seed_given = true;
    }
    else if (a == "--save-dir") save_dir = next();
    else if (a == "--save-every") save_every = static_cast<int>(tessel::cli::parse_i64(a, next(), 1, 1000000));
    else if (a == "--keep") keep = static_cast<int>(tessel::cli::parse_i64(a, next(), 1, 1000000));
    else if (a == "--resume") {  // an optional STEP: the next argument when it is a number
      resume = true;
      if (i + 1 < argc && argv[i + 1][0] != '\0' &&
          std::all_of(argv[i + 1], argv[i + 1] + std::strlen(argv[i + 1]), [](char c) { return c >= '0' && c <= '9'; }))
        resume_at = tessel::cli::parse_i64(a, next(), 0, INT64_MAX);
    }
    else if (a == "--resume-or-start") resume = resume_or_start = true;
    else if (a == "--threads") threads = static_cast<int>(tessel::cli::parse_i64(a, next(), 1, 1024));
    else if (a == "--corpus") corpus_path = next();
    else if (a == "--tolerance") {
      tolerance = tessel::cli::parse_double(a, next(), 0, 1e300);
      tolerance_given = true;
    }
    else if (a == "--no-reference") reference = false;
    else if (a == "--schedule") pipe.kind = tessel::parse_schedule_kind(next());
    else if (a == "--microbatches") pipe.micro = tessel::cli::parse_i64(a, next(), 1, 4096);
    else if (a == "--chunks") pipe.chunks = tessel::cli::parse_i64(a, next(), 1, 64);
    else if (a == "--remat") to.remat = tessel::parse_remat_policy(next());
    else if (a == "--offload") offload = true;
    else if (a == "--backend") cuda = tessel::cli::parse_backend_is_cuda(a, next());
    else if (a == "--timeout") timeout_s = tessel::cli::parse_double(a, next(), 0, 1e9);
    else if (a == "--gpus") gpus = static_cast<int>(tessel::cli::parse_i64(a, next(), 0, 1024));
    else if (a == "--mixed") {
      cfg.compute = tessel::DType::bf16;  // f32 master weights and moments, bf16 activations
      if (!tolerance_given) tolerance = 5e-3;
    }
    else throw tessel::UsageError(fmt::format("unknown option '{}'", a));
  }
  // Checkpoints: which step to resume from (checked before anything compiles); its settings
  // fill in the model, data and schedule flags not given (checked against the given ones below).
  std::optional<tessel::CheckpointDir> ckpt;
  std::optional<tessel::Manifest> resumed;
  json saved;  // the resumed step's metadata
  int64_t start = 0;  // steps done before this run
  std::string resume_note;
  std::vector<int64_t> committed;
  const char* resume_flag = resume_or_start ? "--resume-or-start" : "--resume";
  if (!save_dir.empty()) {
    std::error_code ec;
    if (resume && !resume_or_start && !std::filesystem::exists(save_dir, ec))
      throw tessel::Error(fmt::format("--resume: the folder {} does not exist, so there is no step to resume from "
                                      "(check --save-dir; --resume-or-start starts from step 1 when there is none)",
                                      save_dir));
    ckpt.emplace(save_dir);
    committed = ckpt->steps();
    if (resume && resume_at >= 0) {
      if (std::find(committed.begin(), committed.end(), resume_at) == committed.end())
        throw tessel::Error(fmt::format("--resume {}: step {} is not committed in {} (committed steps: {})", resume_at,
                                        resume_at, save_dir, join_steps(committed)));
      resumed = ckpt->manifest(resume_at);
    } else if (resume && !committed.empty()) {
      resumed = ckpt->manifest(committed.back());
    } else if (resume_or_start) {
      resume_note = fmt::format("no committed step in {}: starting from scratch\n", save_dir);
    } else if (resume) {
      throw tessel::Error(fmt::format("--resume: {} holds no committed step to resume from (check --save-dir; "
                                      "--resume-or-start starts from step 1 when there is none)", save_dir));
    } else if (!committed.empty()) {
      throw tessel::Error(fmt::format("--save-dir {} already holds committed steps ({}): add --resume to continue from "
                                      "the latest, or give another folder",
                                      save_dir, join_steps(committed)));
    }
    if (resumed) {
      start = resumed->step;
      try {
        saved = json::parse(resumed->metadata_json);
      } catch (const json::exception& e) {
        throw tessel::Error(fmt::format("{}: the metadata of step {} in {} is not JSON: {}", resume_flag, start, save_dir,
                                        e.what()));
      }
      // Saved before --kv-heads existed: multi-head attention (as many key/value heads as heads).
      if (saved.is_object() && !saved.contains("kv_heads") && saved.contains("heads")) saved["kv_heads"] = saved["heads"];
      bool ours = saved.is_object() && saved.value("tool", std::string()) == "gpt_train" &&
                  saved.contains("data_position") && saved.contains("seed") && saved.contains("first_losses");
      for (const auto& [field, flag] : kResumeFields) ours = ours && saved.contains(field);
      if (!ours)
        throw tessel::Error(fmt::format("{}: step {} in {} was not saved by gpt_train (its metadata lacks gpt_train's "
                                        "settings)", resume_flag, start, save_dir));
      // The settings whose flags were not given are the checkpoint's.
      ResumableSettings take{cfg, lr, warmup, corpus_path, tolerance, tolerance_given};
      try {
        for (const auto& [field, flag] : kResumeFields)
          if (!given.count(flag) && std::string(field) != "corpus_bytes" && std::string(field) != "corpus_crc32c")
            take.take(field, saved.at(field));
        if (!given.count("--corpus") && saved.contains("corpus")) take.take("corpus", saved.at("corpus"));
      } catch (const json::exception& e) {
        throw tessel::Error(fmt::format("{}: the gpt_train settings of step {} in {} are malformed: {}", resume_flag,
                                        start, save_dir, e.what()));
      }
    }
  }
  if (cfg.vocab < 256)
    throw tessel::UsageError(fmt::format("--vocab {}: the corpus is read as bytes (token ids 0..255), so the "
                                         "vocabulary needs at least 256 rows", cfg.vocab));
  const std::string corpus = read_corpus(corpus_path);
  if (static_cast<int64_t>(corpus.size()) < cfg.seq + 2)
    throw tessel::Error(fmt::format("the corpus '{}' has {} bytes; --seq {} needs at least {}", corpus_path,
                                    corpus.size(), cfg.seq, cfg.seq + 2));
  tessel::Mesh mesh = tessel::Mesh::parse(mesh_spec);
  mesh = tessel::gpt_mesh(mesh, cfg);  // a missing data or model axis is implied with size 1

  if (warmup > steps)
    throw tessel::UsageError(fmt::format("--warmup {}: longer than the {} steps of the run (--steps)", warmup, steps));
  if (save_dir.empty()) {
    if (resume)
      throw tessel::UsageError("--resume needs --save-dir DIR: the folder of the checkpoints to resume from");
    if (save_every > 0 || keep > 0)
      throw tessel::UsageError(fmt::format("{} needs --save-dir DIR: the folder to save the checkpoints in",
                                           save_every > 0 ? "--save-every" : "--keep"));
  }
  if (mesh.axis_index("pipe") >= 0 && given.count("--accumulate"))
    throw tessel::UsageError("--accumulate does not apply with a pipe axis in --mesh: the pipeline accumulates the "
                             "gradients of its micro-batches already (give more with --microbatches M)");
  if (cfg.batch % accumulate != 0)
    throw tessel::UsageError(fmt::format("--accumulate {}: the batch of {} rows does not split into {} equal micro-batches",
                                         accumulate, cfg.batch, accumulate));
  const int64_t batch_rows = cfg.batch;
  if (links == "measured" && cuda)
    throw tessel::UsageError("--links measured measures CPU devices (their links and kernels); with --backend cuda "
                             "give the GPUs' link figures (--links SPEC|@FILE, docs/links.md)");
  if (!auto_layouts && (memory_budget > 0 || !links.empty()))
    throw tessel::UsageError(fmt::format("{} applies to --auto (automatic sharding) only",
                                         memory_budget > 0 ? "--memory-budget" : "--links"));
  const bool piped = mesh.axis_index("pipe") >= 0;
  // With a pipe axis --auto chooses the stages (their cuts and shapes), not the layouts: --zero applies.
  if (auto_layouts && zero_given && !piped)
    throw tessel::UsageError("--auto chooses the layouts of the parameters and optimizer state itself: leave out --zero");
  if (piped) {
    for (const char* flag : {"--offload", "--check-finite", "--write-graph", "--links"})
      if (given.count(flag))
        throw tessel::UsageError(fmt::format("{} is not yet supported with a pipe axis in --mesh (pipeline stages run "
                                             "with ZeRO 0 to 3, in f32 or --mixed: docs/pipeline.md)",
                                             flag));
    if (to.remat == tessel::RematPolicy::einsums)
      throw tessel::UsageError("--remat einsums is not supported with a pipe axis in --mesh (none: each stage keeps the "
                               "activations its backward reads; all: each stage's backward recomputes its forward)");
  } else {
    for (const char* flag : {"--schedule", "--microbatches", "--chunks"})
      if (given.count(flag))
        throw tessel::UsageError(fmt::format("{} applies to a mesh with a pipe axis (e.g. --mesh pipe=2,data=2)", flag));
  }

  // What a checkpoint keeps besides the state, and what a resumed run must share with it.
  json meta = {{"tool", "gpt_train"},
               {"d_model", cfg.d_model},
               {"layers", cfg.layers},
               {"heads", cfg.heads},
               {"kv_heads", tessel::gpt_kv_heads(cfg)},
               {"vocab", cfg.vocab},
               {"seq", cfg.seq},
               {"batch", batch_rows},
               {"ffn_mult", cfg.ffn_mult},
               {"dtype", tessel::dtype_name(cfg.dtype)},
               {"compute", tessel::dtype_name(cfg.compute)},
               {"mixed", cfg.compute != cfg.dtype},
               {"lr", lr},
               {"warmup", warmup},
               {"corpus", corpus_path},
               {"corpus_bytes", corpus.size()},
               {"corpus_crc32c", tessel::crc32c(corpus.data(), corpus.size())}};
  if (resumed) {
    // Every flag given for a setting of the checkpoint must agree with it: one error lists them all.
    std::vector<std::string> differ;
    for (const auto& [field, flag] : kResumeFields) {
      const json& was = saved.at(field);
      if (was != meta.at(field))
        differ.push_back(fmt::format("{} = {} ({} gives {})", field, was.dump(), flag, meta.at(field).dump()));
    }
    const uint64_t saved_seed = saved.at("seed").get<uint64_t>();
    if (seed_given && seed != saved_seed)
      differ.push_back(fmt::format("seed = {} (--seed gives {})", saved_seed, seed));
    if (!differ.empty())
      throw tessel::Error(fmt::format(
          "{}: step {} in {} was saved with other settings than this run's flags: {}. Leave these flags out (a "
          "resumed run takes the model, data, seed and schedule from the checkpoint) or give the saved values; the "
          "mesh, --zero and the other layout flags may change",
          resume_flag, start, save_dir, fmt::join(differ, "; ")));
    seed = saved_seed;
  }
  if (ckpt) {
    // The steps this run saves: every save_every-th after `start`, and the last.
    for (int64_t c : committed)
      if (c > start && c <= steps && (c == steps || (save_every > 0 && c % save_every == 0)))
        throw tessel::Error(fmt::format("{}: this run would save step {}, which {} already holds (committed steps: {}); "
                                        "resume from the latest step or remove the later ones",
                                        resume_at >= 0 ? fmt::format("--resume {}", resume_at) : std::string(resume_flag),
                                        c, save_dir, join_steps(committed)));
  }
  if (piped) {
    PipeRun run{cfg,  mesh,   corpus,    pipe,      seed,   steps,      threads,          lr,   warmup, tolerance,
                reference, out_prefix, ckpt ? &*ckpt : nullptr, start, saved, meta, save_every, keep, to.zero, auto_layouts,
                memory_budget, timeout_s, to.remat, cuda, gpus};
    return run_pipeline(run);
  }
  cfg.batch /= accumulate;  // the model sees one micro-batch
  cfg.annotate = !auto_layouts;
  tessel::GptGraph m = tessel::build_gpt(cfg);
  tessel::Graph& g = m.graph;
  if (auto_layouts) {  // only the batch is placed (on data); auto_shard chooses the rest
    g.annotate(m.tokens, tessel::Sharding::of({{cfg.data_axis}, {}}));
    g.annotate(m.labels, tessel::Sharding::of({{cfg.data_axis}, {}}));
  }
  to.checkpoints = m.checkpoints;
  auto t0 = std::chrono::steady_clock::now();
  // CUDA: a CudaRuntime (one process, or one NCCL world over the launcher's processes). CPU
  // under an MPI launcher: the MPI runtime (this process owns a block of the devices).
  // Otherwise every device is a CPU thread of this process. Only rank 0 prints.
  std::unique_ptr<tessel::Runtime> rt = tessel::make_runtime({cuda ? "cuda" : "cpu", mesh, threads, timeout_s, gpus});
  seed = tessel::agree_on_seed(rt.get(), seed);  // the same inputs and batches on every process
  const bool printer = rt->process_rank() == 0;
  auto print = [&](const std::string& text) {
    if (printer) std::fputs(text.c_str(), stdout);
  };
  if (resumed && start >= steps) {
    print(fmt::format("step {} in {} is already at --steps {}: nothing to train\n", start, save_dir, steps));
    return 0;
  }
  tessel::TrainerOptions o;
  o.train = to;
  o.lr = warmup > 0 ? tessel::LrSchedule::warmup_cosine(lr, warmup, steps) : tessel::LrSchedule::constant(lr);
  if (offload) o.load.lowering.offload_min_bytes = 16 << 10;
  o.run.check_finite = check_finite;
  // A hung GPU collective fails instead of waiting forever; on MPI, 0 is the runtime's timeout.
  if (cuda) o.load.collective_timeout_s = timeout_s >= 0 ? timeout_s : 300;
  if (auto_layouts) {
    tessel::AutoShardOptions ao;
    ao.memory_budget_bytes = memory_budget;
    // No --links: the Trainer plans with the backend's figures (this machine's, measured once
    // and cached, for CPU devices; the GPU's for CUDA: runtime/backend_cost.hpp).
    if (links == "measured")  // measured now, not from the cache (calibrate.hpp)
      ao.cost = tessel::measured_cost_model(*rt, mesh);
    else if (links == "default")  // the cost model's own (H100) figures, as they are
      ao.cost_figures = tessel::AutoShardOptions::CostFigures::Given;
    else if (!links.empty())
      ao.cost.parse_links(links[0] == '@' ? tessel::read_links_file(links.substr(1)) : links);
    o.auto_shard = ao;
  }
  tessel::Trainer trainer(g, m.loss, m.weights, mesh, *rt, o);
  const tessel::Executable* exe_p = &trainer.executable();
  // --auto: the hand layouts (Megatron annotations, --zero 0) of the same model, priced beside
  // the plan; the step trains with the plan only when it is predicted 10% faster.
  tessel::GptConfig hand_cfg = cfg;
  hand_cfg.annotate = true;
  tessel::GptGraph hand = tessel::build_gpt(hand_cfg);
  const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  print(fmt::format("gpt_train: batch={}{} seq={} d_model={} heads={} layers={} vocab={} params={} corpus={} bytes\n",
                    batch_rows, accumulate > 1 ? fmt::format(" ({} micro-batches of {})", accumulate, cfg.batch) : "",
                    cfg.seq, cfg.d_model, cfg.heads, cfg.layers, cfg.vocab, m.params, corpus.size()));
  print(fmt::format("mesh {} = {} {} devices{}, {}, remat={}, lr {}, {}, seed {}\n", mesh.to_string(),
                    mesh.num_devices(), cuda ? "CUDA" : "CPU",
                    rt->process_count() > 1 ? fmt::format(" on {} processes ({})", rt->process_count(), rt->name())
                                            : std::string(" (virtual)"),
                    auto_layouts ? std::string("layouts by auto_shard") : fmt::format("zero={}", to.zero), tessel::remat_policy_name(to.remat), o.lr.to_string(),
                    cfg.compute == cfg.dtype ? "f32" : "mixed precision (bf16 compute, f32 master weights)", seed));
  if (const tessel::AutoShardResult* ar = trainer.auto_shard_result())
    print(fmt::format("auto_shard: {} ({:.2f} s): predicted {:.3f} ms compute + {:.3f} ms collectives per step, {}\n",
                      ar->solver, ar->formulate_s + ar->solve_s, ar->compute_s * 1e3, ar->comm_s * 1e3,
                      memory_budget > 0 ? fmt::format("program peak {} bytes per device (within the budget of {})",
                                                      ar->program_peak_bytes, memory_budget)
                                        : fmt::format("peak about {} bytes per device", ar->peak_bytes)));
  double predicted_step = 0;  // --auto: the plan's predicted step (printed beside the measured one)
  if (const tessel::AutoShardResult* ar = trainer.auto_shard_result()) {
    // What was chosen, in words; what it is predicted to cost against the hand layouts (the
    // Megatron annotations, --zero 0) at the same figures; and where to see every layout.
    print(fmt::format("auto_shard: strategy: {}\n", trainer.strategy_in_words()));
    print(fmt::format("auto_shard: priced with {}\n", ar->cost_source.empty() ? "the figures given" : ar->cost_source));
    const tessel::CostModel& cost = ar->cost;
    tessel::TrainOptions hand_to = to;
    hand_to.zero = 0;
    hand_to.checkpoints = hand.checkpoints;
    tessel::Graph hand_step = hand.graph.clone();
    tessel::add_train_step(hand_step, hand_step.tensor(hand.loss.id), [&] {
      std::vector<tessel::Tensor> w;
      for (const tessel::Tensor& t : hand.weights) w.push_back(hand_step.tensor(t.id));
      return w;
    }(), mesh, [&] {
      tessel::TrainOptions x = hand_to;
      for (tessel::Tensor& c : x.checkpoints) c = hand_step.tensor(c.id);
      return x;
    }());
    const tessel::Executable hand_exe = tessel::compile(hand_step, mesh);
    const tessel::Program hand_low =
        tessel::lower_program(hand_exe.program(), false, tessel::lowering_for(*rt, o.load.lowering));
    // Each program's kernels timed here as the local devices run them (CPU), else the roofline.
    const tessel::ProgramPrediction pa = tessel::predict_on(trainer.program().program(), cost, *rt),
                                    ph = tessel::predict_on(hand_low, cost, *rt);
    predicted_step = pa.total();
    print(fmt::format("auto_shard: predicted per step at those figures{}: {}; the hand layouts (Megatron, --zero 0): {}; "
                      "auto / hand {:.2f}\n",
                      cuda ? "" : " (kernels timed here)", pa.to_string(), ph.to_string(), pa.total() / ph.total()));
    // The plan must beat the hand layouts by the same prediction with a margin, else the hand
    // layouts train (rank 0's choice on every process). With --accumulate the step runs other
    // programs too: the plan is kept.
    const bool keep_plan = tessel::plan_predicted_faster(pa, ph, *rt) || accumulate > 1;
    if (!keep_plan) {
      tessel::TrainerOptions ho = o;
      ho.auto_shard.reset();
      ho.train = hand_to;
      trainer = tessel::Trainer(hand.graph, hand.loss, hand.weights, mesh, *rt, ho);
      exe_p = &trainer.executable();
      predicted_step = ph.total();
      print(fmt::format("auto_shard: the plan is not predicted at least {:.0f}% faster than the hand layouts ({:.3f} ms "
                        "against {:.3f} ms): the step trains with the hand layouts\n",
                        (1 - tessel::kPlanMargin) * 100, pa.total() * 1e3, ph.total() * 1e3));
    }
    print("auto_shard: every layout: add --write-graph FILE (the step's graph with its layouts, for tessel-explain "
          "FILE)\n");
  }
  const tessel::Executable& exe = *exe_p;
  if (!write_graph.empty()) {
    tessel::Graph step_graph = exe.graph().clone();
    step_graph.mesh = mesh;  // so tessel-explain FILE needs no --mesh
    std::ofstream f(write_graph);
    f << tessel::print_graph(step_graph);
    if (!f.flush()) throw tessel::Error(fmt::format("cannot write the graph to '{}' (--write-graph)", write_graph));
    print(fmt::format("wrote the training step's graph ({} values, {} ops, its layouts, mesh {}) to {}\n",
                      exe.graph().values.size(), exe.graph().ops.size(), mesh.to_string(), write_graph));
    return 0;
  }
  // The compiler's warnings (e.g. a mesh axis that only repeats work) are the user's to see.
  for (const std::string& w : all_warnings ? exe.program().warnings
                                           : tessel::summarize_warnings(exe.program().warnings, 2,
                                                                        "--all-warnings lists each"))
    print("warning: " + w + "\n");
  print(fmt::format("compile + load: {:.1f} ms ({} ops -> {} instructions per device)\n", compile_ms,
                    exe.graph().ops.size(), trainer.program().program().instrs.size()));

  // The losses of steps 1..5 of the whole run (a resumed run: the saved ones first), for the
  // check that the loss fell.
  std::vector<double> first_losses;
  if (resumed) {
    // The state as saved, read straight onto this trainer's devices (any mesh and stage: each
    // process reads only the blocks its devices hold, in this run's layout).
    trainer.restore_checkpoint(*ckpt, start);
    first_losses = saved.at("first_losses").get<std::vector<double>>();
    const tessel::Mesh saved_mesh = tessel::Mesh::parse(resumed->mesh);
    print(fmt::format("resumed from step {} (saved on {}, zero {})\n", start, mesh_flag(saved_mesh),
                      saved.value("zero", -1)));
    if (warmup > 0 && saved.value("steps", int64_t{0}) != steps)
      print(fmt::format("note: the schedule now ends at step {} (--steps); the saved run's ended at {}\n", steps,
                        saved.value("steps", int64_t{0})));
  } else {
    print(resume_note);
    // Initial values: GPT-2 scale weights, layer-norm gains 1, biases 0 (the moments start at 0).
    std::vector<tessel::HostTensor> host = tessel::random_inputs(g, seed);
    tessel::gpt_init(g, host);
    std::map<std::string, tessel::HostTensor> init;
    for (std::size_t i = 0; i < g.inputs.size(); ++i) {
      const std::string& name = g.values[static_cast<std::size_t>(g.inputs[i])].name;
      if (name != "tokens" && name != "labels") init[name] = host[i];
    }
    trainer.init(init);
  }
  meta["seed"] = seed;
  meta["zero"] = to.zero;
  meta["auto_shard"] = auto_layouts;
  meta["mesh"] = mesh_flag(mesh);
  meta["remat"] = tessel::remat_policy_name(to.remat);
  meta["accumulate"] = accumulate;
  meta["steps"] = steps;
  meta["rows_per_batch"] = batch_rows;
  // A checkpoint of the state after step t (the Trainer's step counter), straight from the
  // devices: every process writes its share of the blocks its devices hold (a replicated block
  // once, split among its replicas), rank 0 commits (and drops the steps --keep no longer keeps).
  auto save = [&](int64_t data_position) {
    const auto save_start = std::chrono::steady_clock::now();
    tessel::SaveOptions so;
    meta["data_position"] = data_position;
    meta["first_losses"] = first_losses;
    so.metadata_json = meta.dump();
    const int64_t step = trainer.steps_done();
    const tessel::SaveStats ss = trainer.save_checkpoint(*ckpt, so);
    if (!printer) return;
    if (keep > 0) ckpt->keep_last(keep);
    print(fmt::format("saved step {} to {} ({:.1f} ms{}{})\n", step, ckpt->step_path(step),
                      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - save_start).count(),
                      ss.processes > 1 ? fmt::format("; {} processes, bytes per process max/mean {:.2f}", ss.processes,
                                                     ss.imbalance)
                                       : std::string(),
                      keep > 0 ? fmt::format("; kept {}", join_steps(ckpt->steps())) : std::string()));
  };

  BatchStream batches(corpus, seed, batch_rows, cfg.seq, resumed ? saved.at("data_position").get<int64_t>() : 0);
  std::vector<double> losses;
  double worst = 0, total_s = 0;
  std::vector<double> step_s;       // each timed step's seconds (from the second on)
  int64_t peak = 0, host_peak = 0;  // measured, the largest over the steps
  const auto train_start = std::chrono::steady_clock::now();
  for (int t = static_cast<int>(start) + 1; t <= steps; ++t) {
    const std::vector<std::vector<tessel::HostTensor>> micro = batches.next(accumulate);
    // The same step on one device from the same state (every rank gathers; rank 0 computes).
    std::string ref_text;
    double ref = 0;
    if (reference) {
      const tessel::TrainState st = trainer.state();
      if (printer) ref = trainer.reference_step(st, micro, threads).loss;
    }
    const tessel::StepRecord r = trainer.step(micro);
    if (t > start + 1) {
      total_s += r.seconds;
      step_s.push_back(r.seconds);
    }
    peak = std::max(peak, r.measured_peak_bytes);
    host_peak = std::max(host_peak, r.measured_host_peak_bytes);
    losses.push_back(r.loss);
    if (first_losses.size() < 5) first_losses.push_back(r.loss);
    if (reference && printer) {
      const double rel = std::fabs(r.loss - ref) / std::max(std::fabs(ref), 1e-30);
      worst = std::max(worst, rel);
      ref_text = fmt::format("  one device {:.6f}  rel {:.2e}", ref, rel);
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
    print(fmt::format("step {:4d}/{}  loss {:.6f}{}  grad_norm {:.4f}  lr {:.2e}  {:.1f} ms  {:.0f} tokens/s  "
                      "{:.1f} s left\n",
                      t, steps, r.loss, ref_text, r.grad_norm, r.lr, r.seconds * 1e3, r.tokens_per_s,
                      elapsed / static_cast<double>(t - start) * (steps - t)));
    // The loss curve so far after every step: a killed run keeps its finished steps.
    if (printer && !out_prefix.empty()) trainer.write_history_csv(out_prefix + ".csv");
    if (ckpt && (t == steps || (save_every > 0 && t % save_every == 0))) save(batches.drawn());
  }
  if (!printer) return 0;
  if (!out_prefix.empty()) {
    trainer.write_history_csv(out_prefix + ".csv");
    trainer.write_loss_svg(out_prefix + ".svg", fmt::format("gpt_train loss, mesh {}, zero {}", mesh.to_string(), to.zero));
    fmt::print("loss curve: {}.csv, {}.svg\n", out_prefix, out_prefix);
  }
  // Over the whole run (steps 1..steps; a resumed run has the first ones from its checkpoint):
  // the mean loss of the first w steps against that of the last w this process ran.
  const std::size_t n = static_cast<std::size_t>(steps), w = std::max<std::size_t>(1, std::min<std::size_t>(5, n / 2));
  const std::size_t wl = std::min(w, losses.size());
  double first = 0, last = 0;
  for (std::size_t i = 0; i < w; ++i) first += first_losses[i] / static_cast<double>(w);
  for (std::size_t i = 0; i < wl; ++i) last += losses[losses.size() - 1 - i] / static_cast<double>(wl);
  const tessel::MemoryPlan& mem = trainer.program().program().memory_plan();
  fmt::print("loss: mean of the first {} steps {:.4f}, of the last {} steps {:.4f} ({})\n", w, first, wl, last,
             n >= 2 && last < first ? "falling" : "NOT falling");
  if (reference)
    fmt::print("largest relative difference from one device: {:.2e} ({})\n", worst,
               worst <= tolerance ? fmt::format("ok, <= {}", tolerance) : fmt::format("FAILED, > {}", tolerance));
  if (steps - start > 1) {
    const double mean_s = total_s / static_cast<double>(steps - start - 1);
    fmt::print("step time: {:.2f} ms mean over steps {}..{} ({:.0f} tokens/s)\n", mean_s * 1e3, start + 2, steps,
               static_cast<double>(batch_rows * cfg.seq * (steps - start - 1)) / total_s);
    // Beside the prediction the median step, as the prediction's timed kernels are medians: on
    // CPU devices sharing cores, phases of steps run slower while the OS shares the cores
    // unevenly between the device threads (the 2-core VM, data=4: runs of 5 to 10 steps at
    // 1.35x), which the mean keeps and the prediction does not model.
    if (predicted_step > 0) {
      const double median_s = tessel::median(step_s);
      fmt::print("step time against the prediction: {:.2f} ms measured (median of steps {}..{}, mean {:.2f} ms), "
                 "{:.2f} ms predicted (measured / predicted {:.2f})\n",
                 median_s * 1e3, start + 2, steps, mean_s * 1e3, predicted_step * 1e3, median_s / predicted_step);
    }
  }
  fmt::print("peak bytes per device: {} measured (allocator high-water), {} planned (arena {} + inputs {} + outputs {} "
             "- written into donated inputs {}){}\n",
             peak, trainer.planned_peak_bytes(), mem.arena_bytes, mem.input_bytes, mem.output_bytes, mem.donated_bytes,
             mem.host_bytes > 0 ? fmt::format("; host memory (offloaded activations) {} measured, {} planned", host_peak,
                                              mem.host_bytes)
                                : std::string());
  fmt::print("{}\n", exe.program().summary().line());
  const bool ok = (!reference || worst <= tolerance) && (n < 2 || last < first) && std::isfinite(last);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int status = run(argc, argv);  // 1: a result differs from one device
    if (status != 0) tessel::abort_job_on_error(status);
    return status;
  } catch (const tessel::UsageError& e) {
    std::fprintf(stderr, "gpt_train: error: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_train: error: %s\n", e.what());
    tessel::abort_job_on_error(1);  // under mpirun: a non-zero job status whatever the launcher's flags
    return 1;
  }
}
