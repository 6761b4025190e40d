// Checkpoints of named arrays: see tessel/checkpoint/checkpoint.hpp.
#include "tessel/checkpoint/checkpoint.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>
#include <cstring>
#include <filesystem>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "box.hpp"
#include "file_io.hpp"

#ifndef TESSEL_VERSION_STRING
#define TESSEL_VERSION_STRING "unknown"
#endif

namespace tessel {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kStepPrefix = "step_";

// An array name as a folder name: [A-Za-z0-9._-] kept, every other byte %XX; a leading '.'
// (hidden, or "." / "..") and "__" (reserved by zarr) escaped too.
std::string folder_of(const std::string& name) {
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    const bool plain = std::isalnum(c) || c == '-' || (c == '.' && i > 0) || (c == '_' && !(i < 2 && name.rfind("__", 0) == 0));
    if (plain) out.push_back(static_cast<char>(c));
    else out += fmt::format("%{:02X}", c);
  }
  return out.empty() ? "%" : out;
}

std::optional<int64_t> step_of(const std::string& entry) {
  if (entry.rfind(kStepPrefix, 0) != 0) return std::nullopt;
  const std::string digits = entry.substr(std::strlen(kStepPrefix));
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(digits);
}

// fsync every folder under `root` (deepest first) and root itself: the new entries are durable.
void fsync_tree(const std::string& root) {
  std::vector<std::string> dirs;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_directory()) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  for (const std::string& d : dirs) zarr::fsync_dir(d);
  zarr::fsync_dir(root);
}

// The number of blocks of each dim of `sharding` on `mesh`, checked against the shape.
Shape shard_shape_of(const std::string& name, const Shape& shape, const Sharding& sharding, const Mesh& mesh) {
  if (sharding.rank() == 0 && !shape.empty()) return shape;  // not given: one block
  if (sharding.rank() != static_cast<int>(shape.size()))
    throw Error(fmt::format("checkpoint: array '{}' of shape {} has a sharding of rank {} ({})", name, shape_str(shape),
                            sharding.rank(), sharding.to_string()));
  Shape local;
  try {
    local = sharding.without_partial().local_shape(mesh, shape);
  } catch (const Error& e) {
    throw Error(fmt::format("checkpoint: array '{}' {}: sharding {} on mesh {}: {}", name, shape_str(shape),
                            sharding.to_string(), mesh.to_string(), e.what()));
  }
  for (int64_t& d : local) d = std::max<int64_t>(d, 1);
  return local;
}

}  // namespace

const CheckpointArray* Manifest::find(const std::string& name) const {
  for (const CheckpointArray& a : arrays)
    if (a.name == name) return &a;
  return nullptr;
}

CheckpointDir::CheckpointDir(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  if (fs::exists(path_, ec) && !fs::is_directory(path_, ec))
    throw Error(fmt::format("checkpoint: {} is a file, not a checkpoint folder", path_));
  fs::create_directories(path_, ec);
  if (ec) throw Error(fmt::format("checkpoint: cannot create the folder {}: {}", path_, ec.message()));
}

std::string CheckpointDir::step_path(int64_t step) const { return fmt::format("{}/{}{}", path_, kStepPrefix, step); }

void CheckpointDir::save(int64_t step, const std::map<std::string, HostTensor>& arrays, const Mesh& mesh,
                         const std::map<std::string, Sharding>& shardings, const SaveOptions& options) {
  if (step < 0) throw Error(fmt::format("checkpoint {}: step {} is negative", path_, step));
  const std::string final_path = step_path(step);
  std::error_code ec;
  if (fs::exists(final_path, ec))
    throw Error(fmt::format("checkpoint {}: step {} is already committed ({}); remove it or save another step", path_,
                            step, final_path));
  for (const auto& [name, sh] : shardings)
    if (!arrays.count(name))
      throw Error(fmt::format("checkpoint {}: a sharding is given for '{}', which is not among the arrays", path_, name));
  json manifest_arrays = json::array();
  json attrs;
  try {
    attrs = json::parse(options.metadata_json);
  } catch (const json::exception& e) {
    throw Error(fmt::format("checkpoint {}: metadata is not JSON: {}", path_, e.what()));
  }
  std::mt19937_64 rng(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  const std::string tmp = fmt::format("{}/.{}{}.tmp-{}-{:x}", path_, kStepPrefix, step, ::getpid(), rng());
  struct Cleanup {  // a failed save leaves no temporary behind
    std::string dir;
    bool done = false;
    ~Cleanup() {
      if (!done) {
        std::error_code e;
        fs::remove_all(dir, e);
      }
    }
  } cleanup{tmp};
  if (!fs::create_directory(tmp, ec)) throw Error(fmt::format("checkpoint: cannot create {}: {}", tmp, ec.message()));
  for (const auto& [name, value] : arrays) {
    const auto sit = shardings.find(name);
    const Sharding sharding = sit != shardings.end() ? sit->second : Sharding::replicated(static_cast<int>(value.shape().size()));
    zarr::ArraySpec spec;
    spec.shape = value.shape();
    spec.dtype = value.dtype();
    spec.shard_shape = shard_shape_of(name, value.shape(), sharding, mesh);
    spec.inner_shape = zarr::choose_inner_shape(spec.shard_shape, dtype_size(value.dtype()), options.inner_chunk_bytes);
    spec.zstd = options.zstd;
    spec.zstd_level = options.zstd_level;
    spec.chunk_crc32c = options.chunk_checksums;
    spec.bf16_as_uint16 = options.bf16_as_uint16;
    spec.attributes_json = json({{"tessel_name", name}, {"tessel_sharding", sharding.to_string()}}).dump();
    const std::string folder = folder_of(name);
    const std::string dir = tmp + "/" + folder;
    zarr::create_array(dir, spec);
    // Every block of the grid, cut from the global tensor.
    const std::size_t r = spec.shape.size();
    Shape grid(r);
    int64_t blocks = 1;
    for (std::size_t d = 0; d < r; ++d) {
      grid[d] = spec.shape[d] == 0 ? 1 : (spec.shape[d] + spec.shard_shape[d] - 1) / spec.shard_shape[d];
      blocks *= grid[d];
    }
    // The shards in parallel (one file each, read in place from the global tensor): the
    // copies into inner chunks of one overlap the writes of another.
    const HostTensor& source = value;  // (a structured binding cannot be captured in C++17)
    const int64_t n = source.numel() == 0 ? 0 : blocks;
    const int64_t threads = std::min<int64_t>(n, std::max<unsigned>(1, std::thread::hardware_concurrency()));
    std::atomic<int64_t> next{0};
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(std::max<int64_t>(threads, 1)));
    auto work = [&](std::size_t w) {
      try {
        for (int64_t b = next++; b < n; b = next++) {
          std::vector<int64_t> idx(r), start(r);
          int64_t rest = b;
          for (std::size_t d = r; d-- > 0;) {
            idx[d] = rest % grid[d];
            rest /= grid[d];
            start[d] = idx[d] * spec.shard_shape[d];
          }
          zarr::write_shard(dir, spec, idx, source, start);
        }
      } catch (...) {
        errors[w] = std::current_exception();
        next = n;  // the others stop at their next shard
      }
    };
    std::vector<std::thread> pool;
    for (int64_t w = 1; w < threads; ++w) pool.emplace_back(work, static_cast<std::size_t>(w));
    if (threads > 0) work(0);
    for (std::thread& t : pool) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
    manifest_arrays.push_back({{"name", name},
                               {"dtype", dtype_name(value.dtype())},
                               {"shape", value.shape()},
                               {"sharding", sharding.to_string()},
                               {"folder", folder}});
  }
  const json manifest = {{"format", "tessel-checkpoint"}, {"format_version", 1}, {"step", step},
                         {"mesh", mesh.to_string()},       {"tessel_version", TESSEL_VERSION_STRING},
                         {"arrays", manifest_arrays},      {"metadata", attrs}};
  const json group = {{"zarr_format", 3}, {"node_type", "group"}, {"attributes", {{"tessel", manifest}}}};
  zarr::write_file_synced(tmp + "/zarr.json", group.dump(2) + "\n");
  fsync_tree(tmp);
  if (::rename(tmp.c_str(), final_path.c_str()) != 0)
    throw Error(fmt::format("checkpoint: cannot commit step {} (rename {} -> {}): {}", step, tmp, final_path,
                            std::strerror(errno)));
  cleanup.done = true;
  zarr::fsync_dir(path_);
}

std::vector<int64_t> CheckpointDir::steps() const {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path_, ec)) {
    const auto s = step_of(e.path().filename().string());
    if (s && fs::exists(e.path() / "zarr.json")) out.push_back(*s);
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
  const auto s = steps();
  std::mt19937_64 rng(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (std::size_t i = 0; i + static_cast<std::size_t>(n) < s.size(); ++i) {
    // Unlisted first (one rename), then deleted: a process killed while deleting leaves a
    // hidden folder, never a listed step with files missing.
    const std::string doomed = fmt::format("{}/.{}{}.del-{}-{:x}", path_, kStepPrefix, s[i], ::getpid(), rng());
    if (::rename(step_path(s[i]).c_str(), doomed.c_str()) != 0)
      throw Error(fmt::format("checkpoint: cannot remove step {} (rename {} -> {}): {}", s[i], step_path(s[i]), doomed,
                              std::strerror(errno)));
    zarr::fsync_dir(path_);
    std::error_code ec;
    fs::remove_all(doomed, ec);
    if (ec) throw Error(fmt::format("checkpoint: cannot remove {}: {}", doomed, ec.message()));
  }
  // What writers and deleters that are gone left (".step_N.tmp-<pid>-<nonce>", ".step_N.del-...").
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path_, ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(std::string(".") + kStepPrefix, 0) != 0) continue;
    std::size_t at = f.find(".tmp-");
    if (at == std::string::npos) at = f.find(".del-");
    if (at == std::string::npos) continue;
    const long pid = std::strtol(f.c_str() + at + 5, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
}

Manifest CheckpointDir::manifest(int64_t step) const {
  const std::string file = step_path(step) + "/zarr.json";
  std::string text;
  if (!zarr::read_file(file, text)) {
    const auto s = steps();
    throw Error(fmt::format("checkpoint {}: step {} is not committed (committed: {})", path_, step,
                            s.empty() ? std::string("none") : fmt::format("{}", fmt::join(s, ", "))));
  }
  Manifest m;
  try {
    const json g = json::parse(text);
    const json t = g.at("attributes").at("tessel");
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
      m.arrays.push_back(std::move(ca));
    }
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint: {}: not a tessel manifest: {}", file, e.what()));
  }
  return m;
}

zarr::Array CheckpointDir::array(int64_t step, const std::string& name) const {
  const Manifest m = manifest(step);
  const CheckpointArray* a = m.find(name);
  if (!a) {
    std::vector<std::string> names;
    for (const CheckpointArray& x : m.arrays) names.push_back(x.name);
    throw Error(fmt::format("checkpoint {} step {}: no array '{}' (it has: {})", path_, step, name,
                            fmt::join(names, ", ")));
  }
  return zarr::Array::open(step_path(step) + "/" + a->folder);
}

HostTensor CheckpointDir::read(int64_t step, const std::string& name, zarr::ReadStats* stats) const {
  return array(step, name).read_all(stats);
}

std::map<std::string, HostTensor> CheckpointDir::read_all(int64_t step, zarr::ReadStats* stats) const {
  const Manifest m = manifest(step);
  std::map<std::string, HostTensor> out;
  for (const CheckpointArray& a : m.arrays) {
    HostTensor t = zarr::Array::open(step_path(step) + "/" + a.folder).read_all(stats);
    if (t.dtype() != a.dtype || t.shape() != a.shape)
      throw Error(fmt::format("checkpoint {} step {}: array '{}' holds {}{} where the manifest says {}{}", path_, step,
                              a.name, dtype_name(t.dtype()), shape_str(t.shape()), dtype_name(a.dtype),
                              shape_str(a.shape)));
    out.emplace(a.name, std::move(t));
  }
  return out;
}

ShardedArray CheckpointDir::restore_to_device(int64_t step, const std::string& name, const LoadedExecutable& program,
                                              const std::string& input, zarr::ReadStats* stats) const {
  const zarr::Array a = array(step, name);
  const std::size_t in = program.input_index(input);
  const Program& prog = program.program();
  const LocalValue& lv = prog.values.at(static_cast<std::size_t>(prog.inputs.at(in)));
  // The input's global shape may be padded for an uneven layout: the saved array is the user's
  // shape, the rest of each block stays zero.
  const std::size_t r = lv.global_shape.size();
  const Shape user = program.input_shape(in);
  if (a.dtype() != lv.dtype || a.shape() != user)
    throw Error(fmt::format("checkpoint {} step {}: array '{}' is {}{}, input %{} of the program takes {}{}", path_, step,
                            name, dtype_name(a.dtype()), shape_str(a.shape()), input, dtype_name(lv.dtype),
                            shape_str(user)));
  const Mesh& mesh = program.mesh();
  std::map<std::vector<int64_t>, HostTensor> by_offset;  // a replicated block is read once
  std::vector<HostTensor> shards;
  for (int64_t pos : program.local_devices()) {
    const std::vector<int64_t> off = lv.sharding.local_offset(mesh, lv.global_shape, pos);
    auto it = by_offset.find(off);
    if (it == by_offset.end()) {
      HostTensor block(lv.dtype, lv.shape);
      std::vector<int64_t> start(r);
      Shape box(r);
      bool any = true;
      for (std::size_t d = 0; d < r; ++d) {
        start[d] = std::min(off[d], a.shape()[d]);
        box[d] = std::max<int64_t>(0, std::min(off[d] + lv.shape[d], a.shape()[d]) - start[d]);
        any = any && box[d] > 0;
      }
      if (any) {
        const HostTensor part = a.read(start, box, stats);
        zarr::copy_box(static_cast<const char*>(part.data()), box, std::vector<int64_t>(r, 0),
                       static_cast<char*>(block.data()), lv.shape, std::vector<int64_t>(r, 0), box,
                       dtype_size(lv.dtype));
      }
      it = by_offset.emplace(off, std::move(block)).first;
    }
    shards.push_back(it->second);
  }
  return program.shards_to_device(in, shards);
}

// ---- AsyncCheckpointer --------------------------------------------------------------------------

struct AsyncCheckpointer::State {
  std::mutex mu;
  std::condition_variable cv;
  bool busy = false;
  std::exception_ptr error;
  std::thread worker;
};

AsyncCheckpointer::AsyncCheckpointer(CheckpointDir dir, int64_t staging_budget_bytes)
    : dir_(std::move(dir)), budget_(staging_budget_bytes), state_(std::make_shared<State>()) {
  if (budget_ < 0) throw Error(fmt::format("checkpoint {}: the staging budget {} is negative", dir_.path(), budget_));
}

AsyncCheckpointer::~AsyncCheckpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessel: checkpoint %s: the last background save failed: %s\n", dir_.path().c_str(), e.what());
  }
}

void AsyncCheckpointer::wait() {
  std::unique_lock<std::mutex> lk(state_->mu);
  state_->cv.wait(lk, [&] { return !state_->busy; });
  if (state_->worker.joinable()) {
    lk.unlock();
    state_->worker.join();
    lk.lock();
  }
  if (state_->error) {
    std::exception_ptr e = state_->error;
    state_->error = nullptr;
    std::rethrow_exception(e);
  }
}

void AsyncCheckpointer::save(int64_t step, std::map<std::string, HostTensor> arrays, const Mesh& mesh,
                             std::map<std::string, Sharding> shardings, SaveOptions options) {
  const auto t0 = std::chrono::steady_clock::now();
  wait();  // one save at a time; a failure of the previous one is raised here
  int64_t bytes = 0;
  for (const auto& [name, t] : arrays) bytes += static_cast<int64_t>(t.bytes());
  if (budget_ > 0 && bytes > budget_)
    throw Error(fmt::format("checkpoint {}: step {} stages {} bytes on the host, above the staging budget of {} bytes: "
                            "raise the budget or save fewer arrays",
                            dir_.path(), step, bytes, budget_));
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->busy = true;
  }
  std::shared_ptr<State> st = state_;
  CheckpointDir dir = dir_;
  state_->worker = std::thread([st, dir, step, arrays = std::move(arrays), mesh, shardings = std::move(shardings),
                                options = std::move(options)]() mutable {
    std::exception_ptr err;
    try {
      dir.save(step, arrays, mesh, shardings, options);
    } catch (...) {
      err = std::current_exception();
    }
    arrays.clear();  // the staging memory goes back before the next save may start
    std::lock_guard<std::mutex> lk(st->mu);
    st->error = err;
    st->busy = false;
    st->cv.notify_all();
  });
  last_blocking_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace tessel
