// Launch detection from the environment and the shared-file rendezvous (launch.hpp).
//
// Rendezvous file format (v1), one file per rank: <dir>/<key>/rank-<r>, written as
// <dir>/<key>/.rank-<r>.tmp.<pid>, fsync'ed and renamed, so a reader never sees a partial
// file. Content: one ASCII header line
//   tessel-rendezvous v1 rank=<r> world_size=<n> bytes=<len>\n
// followed by exactly <len> payload bytes.
#include "tessel/runtime/launch.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "tessel/core/common.hpp"

namespace tessel {
namespace {

bool env_int(const char* name, int& out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno || *end || x < 0 || x > (1 << 30))
    throw RuntimeError(fmt::format("launch: environment variable {}='{}' is not a non-negative integer", name, v));
  out = static_cast<int>(x);
  return true;
}

void check(const LaunchInfo& l, const char* vars) {
  if (l.world_size < 1 || l.rank < 0 || l.rank >= l.world_size)
    throw RuntimeError(fmt::format("launch: rank {} is outside world size {} ({})", l.rank, l.world_size, vars));
  if (l.local_world_size < 1 || l.local_rank < 0 || l.local_rank >= l.local_world_size)
    throw RuntimeError(fmt::format("launch: local rank {} is outside local world size {} ({})", l.local_rank,
                                   l.local_world_size, vars));
}

void mkdir_p(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (::mkdir(cur.c_str(), 0777) != 0 && errno != EEXIST)
      throw RuntimeError(fmt::format("rendezvous: cannot create directory '{}': {}", cur, std::strerror(errno)));
  }
}

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

LaunchInfo detect_launch() {
  LaunchInfo l;
  if (env_int("OMPI_COMM_WORLD_SIZE", l.world_size)) {
    l.source = "mpi";
    env_int("OMPI_COMM_WORLD_RANK", l.rank);
    l.local_world_size = l.world_size;
    env_int("OMPI_COMM_WORLD_LOCAL_SIZE", l.local_world_size);
    env_int("OMPI_COMM_WORLD_LOCAL_RANK", l.local_rank);
    check(l, "OMPI_COMM_WORLD_*");
    return l;
  }
  if (env_int("PMI_SIZE", l.world_size)) {
    l.source = "mpi";
    env_int("PMI_RANK", l.rank);
    l.local_world_size = l.world_size;
    env_int("MPI_LOCALNRANKS", l.local_world_size);
    env_int("MPI_LOCALRANKID", l.local_rank);
    check(l, "PMI_*");
    return l;
  }
  if (env_int("WORLD_SIZE", l.world_size)) {
    l.source = "env";
    if (!env_int("RANK", l.rank))
      throw RuntimeError("launch: WORLD_SIZE is set but RANK is not (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK)");
    l.local_world_size = l.world_size;
    env_int("LOCAL_WORLD_SIZE", l.local_world_size);
    const bool local_rank_set = env_int("LOCAL_RANK", l.local_rank);
    check(l, "RANK/WORLD_SIZE/LOCAL_WORLD_SIZE");  // sizes >= 1 before the modulo below
    if (!local_rank_set) l.local_rank = l.rank % l.local_world_size;
    check(l, "RANK/WORLD_SIZE/LOCAL_RANK");
    return l;
  }
  return l;
}

std::vector<std::string> file_rendezvous(const std::string& dir_in, const std::string& key, int rank, int world_size,
                                         const std::string& payload, double timeout_s) {
  std::string dir = dir_in;
  if (dir.empty())
    if (const char* e = std::getenv("TESSEL_RENDEZVOUS_DIR")) dir = e;
  if (dir.empty())
    throw RuntimeError("rendezvous: no directory given and TESSEL_RENDEZVOUS_DIR is not set (it must be a directory "
                       "every rank can read and write, e.g. on a shared file system)");
  if (key.empty() || key.find('/') != std::string::npos)
    throw RuntimeError(fmt::format("rendezvous: key '{}' must be a non-empty file name (no '/')", key));
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw RuntimeError(fmt::format("rendezvous: rank {} is outside world size {}", rank, world_size));
  if (std::isnan(timeout_s) || timeout_s < 0)
    throw RuntimeError(fmt::format("rendezvous: timeout_s must be >= 0, got {}", timeout_s));
  const std::string folder = dir + "/" + key;
  mkdir_p(folder);
  const std::string header =
      fmt::format("tessel-rendezvous v1 rank={} world_size={} bytes={}\n", rank, world_size, payload.size());
  {
    const std::string tmp = fmt::format("{}/.rank-{}.tmp.{}", folder, rank, static_cast<long>(::getpid()));
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw RuntimeError(fmt::format("rendezvous: cannot write '{}': {}", tmp, std::strerror(errno)));
    std::string all = header + payload;
    std::size_t off = 0;
    while (off < all.size()) {
      ssize_t w = ::write(fd, all.data() + off, all.size() - off);
      if (w < 0) {
        if (errno == EINTR) continue;
        ::close(fd);
        throw RuntimeError(fmt::format("rendezvous: cannot write '{}': {}", tmp, std::strerror(errno)));
      }
      off += static_cast<std::size_t>(w);
    }
    ::fsync(fd);
    ::close(fd);
    const std::string final_name = fmt::format("{}/rank-{}", folder, rank);
    if (::rename(tmp.c_str(), final_name.c_str()) != 0)
      throw RuntimeError(fmt::format("rendezvous: cannot rename '{}' to '{}': {}", tmp, final_name,
                                     std::strerror(errno)));
  }
  std::vector<std::string> out(static_cast<std::size_t>(world_size));
  std::vector<bool> have(out.size(), false);
  const auto start = std::chrono::steady_clock::now();
  int missing = world_size;
  while (true) {
    for (int r = 0; r < world_size; ++r) {
      if (have[r]) continue;
      const std::string name = fmt::format("{}/rank-{}", folder, r);
      std::ifstream f(name, std::ios::binary);
      if (!f) continue;
      std::string line;
      std::getline(f, line);
      int fr = -1, fw = -1;
      unsigned long long bytes = 0;
      if (std::sscanf(line.c_str(), "tessel-rendezvous v1 rank=%d world_size=%d bytes=%llu", &fr, &fw, &bytes) != 3)
        throw RuntimeError(fmt::format("rendezvous: '{}' is not a tessel rendezvous v1 file (header '{}')", name, line));
      if (fr != r || fw != world_size)
        throw RuntimeError(fmt::format("rendezvous: '{}' was written by rank {} of a world of {} but this is a world of "
                                       "{} (a stale file: use a fresh key per job)", name, fr, fw, world_size));
      // The header's count is checked against what the file holds before anything is
      // allocated: a negative or huge count ("bytes=-1" reads as 2^64-1) is a broken file.
      const std::streamoff body = f.tellg();
      f.seekg(0, std::ios::end);
      const std::streamoff end = f.tellg();
      f.seekg(body);
      if (body < 0 || end < body || bytes != static_cast<unsigned long long>(end - body))
        throw RuntimeError(fmt::format("rendezvous: rank {}: '{}' (from rank {}) says bytes={} but holds {} payload "
                                       "bytes: a broken or foreign file (use a fresh key per job)",
                                       rank, name, r, bytes, body < 0 || end < body ? 0 : end - body));
      std::string data(static_cast<std::size_t>(bytes), '\0');
      f.read(data.data(), static_cast<std::streamsize>(bytes));
      if (static_cast<unsigned long long>(f.gcount()) != bytes)
        throw RuntimeError(fmt::format("rendezvous: '{}' is truncated ({} of {} payload bytes)", name, f.gcount(), bytes));
      out[r] = std::move(data);
      have[r] = true;
      --missing;
    }
    if (missing == 0) return out;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s > 0 && std::isfinite(timeout_s) && waited > timeout_s) {
      std::vector<std::string> ranks;
      for (int r = 0; r < world_size; ++r)
        if (!have[r]) ranks.push_back(std::to_string(r));
      throw RuntimeError(fmt::format("rendezvous: rank {} waited {:.1f} s in '{}' for ranks {} of {} (did they start, "
                                     "with the same directory and key?)",
                                     rank, waited, folder, join(ranks, ","), world_size));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace tessel
