// run_on_cuda: one run of a compiled program on a CudaRuntime made for it — load, inputs to
// the devices, run, outputs to the host — exactly the path of load()/LoadedExecutable on the
// CPU runtime (the same lowering, executors, scatter and gather), with CUDA backends.
#include <fmt/format.h>

#include "tessel/runtime/cuda/cuda.hpp"

namespace tessel {

std::vector<HostTensor> run_on_cuda(const CompiledProgram& exe, const std::vector<HostTensor>& inputs,
                                    const CudaRunOptions& options) {
  CudaRuntimeOptions ro;
  ro.backend = options.backend;
  ro.num_gpus = std::max(1, options.num_gpus);
  ro.use_nccl = options.use_nccl;
  CudaRuntime rt(exe.mesh.num_devices(), ro);
  LoadOptions lo = options.load;
  lo.collective_timeout_s = options.collective_timeout_s;
  LoadedExecutable prog = load(exe, rt, lo);
  if (inputs.size() != prog.input_names().size())
    throw RuntimeError(fmt::format("run_on_cuda: {} inputs given, the program takes {}", inputs.size(),
                                   prog.input_names().size()));
  const std::vector<ShardedArray> arrays = prog.to_device(inputs);
  RunOptions run;
  run.poison = options.poison;
  RunResult r = prog.run(arrays, run);
  std::vector<HostTensor> out;
  for (const ShardedArray& a : r.outputs) out.push_back(prog.to_host(a, options.check_replicas));
  return out;
}

}  // namespace tessel
