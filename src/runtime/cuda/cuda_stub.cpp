// cuda.hpp without CUDA (TESSEL_WITH_CUDA=OFF): the functions and CudaRuntime exist so that
// code using them (gpt --backend cuda, the benchmarks' switches) builds everywhere; each one
// throws a RuntimeError naming the build option, except cuda_device_count (0) and the
// queries (false), which never throw.
#include "tessel/runtime/cuda/cuda.hpp"

#include "tessel/runtime/device_threads.hpp"

namespace tessel {

struct CudaRuntime::Impl {};

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw RuntimeError(std::string(what) +
                     ": tessel was built without CUDA (TESSEL_WITH_CUDA=OFF: no CUDA compiler was found); "
                     "reconfigure with -DTESSEL_WITH_CUDA=ON on a machine with the CUDA toolkit "
                     "(docs/backend-cuda.md), or run on the CPU backend");
}
}  // namespace

bool cuda_compiled() { return false; }
bool cuda_has_kernel(OpKind) { return false; }
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "tessel was built without CUDA (TESSEL_WITH_CUDA=OFF)"; }
std::string cuda_device_name(int) { no_cuda("cuda_device_name"); }
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions&) { no_cuda("make_cuda_backend"); }
std::unique_ptr<CollectiveWorld> make_cuda_virtual_world(const Mesh&, const CudaWorldOptions&) {
  no_cuda("make_cuda_virtual_world");
}
bool nccl_available() { return false; }
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh&, const std::vector<int>&, const CudaWorldOptions&) {
  no_cuda("make_nccl_world");
}
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh&, const std::vector<int64_t>&, const std::vector<int>&,
                                                 const std::string&, const CudaWorldOptions&) {
  no_cuda("make_nccl_world");
}
std::string nccl_unique_id() { no_cuda("nccl_unique_id"); }
std::vector<HostTensor> run_on_cuda(const CompiledProgram&, const std::vector<HostTensor>&, const CudaRunOptions&) {
  no_cuda("run_on_cuda");
}

std::unique_ptr<CudaRuntime> make_cuda_runtime(const Mesh&, CudaRuntimeOptions, int) { no_cuda("make_cuda_runtime"); }
CudaRuntime::CudaRuntime(int64_t, CudaRuntimeOptions) { no_cuda("CudaRuntime"); }
CudaRuntime::~CudaRuntime() = default;
const CudaRuntimeOptions& CudaRuntime::options() const { no_cuda("CudaRuntime"); }
int64_t CudaRuntime::num_devices() const { no_cuda("CudaRuntime"); }
int CudaRuntime::gpu(int64_t) const { no_cuda("CudaRuntime"); }
int64_t CudaRuntime::gemm_plans(int64_t) const { no_cuda("CudaRuntime"); }
std::string CudaRuntime::name() const { no_cuda("CudaRuntime"); }
int CudaRuntime::process_rank() const { no_cuda("CudaRuntime"); }
int CudaRuntime::process_count() const { no_cuda("CudaRuntime"); }
std::vector<int64_t> CudaRuntime::devices_for(const Mesh&) { no_cuda("CudaRuntime"); }
DeviceThreads& CudaRuntime::local() { no_cuda("CudaRuntime"); }
std::unique_ptr<CollectiveWorld> CudaRuntime::make_world(const Mesh&, const std::vector<std::vector<std::string>>&,
                                                         double) {
  no_cuda("CudaRuntime");
}
std::vector<HostTensor> CudaRuntime::allgather_shards(const Mesh&, std::vector<HostTensor>) { no_cuda("CudaRuntime"); }
std::vector<std::string> CudaRuntime::allgather_host(const std::string&) { no_cuda("CudaRuntime"); }

}  // namespace tessel
