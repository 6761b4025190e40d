// The CUDA backend's one-process collective world (make_cuda_virtual_world): any number of
// virtual devices per GPU, any GPUs, no NCCL. The protocol (host rendezvous, ready/done
// events, pulls) is the backend-independent one of src/runtime/virtual_world.hpp, which the
// CPU suite checks on CPU streams under TSan; this file gives it the CUDA device operations:
// events of the stream's GPU, cudaMemcpyAsync between members' pointers (peer access, the
// pools' access granted by the runtime), the member-order reduction kernel
// (cuda_kernels::reduce_sources, f32 accumulation) and the backend's stream-ordered scratch.
#include <fmt/format.h>

#include "../virtual_world.hpp"
#include "cuda_backend.hpp"

namespace tessel::cuda {
namespace {

namespace ck = cuda_kernels;

class CudaVirtualOps final : public detail::VirtualDeviceOps {
 public:
  std::string name() const override { return "cuda virtual communicator"; }
  std::unique_ptr<Event> create_event(Stream& s) override { return backend(s).create_event(); }
  void copy(void* dst, const void* src, std::size_t bytes, Stream& s) override {
    CudaStream& cs = stream(s);
    DeviceGuard g(cs.backend().device());
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cs.handle()));
  }
  void reduce(const std::vector<const void*>& srcs, void* dst, DType dtype, ReduceOp op, std::size_t count,
              Stream& s) override {
    CudaStream& cs = stream(s);
    DeviceGuard g(cs.backend().device());
    ck::reduce_sources(srcs.data(), static_cast<int>(srcs.size()), dst, dtype,
                       op == ReduceOp::Max ? ck::Reduce::Max : ck::Reduce::Sum, static_cast<int64_t>(count),
                       cs.handle());
  }
  void* scratch(std::size_t bytes, Stream& s) override {
    CudaStream& cs = stream(s);
    DeviceGuard g(cs.backend().device());
    return cs.backend().scratch(bytes, cs);
  }
  void free_scratch(void* p, Stream& s) override {
    CudaStream& cs = stream(s);
    DeviceGuard g(cs.backend().device());
    cs.backend().free_scratch(p, cs);
  }
  void before_collective(Stream& s) override {
    CudaStream& cs = stream(s);
    DeviceGuard g(cs.backend().device());
    cs.backend().debug_delay(cs);
  }
  int max_group_size() const override { return ck::kMaxReduceSources; }

 private:
  static CudaStream& stream(Stream& s) { return cuda_stream(s, "cuda virtual communicator"); }
  static CudaBackend& backend(Stream& s) { return stream(s).backend(); }
};

}  // namespace
}  // namespace tessel::cuda

namespace tessel {

std::unique_ptr<CollectiveWorld> make_cuda_virtual_world(const Mesh& mesh, const CudaWorldOptions& options) {
  return detail::make_virtual_world(mesh, options.timeout_seconds, std::make_shared<cuda::CudaVirtualOps>());
}

}  // namespace tessel
