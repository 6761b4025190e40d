// tessel/runtime/executor.hpp — walks one device's SPMD program, enqueuing every instruction
// on the device's streams: kernels and local shard slices on the compute stream, collectives
// (with the packing of a tensor dim into rank-major blocks and back, as Backend::copy_block
// operations) on the communication stream. Events are the only edges between the two: a
// collective waits for the compute work before it, a kernel reading a collective's result
// waits for that collective, and a buffer is released on the stream of its last use after
// the other stream's uses of it. The executor never dereferences device memory.
//
// A DeviceExecutor is made once per device at load (kernel arguments, labels and events are
// prepared there) and run once per step; it is not reentrant (one run at a time).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/program.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/communicator.hpp"
#include "tessel/runtime/trace.hpp"

namespace tessel {

// The axis groups (as axes lists) whose communicators the program's collectives use:
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
};

struct DeviceRunResult {
  std::vector<std::shared_ptr<Buffer>> outputs;  // program.outputs order, local shapes
  int64_t peak_bytes = 0;                        // inputs, live intermediates and scratch
};

class DeviceExecutor {
 public:
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
  struct RunState;
  void kernel(RunState& st, std::size_t i);
  void shard_slice(RunState& st, std::size_t i);
  void collective(RunState& st, std::size_t i);

  const Program& p_;
  int64_t pos_;
  DeviceContext ctx_;
  std::vector<int> last_use_;
  std::vector<std::string> labels_;        // per instruction, for error messages
  std::vector<KernelArgs> kernel_args_;    // per instruction (kernels): all but the pointers
  std::vector<std::unique_ptr<Event>> start_;  // per collective: compute work before it
  std::vector<std::unique_ptr<Event>> done_;   // per collective: the collective finished
  std::vector<std::unique_ptr<Event>> donate_events_;  // per output: donated buffer reuse
};

}  // namespace tessel
