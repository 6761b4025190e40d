// tessel/runtime/executor.hpp — walks one device's lowered SPMD program (Program IR v2,
// docs/program-ir.md) and enqueues every instruction on the stream it names: kernels and
// block copies (the packing decided at compile time by the pack pass), collective starts on
// `comm` (a done is a point in comm's order), and waits as events recorded on one stream and
// waited on by another. The program's waits are the only edges between streams; the executor
// adds none of its own (the verifier checked the discipline). Intermediate values are views
// into one arena per device, allocated at construction (load) from the memory plan; outputs
// get a buffer per run (or a donated input's); inputs are the caller's. The executor never
// dereferences device memory.
//
// A DeviceExecutor is made once per device at load (kernel arguments, block copies, labels,
// events and the arena are prepared there) and run once per step; it is not reentrant.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/ir/program.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/communicator.hpp"
#include "tessel/runtime/trace.hpp"

namespace tessel {

// The axis groups (as axes lists) whose communicators the program's collectives use (a
// collective permute uses the group of every mesh axis):
// everything load() must create up front.
std::vector<std::vector<std::string>> communicator_axes(const Program& program);

// What a device runs on. The communicators (one per communicator_axes entry) belong to the
// caller and may be replaced between runs (after an abort).
struct DeviceContext {
  Backend* backend = nullptr;
  Stream* compute = nullptr;
  Stream* comm = nullptr;
  std::map<std::vector<std::string>, Communicator*> comms;
};

struct DeviceRunOptions {
  bool poison = false;  // fill every buffer the run allocates with NaN / INT32_MIN first
  Trace* trace = nullptr;
  // Checked between instructions: when set, the run stops enqueuing and throws.
  const std::atomic<bool>* cancelled = nullptr;
  // Per program input: the output it is donated to (its buffer may become the output's),
  // or -1. The donated input buffer is released by the run.
  std::vector<int> donate;
  // Called with the error's message as soon as the run fails, before the streams are drained
  // (so that the caller can abort the communicators other devices may be blocked in).
  std::function<void(const std::string&)> on_error;
  // Check every float value the run reads or writes for NaN and infinity (RunOptions::
  // check_finite); the run fails naming the first instruction that wrote one. run_index
  // numbers the run in the message.
  bool check_finite = false;
  int64_t run_index = 0;
};

struct DeviceRunResult {
  std::vector<std::shared_ptr<Buffer>> outputs;  // program.outputs order, local shapes
  // The backend's high-water marks over the run (Backend::device_memory(), host_memory()),
  // from the bytes in use when it started: measured, not the memory plan's number.
  int64_t measured_peak_bytes = 0;
  int64_t measured_host_peak_bytes = 0;
};

class DeviceExecutor {
 public:
  // `program` is lowered (lower_program: it has a memory plan) and must outlive the
  // executor. Throws RuntimeError for a program the executor cannot run (no memory plan, a
  // stream other than compute/comm, a collective over a non-contiguous dim, a missing
  // communicator).
  DeviceExecutor(const Program& program, int64_t position, DeviceContext ctx);
  ~DeviceExecutor();
  DeviceExecutor(const DeviceExecutor&) = delete;
  DeviceExecutor& operator=(const DeviceExecutor&) = delete;

  DeviceContext& context() { return ctx_; }

  // Runs the program on this device: inputs[i] is the local shard of program.inputs[i] on
  // this device. Returns when both streams are done. Throws RuntimeError naming the device and
  // instruction that failed, after draining both streams.
  DeviceRunResult run(const std::vector<std::shared_ptr<Buffer>>& inputs, const DeviceRunOptions& opts);

 private:
  void pair_permutes();
  struct RunState;
  Stream& stream(std::size_t instr) const { return *streams_[stream_of_[instr]]; }
  void collective(RunState& st, std::size_t i);
  // RunOptions::check_finite: value copied to the host after the work enqueued on s and
  // checked there; `source` names what wrote it.
  void check_finite(RunState& st, int value, Stream& s, const std::string& source, bool allow_inf = false,
                    int64_t instruction = -1);
  std::string finite_source(std::size_t instr) const;  // "instruction #i (%h = einsum) for op #k of the graph"

  const Program& p_;
  int64_t pos_;
  DeviceContext ctx_;
  Stream* streams_[2] = {nullptr, nullptr};  // compute, comm
  std::vector<int> stream_of_;               // per instruction: 0 compute, 1 comm
  std::vector<std::string> labels_;          // per instruction, for error messages
  std::vector<KernelArgs> kernel_args_;      // per instruction (kernels): all but the pointers
  std::vector<std::vector<BlockCopy>> copies_;  // per instruction (copies): this device's blocks
  std::vector<std::unique_ptr<Event>> events_;  // per instruction (waits)
  // Per instruction: the index of the permute issued with this one in one communicator group
  // (the two directions of a bidirectional collective-matmul ring step), else -1.
  std::vector<int> permute_partner_;
  std::shared_ptr<Buffer> arena_;
  std::shared_ptr<Buffer> host_pool_;  // offloaded activations (MemoryPlan::host_bytes), if any
  std::vector<std::shared_ptr<Buffer>> arena_views_;  // per value placed in the arena
  std::vector<int> output_of_;   // per value: index in outputs, -1
  std::vector<int> input_last_;  // per input: last instruction using its storage (-1: none)
  std::vector<std::unique_ptr<Event>> donate_events_;  // per stream: donated buffer reuse
};

}  // namespace tessel
