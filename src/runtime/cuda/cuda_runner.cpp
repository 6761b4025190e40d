// run_on_cuda: one run of a compiled program on CUDA devices — a backend, a compute and a
// communication stream and a host thread per mesh device (virtual devices round-robin over
// the GPUs), the collective world (virtual-device or NCCL), and the CPU runtime's
// DeviceExecutor walking each device's program. This is load() + run() of
// loaded_executable.hpp for CUDA until ThreadRuntime can be given a backend factory (see
// docs/backend-cuda.md, "Integration"); the executors, the lowering and the host scatter and
// gather are the very ones the CPU runtime uses.
#include <fmt/format.h>

#include <thread>

#include "cuda_backend.hpp"
#include "tessel/executable.hpp"
#include "tessel/program_passes.hpp"
#include "tessel/runtime/executor.hpp"

namespace tessel {

std::vector<HostTensor> run_on_cuda(const Executable& exe, const std::vector<HostTensor>& inputs,
                                    const CudaRunOptions& options) {
  const Mesh& mesh = exe.mesh();
  const int64_t n = mesh.num_devices();
  const int gpus = std::max(1, options.num_gpus);
  if (cuda_device_count() < options.backend.device + gpus)
    throw RuntimeError(fmt::format("run_on_cuda: needs GPUs {}..{} but {} are visible", options.backend.device,
                                   options.backend.device + gpus - 1, cuda_device_count()));
  // The CUDA backend has no fused_elementwise kernel yet (kernels/ has one kernel per op of the
  // registry): lower without fusing, whatever the options say.
  ProgramPassOptions lowering = options.load.lowering;
  lowering.fuse_elementwise = false;
  const Program program = lower_program(exe.program(), /*verify=*/false, lowering);
  if (inputs.size() != program.inputs.size())
    throw RuntimeError(fmt::format("run_on_cuda: {} inputs given, the program takes {}", inputs.size(),
                                   program.inputs.size()));

  // Devices: backend, streams.
  std::vector<int> gpu_of(static_cast<std::size_t>(n));
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Stream>> compute, comm;
  for (int64_t d = 0; d < n; ++d) {
    CudaBackendOptions bo = options.backend;
    bo.device = options.backend.device + static_cast<int>(d % gpus);
    gpu_of[static_cast<std::size_t>(d)] = bo.device;
    backends.push_back(make_cuda_backend(bo));
    compute.push_back(backends.back()->create_stream(fmt::format("device {} compute", d)));
    comm.push_back(backends.back()->create_stream(fmt::format("device {} comm", d)));
  }
  if (gpus > 1) {  // the virtual-device reductions read peers' memory directly
    for (int a = 0; a < gpus; ++a)
      for (int b = 0; b < gpus; ++b)
        if (a != b) {
          cuda::DeviceGuard g(options.backend.device + a);
          const cudaError_t e = cudaDeviceEnablePeerAccess(options.backend.device + b, 0);
          if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
            throw RuntimeError(fmt::format("run_on_cuda: GPU {} cannot access GPU {}: {}", options.backend.device + a,
                                           options.backend.device + b, cudaGetErrorString(e)));
          cudaGetLastError();
        }
  }

  // The collective world and every communicator the program uses (as at load).
  CudaWorldOptions wo;
  wo.timeout_seconds = options.collective_timeout_s;
  std::unique_ptr<CollectiveWorld> world =
      options.use_nccl ? make_nccl_world(mesh, gpu_of, wo) : make_cuda_virtual_world(mesh, wo);
  const auto axes = communicator_axes(program);
  std::vector<std::vector<std::unique_ptr<Communicator>>> comms(static_cast<std::size_t>(n));
  std::vector<std::unique_ptr<DeviceExecutor>> executors;
  for (int64_t d = 0; d < n; ++d) {
    DeviceContext ctx;
    ctx.backend = backends[static_cast<std::size_t>(d)].get();
    ctx.compute = compute[static_cast<std::size_t>(d)].get();
    ctx.comm = comm[static_cast<std::size_t>(d)].get();
    for (const auto& ax : axes) {
      comms[static_cast<std::size_t>(d)].push_back(world->communicator(d, ax));
      ctx.comms[ax] = comms[static_cast<std::size_t>(d)].back().get();
    }
    executors.push_back(std::make_unique<DeviceExecutor>(program, d, std::move(ctx)));
  }

  // Inputs: every device's shard, host -> device through the compute stream.
  std::vector<std::vector<std::shared_ptr<Buffer>>> per(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto shards = exe.scatter(i, inputs[i]);
    for (int64_t d = 0; d < n; ++d) {
      const HostTensor& t = shards[static_cast<std::size_t>(d)];
      std::shared_ptr<Buffer> b = backends[static_cast<std::size_t>(d)]->allocate(t.bytes());
      backends[static_cast<std::size_t>(d)]->copy_from_host(*b, t.data(), t.bytes(), *compute[static_cast<std::size_t>(d)]);
      per[static_cast<std::size_t>(d)].push_back(std::move(b));
    }
  }
  for (auto& s : compute) s->synchronize();

  // The run: a thread per device; the first failure aborts the world so no peer hangs.
  std::vector<DeviceRunResult> results(static_cast<std::size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<char> root(static_cast<std::size_t>(n), 0);
  std::mutex root_mu;
  {
    std::vector<std::thread> threads;
    for (int64_t d = 0; d < n; ++d)
      threads.emplace_back([&, d] {
        const auto u = static_cast<std::size_t>(d);
        try {
          DeviceRunOptions ro;
          ro.poison = options.poison;
          ro.donate.assign(program.inputs.size(), -1);
          ro.on_error = [&, u, d](const std::string& msg) {
            std::lock_guard<std::mutex> lk(root_mu);
            if (!world->aborted()) {
              root[u] = 1;
              world->abort(fmt::format("device {} failed: {}", d, msg));
            }
          };
          results[u] = executors[u]->run(per[u], ro);
        } catch (...) {
          errors[u] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
  }
  for (int64_t d = 0; d < n; ++d)
    if (errors[static_cast<std::size_t>(d)] && root[static_cast<std::size_t>(d)])
      std::rethrow_exception(errors[static_cast<std::size_t>(d)]);
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);

  // Outputs: device -> host, then the host gather (replicas checked when asked).
  std::vector<HostTensor> out;
  for (std::size_t o = 0; o < program.outputs.size(); ++o) {
    const LocalValue& lv = program.values[static_cast<std::size_t>(program.outputs[o])];
    std::vector<HostTensor> shards;
    for (int64_t d = 0; d < n; ++d) {
      HostTensor t(lv.dtype, lv.shape);
      backends[static_cast<std::size_t>(d)]->copy_to_host(t.data(), *results[static_cast<std::size_t>(d)].outputs[o],
                                                         t.bytes(), *compute[static_cast<std::size_t>(d)]);
      shards.push_back(std::move(t));
    }
    for (auto& s : compute) s->synchronize();
    out.push_back(exe.gather(o, shards, options.check_replicas));
  }
  // Buffers die before their streams and backends (declared after them).
  results.clear();
  per.clear();
  executors.clear();
  return out;
}

}  // namespace tessel
