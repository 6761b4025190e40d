// tessel/runtime/loaded_executable.hpp — compile → load → run.
//
//   tessel::Executable exe = tessel::compile(graph, mesh);              // pure (or compile_program)
//   tessel::ThreadRuntime rt(mesh.num_devices());  // runtime/cpu/thread_runtime.hpp: devices, threads, streams
//   tessel::LoadedExecutable prog = tessel::load(exe, rt);               // communicators, events: once
//   tessel::ShardedArray w = prog.to_device("w", w_host);                 // explicit host -> devices
//   tessel::RunResult r = prog.run({prog.to_device("x", x_host), w});     // arrays stay on the devices
//   tessel::HostTensor y = prog.to_host(r.outputs[0]);                    // explicit devices -> host
//
// load() does every expensive thing once: one DeviceExecutor per device (kernel arguments,
// labels and events prepared), and the communicators of every axis group the program's
// collectives use (as ncclCommSplit would be called at load, never in the step loop). run()
// only enqueues work on the runtime's persistent device threads and streams.
//
// The runtime may be a ThreadRuntime (every device here) or an MpiRuntime (this process owns a
// block of the mesh's devices; see docs/runtime-mpi.md). On a multi-process runtime every
// process runs the same calls in the same order (SPMD): load, to_device, run and to_host are
// collective over the processes; arrays hold this process's shards only, and to_host
// returns the whole tensor on every process.
//
// Thread safety: run() may be called from several threads at once; runs of one loaded
// executable (and of everything loaded on one runtime) execute one at a time, and each run
// returns its own outputs and statistics. cancel() may be called from any thread: it aborts
// the run in flight (every device stops, the run throws RuntimeError "cancelled"), and the
// next run starts on fresh communicators. to_device/to_host may be called from any thread,
// also against a run that donates the same array: to_host then returns the old values or
// throws saying the array was donated (sharded_array.hpp).
//
// Lifetimes: the destructor waits for the calls in flight on other threads (runs, transfers);
// a call that starts while it runs throws. A program may outlive its runtime: destroying the
// runtime waits for the runs and transfers in flight, and every later run, to_device,
// to_host or runtime() throws RuntimeError saying the runtime was destroyed (runtime.hpp).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessel/compiler/compiled_program.hpp"
#include "tessel/ir/program.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/runtime/sharded_array.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel {


struct LoadOptions {
  // A collective waiting longer than this for its peers aborts the run with an error naming
  // it. 0 or infinity: no timeout. NaN or negative: load throws RuntimeError naming
  // collective_timeout_s. On an MpiRuntime, 0 means the runtime's timeout
  // (MpiRuntimeOptions::timeout_s): a multi-process run never waits forever.
  double collective_timeout_s = 0;
  // Donation, (input name, output name) pairs: the input's buffers are given to the run and
  // may become the output's (in-place update, as an optimizer step needs); the input array
  // is deleted by the run. Both must have the same global type and sharding (checked here).
  // The buffer is reused when the input is dead before the output is written; otherwise the
  // output gets a fresh buffer and the input's is freed at its last use.
  std::vector<std::pair<std::string, std::string>> donate;
  // Options of the lowering pipeline load() runs (lower_program): e.g.
  // lowering.combine_threshold_bytes = 0 keeps every collective separate.
  ProgramPassOptions lowering;
};

struct RunOptions {
  // Fill every buffer with NaN before it is written, and the gathered outputs before the
  // gather: an element nobody writes then fails every comparison (tests turn this on).
  bool poison = false;
  // Chrome-trace JSON of every device's kernels and collectives; empty: the TESSEL_TRACE
  // environment variable, when set, names the file. The file is opened before the run
  // starts, so a path that cannot be written fails at once.
  std::string trace_path;
  // NaN hunting (as JAX's debug_nans): after every instruction, its float results are copied
  // to the host and checked; the run then fails with an error naming the first instruction
  // that wrote NaN or infinity — its op, the value (the graph's name), the element, the
  // device and the run's number (counted per loaded program from 1) — or the input that
  // already held one. The -infinity causal_mask writes by design is not reported (NaN
  // still is). Slow: for debugging. The environment variable TESSEL_CHECK_FINITE=1
  // turns it on for every run.
  bool check_finite = false;
  // Only used by the Executable::run / run_sharded conveniences (which load on demand):
  bool check_replicas = false;     // when gathering outputs, replicas must agree bit for bit
  int kernel_threads = 1;          // ThreadRuntimeOptions::kernel_threads
  double collective_timeout_s = 0; // LoadOptions::collective_timeout_s
  StreamMode stream_mode = StreamMode::Async;  // ThreadRuntimeOptions::stream_mode
  int64_t inline_max_comm_bytes = 256 << 10;   // ThreadRuntimeOptions::inline_max_comm_bytes
  ProgramPassOptions lowering;     // LoadOptions::lowering (e.g. fuse_elementwise = false)
};

struct RunStats {
  // Per local device: the most bytes the device's backend had allocated at once during the
  // run (Backend::device_memory(): its allocator's count, reset at the run's start to the
  // bytes in use then). So it counts what the device holds besides this program (other
  // loaded programs' arenas, arrays the caller keeps) and kernel scratch the plan does not.
  std::vector<int64_t> measured_peak_bytes;
  // The same for host memory the backend allocated (the pool of offloaded activations).
  std::vector<int64_t> measured_host_peak_bytes;
  // The memory plan's peak per device (program().memory_plan().peak_bytes(): arena + inputs +
  // outputs - outputs written into donated buffers); the same on every device.
  int64_t planned_peak_bytes = 0;
  double seconds = 0;  // wall time of the device phase
};

struct RunResult {
  std::vector<ShardedArray> outputs;  // program output order
  RunStats stats;
};

class LoadedExecutable {
 public:
  LoadedExecutable(LoadedExecutable&&) noexcept;
  LoadedExecutable& operator=(LoadedExecutable&&) noexcept;
  ~LoadedExecutable();

  // The lowered program the executors run (lower_program of the Executable's: Program IR
  // v2 with its memory plan; program().memory_plan().peak_bytes() per device).
  const Program& program() const;
  // True when the program runs on each device's own thread (DeviceThreads::inline_stream):
  // asynchronous streams, but nothing to overlap in the program (no collective, or each one
  // on the critical path), or overlappable collectives too small for overlap to pay
  // (DeviceThreadsOptions::inline_max_comm_bytes).
  bool runs_inline() const;
  const Mesh& mesh() const;
  Runtime& runtime() const;
  // The mesh positions of this process's devices (all of them on a ThreadRuntime).
  const std::vector<int64_t>& local_devices() const;

  const std::vector<std::string>& input_names() const;   // graph input order
  const std::vector<std::string>& output_names() const;  // graph output order
  // The user's global shape of input `input` (before any padding for an uneven layout, which
  // the arrays on the devices carry: ShardedArray::shape()).
  Shape input_shape(std::size_t input) const;
  // The same for output `output`: an output of an uneven layout stays padded on the devices
  // (so it can be donated back to a padded input); to_host trims it to this shape.
  Shape output_shape(std::size_t output) const;
  // The layout input `name` has on the devices (what to_device gives it): an array of another
  // program on the same runtime and mesh in this layout may be passed to run() as it is, without
  // a copy through the host. Throws RuntimeError naming an unknown input.
  const Sharding& input_sharding(const std::string& name) const;
  // Throws RuntimeError naming the unknown name and the known ones.
  std::size_t input_index(const std::string& name) const;
  std::size_t output_index(const std::string& name) const;

  // Host -> devices: the shards of input `input` (scattered from the global tensor, checking
  // its type), copied to every device. Returns when the copies are done.
  ShardedArray to_device(std::size_t input, const HostTensor& global) const;
  ShardedArray to_device(const std::string& input, const HostTensor& global) const;
  // Every input at once (graph input order): the copies are enqueued together and waited for
  // once per device, not once per input.
  std::vector<ShardedArray> to_device(const std::vector<HostTensor>& globals) const;
  // Some inputs by name, at once in the same way (a step's batch and its scalars: one wait per
  // device for all). Throws RuntimeError naming an unknown input or a mistyped tensor.
  std::map<std::string, ShardedArray> to_device(const std::map<std::string, HostTensor>& named) const;
  // Host -> devices from per-device shards (checked against the local type).
  ShardedArray shards_to_device(std::size_t input, const std::vector<HostTensor>& shards) const;
  // Host -> devices in parts, for inputs too large to stage on the host at once (a checkpoint
  // restore under a host budget): an array of input `input` whose buffers are allocated and
  // not written, then write_to_shards copies the host tensor `box` into the shard of each
  // local device in `locals` at element coordinates `start` (synchronously, through one staging
  // buffer of the box's size per device). Only for an array being built that nothing else
  // reads yet. Throws RuntimeError naming the array when the box falls outside the shard.
  ShardedArray allocate_input_array(std::size_t input) const;
  void write_to_shards(const ShardedArray& array, const std::vector<std::size_t>& locals,
                       const std::vector<int64_t>& start, const HostTensor& box) const;
  // Devices -> host: the global tensor in the user's shape (ShardedArray::user_shape: an uneven
  // layout's padding cut off; check_replicas as in RunOptions), or every shard as the devices
  // hold it (padding included).
  HostTensor to_host(const ShardedArray& array, bool check_replicas = false) const;
  std::vector<HostTensor> shards_to_host(const ShardedArray& array) const;
  // The shard of one local device (array.devices()[local]) on the host, as the device holds it
  // (local shape, padding included). Not collective: each process copies what it needs (a
  // checkpoint writes each block from one process). Throws RuntimeError naming the array when
  // it is not an array of this program's local devices or `local` is out of range.
  HostTensor shard_to_host(const ShardedArray& array, std::size_t local) const;

  // Runs one step. inputs in graph input order (or by name). Throws RuntimeError naming the
  // input on a wrong array, and the device and instruction when one fails (all devices are
  // stopped first).
  RunResult run(const std::vector<ShardedArray>& inputs, const RunOptions& opts = {});
  RunResult run_named(const std::map<std::string, ShardedArray>& inputs, const RunOptions& opts = {});
  // The output of a result by name.
  const ShardedArray& output(const RunResult& result, const std::string& name) const;

  // Aborts the run in flight, if any (true), from any thread.
  bool cancel(const std::string& reason);

  struct Impl;

 private:
  ShardedArray enqueue_to_device(std::size_t input, const HostTensor& global, std::deque<HostTensor>& staged) const;
  explicit LoadedExecutable(std::unique_ptr<Impl> impl);
  friend LoadedExecutable load(const CompiledProgram&, Runtime&, const LoadOptions&);
  std::unique_ptr<Impl> impl_;
};

// The lowering options load() uses on `runtime`: `lowering`, with fuse_elementwise (or the
// einsum epilogues) turned off when a local backend has no fused_elementwise / fused_softmax
// (fused_einsum) kernel (Backend::has_kernel), so the lowering makes no kernel the devices
// cannot run; and on CPU backends, the collective-matmul gate's compute_sharing set to
// devices / hardware threads when the caller left it at 1 (cost.hpp).
ProgramPassOptions lowering_for(Runtime& runtime, ProgramPassOptions lowering);
// Throws RuntimeError naming the instruction, its op, the device and the backend when a kernel
// instruction of `program` has no kernel on `backend` (load() checks every local device).
void check_program_kernels(const Program& program, const Backend& backend, int64_t device);

// Loads `exe` on `runtime` (a ThreadRuntime must have exe.mesh().num_devices() devices; an
// MpiRuntime's world size must divide it). The runtime should outlive the loaded executable:
// once it is destroyed, the executable only throws (see Lifetimes above).
LoadedExecutable load(const CompiledProgram& program, Runtime& runtime, const LoadOptions& options = {});

}  // namespace tessel
