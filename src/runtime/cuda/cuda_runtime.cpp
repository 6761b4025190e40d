// CudaRuntime (cuda.hpp): DeviceThreads whose backends are CUDA backends, and the collective
// world of a load — the virtual-device world, an NCCL world over this process's GPUs, or one
// NCCL world over every process of a job (the unique id shared through a ProcessGroup).
#include <fmt/format.h>

#include <cstring>
#include <set>

#include "cuda_backend.hpp"
#include "nccl_core.hpp"
#include "tessel/runtime/device_threads.hpp"

namespace tessel {

struct CudaRuntime::Impl {
  CudaRuntimeOptions options;
  std::vector<int> gpus;  // per local device
  int rank = 0, size = 1;
  std::unique_ptr<DeviceThreads> threads;

  std::vector<int64_t> positions() const {
    const int64_t k = static_cast<int64_t>(gpus.size());
    std::vector<int64_t> p(gpus.size());
    for (int64_t i = 0; i < k; ++i) p[static_cast<std::size_t>(i)] = rank * k + i;
    return p;
  }
};

namespace {

// Lets every GPU of the set read the others' memory (the virtual-device reductions pull peers'
// buffers directly). Peer access covers cudaMalloc memory only: memory from a GPU's
// stream-ordered pool (cudaMallocAsync, what CudaBackend allocates from) is visible to another
// GPU only once the pool grants it (cudaMemPoolSetAccess), so every pool grants every peer.
void enable_peer_access(const std::set<int>& gpus) {
  for (int a : gpus)
    for (int b : gpus) {
      if (a == b) continue;
      int can = 0;
      TESSEL_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can)
        throw RuntimeError(fmt::format("CudaRuntime: GPU {} cannot access GPU {}'s memory (no peer access), which "
                                       "the virtual-device collectives need; use use_nccl, or num_gpus = 1",
                                       a, b));
      cuda::DeviceGuard g(a);
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
        throw RuntimeError(fmt::format("CudaRuntime: GPU {} cannot access GPU {}: {}", a, b, cudaGetErrorString(e)));
      cudaGetLastError();  // clears cudaErrorPeerAccessAlreadyEnabled
    }
  for (int b : gpus) {
    int pools = 0;
    TESSEL_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, b));
    if (!pools) continue;  // the backend falls back to cudaMalloc there
    cudaMemPool_t pool;
    TESSEL_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, b));
    for (int a : gpus) {
      if (a == b) continue;
      cudaMemAccessDesc desc{};
      desc.location.type = cudaMemLocationTypeDevice;
      desc.location.id = a;
      desc.flags = cudaMemAccessFlagsProtReadWrite;
      const cudaError_t e = cudaMemPoolSetAccess(pool, &desc, 1);
      if (e != cudaSuccess)
        throw RuntimeError(fmt::format("CudaRuntime: GPU {}'s memory pool cannot be opened to GPU {} "
                                       "(cudaMemPoolSetAccess: {}), which the virtual-device collectives need; use "
                                       "use_nccl, num_gpus = 1, or TESSEL_CUDA_MEMORY_POOLS=0",
                                       b, a, cudaGetErrorString(e)));
    }
  }
}

std::string no_gpu_message(const char* who) {
  return fmt::format("{}: no CUDA GPU is visible to this process (check nvidia-smi, the driver and "
                     "CUDA_VISIBLE_DEVICES), so the CUDA backend cannot run; use the CPU runtime (ThreadRuntime) "
                     "instead",
                     who);
}

}  // namespace

bool cuda_compiled() { return true; }
bool cuda_has_kernel(OpKind kind) { return cuda::has_cuda_kernel(kind); }

CudaRuntime::CudaRuntime(int64_t num_devices, CudaRuntimeOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  im.options = std::move(options);
  const CudaRuntimeOptions& o = im.options;
  if (num_devices < 1)
    throw RuntimeError(fmt::format("CudaRuntime: num_devices must be >= 1, got {}", num_devices));
  if (o.num_gpus < 0) throw RuntimeError(fmt::format("CudaRuntime: num_gpus must be >= 0, got {}", o.num_gpus));
  const int visible = cuda_device_count();
  if (visible == 0) throw RuntimeError(no_gpu_message("CudaRuntime"));
  if (o.processes) {
    im.rank = o.processes->rank();
    im.size = o.processes->size();
    if (!nccl_available())
      throw RuntimeError(fmt::format("CudaRuntime: {} processes ({}) need NCCL, and tessel was built without it; "
                                     "reconfigure with -DTESSEL_WITH_NCCL=ON",
                                     im.size, o.processes->name()));
  }
  const int first = o.backend.device;
  for (int64_t i = 0; i < num_devices; ++i) {
    int g;
    if (o.num_gpus >= 1)
      g = first + static_cast<int>(i % o.num_gpus);
    else if (o.processes)
      g = cuda::nccl_process_gpu(o.processes->local_rank(), num_devices, i, visible);
    else
      g = first + static_cast<int>(i % std::max(1, visible - first));
    if (g < 0 || g >= visible)
      throw RuntimeError(fmt::format("CudaRuntime: local device {} of {} would run on GPU {}, but {} GPU(s) are "
                                     "visible (ordinals 0..{}); lower backend.device ({}) or num_gpus ({})",
                                     i, num_devices, g, visible, visible - 1, first, o.num_gpus));
    im.gpus.push_back(g);
  }
  const std::set<int> distinct(im.gpus.begin(), im.gpus.end());
  if (!o.processes && !o.use_nccl && distinct.size() > 1) enable_peer_access(distinct);

  DeviceThreadsOptions to;
  to.owner = "CudaRuntime";
  to.spin_us = o.spin_us;
  to.make_backend = [this](int64_t d, int) {
    CudaBackendOptions bo = impl_->options.backend;
    bo.device = impl_->gpus[static_cast<std::size_t>(d)];
    return make_cuda_backend(bo);
  };
  im.threads = std::make_unique<DeviceThreads>(num_devices, std::move(to));
}

CudaRuntime::~CudaRuntime() {
  // Programs loaded here may outlive it: their runs in flight end first (while the device
  // threads still run), later ones throw.
  retire(fmt::format("CudaRuntime of {} devices", impl_ ? impl_->gpus.size() : 0));
}

const CudaRuntimeOptions& CudaRuntime::options() const { return impl_->options; }
int64_t CudaRuntime::num_devices() const { return static_cast<int64_t>(impl_->gpus.size()); }
int CudaRuntime::gpu(int64_t local_device) const { return impl_->gpus.at(static_cast<std::size_t>(local_device)); }
int64_t CudaRuntime::gemm_plans(int64_t local_device) const {
  if (local_device < 0 || local_device >= num_devices())
    throw RuntimeError(fmt::format("CudaRuntime::gemm_plans: local device {} is outside [0, {})", local_device, num_devices()));
  auto* be = dynamic_cast<cuda::CudaBackend*>(&impl_->threads->backend(local_device));
  return be ? cuda::gemm_plan_count(be->gemm()) : 0;
}

std::string CudaRuntime::name() const {
  return impl_->options.processes ? "cuda+" + impl_->options.processes->name() : "cuda";
}
int CudaRuntime::process_rank() const { return impl_->rank; }
int CudaRuntime::process_count() const { return impl_->size; }
DeviceThreads& CudaRuntime::local() { return *impl_->threads; }

std::vector<int64_t> CudaRuntime::devices_for(const Mesh& mesh) {
  const int64_t k = num_devices();
  if (mesh.num_devices() != k * impl_->size)
    throw RuntimeError(fmt::format("load: the program is partitioned for mesh {} ({} devices) but the CUDA runtime "
                                   "has {} device(s) per process x {} process(es); make the CudaRuntime with "
                                   "mesh.num_devices() / process count devices",
                                   mesh.to_string(), mesh.num_devices(), k, impl_->size));
  return impl_->positions();
}

std::unique_ptr<CollectiveWorld> CudaRuntime::make_world(const Mesh& mesh,
                                                         const std::vector<std::vector<std::string>>& /*axes*/,
                                                         double timeout_s) {
  // The communicators are split on first request (load asks for every group right after).
  CudaWorldOptions wo;
  wo.timeout_seconds = timeout_s;
  const Impl& im = *impl_;
  if (im.options.processes) {
    // Rank 0 makes the id; everyone takes rank 0's bytes, after every process's GPUs were checked
    // against NCCL's one-rank-per-GPU rule (nccl_bootstrap). A fresh id per world: after an abort
    // load makes a new world, and NCCL ids are single-use.
    std::vector<std::string> bus_ids;
    for (int g : im.gpus) {
      char bus[64] = {};
      TESSEL_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus), g));
      bus_ids.emplace_back(bus);
    }
    const std::string id = cuda::nccl_bootstrap(*im.options.processes, bus_ids, [] { return nccl_unique_id(); });
    wo.processes = im.options.processes;  // the abort channel
    return make_nccl_world(mesh, im.positions(), im.gpus, id, wo);
  }
  if (im.options.use_nccl) return make_nccl_world(mesh, im.gpus, wo);
  return make_cuda_virtual_world(mesh, wo);
}

std::vector<HostTensor> CudaRuntime::allgather_shards(const Mesh& mesh, std::vector<HostTensor> local) {
  const Impl& im = *impl_;
  if (!im.options.processes || im.size == 1) return local;
  if (local.empty()) throw RuntimeError("CudaRuntime::allgather_shards: no local shard");
  const DType dt = local[0].dtype();
  const Shape shape = local[0].shape();
  const std::size_t bytes = local[0].bytes();
  std::string mine;
  mine.reserve(bytes * local.size());
  for (const HostTensor& t : local) mine.append(static_cast<const char*>(t.data()), t.bytes());
  const std::vector<std::string> all = im.options.processes->allgather(mine);
  const int64_t k = num_devices();
  std::vector<HostTensor> out;
  for (int64_t p = 0; p < mesh.num_devices(); ++p) {
    const std::string& from = all.at(static_cast<std::size_t>(p / k));
    if (from.size() != bytes * static_cast<std::size_t>(k))
      throw RuntimeError(fmt::format("CudaRuntime::allgather_shards: process {} sent {} bytes, expected {} ({} shards "
                                     "of {})",
                                     p / k, from.size(), bytes * static_cast<std::size_t>(k), k, type_str(dt, shape)));
    HostTensor t(dt, shape);
    std::memcpy(t.data(), from.data() + static_cast<std::size_t>(p % k) * bytes, bytes);
    out.push_back(std::move(t));
  }
  return out;
}

std::unique_ptr<CudaRuntime> make_cuda_runtime(const Mesh& mesh, CudaRuntimeOptions options, int max_gpus) {
  if (max_gpus < 0) throw RuntimeError(fmt::format("make_cuda_runtime: max_gpus must be >= 0, got {}", max_gpus));
  // Before any launcher bootstrap (MPI_Init, a rendezvous that would wait for the others).
  if (cuda_device_count() == 0) throw RuntimeError(no_gpu_message("make_cuda_runtime"));
  if (!options.processes) options.processes = process_group_from_env();
  if (options.processes && options.processes->size() > 1) {
    const int np = options.processes->size();
    if (mesh.num_devices() % np != 0)
      throw RuntimeError(fmt::format("make_cuda_runtime: mesh {} has {} devices, which {} processes ({}) cannot "
                                     "share evenly; launch a number of processes that divides it",
                                     mesh.to_string(), mesh.num_devices(), np, options.processes->name()));
    options.num_gpus = 0;  // by local rank
    return std::make_unique<CudaRuntime>(mesh.num_devices() / np, std::move(options));
  }
  options.processes = nullptr;
  const int visible = cuda_device_count() - options.backend.device;
  int gpus = max_gpus > 0 ? std::min(max_gpus, visible) : visible;
  if (gpus >= mesh.num_devices()) gpus = static_cast<int>(mesh.num_devices());
  options.num_gpus = std::max(1, gpus);
  return std::make_unique<CudaRuntime>(mesh.num_devices(), std::move(options));
}

std::vector<std::string> CudaRuntime::allgather_host(const std::string& mine) {
  const Impl& im = *impl_;
  if (!im.options.processes || im.size == 1) return {mine};
  return im.options.processes->allgather(mine);
}

}  // namespace tessel
