// mpi_process_group.cpp — the MPI process group (process_group.hpp): the processes of
// MPI_COMM_WORLD, for bootstrap exchanges and abort notices, on the MPI session that
// MpiRuntime uses too (mpi_common.hpp).
#include "tessel/runtime/process_group.hpp"

#include <fmt/format.h>

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
  MpiProcessGroup() {
    detail::Session& s = detail::session();
    rank_ = s.rank;
    size_ = s.size;
    local_rank_ = s.local_rank;
    TESSEL_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    TESSEL_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    TESSEL_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &abort_comm_));
    TESSEL_MPI(MPI_Comm_set_errhandler(abort_comm_, MPI_ERRORS_RETURN));
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
    MPI_Comm_free(&abort_comm_);
    MPI_Comm_free(&comm_);
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

  int rank_ = 0, size_ = 1, local_rank_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm abort_comm_ = MPI_COMM_NULL;  // abort notices only
  std::mutex abort_mu_;
  std::vector<std::unique_ptr<std::string>> posted_;  // the buffers of sends in flight
  std::vector<MPI_Request> sends_;
};
}  // namespace

std::shared_ptr<ProcessGroup> mpi_process_group() { return std::make_shared<MpiProcessGroup>(); }

}  // namespace tessel
