// The NCCL collective world (built with TESSEL_WITH_NCCL; otherwise make_nccl_world throws).
//
// One world communicator per local device (ncclCommInitAll: this process drives every device
// of the mesh, a thread each), then, the first time an axis set is asked for, one
// ncclCommSplit per device inside one ncclGroupStart/End (a single thread drives all ranks of
// the split, which NCCL requires to be grouped): colour = index of the device's axis group in
// Mesh::groups(axes) and key = its index in the group, a pure function of the mesh, identical
// on every rank (docs/backend-cuda.md). Collectives are enqueued on the caller's stream (the
// executor's comm stream, ordered with compute by the program's events): all-gather,
// reduce-scatter and all-reduce (sum, max) directly; all-to-all and collective-permute as
// grouped ncclSend/ncclRecv.
//
// NCCL has no per-operation timeout: a watchdog thread polls ncclCommGetAsyncError on every
// communicator and, when a collective has been pending (its end event not reached) for longer
// than the timeout, aborts every communicator (ncclCommAbort), so blocked streams return and
// the run fails with the reason instead of hanging. Across processes the abort is posted on
// the ProcessGroup's abort channel, and each watchdog polls it: a failure on one process
// aborts every process's communicators with "process r aborted: <reason>".
//
// One process per GPU under mpirun / a launcher (issue 8, item 4b): each process owns some
// positions and joins with ncclCommInitRank on a unique id made by one process and shared
// through a ProcessGroup (MPI or a shared-file rendezvous; CudaRuntime does it); the splits
// are then collective over the processes, each splitting its own devices.
//
// What is decided is host code (nccl_core.cpp, in tessel): the NCCL calls of each collective,
// the splits, the init, the abort and the watchdog, calling NCCL through a table of entry
// points (nccl_api.hpp; NCCL itself in nccl_api.cpp), which the unit tests replace with a
// recording fake. This file adds the CUDA side: the cudaStream_t behind the executor's stream,
// the member's GPU made current, an end event per call for the watchdog's timeout, and the
// barrier's device word.
#include <fmt/format.h>

#include "cuda_backend.hpp"

#ifdef TESSEL_HAVE_NCCL
#include <chrono>
#include <mutex>

#include "nccl_core.hpp"

namespace tessel::cuda {
namespace {

// A collective in flight, for the watchdog: its end event and when it was enqueued.
struct Pending {
  cudaEvent_t done = nullptr;
  std::chrono::steady_clock::time_point since;
  std::string what;
  bool active = false;
};

// A member on a GPU: its calls are enqueued on the cudaStream_t behind the executor's stream,
// with its GPU current, and each records an end event the watchdog checks against the timeout.
class NcclCommunicator final : public NcclCommunicatorBase {
 public:
  NcclCommunicator(NcclWorldBase& w, NcclComm comm, int device, int rank, int size, std::string group)
      : NcclCommunicatorBase(w, comm, device, rank, size, std::move(group)) {
    DeviceGuard g(device);
    TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&pending_.done, cudaEventDisableTiming));
    TESSEL_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(int32_t)));
  }
  ~NcclCommunicator() override {
    detach();  // out of the watchdog's sight before the event goes
    if (pending_.done) cudaEventDestroy(pending_.done);
    if (barrier_buf_) cudaFree(barrier_buf_);
  }

  // For the watchdog (under its lock): true when a collective has been pending too long.
  bool overdue(double timeout, std::string& what) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (!pending_.active) return false;
    if (cudaEventQuery(pending_.done) == cudaSuccess) {
      pending_.active = false;
      return false;
    }
    cudaGetLastError();  // cudaErrorNotReady
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - pending_.since).count();
    if (timeout > 0 && waited > timeout) {
      what = fmt::format("{} on device {} (rank {} of {} in group {}) pending for {:.3g} s", pending_.what, device(),
                         rank(), size(), group(), waited);
      return true;
    }
    return false;
  }

 protected:
  int enqueue(Stream& s, const char* what, const std::function<int(NcclStream)>& issue) override {
    CudaStream& cs = cuda_stream(s, "nccl communicator");
    DeviceGuard g(device());
    cs.backend().debug_delay(cs);
    const int r = issue(cs.handle());
    if ((r == kNcclSuccess || r == kNcclInProgress) && !in_group()) {
      std::lock_guard<std::mutex> lk(mu_);
      TESSEL_CUDA_CHECK(cudaEventRecord(pending_.done, cs.handle()));
      pending_.since = std::chrono::steady_clock::now();
      pending_.what = what;
      pending_.active = true;
    }
    return r;
  }
  void* barrier_word() override { return barrier_buf_; }

 private:
  std::mutex mu_;
  Pending pending_;
  void* barrier_buf_ = nullptr;
};

class NcclWorld final : public NcclWorldBase {
 public:
  using NcclWorldBase::NcclWorldBase;

 protected:
  std::unique_ptr<NcclCommunicatorBase> make_member(NcclComm comm, int device, int rank, int size,
                                                    std::string group) override {
    return std::make_unique<NcclCommunicator>(*this, comm, device, rank, size, std::move(group));
  }
};

}  // namespace
}  // namespace tessel::cuda

namespace tessel {
bool nccl_available() { return true; }
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh& mesh, const std::vector<int>& gpus,
                                                 const CudaWorldOptions& options) {
  std::vector<int64_t> positions(gpus.size());
  for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int64_t>(i);
  return std::make_unique<cuda::NcclWorld>(cuda::real_nccl_api(), mesh, std::move(positions), gpus, std::string(),
                                          options);
}
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh& mesh, const std::vector<int64_t>& positions,
                                                 const std::vector<int>& gpus, const std::string& unique_id,
                                                 const CudaWorldOptions& options) {
  if (unique_id.empty())
    throw RuntimeError(fmt::format("make_nccl_world (mesh {}): empty NCCL unique id; make one with nccl_unique_id() "
                                   "on one process and give every process its bytes",
                                   mesh.to_string()));
  return std::make_unique<cuda::NcclWorld>(cuda::real_nccl_api(), mesh, positions, gpus, unique_id, options);
}
std::string nccl_unique_id() {
  std::string id(cuda::kNcclUniqueIdBytes, '\0');
  TESSEL_NCCL_CHECK(cuda::real_nccl_api(), cuda::real_nccl_api().get_unique_id(id.data()));
  return id;
}
}  // namespace tessel

#else  // no NCCL

namespace tessel {
bool nccl_available() { return false; }
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh& mesh, const std::vector<int>&, const CudaWorldOptions&) {
  throw RuntimeError(fmt::format("make_nccl_world (mesh {}): tessel was built without NCCL; reconfigure with "
                                 "-DTESSEL_WITH_NCCL=ON (and NCCL_ROOT pointing at an NCCL install)",
                                 mesh.to_string()));
}
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh& mesh, const std::vector<int64_t>&, const std::vector<int>& gpus,
                                                 const std::string&, const CudaWorldOptions& options) {
  return make_nccl_world(mesh, gpus, options);  // throws: no NCCL
}
std::string nccl_unique_id() {
  throw RuntimeError("nccl_unique_id: tessel was built without NCCL; reconfigure with -DTESSEL_WITH_NCCL=ON (and "
                     "NCCL_ROOT pointing at an NCCL install)");
}
}  // namespace tessel

#endif
