// tessel/runtime/calibrate.hpp — measure the link figures of the cost model (α and bus
// bandwidth per mesh axis) on the runtime at hand, and write them in the --links format.
//
// The cost model prices a collective over an axis group of n devices as
//   seconds = α + bytes · factor(n) / bandwidth      (factor: 2(n−1)/n for all-reduce, ...)
// (cost.hpp, docs/links.md). calibrate_links fits exactly that line, per axis, with an
// all-reduce of f32 on every group of the axis at once (all devices busy, as in a program):
//   α          = the median time of a tiny all-reduce (`small_bytes`),
//   bandwidth  = large_bytes · 2(n−1)/n / (t_large − α), t_large the median time of an
//                all-reduce of `large_bytes` (nccl-tests' busbw with the latency taken out).
// Each sample is the slowest local device's time for one collective enqueued on its
// communication stream and synchronised (what the executor pays), after warm-up calls; on a
// multi-process runtime the slowest device of every process (allgather_shards).
//
// Works on any Runtime: a ThreadRuntime (the in-process communicator) or an MpiRuntime
// (collective over the processes: every process calls it with the same arguments).
// tessel-bench --calibrate-links and tessel-bench-mpi --calibrate-links drive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessel/core/cost.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel {

struct CalibrationOptions {
  std::size_t small_bytes = 8;          // latency probe (2 floats)
  std::size_t large_bytes = 16u << 20;  // bandwidth probe; a multiple of 4 bytes
  int warmup = 3;                       // untimed calls per size
  int iterations = 20;                  // timed calls per size (the median is kept)
  double timeout_s = 120;               // a member waiting longer for its peers fails
  // time_kernels: the devices wait for each other where the program has a collective (a barrier
  // over the devices timed at once), as a step's devices do: a device the shared cores ran late
  // holds the others there. False: each device runs its kernels straight through.
  bool sync_at_collectives = true;
  // time_kernels: untimed passes for at least this many seconds too (beside `warmup`): fresh
  // threads sharing cores run slower at first (the 2-core VM: about 70 ms at 1.4x, where 3 + 20
  // passes of a 2-ms program all fell and its prediction came out up to 18% high).
  double warmup_s = 0.2;
};

struct AxisCalibration {
  std::string axis;
  int64_t group_size = 0;
  double small_seconds = 0;  // median time of the small all-reduce
  double large_seconds = 0;  // median time of the large all-reduce
  double busbw = 0;          // nccl-tests' busbw of the large one: large_bytes*2(n-1)/n / large_seconds
  LinkSpec link;             // the fitted α and bandwidth
};

struct LinkCalibration {
  std::string runtime;  // Runtime::name(): "threads", "mpi"
  Mesh mesh;
  CalibrationOptions options;
  std::vector<AxisCalibration> axes;  // the axes of size > 1, in mesh order

  // axis -> fitted link, for CostModel::links.
  std::map<std::string, LinkSpec> links() const;
  // The file tessel-explain --links @FILE reads: '#' comment lines saying how and where it
  // was measured (with the raw medians), then one `axis=bw:...,alpha:...` line per axis.
  std::string to_links_file(const std::string& machine = {}) const;
};

// Throws RuntimeError when the runtime cannot run the mesh, a collective fails, or the
// options are unusable (sizes not multiples of 4 bytes, small >= large, iterations < 1).
LinkCalibration calibrate_links(Runtime& runtime, const Mesh& mesh, const CalibrationOptions& options = {});

// The compute figures of the cost model (CostModel::flops_per_s, memory_bandwidth) measured on
// this host's CPU kernels, as one device thread runs them (one kernel thread): an f32 einsum
// `mk,kn->mn` of gemm_size^3 (its flops over its median time) and an f32 add over stream_bytes
// per operand (3 x stream_bytes moved over its median time). For CPU virtual devices; a GPU
// has its own figures (docs/links.md).
struct ComputeCalibration {
  int64_t gemm_size = 512;
  int64_t stream_bytes = 16 << 20;
  double gemm_seconds = 0, stream_seconds = 0;  // medians
  double flops_per_s = 0, memory_bandwidth = 0;
};
ComputeCalibration calibrate_compute(const CalibrationOptions& options = {});

// What a runtime pays per instruction and per run beyond the kernels' own time, measured by
// running programs on every device at once: a chain of `long_chain` tiny f32 kernels (no
// fusion) against one of `short_chain`, each run `iterations` times after `warmup` (medians),
// each time as a caller runs a step: its input sent (to_device), the run, its result read back
// (to_host).
//   per_instruction_s = (t_long - t_short) / (long_chain - short_chain): the hand-off, the
//                       events, the kernel's own call on a few floats — with every local
//                       device's thread sharing the cores, as a step has them;
//   per_run_s         = t_short - short_chain · per_instruction_s: a step's sending of its
//                       inputs, the run's start and end (the devices' start and join) and the
//                       reading of a result;
//   per_launch_s      = the same from the short chain run on its resident input with nothing
//                       read back (resident_seconds): the run's start and end alone.
// CostModel::dispatch_s is per_instruction_s over the mesh's compute_sharing (dispatch_seconds()
// multiplies it back), CostModel::run_s is per_run_s, CostModel::launch_s per_launch_s. Collective over an MpiRuntime's processes.
struct DispatchCalibration {
  int64_t short_chain = 8, long_chain = 136;
  double short_seconds = 0, long_seconds = 0, resident_seconds = 0;
  double per_instruction_s = 0, per_run_s = 0, per_launch_s = 0;
};
DispatchCalibration calibrate_dispatch(Runtime& runtime, const Mesh& mesh, const CalibrationOptions& options = {});

// The kernels of a lowered program (what load() runs) timed as the devices run them, on this
// host's CPU kernels: `devices_at_once` threads (the local devices of the mesh) each run every
// kernel instruction in program order over a memory laid out by the program's plan (its arena
// and host pool; inputs, outputs and integer values apart, made up: floats in [0.5, 1),
// integers 0), all released together (a pass ends when the last device ends: a device the cores
// do not take at once waits, as in a step), untimed passes (at least `warmup` of them and for
// at least `warmup_s`) then `iterations` timed ones. The kernels' real
// rates at the program's local shapes (which the cost model's roofline does not know: a small
// product, a layer norm's backward, an attention at a short sequence run far below the machine's
// peak), their caches as the program leaves them, and the cores' sharing between devices are
// then in the times. Collectives and copies are not run (their outputs keep made-up values). A
// kernel that fails on made-up values is left out and named in `untimed` (predict_program
// prices it by its roofline).
struct KernelTimes {
  int64_t devices = 1;               // threads that ran the kernels at once
  std::vector<double> seconds;       // per instruction: device 0's median seconds in the passes (0: not timed)
  std::vector<bool> timed;           // per instruction: a kernel that was timed
  double sequence_s = 0;             // the median over the passes of the release to the last device's end
  int64_t kernels = 0;               // kernel instructions
  std::vector<std::string> untimed;  // "instruction #i (op): why" per kernel that could not run
  // The devices' rendezvous in a pass (sync_at_collectives, several devices): one before each
  // kernel that needs a collective's result. 0: the devices did not wait for each other.
  int64_t sync_points = 0;
};
KernelTimes time_kernels(const Program& program, int64_t devices_at_once = 1, const CalibrationOptions& options = {});

// One device's step time of a lowered program, term by term, at `cost`:
//   compute   the kernels: timed (KernelTimes::sequence_s, when given: the sharing of cores
//             is in it) or their roofline (times cost.compute_sharing), and the copies' roofline;
//   comm      every collective at the links (Program::comm_seconds(cost)), its α too though
//             the pass holds the devices' rendezvous (KernelTimes::sync_points): without it the
//             hand layouts' many collectives were predicted 18% fast on the 2-core VM;
//   dispatch  cost.dispatch_seconds() per kernel, copy and collective;
//   run       cost.run_s, once.
// Terms add: the collectives are counted as if none overlapped (the CPU runtime runs a program's
// small collectives on the device thread itself).
struct ProgramPrediction {
  double compute_s = 0, comm_s = 0, dispatch_s = 0, run_s = 0;
  bool timed = false;  // compute from timed kernels
  std::vector<std::string> untimed;  // predict_on: the kernels priced by the roofline (KernelTimes::untimed)
  int64_t kernels = 0;               // predict_on: the kernel instructions
  double launch_s = 0;  // of run_s: the run's start and end alone (CostModel::launch_s)
  double total() const { return compute_s + comm_s + dispatch_s + run_s; }
  // A run of resident inputs whose outputs stay on the devices (a loop of forwards): run_s's
  // transfers left out, its launch kept.
  double resident_total() const { return compute_s + comm_s + dispatch_s + launch_s; }
  // "4.12 ms (compute 3.01 [timed kernels] + collectives 0.55 + dispatch 0.31 + run 0.25)"
  std::string to_string() const;
};
ProgramPrediction predict_program(const Program& lowered, const CostModel& cost, const KernelTimes* timed = nullptr);
// predict_program on the machine at hand: on a CPU runtime ("threads", "mpi") the kernels timed
// as its local devices run them (time_kernels over this process's devices: all of them on threads,
// mesh / processes under MPI), else (CUDA)
// their roofline at `cost`. Not collective: each process times its own (a plan every process
// must agree on takes one process's figures).
ProgramPrediction predict_on(const Program& lowered, const CostModel& cost, Runtime& runtime);

// Whether an automatic plan should replace other layouts (the user's, the hand ones): its
// prediction at most `margin` times theirs. The margin is what the prediction may err by on
// this machine: 0.9 (the plan at least 10% faster) covers CPU devices sharing cores, where
// measured/predicted ran 0.88-1.24 (bench/results/2026-12-03T2310-2core-xeon-auto-vs-hand).
// Collective over the runtime's processes: every process takes rank 0's answer (the kernels'
// times differ from process to process). Throws Error when margin is not > 0.
constexpr double kPlanMargin = 0.9;
bool plan_predicted_faster(const ProgramPrediction& plan, const ProgramPrediction& other, Runtime& runtime,
                           double margin = kPlanMargin);

// A cost model of `mesh` on `runtime` as measured here: calibrate_links for the links,
// calibrate_compute for the compute (on CPU runtimes), compute_sharing for the mesh's local
// devices on this host's hardware threads, and calibrate_dispatch for dispatch_s and run_s. What automatic sharding should plan with on
// CPU devices, where the default (H100) figures price compute and collectives in other ratios
// (docs/auto-sharding.md).
CostModel measured_cost_model(Runtime& runtime, const Mesh& mesh, const CalibrationOptions& options = {});

}  // namespace tessel
