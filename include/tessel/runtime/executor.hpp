// tessel/runtime/executor.hpp — walks one device's SPMD program over a Backend and the
// device's Communicators. Collectives exchange flat rank-major blocks (communicator.hpp);
// the executor packs a tensor dim into such blocks and unpacks them with block copies.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/program.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/communicator.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/runtime/trace.hpp"

namespace tessel {

// Makes the communicator of this device for an axis group (e.g. ThreadWorld::communicator).
using CommunicatorFactory = std::function<std::unique_ptr<Communicator>(const std::vector<std::string>& axes)>;

struct DeviceRunOptions {
  bool poison = false;
  int kernel_threads = 1;
  Trace* trace = nullptr;
};

struct DeviceRunResult {
  std::vector<HostTensor> outputs;  // program.outputs order, local shapes
  int64_t peak_bytes = 0;
};

// Runs `program` as device `position`. inputs[i] is the local shard of program.inputs[i]
// (host memory). last_use is Program::last_use(). Exceptions propagate to the caller.
DeviceRunResult execute_device(const Program& program, const std::vector<int>& last_use,
                               int64_t position, Backend& backend, const CommunicatorFactory& comms,
                               const std::vector<const HostTensor*>& inputs,
                               const DeviceRunOptions& opts);

}  // namespace tessel
