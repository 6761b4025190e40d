// make_runtime (runtime/make_runtime.hpp): every backend. Built into the CUDA backend's library
// when CUDA is on (make_cuda_runtime lives there), into tessel otherwise (beside the CUDA
// stub): CMakeLists.txt adds it to one of the two.
#include "tessel/runtime/make_runtime.hpp"

#include "tessel/runtime/cuda/cuda.hpp"

namespace tessel {

std::unique_ptr<Runtime> make_runtime(const RuntimeRequest& r) {
  if (r.backend == "cuda") return make_cuda_runtime(r.mesh, {}, r.max_gpus);
  return make_cpu_runtime(r);
}

}  // namespace tessel
