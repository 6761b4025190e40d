// Internal to the pipeline runner (runner.cpp): where each stage runs, and the links that carry
// the values between stages: a mailbox between the stage threads of one process, and host
// messages between processes (ProcessGroup::send / try_recv) when the stages are spread over an
// mpirun job. Not installed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "tessel/runtime/process_group.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel::detail {

using Hosts = std::map<std::string, HostTensor>;

// Host tensors by name as bytes and back (the values crossing between processes). unpack
// throws Error naming `what` when the bytes are not such a packing; no bytes are no values.
std::string pack_hosts(const Hosts& values);
Hosts unpack_hosts(const std::string& bytes, const std::string& what);
std::string pack_doubles(const std::vector<double>& values);
std::vector<double> unpack_doubles(const std::string& bytes, const std::string& what);

// The stages' processes: without a process group every stage runs in this process; with one of
// P·k processes, stage s runs on processes [s·k, (s+1)·k), and the process of index i within its
// stage talks to index i of the others (each process holds every value whole on the host).
struct StagePlacement {
  std::shared_ptr<ProcessGroup> processes;
  int64_t stages = 1;
  int per_stage = 1;
  int64_t my_stage = -1;  // with processes
  int index = 0;          // within the stage
  bool local(int64_t stage) const { return !processes || stage == my_stage; }
  int peer(int64_t stage) const { return static_cast<int>(stage) * per_stage + index; }
  // One process of each stage speaks for it in the gathers (the others hold the same values).
  bool leader() const { return index == 0; }
  // Every process's bytes in rank order (collective over the processes); alone: {mine}.
  std::vector<std::string> gather(const std::string& mine) const;
};

// The values between the stages of one step: (0 forward / 1 backward, receiving virtual stage,
// micro-batch) -> the values by name. A value for a stage of another process is sent there; a
// failure anywhere wakes every waiter here and, across processes, every process's.
class StageLinks {
 public:
  StageLinks(StagePlacement where, double timeout_s);
  // A new step: forgets a failure and every value of earlier steps.
  void begin_step(int64_t step);
  void put(int kind, int64_t vs, int64_t m, Hosts values);
  // Waits for the value; throws Error when a stage failed, or (across processes) when none came
  // within the timeout, naming what it waited for.
  Hosts take(int kind, int64_t vs, int64_t m);
  void fail(const std::string& reason);

 private:
  using Key = std::tuple<int64_t, int, int64_t, int64_t>;  // step, kind, vs, micro-batch
  void poll_locked();                                       // moves arrived messages into the box
  StagePlacement where_;
  double timeout_s_;
  int64_t step_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, Hosts> box_;
  bool failed_ = false;
  std::string reason_;
};

}  // namespace tessel::detail
