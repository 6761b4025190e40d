// gpt: a GPT-2-style decoder (models/gpt.hpp) with data × model parallelism given only by
// annotations (Megatron layout), run on N virtual CPU devices and checked against the same
// graph on one device.
//
//   build/bin/gpt [--mesh data=2,model=4] [--batch 8] [--seq 64] [--d-model 128] [--heads 4]
//                 [--layers 2] [--vocab 512] [--iters 3] [--seed N] [--threads T]
//                 [--trace FILE] [--print-program] [--backend cpu|cuda] [--gpus N]
//                 [--layouts megatron|batch|auto] [--write-graph FILE] [--all-warnings]
//
// Prints the loss, the loss of the same inputs on one device and their relative
// difference, tokens/s, peak bytes per device, and the collectives summary line of
// tessel-explain. Exits 1 when the relative difference is above 1e-5.
//
// --layouts: megatron (the default) annotates the Megatron layout; batch places only the batch
// (tokens and labels) on `data` and leaves the rest to propagation; auto places only the batch
// and lets automatic sharding choose every other layout (autoshard/auto_shard.hpp; under mpirun
// every process adopts rank 0's plan); the plan runs only when predicted at least 10% faster than
// the Megatron layouts on this machine (predict_on), and the measured forward is printed beside the
// prediction. --write-graph FILE writes the model's graph in the text
// form (graph_text.hpp: the mesh, the layouts of --layouts megatron or batch) to FILE and exits
// without running, e.g. for `tessel-explain FILE --auto` (docs/auto-sharding.md).
//
// Under mpirun (e.g. `mpirun -np 2 build/bin/gpt --mesh data=2,model=2`) it runs on the MPI
// runtime: each process owns devices/np devices of the mesh, and only rank 0 prints.
//
// --backend cuda runs on a CudaRuntime (runtime/cuda.hpp, make_cuda_runtime): alone, one
// device per GPU when there are enough GPUs (at most --gpus N, 0 = all), else virtual devices
// on the GPUs; under mpirun or a RANK/WORLD_SIZE launcher (with TESSEL_RENDEZVOUS_DIR), one
// NCCL world over the processes, each owning devices/np devices placed by local rank. Without
// a GPU, or built without CUDA, it stops with an error saying so.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <string>

#include "tessel/compiler/checks.hpp"
#include "tessel/runtime/backend_cost.hpp"
#include "tessel/runtime/calibrate.hpp"
#include "tessel/cli.hpp"
#include "tessel/executable.hpp"
#include "tessel/ir/graph_text.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/cuda/cuda.hpp"
#include "tessel/runtime/launch.hpp"
#include "tessel/runtime/make_runtime.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/mpi/mpi_runtime.hpp"
#include "tessel/runtime/reference.hpp"

namespace {


// The model with the layouts of cfg.annotate (Megatron) or, without them, only the batch on the
// data axis; the mesh set, so its text form declares it.
tessel::GptGraph build_batch_annotated(const tessel::GptConfig& cfg, const tessel::Mesh& mesh) {
  tessel::GptGraph m = tessel::build_gpt(cfg);
  if (!cfg.annotate) {
    m.graph.annotate(m.tokens, tessel::Sharding::of({{cfg.data_axis}, {}}));
    m.graph.annotate(m.labels, tessel::Sharding::of({{cfg.data_axis}, {}}));
  }
  m.graph.mesh = mesh;
  return m;
}

const char* kUsage =
    "usage: gpt [--mesh data=2,model=4] [--batch 8] [--seq 64] [--d-model 128] [--heads 4]\n"
    "           [--kv-heads H] [--layers 2] [--vocab 512] [--iters 3] [--seed N] [--threads T]\n"
    "           [--trace FILE] [--print-program] [--backend cpu|cuda] [--gpus N] [--timeout S]\n"
    "           [--layouts megatron|batch|auto] [--write-graph FILE] [--all-warnings]\n"
    "A GPT-2-style decoder on N virtual CPU (or CUDA) devices, checked against one device.\n"
    "--layouts: megatron (default: the Megatron annotations), batch (only the batch on data, the\n"
    "rest propagated), auto (only the batch on data, the rest chosen by automatic sharding; the plan\n"
    "and the Megatron layouts are both priced on this machine, the plan runs only when predicted at\n"
    "least 10% faster, and the measured forward is printed beside the prediction).\n"
    "--write-graph FILE: write the graph (mesh and layouts) in the text form and exit, e.g. for\n"
    "tessel-explain FILE --auto.\n"
    "--all-warnings: print each compiler warning (default: a kind with more than 2 becomes one line).\n"
    "Under mpirun every process owns a block of the devices; --timeout S: a collective waiting longer\n"
    "than S seconds for another process (a dead or stuck rank) fails the whole job, naming the rank\n"
    "(default: $TESSEL_MPI_TIMEOUT_S, else 300 s; 0: no limit).\n";

int run(int argc, char** argv) {
  tessel::GptConfig cfg;
  std::string mesh_spec = "data=2,model=4", trace, layouts = "megatron", write_graph;
  int iters = 3, threads = 1, gpus = 0;
  double timeout_s = -1;  // < 0: $TESSEL_MPI_TIMEOUT_S, else 300 s
  bool print_program = false, cuda = false, all_warnings = false;
  uint64_t seed = (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return tessel::cli::next_value(i, argc, argv); };
    if (tessel::cli::is_help(a)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--mesh") mesh_spec = next();
    else if (tessel::parse_gpt_flag(a, next, cfg)) continue;
    else if (a == "--iters") iters = static_cast<int>(tessel::cli::parse_i64(a, next(), 1, 1000000));
    else if (a == "--seed") seed = tessel::cli::parse_u64(a, next());
    else if (a == "--threads") threads = static_cast<int>(tessel::cli::parse_i64(a, next(), 1, 1024));
    else if (a == "--trace") trace = next();
    else if (a == "--print-program") print_program = true;
    else if (a == "--all-warnings") all_warnings = true;
    else if (a == "--backend") cuda = tessel::cli::parse_backend_is_cuda(a, next());
    else if (a == "--timeout") timeout_s = tessel::cli::parse_double(a, next(), 0, 1e9);
    else if (a == "--gpus") gpus = static_cast<int>(tessel::cli::parse_i64(a, next(), 0, 1024));
    else if (a == "--layouts") {
      layouts = next();
      if (layouts != "megatron" && layouts != "batch" && layouts != "auto")
        throw tessel::UsageError(fmt::format("--layouts {}: expected megatron, batch or auto", layouts));
    } else if (a == "--write-graph") write_graph = next();
    else throw tessel::UsageError(fmt::format("unknown option '{}'", a));
  }
  tessel::Mesh mesh = tessel::Mesh::parse(mesh_spec);
  mesh = tessel::gpt_mesh(mesh, cfg);  // a missing data or model axis is implied with size 1
  cfg.annotate = layouts == "megatron";
  if (!write_graph.empty()) {
    if (layouts == "auto")
      throw tessel::UsageError("--write-graph writes the layouts of --layouts megatron or batch; for the automatic "
                               "ones use --layouts batch and `tessel-explain FILE --auto`");
    tessel::GptGraph m = build_batch_annotated(cfg, mesh);
    std::ofstream f(write_graph);
    f << tessel::print_graph(m.graph);
    if (!f.flush())
      throw tessel::Error(fmt::format("gpt: cannot write the graph to '{}' (--write-graph)", write_graph));
    fmt::print("gpt: wrote the graph ({} values, {} ops, layouts: {}, mesh {}) to {}\n", m.graph.values.size(),
               m.graph.ops.size(), layouts, mesh.to_string(), write_graph);
    return 0;
  }
  // CUDA: a CudaRuntime (one process, or one NCCL world over the launcher's processes). CPU
  // under an MPI launcher: the MPI runtime; otherwise every device a thread of this process
  // (make_runtime). Only rank 0 prints.
  std::unique_ptr<tessel::Runtime> runtime = tessel::make_runtime({cuda ? "cuda" : "cpu", mesh, threads, timeout_s, gpus});
  tessel::Runtime* const rt = runtime.get();
  seed = tessel::agree_on_seed(rt, seed);  // every process draws the same inputs: rank 0's seed
  const bool printer = rt->process_rank() == 0;
  auto print = [&](const std::string& text) {
    if (printer) std::fputs(text.c_str(), stdout);
  };
  tessel::GptGraph m = build_batch_annotated(cfg, mesh);
  if (printer) fmt::print("gpt: batch={} seq={} d_model={} heads={} layers={} vocab={} params={}\n", cfg.batch,
             cfg.seq, cfg.d_model, cfg.heads, cfg.layers, cfg.vocab, m.params);
  if (cuda) {
    auto* c = static_cast<tessel::CudaRuntime*>(rt);
    std::vector<int> used;
    for (int64_t d = 0; d < c->num_devices(); ++d)
      if (std::find(used.begin(), used.end(), c->gpu(d)) == used.end()) used.push_back(c->gpu(d));
    print(fmt::format("mesh {} = {} CUDA devices, {} per process on {} process(es) ({}), {} GPU(s) per process: {}, "
                      "seed {}\n",
                      mesh.to_string(), mesh.num_devices(), c->num_devices(), c->process_count(), c->name(),
                      used.size(), tessel::cuda_device_name(used[0]), seed));
  } else if (rt->process_count() > 1) {
    print(fmt::format("mesh {} = {} CPU devices on {} MPI processes ({} per process), seed {}\n", mesh.to_string(),
                      mesh.num_devices(), rt->process_count(), mesh.num_devices() / std::max(1, rt->process_count()),
                      seed));
  } else
    print(fmt::format("mesh {} = {} virtual CPU devices, seed {}\n", mesh.to_string(), mesh.num_devices(), seed));

  auto t0 = std::chrono::steady_clock::now();
  std::optional<tessel::Graph> auto_graph;  // --layouts auto: m.graph with the chosen layouts
  tessel::CostModel auto_cost;               // --layouts auto: the figures it planned with
  if (layouts == "auto") {
    // Under mpirun every process adopts rank 0's plan.
    // Priced with the figures of the machine it runs on (measured once per machine for CPU
    // devices, then read from the cache; the GPU's for CUDA).
    tessel::AutoShardOptions ao;
    const tessel::BackendCost bc = tessel::backend_cost_model(*rt, mesh);
    ao.cost = bc.cost;
    auto_cost = bc.cost;
    const tessel::AutoShardResult r = tessel::agree_on_plan(rt, tessel::auto_shard(m.graph, mesh, ao), m.graph);
    print(fmt::format("auto_shard: {} ({:.2f} s): predicted {:.4g} ms compute + {:.4g} ms collectives per device, "
                      "priced with {}\n",
                      r.solver, r.formulate_s + r.solve_s, r.compute_s * 1e3, r.comm_s * 1e3, bc.source));
    auto_graph.emplace(r.annotated(m.graph));
  }
  tessel::Executable exe = tessel::compile(auto_graph ? *auto_graph : m.graph, mesh);
  double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (print_program) print(exe.program().to_string(0));
  // The compiler's warnings (e.g. a mesh axis that only repeats work) are the user's to see.
  for (const std::string& w : all_warnings ? exe.program().warnings
                                           : tessel::summarize_warnings(exe.program().warnings, 2,
                                                                        "--all-warnings lists each"))
    print("warning: " + w + "\n");

  std::vector<tessel::HostTensor> inputs = tessel::random_inputs(m.graph, seed);
  tessel::gpt_init(m.graph, inputs);

  tessel::RunOptions ro;
  std::vector<tessel::HostTensor> out;
  double best = 1e300;
  std::vector<double> times;  // every forward's seconds (the median is set beside the prediction)
  int64_t peak = 0, planned = 0;  // bytes per device: measured (the largest device's), the plan's
  // Every process runs the same steps (SPMD); inputs are made from the same seed everywhere.
  tessel::LoadOptions lo;
  // A hung GPU collective fails instead of waiting forever; on MPI, 0 is the runtime's timeout.
  lo.collective_timeout_s = cuda ? (timeout_s >= 0 ? timeout_s : 300) : 0;
  tessel::LoadedExecutable prog = tessel::load(exe, *rt, lo);
  // --layouts auto: the plan's program and the Megatron layouts' priced alike (on CPU devices
  // their kernels timed here, as the local devices run them); the faster one runs (rank 0's
  // choice on every process).
  double predicted_s = 0;
  if (auto_graph) {
    tessel::GptConfig hand_cfg = cfg;
    hand_cfg.annotate = true;
    const tessel::GptGraph hand = build_batch_annotated(hand_cfg, mesh);
    tessel::Executable hand_exe = tessel::compile(hand.graph, mesh);
    // (after the plan's program is loaded: under mpirun the runtime knows its devices then)
    const tessel::ProgramPassOptions lowering = tessel::lowering_for(*rt, lo.lowering);
    const tessel::CostModel& cost = auto_cost;
    const tessel::ProgramPrediction pa = tessel::predict_on(prog.program(), cost, *rt);
    const tessel::ProgramPrediction ph =
        tessel::predict_on(tessel::lower_program(hand_exe.program(), false, lowering), cost, *rt);
    print(fmt::format("auto_shard: predicted per forward{}: {}; the Megatron layouts: {}; auto / Megatron {:.2f}\n",
                      cuda ? "" : " (kernels timed here)", pa.to_string(), ph.to_string(), pa.total() / ph.total()));
    // The plan replaces the Megatron layouts only when predicted at least 10% faster
    // (plan_predicted_faster: rank 0's choice on every process).
    // The forwards below run on resident inputs and leave their outputs on the devices: the
    // prediction of such a run (no transfers; the launch kept).
    predicted_s = pa.resident_total();
    if (!tessel::plan_predicted_faster(pa, ph, *rt)) {
      print(fmt::format("auto_shard: the plan is not predicted at least {:.0f}% faster than the Megatron layouts ({:.3f} "
                        "ms against {:.3f} ms): the forward runs with the Megatron layouts\n",
                        (1 - tessel::kPlanMargin) * 100, pa.total() * 1e3, ph.total() * 1e3));
      exe = std::move(hand_exe);
      prog = tessel::load(exe, *rt, lo);
      predicted_s = ph.resident_total();
    }
  }

  const std::vector<tessel::ShardedArray> args = prog.to_device(inputs);
  tessel::RunResult r;
  // Untimed forwards first, about 0.1 s of them (at least one, at most 100; every process runs
  // rank 0's count): the first tens of forwards of a fresh runtime run slower (on the 2-core VM,
  // data=4: about 25 forwards at 1.4x), and `--iters` times what follows.
  {
    const auto w0 = std::chrono::steady_clock::now();
    r = prog.run(args, ro);
    const double first = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    int64_t warmup = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(0.1 / std::max(first, 1e-6))), 1, 100);
    warmup = std::stoll(rt->allgather_host(std::to_string(warmup)).at(0));
    for (int64_t w = 1; w < warmup; ++w) r = prog.run(args, ro);
  }
  for (int it = 0; it < iters; ++it) {
    ro.trace_path = it == iters - 1 && !trace.empty()
                        ? (rt->process_count() > 1 ? fmt::format("{}.rank{}", trace, rt->process_rank()) : trace)
                        : "";
    auto s = std::chrono::steady_clock::now();
    r = prog.run(args, ro);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
    best = std::min(best, times.back());
  }
  for (std::size_t o = 0; o < r.outputs.size(); ++o) out.push_back(prog.to_host(r.outputs[o]));
  for (int64_t b : r.stats.measured_peak_bytes) peak = std::max(peak, b);
  planned = r.stats.planned_peak_bytes;
  if (!printer) return 0;
  const double loss = out[0].get(0);
  std::vector<tessel::HostTensor> ref = tessel::run_reference(m.graph, inputs, threads);
  const double ref_loss = ref[0].get(0);
  const double rel = std::fabs(loss - ref_loss) / std::max(std::fabs(ref_loss), 1e-30);
  const double tokens = static_cast<double>(cfg.batch * cfg.seq);
  fmt::print("compile: {:.1f} ms ({} ops -> {} instructions per device)\n", compile_ms,
             m.graph.ops.size(), exe.program().instrs.size());
  fmt::print("loss (partitioned, {} {} devices{}) = {:.7f}\n", mesh.num_devices(), cuda ? "CUDA" : "CPU",
             rt->process_count() > 1 ? fmt::format(", {} processes", rt->process_count()) : "", loss);
  fmt::print("loss (reference, 1 device)    = {:.7f}\n", ref_loss);
  fmt::print("relative difference = {:.3g} ({})\n", rel, rel <= 1e-5 ? "ok, <= 1e-5" : "FAILED, > 1e-5");
  fmt::print("forward: {:.2f} ms, {:.0f} tokens/s (best of {})\n", best * 1e3, tokens / best, iters);
  if (predicted_s > 0) {  // the median, as the prediction's timed kernels are
    const double median = tessel::median(times);
    fmt::print("forward against the prediction: {:.2f} ms measured (median of {}), {:.2f} ms predicted for a run of "
               "resident inputs (measured / predicted {:.2f})\n",
               median * 1e3, iters, predicted_s * 1e3, median / predicted_s);
  }
  fmt::print("peak bytes per device = {} ({:.2f} MiB) measured (allocator high-water), {} planned\n", peak,
             static_cast<double>(peak) / (1 << 20), planned);
  if (!trace.empty())
    fmt::print("trace written to {}{} (open in https://ui.perfetto.dev)\n", trace,
               rt->process_count() > 1 ? ".rank<N>" : "");
  fmt::print("{}\n", exe.program().summary().line());
  return rel <= 1e-5 && std::isfinite(loss) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int status = run(argc, argv);  // 1: a result differs from one device
    if (status != 0) tessel::abort_job_on_error(status);
    return status;
  } catch (const tessel::UsageError& e) {
    std::fprintf(stderr, "gpt: error: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt: error: %s\n", e.what());
    tessel::abort_job_on_error(1);  // under mpirun: a non-zero job status whatever the launcher's flags
    return 1;
  }
}
