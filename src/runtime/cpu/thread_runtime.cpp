// ThreadRuntime: the CPU runtime of one process — DeviceThreads with CPU backends (and an
// eager CPU stream per device for inline programs), an in-process ThreadWorld for collectives.
#include "tessel/runtime/cpu/thread_runtime.hpp"

#include "tessel/runtime/cpu/thread_communicator.hpp"
#include "cpu_stream.hpp"

#include <fmt/format.h>

namespace tessel {
namespace {

DeviceThreadsOptions device_options(const ThreadRuntimeOptions& o) {
  if (o.kernel_threads < 1)
    throw RuntimeError(fmt::format("ThreadRuntime: kernel_threads must be >= 1, got {}", o.kernel_threads));
  DeviceThreadsOptions d;
  d.owner = "ThreadRuntime";
  d.stream_mode = o.stream_mode;
  d.spin_us = o.spin_us;
  d.inline_serial_programs = o.inline_serial_programs;
  // A simulated interconnect is worth overlapping: only programs with nothing on another
  // stream run inline then.
  const bool links = o.link_model.on() || LinkModel::from_env().on();
  d.inline_max_comm_bytes = links ? 0 : o.inline_max_comm_bytes;
  d.before_thread_start = o.before_thread_start;
  if (o.make_backend) {
    // A backend of the caller's: its streams are not CPU streams, so there is no inline CPU
    // stream to run serial programs on.
    d.make_backend = [mb = o.make_backend](int64_t device, int) { return mb(device); };
  } else {
    const StreamMode mode = o.stream_mode;
    const int kernel_threads = o.kernel_threads;
    d.make_backend = [mode, kernel_threads](int64_t, int spin_us) {
      CpuBackendOptions bo;
      bo.mode = mode;
      bo.kernel_threads = kernel_threads;
      bo.spin_us = spin_us;
      return make_cpu_backend(bo);
    };
    d.make_inline_stream = [](int64_t device, int spin_us) -> std::unique_ptr<Stream> {
      return std::make_unique<detail::CpuStream>(StreamMode::Eager, fmt::format("device {} inline", device), spin_us);
    };
  }
  return d;
}

}  // namespace

ThreadRuntime::ThreadRuntime(int64_t num_devices, ThreadRuntimeOptions options)
    : DeviceThreads(num_devices, device_options(options)), options_(std::move(options)) {
  if (options_.make_backend) options_.inline_serial_programs = false;
}

ThreadRuntime::~ThreadRuntime() {
  // Programs loaded here may outlive it: their runs in flight end first, later ones throw.
  retire(fmt::format("ThreadRuntime of {} devices", num_devices()));
  stop_threads();
}

std::vector<int64_t> ThreadRuntime::devices_for(const Mesh& mesh) {
  if (num_devices() != mesh.num_devices())
    throw RuntimeError(fmt::format("load: the program is partitioned for mesh {} ({} devices) but the runtime has {} "
                                   "devices; make the ThreadRuntime with mesh.num_devices()",
                                   mesh.to_string(), mesh.num_devices(), num_devices()));
  std::vector<int64_t> pos(static_cast<std::size_t>(num_devices()));
  for (int64_t d = 0; d < num_devices(); ++d) pos[static_cast<std::size_t>(d)] = d;
  return pos;
}

LinkModel ThreadRuntime::link_model() const {
  return options_.link_model.on() ? options_.link_model : LinkModel::from_env();
}

std::unique_ptr<CollectiveWorld> ThreadRuntime::make_world(const Mesh& mesh,
                                                           const std::vector<std::vector<std::string>>& /*axes*/,
                                                           double timeout_s) {
  ThreadWorldOptions wo;
  wo.timeout_seconds = timeout_s;
  wo.spin_us = spin_us();  // the collectives run on this runtime's threads: same budget
  wo.link_model = link_model();
  return std::make_unique<ThreadWorld>(mesh, wo);  // groups are created on first request
}

std::vector<HostTensor> ThreadRuntime::allgather_shards(const Mesh& /*mesh*/, std::vector<HostTensor> local) {
  return local;
}

}  // namespace tessel
