// src/runtime/cuda/nccl_core.hpp — the NCCL world without CUDA: which NCCL calls each collective
// makes, the splits, the abort, the watchdog (issue 22, "GPU readiness").
//
// Everything the NCCL world decides is here, in host code over the table of NCCL entry points
// (nccl_api.hpp), part of tessel in every build: the plan of each collective (the NCCL calls and
// their arguments: pointers, counts, types, peers, groups), the ncclCommSplit colours and keys,
// the communicator init, the gate that orders calls against an abort, the abort itself (across
// processes too), the watchdog, and a multi-process world's bootstrap (each process's GPUs, the
// unique id, NCCL's one-rank-per-GPU rule across processes). nccl_world.cpp adds only what needs the CUDA runtime: the
// cudaStream_t behind a Stream, the current device, an end event per call for the watchdog's
// timeout, and the barrier's device word (NcclCommunicatorBase's virtuals).
//
// The unit tests (tests/unit/test_nccl_world.cpp) run this very code with a recording fake of
// NCCL on host memory (tests/unit/nccl_fake.hpp), so the GPU runs the logic the tests check.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "nccl_api.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/runtime/communicator.hpp"
#include "tessel/runtime/cuda/cuda.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel::cuda {

// An NCCL result that is neither success nor in-progress becomes a RuntimeError with the
// expression, NCCL's text and file:line.
void nccl_check(NcclApi& api, int result, const char* expr, const char* file, int line);
#define TESSEL_NCCL_CHECK(api, expr) ::tessel::cuda::nccl_check((api), (expr), #expr, __FILE__, __LINE__)

NcclType nccl_type(DType t);
NcclRedOp nccl_op(ReduceOp op);

// One NCCL call of a collective's plan.
enum class NcclCallKind { group_start, group_end, all_gather, reduce_scatter, all_reduce, broadcast, send, recv };
struct NcclCall {
  NcclCallKind kind = NcclCallKind::group_start;
  const void* send = nullptr;  // send buffer (send, the collectives)
  void* recv = nullptr;        // receive buffer (recv, the collectives)
  std::size_t count = 0;       // elements of `type` (reduce_scatter: per rank, NCCL's recvcount)
  NcclType type = NcclType::u8;
  NcclRedOp op = NcclRedOp::sum;
  int peer = -1;  // send/recv: the peer; broadcast: the root
};
using NcclPlan = std::vector<NcclCall>;

// The plans of the Communicator calls (communicator.hpp), for a member of a group of `size`.
// Byte-sized moves use ncclUint8, reductions the element type.
NcclPlan nccl_all_gather_plan(const void* send, void* recv, std::size_t bytes);
NcclPlan nccl_reduce_scatter_plan(const void* send, void* recv, std::size_t count, DType t, ReduceOp op);
NcclPlan nccl_all_reduce_plan(const void* send, void* recv, std::size_t count, DType t, ReduceOp op);
// One group: to every rank j, block j of send; from every rank j, block j of recv.
NcclPlan nccl_all_to_all_plan(const void* send, void* recv, std::size_t bytes, int size);
// One group: a send to send_to unless it is -1, a receive from recv_from unless it is -1.
NcclPlan nccl_permute_plan(const void* send, int send_to, void* recv, int recv_from, std::size_t bytes);
NcclPlan nccl_send_plan(const void* buf, std::size_t bytes, int peer);
NcclPlan nccl_recv_plan(void* buf, std::size_t bytes, int peer);
NcclPlan nccl_broadcast_plan(void* buf, std::size_t bytes, int root);
// An all-reduce of one int32 word (device memory of the member) in place.
NcclPlan nccl_barrier_plan(void* word);

// Issues `plan` on `comm` and `stream`; returns the first result that is neither success nor
// in-progress (then stops), else success. A group the plan opened is closed even after a
// failure, so no group is left open on the calling thread.
int issue_nccl_plan(NcclApi& api, const NcclPlan& plan, NcclComm comm, NcclStream stream);

// The ncclCommSplit of one local device for an axis set: colour = index of the device's group
// in Mesh::groups(axes), key = its index in that group (so the split communicator's NCCL rank is
// the member's rank in Mesh::group order). local_of: per mesh position, its local device or -1
// (another process's). In Mesh::groups order, local devices only.
struct NcclSplit {
  int local = -1;
  int color = 0;
  int key = 0;
};
std::vector<NcclSplit> nccl_split_plan(const Mesh& mesh, const std::vector<std::string>& axes,
                                       const std::vector<int>& local_of);

// ---- one NCCL world over several processes: the launcher's side (CudaRuntime) -----------------

// The GPU of local device i (of `local_devices`) of the process with local rank `local_rank`,
// among `visible` GPUs: (local_rank * local_devices + i) % visible. Processes of one node take
// distinct GPUs while there are enough, and share them round-robin otherwise (on one GPU, every
// process is on GPU 0: NCCL then needs a distinct NCCL_HOSTID per process, see nccl_bootstrap).
int nccl_process_gpu(int local_rank, int64_t local_devices, int64_t i, int visible);

// What one process tells the others before its ranks join a multi-process NCCL world.
struct NcclProcessInfo {
  int rank = 0;                    // the process's rank
  std::string hostname;            // gethostname()
  std::string boot_id;             // /proc/sys/kernel/random/boot_id: hostname + boot id = one machine
  std::string nccl_hostid;         // $NCCL_HOSTID ("" when unset)
  bool multi_rank_gpu = false;     // $NCCL_MULTI_RANK_GPU_ENABLE set and not 0 (NCCL 2.30+)
  std::vector<std::string> gpus;   // per local device, the GPU's PCI bus id
  std::string unique_id;           // rank 0: the world's NCCL unique id; the others: empty
  // What NCCL hashes as the host (its "host hash"): NCCL_HOSTID when set, else hostname + boot id.
  std::string nccl_host() const { return nccl_hostid.empty() ? hostname + boot_id : nccl_hostid; }
};
// This process's info: `gpus` and `unique_id` as given, the rest from the machine and the
// environment, as NCCL reads them.
NcclProcessInfo nccl_process_info(int rank, std::vector<std::string> gpus, std::string unique_id);

// NCCL refuses two ranks on one GPU of one host ("Duplicate GPU detected": same host hash and
// PCI bus id). Throws RuntimeError naming the two processes, the GPU, and what to set when two
// processes would be that (the ranks of one process are NcclWorldBase's check), unless both set
// NCCL_MULTI_RANK_GPU_ENABLE. Returns a warning (empty when none) when processes of one machine
// share a GPU through distinct NCCL_HOSTID: NCCL then sees two hosts and connects them over
// sockets (correctness tests only; not supported by NVIDIA).
std::string nccl_check_process_gpus(const std::vector<NcclProcessInfo>& processes);

// The bootstrap of a multi-process NCCL world (CudaRuntime::make_world): one allgather over
// `processes` of every process's NcclProcessInfo (rank 0's carrying a fresh unique id from
// make_unique_id, called on rank 0 only), then nccl_check_process_gpus on every process alike
// (so all of them fail with the same message, none is left waiting in ncclCommInitRank; its
// warning goes to stderr on rank 0). `gpu_bus_ids`: this process's GPUs, per local device.
// Returns rank 0's unique id.
std::string nccl_bootstrap(ProcessGroup& processes, const std::vector<std::string>& gpu_bus_ids,
                           const std::function<std::string()>& make_unique_id);

class NcclWorldBase;

// A member's communicator. Every call goes through call(): the world's gate, the abort check,
// the plan issued through the table, an NCCL error aborting the world. The virtuals are the CUDA
// side (nccl_world.cpp); the defaults issue on a null stream with a host barrier word, for the
// tests' fake NCCL.
class NcclCommunicatorBase : public Communicator {
 public:
  NcclCommunicatorBase(NcclWorldBase& w, NcclComm comm, int device, int rank, int size, std::string group);
  ~NcclCommunicatorBase() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather(const void* send, void* recv, std::size_t bytes, Stream& s) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, Stream& s) override;
  void all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op, Stream& s) override;
  void all_to_all(const void* send, void* recv, std::size_t bytes, Stream& s) override;
  void collective_permute(const void* send, int send_to, void* recv, int recv_from, std::size_t bytes,
                          Stream& s) override;
  void send(const void* buf, std::size_t bytes, int peer, Stream& s) override;
  void recv(void* buf, std::size_t bytes, int peer, Stream& s) override;
  void broadcast(void* buf, std::size_t bytes, int root, Stream& s) override;
  void barrier(Stream& s) override;
  void group_start() override;
  void group_end() override;
  void abort(const std::string& reason) override;

  // For the watchdog: true (and `what` set) when a call has been pending longer than `timeout`.
  virtual bool overdue(double timeout, std::string& what);
  NcclComm comm() const { return comm_; }
  int device() const { return device_; }
  const std::string& group() const { return group_; }

 protected:
  // Runs `issue` with the NCCL stream behind `s` (and whatever the device needs around it);
  // returns its result. Called under the world's gate, after the abort check. The default
  // passes a null stream.
  virtual int enqueue(Stream& s, const char* what, const std::function<int(NcclStream)>& issue);
  // The barrier's int32 word, in memory NCCL can reach. The default is a host word.
  virtual void* barrier_word() { return &host_barrier_; }
  bool in_group() const { return group_depth_ > 0; }
  // Leaves the world's list of live members (the watchdog's): a subclass calls it first in its
  // destructor, before the state its overdue() reads goes (the base's destructor calls it too).
  void detach();

 private:
  void call(const char* what, Stream& s, const NcclPlan& plan);

  NcclWorldBase& w_;
  NcclComm comm_;
  int device_, rank_, size_;
  std::string group_;
  int32_t host_barrier_ = 0;
  int group_depth_ = 0;
  // Held shared from the outermost group_start to its group_end: a group's calls are issued at
  // its end, so the whole group is one call for the world's gate (NcclWorldBase::calls_mutex).
  std::shared_lock<std::shared_timed_mutex> group_guard_;
};

// The world: one world communicator per local device, the splits per axis set, the abort and
// the watchdog. make_member() makes the communicators (the CUDA world's have streams and events).
class NcclWorldBase : public CollectiveWorld {
 public:
  // This process drives the mesh positions `positions` (local index i on GPU gpus[i]).
  // unique_id empty: every position is local, one ncclCommInitAll. Otherwise one
  // ncclCommInitRank per local position (rank = position), grouped, with the id every process
  // of the job was given. Starts the watchdog.
  NcclWorldBase(NcclApi& api, const Mesh& mesh, std::vector<int64_t> positions, std::vector<int> gpus,
                const std::string& unique_id, const CudaWorldOptions& options);
  ~NcclWorldBase() override;
  NcclWorldBase(const NcclWorldBase&) = delete;
  NcclWorldBase& operator=(const NcclWorldBase&) = delete;

  std::unique_ptr<Communicator> communicator(int64_t position, const std::vector<std::string>& axes) override;
  void abort(std::string reason) override { abort_world(std::move(reason), /*from_peer=*/false); }
  bool aborted() const override { return aborted_.load(); }
  std::string abort_reason() const override;

  // Aborts this process's communicators; unless the abort came from another process, tells
  // the others first (options.processes), so theirs stop too instead of timing out.
  void abort_world(std::string reason, bool from_peer);
  void forget(NcclCommunicatorBase* c);
  NcclApi& api() { return api_; }
  // Calls hold it shared from their aborted() check through the NCCL call; an abort takes it
  // exclusively before freeing the communicators (ncclCommAbort), so no call uses a freed one
  // (finding 10 of issue 22).
  std::shared_timed_mutex& calls_mutex() { return calls_mu_; }
  const Mesh& mesh() const { return mesh_; }

 protected:
  virtual std::unique_ptr<NcclCommunicatorBase> make_member(NcclComm comm, int device, int rank, int size,
                                                            std::string group);

 private:
  std::vector<NcclComm> split(const std::vector<std::string>& axes);
  void watch();

  NcclApi& api_;
  Mesh mesh_;
  std::vector<int64_t> positions_;  // per local device
  std::vector<int> gpus_;           // per local device
  std::vector<int> local_of_;       // per mesh position: its local device, -1 on another process
  CudaWorldOptions options_;
  std::vector<NcclComm> world_;
  std::mutex split_mu_;
  std::map<std::vector<std::string>, std::vector<NcclComm>> split_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<NcclCommunicatorBase*> live_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
  bool stop_ = false;
  std::thread watchdog_;
  std::shared_timed_mutex calls_mu_;
};

}  // namespace tessel::cuda
