// Liveness of the other processes of an MpiRuntime (mpi_common.hpp, ProcessIdentity): a dead
// peer on this host is noticed in about half a second instead of at the collective timeout
// (issue 36 item 4).
//
// A peer on this host (same host name, boot id and PID namespace, so its PID means the same
// process here, and its marker file is visible) is watched through /proc: gone, a zombie, or
// its PID reused by another process (another start time) means it exited. Whether that exit was
// a death or a clean end is its marker's: every process holding at least one live MpiRuntime
// keeps a marker file in /dev/shm (removed when its last runtime ends cleanly), so a peer that
// is gone with its marker still there died inside a runtime. No message is involved: a
// message to a peer that already freed the communicator could reach a communicator made later
// with the same context id (Open MPI 4.1 crashed in MPI_Comm_split_type on such a stray).
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>

#include "mpi_common.hpp"

namespace tessel::detail {

namespace {

std::string read_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// The process's state and start time (clock ticks after boot) from /proc/PID/stat; false when
// the process does not exist.
bool proc_stat(long pid, char& state, unsigned long long& start) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string s;
  if (!f || !std::getline(f, s)) return false;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses: parse after the last ')'.
  const std::size_t close = s.rfind(')');
  if (close == std::string::npos || close + 2 >= s.size()) return false;
  std::istringstream in(s.substr(close + 2));
  in >> state;
  // Fields 4..21 after the state, then starttime (field 22 of proc(5)).
  std::string skip;
  for (int i = 4; i <= 21 && in; ++i) in >> skip;
  in >> start;
  return static_cast<bool>(in);
}

// This process's live runtimes, and its marker while there is one.
std::mutex marker_mu;
int live_runtimes = 0;

// Markers of processes that are gone, older than a minute: a failed runtime leaves its marker
// (its peers must see that it died inside a runtime), and when every process of a job failed no
// peer is left to remove them. The minute leaves the peers of a death that just happened the
// time to notice it (they check every half second).
void remove_stale_markers() {
  const std::string dir = "/dev/shm", prefix = "tessel-mpi-live-";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    long pid = 0;
    unsigned long long start = 0;
    if (std::sscanf(name.c_str() + prefix.size(), "%ld-%llu", &pid, &start) != 2) continue;
    char state = 0;
    unsigned long long now_start = 0;
    const bool alive = proc_stat(pid, state, now_start) && now_start == start && state != 'Z' && state != 'X';
    if (alive) continue;
    struct stat st;
    if (::stat(e.path().c_str(), &st) != 0 || std::time(nullptr) - st.st_mtime < 60) continue;
    std::filesystem::remove(e.path(), ec);
  }
}

}  // namespace

ProcessIdentity ProcessIdentity::self() {
  ProcessIdentity id;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  char ns[256] = {};
  const ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  if (n > 0) ns[n] = '\0';
  const std::string key = fmt::format("{}|{}|{}", host, read_line("/proc/sys/kernel/random/boot_id"), ns);
  // Truncating copies (a host name may be longer than the field; the key names it whole).
  const size_t hn = std::min(std::strlen(host), sizeof id.host - 1);
  std::memcpy(id.host, host, hn);
  id.host[hn] = '\0';
  const size_t kn = std::min(key.size(), sizeof id.key - 1);
  std::memcpy(id.key, key.data(), kn);
  id.key[kn] = '\0';
  id.pid = static_cast<long>(getpid());
  char state = 0;
  if (!proc_stat(id.pid, state, id.start)) id.start = 0;
  return id;
}

std::string ProcessIdentity::marker() const { return fmt::format("/dev/shm/tessel-mpi-live-{}-{}", pid, start); }

bool ProcessIdentity::same_host(const ProcessIdentity& o) const {
  return start != 0 && o.start != 0 && std::strncmp(key, o.key, sizeof key) == 0;
}

bool ProcessIdentity::gone() const {
  char state = 0;
  unsigned long long s = 0;
  if (!proc_stat(pid, state, s)) return true;
  return state == 'Z' || state == 'X' || s != start;  // a zombie, or the PID reused
}

bool ProcessIdentity::died_live() const {
  struct stat st;
  return ::stat(marker().c_str(), &st) == 0;
}

bool runtime_started(const ProcessIdentity& self) {
  std::lock_guard<std::mutex> lk(marker_mu);
  if (live_runtimes++ > 0) return true;
  remove_stale_markers();
  std::FILE* f = std::fopen(self.marker().c_str(), "w");
  if (!f) return false;
  std::fclose(f);
  return true;
}

void runtime_ended(const ProcessIdentity& self, bool clean) {
  std::lock_guard<std::mutex> lk(marker_mu);
  if (--live_runtimes > 0 || !clean) return;  // a failed runtime leaves its marker: the job died
  std::remove(self.marker().c_str());
}

}  // namespace tessel::detail

namespace tessel {

void MpiRuntime::Impl::check_peers() {
  for (int r = 0; r < size; ++r) {
    const std::size_t k = static_cast<std::size_t>(r);
    if (r == rank || !watched[k] || departed[k]) continue;
    const detail::ProcessIdentity& p = peers[k];
    if (!p.gone()) continue;
    if (!p.died_live()) {  // its last runtime ended cleanly before it exited
      departed[k] = 1;
      continue;
    }
    std::remove(p.marker().c_str());  // the dead process cannot: its marker is left to us
    fail(fmt::format("rank {}: the process of rank {} (pid {} on this host, {}) is gone: it was killed, crashed or "
                     "exited without ending its MpiRuntime; the job cannot continue (restart it)",
                     rank, r, p.pid, p.host),
         false);
    return;
  }
}

}  // namespace tessel
