// process_group_from_env: the launch environment -> the process group of its launcher (MPI, or a
// file rendezvous). Part of the runtime factory (tessel::factory), the one floor that knows
// every backend: it calls mpi_process_group (tessel::mpi). Declared in
// tessel/runtime/process_group.hpp.
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "tessel/core/common.hpp"
#include "tessel/runtime/launch.hpp"
#include "tessel/runtime/process_group.hpp"

namespace tessel {

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
  if (const char* t = std::getenv("TESSEL_RENDEZVOUS_TIMEOUT"); t && *t) {
    char* end = nullptr;
    errno = 0;
    const double s = std::strtod(t, &end);
    if (errno || *end || !(s > 0) || !std::isfinite(s))
      throw RuntimeError(fmt::format("process group: TESSEL_RENDEZVOUS_TIMEOUT='{}' is not a number of seconds > 0",
                                     t));
    o.timeout_s = s;
  }
  if (o.dir.empty())
    throw RuntimeError(fmt::format("process group: rank {} of {} (RANK/WORLD_SIZE) needs a file rendezvous, but "
                                   "TESSEL_RENDEZVOUS_DIR is not set; set it to a directory every process sees",
                                   l.rank, l.world_size));
  return file_process_group(o);
}

}  // namespace tessel
