// POSIX file access of the checkpoint: see file_io.hpp.
#include "file_io.hpp"

#include <fcntl.h>
#include <climits>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "tessel/core/common.hpp"

namespace tessel::zarr {

namespace {
[[noreturn]] void sys_fail(const std::string& what, const std::string& path) {
  throw Error(fmt::format("checkpoint: {} {}: {}", what, path, std::strerror(errno)));
}
}  // namespace

SyncedFile::SyncedFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) sys_fail("cannot create", path_);
}

SyncedFile::~SyncedFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

void SyncedFile::write(const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      sys_fail("cannot write", path_);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void SyncedFile::write_pieces(const std::vector<std::pair<const char*, std::size_t>>& pieces) {
  std::vector<iovec> iov;
  iov.reserve(std::min<std::size_t>(pieces.size(), IOV_MAX));
  std::size_t next = 0;
  while (next < pieces.size()) {
    iov.clear();
    for (std::size_t i = next; i < pieces.size() && iov.size() < IOV_MAX; ++i)
      iov.push_back({const_cast<char*>(pieces[i].first), pieces[i].second});
    const ssize_t w = ::writev(fd_, iov.data(), static_cast<int>(iov.size()));
    if (w < 0) {
      if (errno == EINTR) continue;
      sys_fail("cannot write", path_);
    }
    // Whole pieces written move `next` on; a piece cut short is finished with write().
    std::size_t left = static_cast<std::size_t>(w);
    while (next < pieces.size() && left >= pieces[next].second) left -= pieces[next++].second;
    if (left > 0) {
      write(pieces[next].first + left, pieces[next].second - left);
      ++next;
    }
  }
}

void SyncedFile::commit() {
  if (::fsync(fd_) != 0) sys_fail("cannot fsync", path_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    sys_fail("cannot close", path_);
  }
  fd_ = -1;
}

void write_file_synced(const std::string& path, const std::string& text) {
  SyncedFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

bool read_file(const std::string& path, std::string& out) {
  ReadFile f;
  if (!f.open(path)) return false;
  out.resize(static_cast<std::size_t>(f.size()));
  f.read_at(0, out.data(), out.size(), path);
  return true;
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) sys_fail("cannot open the folder", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) sys_fail("cannot fsync the folder", dir);
}

ReadFile::~ReadFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool ReadFile::open(const std::string& path) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    if (errno == ENOENT) return false;
    sys_fail("cannot open", path);
  }
  return true;
}

int64_t ReadFile::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) sys_fail("cannot stat", path_);
  return static_cast<int64_t>(st.st_size);
}

void ReadFile::read_at(int64_t offset, void* data, std::size_t n, const std::string& what) const {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, n, offset);
    if (r < 0) {
      if (errno == EINTR) continue;
      sys_fail("cannot read", path_);
    }
    if (r == 0) throw Error(fmt::format("checkpoint: {}: truncated (ends before byte {})", what, offset + static_cast<int64_t>(n)));
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += r;
  }
}

}  // namespace tessel::zarr
