// The file-rendezvous process group of process_group.hpp (over file_rendezvous, launch.hpp),
// and picking a process group from the launcher's environment (detect_launch). The MPI
// process group lives with the MPI runtime (src/runtime/mpi/).
#include "tessel/runtime/process_group.hpp"

#include <fmt/format.h>

#include <cstdlib>

#include "tessel/common.hpp"
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

 private:
  FileRendezvousOptions o_;
  int64_t round_ = 0;
};

}  // namespace

std::shared_ptr<ProcessGroup> file_process_group(const FileRendezvousOptions& options) {
  return std::make_shared<FileProcessGroup>(options);
}

std::shared_ptr<ProcessGroup> process_group_from_env() {
  const LaunchInfo l = detect_launch();
  if (!l.multi_process()) return nullptr;
  if (l.source == "mpi") return mpi_process_group();
  FileRendezvousOptions o;
  o.rank = l.rank;
  o.size = l.world_size;
  o.local_rank = l.local_rank;
  if (const char* k = std::getenv("TESSEL_RENDEZVOUS_KEY"); k && *k) o.key = k;
  if (const char* d = std::getenv("TESSEL_RENDEZVOUS_DIR"); d && *d) o.dir = d;
  if (o.dir.empty())
    throw RuntimeError(fmt::format("process group: rank {} of {} (RANK/WORLD_SIZE) needs a file rendezvous, but "
                                   "TESSEL_RENDEZVOUS_DIR is not set; set it to a directory every process sees",
                                   l.rank, l.world_size));
  return file_process_group(o);
}

}  // namespace tessel
