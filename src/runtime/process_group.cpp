// The file-rendezvous process group of process_group.hpp (over file_rendezvous, launch.hpp),
// and picking a process group from the launcher's environment (detect_launch). The MPI
// process group lives with the MPI runtime (src/runtime/mpi/).
#include "tessel/runtime/process_group.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <system_error>

#include "tessel/core/common.hpp"
#include "tessel/runtime/launch.hpp"

namespace tessel {
namespace {

class FileProcessGroup : public ProcessGroup {
 public:
  explicit FileProcessGroup(const FileRendezvousOptions& o) : o_(o) {
    if (o_.size < 1 || o_.rank < 0 || o_.rank >= o_.size || o_.local_rank < 0)
      throw RuntimeError(fmt::format("file rendezvous: rank {} / world size {} / local rank {} is not a valid "
                                     "process (0 <= rank < size, local rank >= 0); check RANK, WORLD_SIZE and "
                                     "LOCAL_RANK",
                                     o_.rank, o_.size, o_.local_rank));
    if (o_.key.empty() || o_.key.find('/') != std::string::npos)
      throw RuntimeError(fmt::format("file rendezvous: key '{}' must be a non-empty file name (no '/')", o_.key));
    if (o_.dir.empty())
      if (const char* d = std::getenv("TESSEL_RENDEZVOUS_DIR")) o_.dir = d;  // allgather reports it when unset
  }

  std::string name() const override { return "file"; }
  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  int local_rank() const override { return o_.local_rank; }

  // Round k is the rendezvous <dir>/<key>.k: every process makes the same calls in the same
  // order, so the k-th call of each meets the k-th of the others.
  std::vector<std::string> allgather(const std::string& mine) override {
    const std::string key = fmt::format("{}.{}", o_.key, round_++);
    return file_rendezvous(o_.dir, key, o_.rank, o_.size, mine, o_.timeout_s);
  }

  // A notice is written whole to a temporary name, then renamed: a reader sees all or nothing.
  void post_abort(const std::string& reason) override {
    namespace fs = std::filesystem;
    std::lock_guard<std::mutex> lk(mu_);
    if (o_.dir.empty()) return;  // no rendezvous directory: no channel
    const fs::path dir = abort_dir();
    std::error_code ec;
    fs::create_directories(dir, ec);
    const std::string name = fmt::format("{}.{}", o_.rank, posted_++);
    const fs::path tmp = dir / (".tmp." + name);
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << reason;
      if (!f) return;  // best effort: the peers still have their own timeouts
    }
    fs::rename(tmp, dir / name, ec);
  }

  std::optional<AbortNotice> poll_abort() override {
    namespace fs = std::filesystem;
    std::lock_guard<std::mutex> lk(mu_);
    if (o_.dir.empty()) return std::nullopt;
    std::error_code ec;
    fs::directory_iterator it(abort_dir(), ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const auto dot = name.find('.');
      if (name.empty() || name[0] == '.' || dot == std::string::npos || seen_.count(name)) continue;
      int rank = -1;
      try {
        rank = std::stoi(name.substr(0, dot));
      } catch (const std::exception&) {
        continue;  // not a notice
      }
      seen_.insert(name);
      if (rank == o_.rank) continue;
      std::ifstream f(it->path(), std::ios::binary);
      std::string reason((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      return AbortNotice{rank, reason};
    }
    return std::nullopt;
  }

 private:
  std::filesystem::path abort_dir() const { return std::filesystem::path(o_.dir) / (o_.key + ".abort"); }

  FileRendezvousOptions o_;
  int64_t round_ = 0;
  std::mutex mu_;  // post_abort / poll_abort (a watchdog thread)
  int64_t posted_ = 0;
  std::set<std::string> seen_;  // notices already returned (or this rank's own)
};

}  // namespace

void ProcessGroup::send(int rank, int tag, const std::string& bytes) {
  (void)bytes;
  throw RuntimeError(fmt::format("process group '{}' has no point-to-point messages (send to rank {}, tag {}): launch "
                                 "the processes with mpirun",
                                 name(), rank, tag));
}

std::optional<ProcessGroup::Message> ProcessGroup::try_recv(int tag) {
  throw RuntimeError(fmt::format("process group '{}' has no point-to-point messages (receive with tag {}): launch the "
                                 "processes with mpirun",
                                 name(), tag));
}

std::shared_ptr<ProcessGroup> file_process_group(const FileRendezvousOptions& options) {
  return std::make_shared<FileProcessGroup>(options);
}

}  // namespace tessel
