// make_runtime (runtime/make_runtime.hpp): every backend. Built into the CUDA backend's library
// when CUDA is on (make_cuda_runtime lives there), into tessel otherwise (beside the CUDA
// stub): CMakeLists.txt adds it to one of the two.
#include "tessel/runtime/make_runtime.hpp"

#include "tessel/runtime/cuda/cuda.hpp"
#include "tessel/runtime/launch.hpp"
#include "tessel/runtime/process_group.hpp"

namespace tessel {

std::unique_ptr<Runtime> make_runtime(const RuntimeRequest& r) {
  if (r.backend == "cuda" && !r.mpi_ranks.empty()) {
    // One GPU per process, NCCL over the given ranks' processes.
    CudaRuntimeOptions c;
    c.processes = mpi_process_group(r.mpi_ranks, r.mpi_group_tag);
    c.num_gpus = 1;
    c.backend.device = r.cuda_device >= 0 ? r.cuda_device : detect_launch().local_rank;
    return std::make_unique<CudaRuntime>(1, c);
  }
  if (r.backend == "cuda") return make_cuda_runtime(r.mesh, {}, r.max_gpus);
  return make_cpu_runtime(r);
}

}  // namespace tessel
