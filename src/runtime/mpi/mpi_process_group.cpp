// mpi_process_group.cpp — the MPI process group (process_group.hpp): the processes of
// MPI_COMM_WORLD, for bootstrap exchanges and abort notices, on the MPI session that
// MpiRuntime uses too (mpi_common.hpp).
#include "tessel/runtime/process_group.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mpi_common.hpp"

namespace tessel {

// ---- the MPI process group (process_group.hpp) ------------------------------------------------
// Bootstrap only (a CudaRuntime's NCCL unique id, small to_host exchanges): blocking
// MPI_Allgather(v) on a duplicate of MPI_COMM_WORLD, so it never matches a message of an
// MpiRuntime in the same process.

namespace {
class MpiProcessGroup : public ProcessGroup {
 public:
  // `base`: MPI_COMM_WORLD, or a communicator of some of its processes this group takes over.
  explicit MpiProcessGroup(MPI_Comm base = MPI_COMM_WORLD) {
    detail::Session& s = detail::session();
    rank_ = s.rank;
    size_ = s.size;
    local_rank_ = s.local_rank;
    if (base != MPI_COMM_WORLD) {
      TESSEL_MPI(MPI_Comm_rank(base, &rank_));
      TESSEL_MPI(MPI_Comm_size(base, &size_));
      local_rank_ = detail::node_rank(base, rank_);
      sub_ = base;
    }
    TESSEL_MPI(MPI_Comm_dup(base, &comm_));
    TESSEL_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    TESSEL_MPI(MPI_Comm_dup(base, &abort_comm_));
    TESSEL_MPI(MPI_Comm_set_errhandler(abort_comm_, MPI_ERRORS_RETURN));
    TESSEL_MPI(MPI_Comm_dup(base, &msg_comm_));
    TESSEL_MPI(MPI_Comm_set_errhandler(msg_comm_, MPI_ERRORS_RETURN));
  }
  ~MpiProcessGroup() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    {
      // Posted notices not yet delivered: give them a bounded time, then let go.
      std::lock_guard<std::mutex> lk(abort_mu_);
      drive_sends(1.0);
      for (MPI_Request& q : sends_) MPI_Request_free(&q);
      // A freed send may still read its buffer: leave those buffers alive.
      if (!sends_.empty())
        for (auto& b : posted_) (void)b.release();
    }
    {
      std::lock_guard<std::mutex> lk(msg_mu_);
      const double deadline = detail::now_s() + 1.0;
      while (!out_.empty() && detail::now_s() < deadline) {
        reap_sends();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      for (Outgoing& o : out_) {
        MPI_Request_free(&o.req);
        (void)o.bytes.release();  // a freed send may still read it
      }
    }
    MPI_Comm_free(&msg_comm_);
    MPI_Comm_free(&abort_comm_);
    MPI_Comm_free(&comm_);
    if (sub_ != MPI_COMM_NULL) MPI_Comm_free(&sub_);
  }
  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::vector<std::string> allgather(const std::string& mine) override {
    const int n = detail::int_count(mine.size(), "process group allgather");
    std::vector<int> counts(static_cast<std::size_t>(size_)), displs(static_cast<std::size_t>(size_));
    TESSEL_MPI(MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_));
    std::size_t total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[static_cast<std::size_t>(r)] = detail::int_count(total, "process group allgather");
      total += static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
    }
    std::vector<char> recv(std::max<std::size_t>(total, 1));
    TESSEL_MPI(MPI_Allgatherv(mine.data(), n, MPI_BYTE, recv.data(), counts.data(), displs.data(), MPI_BYTE, comm_));
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r)
      out.emplace_back(recv.data() + displs[static_cast<std::size_t>(r)],
                       static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]));
    return out;
  }

  // One message per other rank on a communicator of its own (nothing else is ever sent on
  // it); MPI_THREAD_MULTIPLE (the session's) lets the watchdog thread call these.
  void post_abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lk(abort_mu_);
    posted_.push_back(std::make_unique<std::string>(reason.substr(0, detail::kAbortMax - 1)));
    detail::isend_abort_to_peers(*posted_.back(), rank_, size_, abort_comm_, sends_);
    // MPI delivers a send only while the sender makes progress: drive it a little now (a
    // process often exits right after an abort).
    drive_sends(2.0);
  }

  void send(int rank, int tag, const std::string& bytes) override {
    if (rank < 0 || rank >= size_)
      throw RuntimeError(fmt::format("process group send: rank {} is not one of the {} processes", rank, size_));
    if (tag < 0 || tag >= 16384)
      throw RuntimeError(fmt::format("process group send: tag {} is outside [0, 16384)", tag));
    std::lock_guard<std::mutex> lk(msg_mu_);
    reap_sends();
    Outgoing o;
    o.bytes = std::make_unique<std::string>(bytes);
    TESSEL_MPI(MPI_Isend(o.bytes->data(), detail::int_count(o.bytes->size(), "process group send"), MPI_CHAR, rank, tag,
                         msg_comm_, &o.req));
    out_.push_back(std::move(o));
  }

  std::optional<Message> try_recv(int tag) override {
    {
      std::lock_guard<std::mutex> lk(msg_mu_);
      reap_sends();
    }
    // A matched probe (MPI_Improbe + MPI_Mrecv): another thread receiving meanwhile cannot
    // take this message.
    int flag = 0;
    MPI_Message m;
    MPI_Status st;
    TESSEL_MPI(MPI_Improbe(MPI_ANY_SOURCE, tag, msg_comm_, &flag, &m, &st));
    if (!flag) return std::nullopt;
    int count = 0;
    MPI_Get_count(&st, MPI_CHAR, &count);
    Message out;
    out.rank = st.MPI_SOURCE;
    out.bytes.assign(static_cast<std::size_t>(std::max(count, 0)), '\0');
    TESSEL_MPI(MPI_Mrecv(out.bytes.data(), count, MPI_CHAR, &m, MPI_STATUS_IGNORE));
    return out;
  }

  std::optional<AbortNotice> poll_abort() override {
    std::lock_guard<std::mutex> lk(abort_mu_);
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, detail::kAbortTag, abort_comm_, &flag, &st) != MPI_SUCCESS || !flag)
      return std::nullopt;
    int count = 0;
    MPI_Get_count(&st, MPI_CHAR, &count);
    std::string reason(static_cast<std::size_t>(std::max(count, 0)), '\0');
    if (MPI_Recv(reason.data(), count, MPI_CHAR, st.MPI_SOURCE, detail::kAbortTag, abort_comm_, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
      return std::nullopt;
    return AbortNotice{st.MPI_SOURCE, reason};
  }

 private:
  // Under abort_mu_: test the posted sends until they are done or `seconds` pass.
  void drive_sends(double seconds) {
    const double deadline = detail::now_s() + seconds;
    while (!sends_.empty()) {
      int flag = 0;
      if (MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) break;
      if (flag) {
        sends_.clear();
        break;
      }
      if (detail::now_s() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // Under msg_mu_: drops the sends that completed.
  void reap_sends() {
    for (std::size_t i = 0; i < out_.size();) {
      int done = 0;
      if (MPI_Test(&out_[i].req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) {
        out_.erase(out_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }

  struct Outgoing {
    std::unique_ptr<std::string> bytes;
    MPI_Request req = MPI_REQUEST_NULL;
  };

  int rank_ = 0, size_ = 1, local_rank_ = 0;
  MPI_Comm sub_ = MPI_COMM_NULL;   // the communicator of some processes this group was made on
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm abort_comm_ = MPI_COMM_NULL;  // abort notices only
  MPI_Comm msg_comm_ = MPI_COMM_NULL;    // send / try_recv
  std::mutex msg_mu_;
  std::vector<Outgoing> out_;           // sends in flight
  std::mutex abort_mu_;
  std::vector<std::unique_ptr<std::string>> posted_;  // the buffers of sends in flight
  std::vector<MPI_Request> sends_;
};
}  // namespace

std::shared_ptr<ProcessGroup> mpi_process_group() { return std::make_shared<MpiProcessGroup>(); }

std::shared_ptr<ProcessGroup> mpi_process_group(const std::vector<int>& ranks, int tag) {
  detail::Session& s = detail::session();
  const MPI_Comm sub = detail::comm_of_ranks(ranks, tag, s.rank, s.size, "mpi_process_group", "group's");
  return std::make_shared<MpiProcessGroup>(sub);
}

}  // namespace tessel
