// src/checkpoint/file_io.hpp — the checkpoint's POSIX file access: whole writes that are
// fsynced before they count, positioned reads, folder fsync and the atomic rename that
// commits a step. Every failure is an Error naming the path and the system's reason.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessel::zarr {

// A new file written front to back; commit() fsyncs and closes it. Destroyed uncommitted, the
// file is closed and removed.
class SyncedFile {
 public:
  explicit SyncedFile(std::string path);
  ~SyncedFile();
  SyncedFile(const SyncedFile&) = delete;
  SyncedFile& operator=(const SyncedFile&) = delete;
  void write(const void* data, std::size_t n);
  // The pieces (pointer, size) one after the other, with as few system calls as the kernel
  // allows (writev): no copy into a buffer of our own.
  void write_pieces(const std::vector<std::pair<const char*, std::size_t>>& pieces);
  void commit();

 private:
  std::string path_;
  int fd_ = -1;
};

void write_file_synced(const std::string& path, const std::string& text);
// false when the file cannot be opened; throws on a read error.
bool read_file(const std::string& path, std::string& out);
// fsync of a folder (its entries: new files, renames).
void fsync_dir(const std::string& dir);

class ReadFile {
 public:
  ReadFile() = default;
  ~ReadFile();
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;
  bool open(const std::string& path);  // false when it does not exist
  int64_t size() const;
  // Exactly n bytes at `offset`; Error naming `what` when the file is shorter.
  void read_at(int64_t offset, void* data, std::size_t n, const std::string& what) const;

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace tessel::zarr
