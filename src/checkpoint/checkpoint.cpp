// Checkpoints of named arrays: see tessel/checkpoint/checkpoint.hpp.
#include "tessel/checkpoint/checkpoint.hpp"

#include <signal.h>
#include <mutex>
#include <map>
#include <sys/file.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../core/known_fields.hpp"
#include "box.hpp"
#include "file_io.hpp"
#include "step_dir.hpp"

namespace tessel {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The fields of tessel's manifest (the group attribute "tessel") and of each of its arrays: every
// field any tessel has written. These objects are tessel's own, so a key outside them is an error
// (a newer format, or an edit) rather than something to ignore. Only they are checked: the
// group's other attributes, "metadata" (the caller's) and zarr's own fields may carry what other
// tools add.
const std::vector<std::string> kManifestKeys = {"format",         "format_version", "step",     "mesh",
                                                "tessel_version", "arrays",         "metadata", "processes"};
const std::vector<std::string> kManifestArrayKeys = {"name", "dtype", "shape", "sharding", "folder", "shard_digests"};

// "" when the manifest in `attrs` (the group's attributes) has only known keys; else what is
// unknown and where.
std::string unknown_manifest_field(const json& attrs) {
  if (!attrs.is_object() || !attrs.contains("tessel")) return "";  // reported as "not a tessel manifest"
  const json& t = attrs["tessel"];
  if (std::string bad = unknown_field(t, kManifestKeys); !bad.empty()) return bad;
  if (!t.is_object() || !t.contains("arrays") || !t["arrays"].is_array()) return "";
  for (std::size_t i = 0; i < t["arrays"].size(); ++i) {
    const json& a = t["arrays"][i];
    if (std::string bad = unknown_field(a, kManifestArrayKeys); !bad.empty())
      return fmt::format("array {}{}: {}", i + 1,
                         a.contains("name") && a["name"].is_string() ? " '" + a["name"].get<std::string>() + "'" : "",
                         bad);
  }
  return "";
}

std::optional<int64_t> step_of(const std::string& entry) {
  if (entry.rfind(ckpt::kStepPrefix, 0) != 0) return std::nullopt;
  const std::string digits = entry.substr(std::strlen(ckpt::kStepPrefix));
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(digits);
}

}  // namespace

const CheckpointArray* Manifest::find(const std::string& name) const {
  for (const CheckpointArray& a : arrays)
    if (a.name == name) return &a;
  return nullptr;
}

CheckpointDir::CheckpointDir(std::string path, const ArrayStore& store) : path_(std::move(path)), store_(&store) {
  std::error_code ec;
  if (fs::exists(path_, ec) && !fs::is_directory(path_, ec))
    throw Error(fmt::format("checkpoint: {} is a file, not a checkpoint folder", path_));
  fs::create_directories(path_, ec);
  if (ec) throw Error(fmt::format("checkpoint: cannot create the folder {}: {}", path_, ec.message()));
}

std::string CheckpointDir::step_path(int64_t step) const { return fmt::format("{}/{}{}", path_, ckpt::kStepPrefix, step); }

std::vector<int64_t> CheckpointDir::steps() const {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path_, ec)) {
    const auto s = step_of(e.path().filename().string());
    if (s && store_->has_group(e.path().string())) out.push_back(*s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<int64_t> CheckpointDir::latest() const {
  const auto s = steps();
  if (s.empty()) return std::nullopt;
  return s.back();
}

void CheckpointDir::keep_last(int n) {
  if (n < 1) throw Error(fmt::format("checkpoint {}: keep_last({}): keep at least one step", path_, n));
  if (!writer_lock_) writer_lock_ = ckpt::writer_lock(path_);
  const auto s = steps();
  std::mt19937_64 rng(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (std::size_t i = 0; i + static_cast<std::size_t>(n) < s.size(); ++i) {
    // Unlisted first (one rename), then deleted: a process killed while deleting leaves a
    // hidden folder, never a listed step with files missing.
    const std::string doomed = fmt::format("{}/.{}{}.del-{}-{:x}", path_, ckpt::kStepPrefix, s[i], ::getpid(), rng());
    if (::rename(step_path(s[i]).c_str(), doomed.c_str()) != 0)
      throw Error(fmt::format("checkpoint: cannot remove step {} (rename {} -> {}): {}", s[i], step_path(s[i]), doomed,
                              std::strerror(errno)));
    zarr::fsync_dir(path_);
    std::error_code ec;
    fs::remove_all(doomed, ec);
    if (ec) throw Error(fmt::format("checkpoint: cannot remove {}: {}", doomed, ec.message()));
  }
  ckpt::remove_dead_temporaries(path_);
}

namespace {

struct WriterLock {
  int fd = -1;
  ~WriterLock() {
    if (fd >= 0) ::close(fd);  // releases the flock
  }
};

}  // namespace

std::shared_ptr<void> ckpt::writer_lock(const std::string& dir) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<WriterLock>> held;  // by canonical folder
  std::error_code ec;
  const std::string key = fs::weakly_canonical(dir, ec).string();
  std::lock_guard<std::mutex> lk(mu);
  if (auto it = held.find(key); it != held.end())
    if (std::shared_ptr<WriterLock> live = it->second.lock()) return live;
  const std::string file = dir + "/.tessel-writer.lock";
  auto lock = std::make_shared<WriterLock>();
  lock->fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock->fd < 0) throw Error(fmt::format("checkpoint {}: cannot open its writer lock {}: {}", dir, file, std::strerror(errno)));
  if (::flock(lock->fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    const ssize_t n = ::pread(lock->fd, buf, sizeof buf - 1, 0);
    const std::string pid = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("?");
    throw Error(fmt::format("checkpoint {}: another process (pid {} on this host) is writing to this folder (it holds "
                            "{}): one writer per checkpoint folder, or their keep_last would delete each other's "
                            "steps; give this run its own folder, or wait for that one to end",
                            dir, pid, file));
  }
  const std::string me = std::to_string(::getpid());
  if (::ftruncate(lock->fd, 0) != 0 || ::pwrite(lock->fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    throw Error(fmt::format("checkpoint {}: cannot write its writer lock {}: {}", dir, file, std::strerror(errno)));
  held[key] = lock;
  return lock;
}

void ckpt::remove_dead_temporaries(const std::string& dir) {
  // What writers and deleters that are gone left (".step_N.tmp-<pid>-<nonce>", ".step_N.del-...").
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(std::string(".") + ckpt::kStepPrefix, 0) != 0) continue;
    std::size_t at = f.find(".tmp-");
    if (at == std::string::npos) at = f.find(".del-");
    if (at == std::string::npos) continue;
    const long pid = std::strtol(f.c_str() + at + 5, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
}

Manifest CheckpointDir::manifest(int64_t step) const {
  const std::string dir = step_path(step);
  std::optional<std::string> attrs;
  try {
    attrs = store_->read_group(dir);
  } catch (const Error& e) {
    throw Error(fmt::format("checkpoint: step {} of {}: not a tessel manifest: {}", step, path_, e.what()));
  }
  if (!attrs) {
    const auto s = steps();
    throw Error(fmt::format("checkpoint {}: step {} is not committed (committed: {})", path_, step,
                            s.empty() ? std::string("none") : fmt::format("{}", fmt::join(s, ", "))));
  }
  Manifest m;
  json root;
  try {
    root = json::parse(*attrs);
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint: {} ({} group): not a tessel manifest: {}", dir, store_->format(), e.what()));
  }
  if (const std::string bad = unknown_manifest_field(root); !bad.empty())
    throw Error(fmt::format("checkpoint: {}: the tessel manifest of step {}: {} (a checkpoint of a newer tessel, or "
                            "an edited one?)",
                            store_->group_file(dir), step, bad));
  try {
    const json t = root.at("tessel");
    m.step = t.at("step").get<int64_t>();
    m.mesh = t.at("mesh").get<std::string>();
    m.tessel_version = t.value("tessel_version", "");
    m.metadata_json = t.value("metadata", json::object()).dump();
    for (const json& a : t.at("arrays")) {
      CheckpointArray ca;
      ca.name = a.at("name").get<std::string>();
      ca.dtype = parse_dtype(a.at("dtype").get<std::string>());
      ca.shape = a.at("shape").get<Shape>();
      ca.sharding = Sharding::parse(a.at("sharding").get<std::string>());
      ca.folder = a.at("folder").get<std::string>();
      if (a.contains("shard_digests"))
        for (const auto& [key, d] : a.at("shard_digests").items()) {
          const std::string hex = d.get<std::string>();
          std::size_t used = 0;
          const unsigned long v = hex.size() == 8 ? std::stoul(hex, &used, 16) : 0;
          if (hex.size() != 8 || used != 8)
            throw Error(fmt::format("array '{}': shard digest '{}' of {} is not 8 hex digits", ca.name, hex, key));
          ca.shard_digests[key] = static_cast<uint32_t>(v);
        }
      m.arrays.push_back(std::move(ca));
    }
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint: {} ({} group): not a tessel manifest: {}", dir, store_->format(), e.what()));
  }
  return m;
}

std::unique_ptr<StoredArray> CheckpointDir::array(int64_t step, const std::string& name) const {
  const Manifest m = manifest(step);
  const CheckpointArray* a = m.find(name);
  if (!a) {
    std::vector<std::string> names;
    for (const CheckpointArray& x : m.arrays) names.push_back(x.name);
    throw Error(fmt::format("checkpoint {} step {}: no array '{}' (it has: {})", path_, step, name,
                            fmt::join(names, ", ")));
  }
  return open_checked(step, *a);
}

std::unique_ptr<StoredArray> CheckpointDir::open_checked(int64_t step, const CheckpointArray& a) const {
  const std::string folder = step_path(step) + "/" + a.folder;
  std::unique_ptr<StoredArray> arr = store_->open(folder);
  // Every shard was written (a missing one is lost data, not zeros), each one the manifest's (its
  // digest: not copied from another step or position), the folder holds the array the manifest
  // names there, of its dtype and shape (issue 37 D1, D6).
  arr->require_every_chunk();
  if (!a.shard_digests.empty()) arr->expect_shard_digests(a.shard_digests);
  std::string held;
  try {
    const json attrs = json::parse(arr->attributes_json());
    if (attrs.is_object() && attrs.contains("tessel_name") && attrs["tessel_name"].is_string())
      held = attrs["tessel_name"].get<std::string>();
  } catch (const json::exception&) {
  }
  if (held.empty())
    throw Error(fmt::format("checkpoint {} step {}: {}: the array's metadata has no tessel_name, so it cannot be "
                            "told to hold '{}'; it was not written by tessel's save (restore from another step)",
                            path_, step, store_->group_file(folder), a.name));
  if (held != a.name)
    throw Error(fmt::format("checkpoint {} step {}: folder {} holds array '{}' where the manifest puts '{}' (the "
                            "folders were swapped or copied from elsewhere); restore from another step",
                            path_, step, folder, held, a.name));
  if (arr->dtype() != a.dtype || arr->shape() != a.shape)
    throw Error(fmt::format("checkpoint {} step {}: array '{}' holds {}{} where the manifest says {}{}", path_, step,
                            a.name, dtype_name(arr->dtype()), shape_str(arr->shape()), dtype_name(a.dtype),
                            shape_str(a.shape)));
  return arr;
}

HostTensor CheckpointDir::read(int64_t step, const std::string& name, ReadStats* stats) const {
  return array(step, name)->read_all(stats);
}

std::map<std::string, HostTensor> CheckpointDir::read_all(int64_t step, ReadStats* stats) const {
  const Manifest m = manifest(step);
  std::map<std::string, HostTensor> out;
  for (const CheckpointArray& a : m.arrays) {
    out.emplace(a.name, open_checked(step, a)->read_all(stats));
  }
  return out;
}

ShardedArray CheckpointDir::restore_to_device(int64_t step, const std::string& name, const LoadedExecutable& program,
                                              const std::string& input, ReadStats* stats,
                                              const RestoreOptions& options) const {
  const std::unique_ptr<StoredArray> held = array(step, name);
  const StoredArray& a = *held;
  const std::size_t in = program.input_index(input);
  const Program& prog = program.program();
  const LocalValue& lv = prog.values.at(static_cast<std::size_t>(prog.inputs.at(in)));
  // The input's global shape may be padded for an uneven layout: the saved array is the user's
  // shape, the rest of each block is written as zeros.
  const std::size_t r = lv.global_shape.size();
  const Shape user = program.input_shape(in);
  if (a.dtype() != lv.dtype || a.shape() != user)
    throw Error(fmt::format("checkpoint {} step {}: array '{}' is {}{}, input %{} of the program takes {}{}", path_, step,
                            name, dtype_name(a.dtype()), shape_str(a.shape()), input, dtype_name(lv.dtype),
                            shape_str(user)));
  // Slabs: boxes of the block that fit the budget, cut on the saved array's inner-chunk grid so
  // that each inner chunk is read once. A slab is held up to three times (the slab, the region
  // read when it is not the whole slab, the staging copy) beside the reader's buffers.
  const int64_t elem = static_cast<int64_t>(dtype_size(lv.dtype));
  const int64_t reader = a.read_buffer_bytes();
  const int64_t slab_budget = (options.host_budget_bytes - reader) / 3;
  if (slab_budget < elem)
    throw Error(fmt::format("checkpoint {} step {}: array '{}': a host budget of {} bytes cannot hold the reader's "
                            "{} bytes (one encoded and one decoded inner chunk, a shard index) and a slab of one "
                            "element (3 x {} bytes): raise RestoreOptions::host_budget_bytes to at least {}",
                            path_, step, name, options.host_budget_bytes, reader, elem, reader + 3 * elem));
  // The slab's extent per dim: the whole block when it fits; else, dim by dim from the first,
  // the largest multiple of the inner chunk's extent that fits (the chunk's extent when none
  // does, and on to the next dim); when one inner chunk is still too large, the same with a
  // unit of one element (the chunks are then read more than once: the budget is too small
  // for them).
  Shape ext = lv.shape;
  auto bytes_of = [&](const Shape& e) { return num_elements(e) * elem; };
  for (int pass = 0; pass < 2 && bytes_of(ext) > slab_budget; ++pass) {
    for (std::size_t d = 0; d < r && bytes_of(ext) > slab_budget; ++d) {
      const int64_t unit = pass == 0 ? std::min(a.inner_chunk_shape()[d], lv.shape[d]) : 1;
      Shape one = ext;
      one[d] = 1;
      const int64_t fit = slab_budget / std::max<int64_t>(1, bytes_of(one));
      ext[d] = std::max(unit, std::min(ext[d], fit / unit * unit));
    }
  }
  const Mesh& mesh = program.mesh();
  ShardedArray out = program.allocate_input_array(in);
  const std::vector<int64_t>& locals = program.local_devices();
  std::map<std::vector<int64_t>, std::vector<std::size_t>> by_offset;  // a replicated block is read once
  for (std::size_t i = 0; i < locals.size(); ++i)
    by_offset[lv.sharding.local_offset(mesh, lv.global_shape, locals[i])].push_back(i);
  int64_t peak = 0;
  for (const auto& [off, holders] : by_offset) {
    // Slab k of dim d covers the block's part of [k * ext[d], (k + 1) * ext[d]) in the array's
    // coordinates (aligned on the inner-chunk grid).
    std::vector<int64_t> first(r), count(r);
    for (std::size_t d = 0; d < r; ++d) {
      first[d] = off[d] / ext[d];
      count[d] = (off[d] + lv.shape[d] - 1) / ext[d] - first[d] + 1;
    }
    const int64_t slabs = lv.shape.empty() ? 1 : num_elements(count);
    for (int64_t sidx = 0; sidx < slabs; ++sidx) {
      std::vector<int64_t> lstart(r);
      Shape lbox(r);
      int64_t rest = sidx;
      for (std::size_t d = r; d-- > 0;) {
        const int64_t k = first[d] + rest % count[d];
        rest /= count[d];
        const int64_t lo = std::max(off[d], k * ext[d]), hi = std::min(off[d] + lv.shape[d], (k + 1) * ext[d]);
        lstart[d] = lo - off[d];
        lbox[d] = hi - lo;
      }
      // The part of the slab inside the saved array (the rest is an uneven layout's padding).
      std::vector<int64_t> astart(r);
      Shape abox(r);
      bool any = true, whole = true;
      for (std::size_t d = 0; d < r; ++d) {
        astart[d] = std::min(off[d] + lstart[d], a.shape()[d]);
        abox[d] = std::max<int64_t>(0, std::min(off[d] + lstart[d] + lbox[d], a.shape()[d]) - astart[d]);
        any = any && abox[d] > 0;
        whole = whole && abox[d] == lbox[d];
      }
      HostTensor slab(lv.dtype, lbox);  // zeros: the padding beyond the array
      int64_t held = static_cast<int64_t>(slab.bytes()) * 2 + reader;  // the slab and its staging copy
      if (any) {
        HostTensor part = a.read(astart, abox, stats);
        if (whole) {
          slab = std::move(part);
        } else {
          held += static_cast<int64_t>(part.bytes());
          zarr::copy_box(static_cast<const char*>(part.data()), abox, std::vector<int64_t>(r, 0),
                         static_cast<char*>(slab.data()), lbox, std::vector<int64_t>(r, 0), abox,
                         static_cast<std::size_t>(elem));
        }
      }
      peak = std::max(peak, held);
      program.write_to_shards(out, holders, lstart, slab);
    }
  }
  if (stats) stats->host_peak_bytes = std::max(stats->host_peak_bytes, peak);
  return out;
}

}  // namespace tessel
