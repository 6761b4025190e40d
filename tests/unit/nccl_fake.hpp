// tests/unit/nccl_fake.hpp — a recording fake of NCCL on host memory, behind the NCCL world's
// table of entry points (src/runtime/cuda/nccl_api.hpp), for the CPU tests of the NCCL world
// (test_nccl_world.cpp; issue 22, "GPU readiness").
//
// It does what NCCL does, on host memory, with NCCL's rules checked at every call:
// - Communicators: ncclCommInitAll and grouped ncclCommInitRank (ranks meeting on an id) make
//   cliques; ncclCommSplit (grouped or not) makes the new ones, ranks ordered by key then by
//   parent rank, as NCCL documents; handles are the fake's own.
// - Calls are issued when the thread's outermost group ends (at once outside a group), as
//   NCCL does: all sends and collective contributions of the group are posted first (copies of
//   the send buffers), then receives and collectives complete, blocking the calling thread until
//   the peers' calls arrive. The n-th send from r to p matches the n-th receive on p from r; the
//   k-th collective of a clique's ranks must be the same collective with the same count, type,
//   reduction and root. Collectives compute their result (sum, max over u8, i32, f16, bf16, f32).
// - Violations (violations()): a group end without a start; a call on a null, unknown or
//   aborted communicator, or a second ncclCommAbort; a peer or root out of range; a send and its
//   receive with different counts or types; ranks of one clique that disagree on a collective; a
//   send buffer that overlaps a receive buffer in any but NCCL's in-place form (all-gather:
//   send == recv + rank*count; reduce-scatter: recv == send + rank*recv_count; all-reduce,
//   broadcast: send == recv); receive buffers of one group that overlap each other or a send
//   buffer of the group; a buffer outside the tracked host memory (track(), when any is: the
//   call then fails, so the fake never writes out of bounds);
//   waiting longer than wait_seconds for peers that never come (returns an error, no hang).
// - At rest (check_quiescent()): no group open on any thread, no send never received, no
//   collective or split some ranks of the clique never joined.
// - Faults: fail_next(op, result) makes the next call of that name fail; set_async_error makes
//   ncclCommGetAsyncError report one.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "nccl_api.hpp"

namespace tessel::test {

class FakeNccl final : public cuda::NcclApi {
 public:
  using NcclComm = cuda::NcclComm;
  using NcclStream = cuda::NcclStream;
  using NcclType = cuda::NcclType;
  using NcclRedOp = cuda::NcclRedOp;

  // One recorded call, in the order the calls were made (seq).
  struct Call {
    uint64_t seq = 0;
    int thread = 0;                  // the calling thread, numbered from 0 in order of first call
    std::string op;                  // "ncclAllGather", "ncclGroupStart", ...
    int depth = 0;                   // the thread's group depth before the call
    int clique = -1, rank = -1, size = 0;  // the communicator's clique, its rank and size
    std::size_t count = 0;
    NcclType type = NcclType::u8;
    NcclRedOp red = NcclRedOp::sum;
    int peer = -1;  // send/recv peer, broadcast root
    const void* send = nullptr;
    void* recv = nullptr;
    int color = 0, key = 0;  // ncclCommSplit
    int result = 0;          // what the fake returned
  };

  explicit FakeNccl(double wait_seconds = 10) : wait_seconds_(wait_seconds) {}
  ~FakeNccl() override;
  FakeNccl(const FakeNccl&) = delete;
  FakeNccl& operator=(const FakeNccl&) = delete;

  // ---- the table ----
  const char* error_string(int result) override;
  int get_unique_id(char* id) override;
  int comm_init_all(NcclComm* comms, int n, const int* devices) override;
  int comm_init_rank(NcclComm* comm, int nranks, const char* id, int rank, int device) override;
  int comm_split(NcclComm comm, int color, int key, NcclComm* out) override;
  int comm_abort(NcclComm comm) override;
  int comm_get_async_error(NcclComm comm, int* async_error) override;
  int group_start() override;
  int group_end() override;
  int all_gather(const void* send, void* recv, std::size_t count, NcclType t, NcclComm comm, NcclStream s) override;
  int reduce_scatter(const void* send, void* recv, std::size_t recv_count, NcclType t, NcclRedOp op, NcclComm comm,
                     NcclStream s) override;
  int all_reduce(const void* send, void* recv, std::size_t count, NcclType t, NcclRedOp op, NcclComm comm,
                 NcclStream s) override;
  int broadcast(const void* send, void* recv, std::size_t count, NcclType t, int root, NcclComm comm,
                NcclStream s) override;
  int send(const void* buf, std::size_t count, NcclType t, int peer, NcclComm comm, NcclStream s) override;
  int recv(void* buf, std::size_t count, NcclType t, int peer, NcclComm comm, NcclStream s) override;

  // ---- for the tests ----
  std::vector<Call> calls() const;
  std::vector<std::string> violations() const;
  // The rules at rest (above); empty when every group is closed and every call matched.
  std::vector<std::string> check_quiescent() const;
  // Host memory every buffer must lie in (once anything is tracked).
  void track(const void* p, std::size_t bytes);
  void fail_next(const std::string& op, int result);
  void set_async_error(NcclComm comm, int result);
  int rank_of(NcclComm comm) const;
  int size_of(NcclComm comm) const;
  int clique_of(NcclComm comm) const;
  // The rank in the world (the clique made by init) behind a communicator, through its splits.
  int world_rank_of(NcclComm comm) const;
  int live_comms() const;  // made and not aborted

 private:
  struct Comm {
    int clique = -1, rank = -1, parent = -1;  // parent: the comm it was split from (index), -1
    bool aborted = false;
    int async = 0;
    uint64_t next_coll = 0, next_split = 0;
  };
  struct Clique {
    std::vector<int> members;  // comm index per rank
  };
  enum class Kind { coll, send, recv, split, join };
  struct Op;  // a call queued until its group ends
  struct Contribution {
    Call call;
    std::vector<unsigned char> data;
  };
  struct CollSlot {
    std::map<int, Contribution> by_rank;
    int finished = 0;
  };
  struct SplitSlot {
    std::map<int, std::pair<int, int>> by_rank;  // rank -> colour, key
    std::map<int, int> result;                    // rank -> new comm index (-1: none)
    bool made = false;
    int finished = 0;
  };
  struct Message {
    std::vector<unsigned char> data;
    std::size_t count;
    NcclType type;
  };
  struct Thread {
    int id = 0;
    int depth = 0;
    std::vector<std::shared_ptr<Op>> queued;
  };

  // All under mu_.
  Thread& thread_locked();
  Comm* comm_locked(NcclComm c, const char* op, Call& rec);
  void violation_locked(std::string what);
  bool check_memory_locked(const char* op, const void* p, std::size_t bytes);
  int record_locked(Call rec);
  int data_call(Call rec, Kind kind, NcclComm comm);
  int enqueue_locked(std::unique_lock<std::mutex>& lk, std::shared_ptr<Op> op);
  int run_locked(std::unique_lock<std::mutex>& lk, std::vector<std::shared_ptr<Op>> ops);
  int complete_locked(std::unique_lock<std::mutex>& lk, Op& op);
  bool clique_aborted_locked(int clique) const;
  int failure_locked(const std::string& op);
  NcclComm handle(int index) const;
  int new_clique_locked(const std::vector<int>& comms_by_rank);

  double wait_seconds_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Comm> comms_;  // a handle is the address of an element (stable)
  std::map<const void*, int> index_of_;  // handle -> index in comms_
  std::vector<Clique> cliques_;
  std::map<std::thread::id, Thread> threads_;
  std::vector<Call> calls_;
  std::vector<std::string> violations_;
  std::vector<std::pair<const unsigned char*, std::size_t>> tracked_;
  std::map<std::string, int> fail_next_;
  std::map<std::tuple<int, int, int>, std::deque<Message>> mail_;  // (clique, from, to)
  std::map<std::pair<int, uint64_t>, CollSlot> colls_;             // (clique, k)
  std::map<std::pair<int, uint64_t>, SplitSlot> splits_;           // (parent clique, k)
  std::map<std::string, std::vector<std::pair<int, NcclComm*>>> joins_;  // id -> (rank, out)
  std::map<std::string, int> joined_clique_;
  std::map<std::string, int> join_size_;
  uint64_t unique_ids_ = 0;
};

}  // namespace tessel::test
