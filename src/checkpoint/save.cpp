// Saving a checkpoint step (tessel/checkpoint/checkpoint.hpp): from global host tensors, from
// the blocks each process holds (many processes, each block written once), from a loaded
// program's device arrays, and in the background (AsyncCheckpointer).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "file_io.hpp"
#include "step_dir.hpp"
#include "tessel/checkpoint/checkpoint.hpp"
#include "tessel/runtime/runtime.hpp"

#ifndef TESSEL_VERSION_STRING
#define TESSEL_VERSION_STRING "unknown"
#endif

namespace tessel {

using json = nlohmann::json;
namespace fs = std::filesystem;

// ---- step folder helpers (step_dir.hpp) ---------------------------------------------------------

namespace ckpt {

std::string folder_of(const std::string& name) {
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    const bool plain =
        std::isalnum(c) || c == '-' || (c == '.' && i > 0) || (c == '_' && !(i < 2 && name.rfind("__", 0) == 0));
    if (plain) out.push_back(static_cast<char>(c));
    else out += fmt::format("%{:02X}", c);
  }
  return out.empty() ? "%" : out;
}

void fsync_tree(const std::string& root) {
  std::vector<std::string> dirs;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_directory()) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  for (const std::string& d : dirs) zarr::fsync_dir(d);
  zarr::fsync_dir(root);
}

Shape block_shape_of(const std::string& name, const Shape& shape, const Sharding& sharding, const Mesh& mesh) {
  if (sharding.rank() == 0 && !shape.empty()) return shape;  // not given: one block
  if (sharding.rank() != static_cast<int>(shape.size()))
    throw Error(fmt::format("checkpoint: array '{}' of shape {} has a sharding of rank {} ({}): give one {{...}} per dim",
                            name, shape_str(shape), sharding.rank(), sharding.to_string()));
  const Sharding s = sharding.without_partial();
  try {
    s.validate(mesh, shape, fmt::format("checkpoint array '{}'", name), /*allow_uneven=*/true);
  } catch (const Error& e) {
    throw Error(fmt::format("checkpoint: array '{}' {}: sharding {} on mesh {}: {}", name, shape_str(shape),
                            sharding.to_string(), mesh.to_string(), e.what()));
  }
  Shape block(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const int64_t n = mesh.axes_size(s.dims[d].axes);
    block[d] = std::max<int64_t>(1, (shape[d] + n - 1) / n);
  }
  return block;
}

}  // namespace ckpt

// ---- the write plan -----------------------------------------------------------------------------

double WritePlan::imbalance() const {
  if (bytes.empty()) return 1;
  const int64_t total = std::accumulate(bytes.begin(), bytes.end(), int64_t{0});
  if (total == 0) return 1;
  const double mean = static_cast<double>(total) / static_cast<double>(bytes.size());
  return static_cast<double>(*std::max_element(bytes.begin(), bytes.end())) / mean;
}

namespace {

// A regular grid of blocks over an array: the devices' blocks of its saving layout, or the
// zarr shards it is stored in.
struct Grid {
  Shape block;   // block shape
  Shape counts;  // blocks per dim that hold any element
  int64_t blocks = 1;
};

Grid grid_with(const Shape& shape, const Shape& block) {
  Grid g;
  g.block = block;
  g.counts.resize(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    g.counts[d] = shape[d] == 0 ? 1 : (shape[d] + block[d] - 1) / block[d];
    g.blocks *= g.counts[d];
  }
  return g;
}

// The devices' blocks (ceil division).
Grid grid_of(const std::string& name, const ArrayLayout& l, const Mesh& mesh) {
  return grid_with(l.shape, ckpt::block_shape_of(name, l.shape, l.sharding, mesh));
}

std::vector<int64_t> unravel(const Grid& g, int64_t b) {
  std::vector<int64_t> idx(g.counts.size());
  for (std::size_t d = idx.size(); d-- > 0;) {
    idx[d] = b % g.counts[d];
    b /= g.counts[d];
  }
  return idx;
}

int64_t ravel(const Grid& g, const std::vector<int64_t>& idx) {
  int64_t b = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) b = b * g.counts[d] + idx[d];
  return b;
}

// The block mesh position `p` holds, or -1 when it holds only padding.
int64_t block_of(const ArrayLayout& l, const Grid& g, const Mesh& mesh, int64_t p) {
  if (l.sharding.rank() == 0) return 0;
  const Sharding s = l.sharding.without_partial();
  std::vector<int64_t> idx(l.shape.size());
  for (std::size_t d = 0; d < l.shape.size(); ++d) {
    idx[d] = s.dims[d].axes.empty() ? 0 : s.shard_index(static_cast<int>(d), mesh, p);
    if (idx[d] >= g.counts[d]) return -1;
  }
  return ravel(g, idx);
}

int64_t block_bytes(const ArrayLayout& l, const Grid& g, int64_t b) {
  int64_t n = static_cast<int64_t>(dtype_size(l.dtype));
  const std::vector<int64_t> idx = unravel(g, b);
  for (std::size_t d = 0; d < idx.size(); ++d)
    n *= std::max<int64_t>(0, std::min(g.block[d], l.shape[d] - idx[d] * g.block[d]));
  return n;
}

// The zarr shards of an array whose every block is held by at least `r` processes: each block
// cut in r along one dim (the longest that r divides), so that every holder can write a
// part. No dim divides: the blocks themselves.
Grid storage_grid(const ArrayLayout& l, const Grid& base, int64_t r) {
  if (r <= 1) return base;
  int best = -1;
  for (std::size_t d = 0; d < base.block.size(); ++d)
    if (base.block[d] % r == 0 && (best < 0 || base.block[d] > base.block[static_cast<std::size_t>(best)]))
      best = static_cast<int>(d);
  if (best < 0) return base;
  Shape block = base.block;
  block[static_cast<std::size_t>(best)] /= r;
  return grid_with(l.shape, block);
}

// The device block holding zarr shard `s` (the storage grid divides the blocks).
int64_t base_of(const Grid& base, const Grid& store, int64_t s) {
  std::vector<int64_t> idx = unravel(store, s);
  for (std::size_t d = 0; d < idx.size(); ++d) idx[d] = idx[d] * store.block[d] / base.block[d];
  return ravel(base, idx);
}

// LPT over the blocks: `holders[a][b]` the processes holding block b of array a (ascending).
WritePlan plan_from_holders(const std::vector<ArrayLayout>& arrays, const std::vector<Grid>& grids,
                            const std::vector<std::vector<std::vector<int>>>& holders, int processes) {
  WritePlan plan;
  plan.bytes.assign(static_cast<std::size_t>(std::max(processes, 1)), 0);
  plan.writer.resize(arrays.size());
  struct Job {
    std::size_t choices;
    int64_t bytes;
    std::size_t a;
    int64_t b;
  };
  std::vector<Job> jobs;
  for (std::size_t a = 0; a < arrays.size(); ++a) {
    plan.writer[a].assign(static_cast<std::size_t>(grids[a].blocks), -1);
    for (int64_t b = 0; b < grids[a].blocks; ++b) {
      const std::size_t n = holders[a][static_cast<std::size_t>(b)].size();
      if (n == 0) ++plan.unheld_blocks;
      else jobs.push_back({n, block_bytes(arrays[a], grids[a], b), a, b});
    }
  }
  // The blocks with the fewest holders first (a block held once has no choice: it must be
  // counted before the others fill the gaps), then the largest first.
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& x, const Job& y) {
    return x.choices != y.choices ? x.choices < y.choices : x.bytes > y.bytes;
  });
  for (const Job& j : jobs) {
    int best = -1;
    for (int r : holders[j.a][static_cast<std::size_t>(j.b)])
      if (best < 0 || plan.bytes[static_cast<std::size_t>(r)] < plan.bytes[static_cast<std::size_t>(best)]) best = r;
    plan.writer[j.a][static_cast<std::size_t>(j.b)] = best;
    plan.bytes[static_cast<std::size_t>(best)] += j.bytes;
  }
  return plan;
}

// The storage grids and the plan, from the processes holding each device block.
struct Planned {
  std::vector<Grid> stores;
  WritePlan plan;
};
Planned plan_arrays(const std::vector<ArrayLayout>& arrays, const std::vector<Grid>& bases,
                    const std::vector<std::vector<std::vector<int>>>& base_holders, int processes) {
  Planned out;
  std::vector<std::vector<std::vector<int>>> holders(arrays.size());
  for (std::size_t a = 0; a < arrays.size(); ++a) {
    std::size_t r = 0;
    for (const auto& h : base_holders[a])
      if (!h.empty()) r = r == 0 ? h.size() : std::min(r, h.size());
    out.stores.push_back(storage_grid(arrays[a], bases[a], static_cast<int64_t>(std::max<std::size_t>(r, 1))));
    const Grid& st = out.stores.back();
    holders[a].resize(static_cast<std::size_t>(st.blocks));
    for (int64_t sh = 0; sh < st.blocks; ++sh)
      holders[a][static_cast<std::size_t>(sh)] = base_holders[a][static_cast<std::size_t>(base_of(bases[a], st, sh))];
  }
  out.plan = plan_from_holders(arrays, out.stores, holders, processes);
  return out;
}

// The processes of one save and their host exchange (none: this process alone).
struct Exchange {
  int rank = 0;
  int size = 1;
  std::function<std::vector<std::string>(const std::string&)> allgather;
  std::vector<json> all(const json& mine) const {
    const std::vector<std::string> got = allgather ? allgather(mine.dump()) : std::vector<std::string>{mine.dump()};
    if (got.size() != static_cast<std::size_t>(size))
      throw Error(fmt::format("checkpoint: rank {}: the process group answered {} processes, expected {}", rank,
                              got.size(), size));
    std::vector<json> out;
    for (const std::string& g : got) out.push_back(json::parse(g));
    return out;
  }
};

// Every process's {"err": ...}: an Error on every process, naming each failed one, when any failed.
void raise_failures(const std::vector<json>& all, const std::string& where) {
  std::vector<std::string> failed;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const std::string e = all[r].value("err", std::string());
    if (!e.empty()) failed.push_back(all.size() > 1 ? fmt::format("rank {}: {}", r, e) : e);
  }
  if (failed.empty()) return;
  throw Error(fmt::format("{}{}", where, fmt::join(failed, "; ")));
}

// One array of a save.
struct Item {
  std::string name;
  ArrayLayout layout;
  Grid base;   // the devices' blocks
  Grid store;  // the zarr shards (the blocks, cut among their replicas' processes)
  ArraySpec spec;
  std::string folder;
  const HostTensor* global = nullptr;  // the whole array on this host (save from host tensors)
  const LocalArray* local = nullptr;   // this process's blocks (save_local)
};

ArraySpec spec_of(const Item& it, const SaveOptions& options) {
  ArraySpec spec;
  spec.shape = it.layout.shape;
  spec.dtype = it.layout.dtype;
  spec.shard_shape = it.store.block;
  spec.inner_shape = choose_inner_shape(spec.shard_shape, dtype_size(spec.dtype), options.inner_chunk_bytes);
  spec.zstd = options.zstd;
  spec.zstd_level = options.zstd_level;
  spec.chunk_crc32c = options.chunk_checksums;
  spec.bf16_as_uint16 = options.bf16_as_uint16;
  spec.attributes_json = json({{"tessel_name", it.name}, {"tessel_sharding", it.layout.sharding.to_string()}}).dump();
  return spec;
}

// Runs fn(i) for i in [0, n) on up to hardware_concurrency threads; the first failure is
// rethrown once every thread stopped.
template <class Fn>
void parallel_for(int64_t n, Fn fn) {
  const int64_t threads = std::min<int64_t>(n, std::max<unsigned>(1, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(std::max<int64_t>(threads, 1)));
  auto work = [&](std::size_t w) {
    try {
      for (int64_t i = next++; i < n; i = next++) fn(i);
    } catch (...) {
      errors[w] = std::current_exception();
      next = n;  // the others stop at their next item
    }
  };
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < threads; ++w) pool.emplace_back(work, static_cast<std::size_t>(w));
  if (threads > 0) work(0);
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

std::string what_failed(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown exception";
  }
}

// The save of one step by every process of `ex`: see the protocol in checkpoint.hpp. `items`
// are the same arrays on every process (checked); `held[a]` the mesh positions of array a this
// process holds (ignored for host tensors: rank 0 writes every block).
SaveStats save_step(const ArrayStore& store, const std::string& path, const std::string& final_path, int64_t step,
                    std::vector<Item>& items,
                    const std::vector<std::vector<int64_t>>& held, const Mesh& mesh, const Exchange& ex,
                    const SaveOptions& options, std::string local_error) {
  const std::string where = fmt::format("checkpoint {} step {}: ", path, step);
  const int r = ex.rank;
  // 1. Agree on the arrays and the temporary folder; rank 0 checks the step is new.
  json fp = json::array();
  for (const Item& it : items)
    fp.push_back({it.name, dtype_name(it.layout.dtype), it.layout.shape, it.layout.sharding.to_string()});
  std::string tmp;
  if (r == 0 && local_error.empty()) {
    ckpt::remove_dead_temporaries(path);  // killed saves' leftovers, with or without keep_last
    std::error_code ec;
    std::mt19937_64 rng(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
    if (step < 0) local_error = fmt::format("step {} is negative", step);
    else if (fs::exists(final_path, ec)) {
      if (store.has_group(final_path))
        local_error = fmt::format("step {} is already committed ({}); remove it or save another step", step, final_path);
      else {
        // A step folder without its group metadata was never committed (no save makes one:
        // a partial copy, or a hand edit). It is not listed, so it must not block this save
        // (issue 37 D7); it is moved aside, hidden, rather than deleted: it may hold data.
        const std::string aside =
            fmt::format("{}/.{}{}.uncommitted-{}-{:x}", path, ckpt::kStepPrefix, step, ::getpid(), rng());
        if (::rename(final_path.c_str(), aside.c_str()) != 0)
          local_error = fmt::format("{} is in the way of step {}: it is not a committed step (no {}), and it cannot be "
                                    "moved aside to {}: {}; remove it",
                                    final_path, step, store.group_file(final_path), aside, std::strerror(errno));
      }
    }
    tmp = fmt::format("{}/.{}{}.tmp-{}-{:x}", path, ckpt::kStepPrefix, step, ::getpid(), rng());
  }
  const std::vector<json> hello =
      ex.all({{"err", local_error}, {"arrays", fp}, {"mesh", mesh.to_string()}, {"tmp", tmp}, {"held", held}});
  raise_failures(hello, where);
  for (std::size_t q = 1; q < hello.size(); ++q)
    if (hello[q].at("arrays") != hello[0].at("arrays") || hello[q].at("mesh") != hello[0].at("mesh"))
      throw Error(fmt::format("{}rank {} saves other arrays or another mesh than rank 0 (rank {}: {} on {}; rank 0: {} on "
                              "{}): every process must save the same names, types, shapes and layouts",
                              where, q, q, hello[q].at("arrays").dump(), hello[q].value("mesh", ""),
                              hello[0].at("arrays").dump(), hello[0].value("mesh", "")));
  tmp = hello[0].at("tmp").get<std::string>();

  // The plan: who holds which block, how the blocks are stored, who writes each shard.
  std::vector<ArrayLayout> layouts;
  std::vector<Grid> bases;
  std::vector<std::vector<std::vector<int>>> holders(items.size());
  for (std::size_t a = 0; a < items.size(); ++a) {
    layouts.push_back(items[a].layout);
    bases.push_back(items[a].base);
    auto& h = holders[a];
    h.assign(static_cast<std::size_t>(items[a].base.blocks), {});
    if (items[a].global) {  // host tensors: the saving process holds everything
      for (auto& v : h) v.push_back(0);
      continue;
    }
    for (std::size_t q = 0; q < hello.size(); ++q)
      for (int64_t p : hello[q].at("held").at(a).get<std::vector<int64_t>>()) {
        const int64_t b = block_of(items[a].layout, items[a].base, mesh, p);
        if (b < 0) continue;
        auto& v = h[static_cast<std::size_t>(b)];
        if (v.empty() || v.back() != static_cast<int>(q)) v.push_back(static_cast<int>(q));
      }
    for (int64_t b = 0; b < items[a].base.blocks; ++b)
      if (h[static_cast<std::size_t>(b)].empty())
        throw Error(fmt::format("{}no process holds block {} of array '{}' ({}{} {} on {}): give every mesh position's "
                                "block to some process",
                                where, b, items[a].name, dtype_name(items[a].layout.dtype),
                                shape_str(items[a].layout.shape), items[a].layout.sharding.to_string(),
                                mesh.to_string()));
  }
  const Planned planned = plan_arrays(layouts, bases, holders, ex.size);
  const WritePlan& plan = planned.plan;
  for (std::size_t a = 0; a < items.size(); ++a) {
    items[a].store = planned.stores[a];
    items[a].spec = spec_of(items[a], options);
  }

  // 2. Rank 0 makes the temporary step and every array's zarr.json.
  struct Cleanup {  // on rank 0: a failed save leaves no temporary behind
    std::string dir;
    bool armed = false;
    ~Cleanup() {
      if (armed) {
        std::error_code e;
        fs::remove_all(dir, e);
      }
    }
  } cleanup{tmp, false};
  std::string err;
  if (r == 0) {
    try {
      std::error_code ec;
      if (!fs::create_directory(tmp, ec)) throw Error(fmt::format("cannot create {}: {}", tmp, ec.message()));
      cleanup.armed = true;
      for (Item& it : items) store.create_array(tmp + "/" + it.folder, it.spec);
    } catch (...) {
      err = what_failed(std::current_exception());
    }
  }
  raise_failures(ex.all({{"err", err}}), where);

  // 3. Every process copies the blocks it writes to the host, then writes them in parallel.
  SaveStats stats;
  stats.processes = ex.size;
  stats.imbalance = plan.imbalance();
  json digests = json::object();  // this process's shards: array -> key -> digest (hex)
  try {
    struct Job {
      std::size_t a;
      int64_t b;
      const HostTensor* source;
      std::vector<int64_t> origin;
    };
    std::vector<Job> jobs;
    std::map<std::pair<std::size_t, int64_t>, std::unique_ptr<HostTensor>> fetched;  // blocks copied to the host
    for (std::size_t a = 0; a < items.size(); ++a) {
      const Item& it = items[a];
      const std::size_t rank_ = it.layout.shape.size();
      for (int64_t sh = 0; sh < it.store.blocks; ++sh) {
        if (plan.writer[a][static_cast<std::size_t>(sh)] != r) continue;
        const std::vector<int64_t> idx = unravel(it.store, sh);
        std::vector<int64_t> origin(rank_);
        for (std::size_t d = 0; d < rank_; ++d) origin[d] = idx[d] * it.store.block[d];
        if (it.global) {
          jobs.push_back({a, sh, it.global, origin});
          continue;
        }
        // The device block holding the shard, copied once from the first local device holding it.
        const int64_t b = base_of(it.base, it.store, sh);
        auto& held_block = fetched[{a, b}];
        if (!held_block) {
          std::size_t dev = it.local->devices.size();
          for (std::size_t i = 0; i < it.local->devices.size() && dev == it.local->devices.size(); ++i)
            if (block_of(it.layout, it.base, mesh, it.local->devices[i]) == b) dev = i;
          HostTensor t = it.local->block(dev);
          if (t.dtype() != it.layout.dtype || t.shape() != it.base.block)
            throw Error(fmt::format("the block of mesh position {} of array '{}' is {}{}, its layout {} on {} makes "
                                    "blocks of {}{}",
                                    it.local->devices[dev], it.name, dtype_name(t.dtype()), shape_str(t.shape()),
                                    it.layout.sharding.to_string(), mesh.to_string(), dtype_name(it.layout.dtype),
                                    shape_str(it.base.block)));
          held_block = std::make_unique<HostTensor>(std::move(t));
        }
        const std::vector<int64_t> bidx = unravel(it.base, b);
        for (std::size_t d = 0; d < rank_; ++d) origin[d] -= bidx[d] * it.base.block[d];
        jobs.push_back({a, sh, held_block.get(), origin});
      }
    }
    // Files first (their own threads: the copies into inner chunks of one overlap the writes
    // of another), then the folders holding them, so this process's part is durable.
    std::vector<int64_t> written(jobs.size(), 0);
    std::vector<ShardWritten> shards(jobs.size());
    parallel_for(static_cast<int64_t>(jobs.size()), [&](int64_t j) {
      const Job& job = jobs[static_cast<std::size_t>(j)];
      const Item& it = items[job.a];
      if (job.source->numel() > 0)
        shards[static_cast<std::size_t>(j)] =
            store.write_shard(tmp + "/" + it.folder, it.spec, unravel(it.store, job.b), *job.source, job.origin);
      written[static_cast<std::size_t>(j)] = block_bytes(it.layout, it.store, job.b);
    });
    // Each shard's digest, by array and key, for the manifest (rank 0 gathers every process's).
    for (std::size_t j = 0; j < jobs.size(); ++j)
      if (shards[j].digest)
        digests[items[jobs[j].a].name][shards[j].key] = fmt::format("{:08x}", *shards[j].digest);
    // The folders of the shard files, up to the array's folder (made here by write_shard).
    std::set<std::string> dirs;
    for (const Job& job : jobs) {
      const Item& it = items[job.a];
      const std::string array_dir = tmp + "/" + it.folder;
      std::string d = array_dir;
      if (!it.layout.shape.empty()) {
        d += "/c";
        const std::vector<int64_t> idx = unravel(it.store, job.b);
        for (std::size_t k = 0; k + 1 < idx.size(); ++k) d += "/" + std::to_string(idx[k]);
      }
      for (fs::path p = d; p.string().size() >= array_dir.size(); p = p.parent_path()) {
        dirs.insert(p.string());
        if (p.string() == array_dir) break;
      }
    }
    for (auto d = dirs.rbegin(); d != dirs.rend(); ++d) zarr::fsync_dir(*d);
    stats.blocks_written = static_cast<int64_t>(jobs.size());
    stats.bytes_written = std::accumulate(written.begin(), written.end(), int64_t{0});
  } catch (...) {
    err = what_failed(std::current_exception());
  }
  const std::vector<json> wrote = ex.all({{"err", err}, {"digests", digests}});
  raise_failures(wrote, where);

  // 4. Rank 0 writes the manifest, makes everything durable and commits with one rename.
  if (r == 0) {
    try {
      json attrs = json::parse(options.metadata_json);
      json all_digests = json::object();  // array -> shard key -> digest, from every process
      for (const json& w : wrote)
        for (const auto& [name, by_key] : w.at("digests").items())
          for (const auto& [key, d] : by_key.items()) all_digests[name][key] = d;
      json arrays = json::array();
      for (const Item& it : items) {
        json a = {{"name", it.name},
                  {"dtype", dtype_name(it.layout.dtype)},
                  {"shape", it.layout.shape},
                  {"sharding", it.layout.sharding.to_string()},
                  {"folder", it.folder}};
        if (all_digests.contains(it.name)) a["shard_digests"] = all_digests[it.name];
        arrays.push_back(std::move(a));
      }
      const json manifest = {{"format", "tessel-checkpoint"}, {"format_version", 1}, {"step", step},
                             {"mesh", mesh.to_string()},       {"tessel_version", TESSEL_VERSION_STRING},
                             {"arrays", arrays},               {"metadata", attrs},
                             {"processes", ex.size}};
      store.write_group(tmp, json{{"tessel", manifest}}.dump());
      ckpt::fsync_tree(tmp);
      if (::rename(tmp.c_str(), final_path.c_str()) != 0)
        throw Error(fmt::format("cannot commit step {} (rename {} -> {}): {}", step, tmp, final_path,
                                std::strerror(errno)));
      cleanup.armed = false;
      zarr::fsync_dir(path);
    } catch (...) {
      err = what_failed(std::current_exception());
    }
  }
  raise_failures(ex.all({{"err", err}}), where);
  return stats;
}

// The items of a save, their folders unique (two names may not map to one folder).
void finish_items(std::vector<Item>& items, const Mesh& mesh) {
  std::map<std::string, std::string> folders;
  for (Item& it : items) {
    it.base = grid_of(it.name, it.layout, mesh);
    it.store = it.base;
    it.folder = ckpt::folder_of(it.name);
    auto [pos, fresh] = folders.emplace(it.folder, it.name);
    if (!fresh)
      throw Error(fmt::format("checkpoint: arrays '{}' and '{}' would share the folder {}: rename one", pos->second,
                              it.name, it.folder));
  }
}

std::string metadata_error(const SaveOptions& options) {
  try {
    const json m = json::parse(options.metadata_json);
    (void)m;
    return "";
  } catch (const json::exception& e) {
    return fmt::format("metadata is not JSON: {}", e.what());
  }
}

}  // namespace

WritePlan plan_writes(const std::vector<ArrayLayout>& arrays, const Mesh& mesh,
                      const std::vector<int>& process_of_position, int processes) {
  if (static_cast<int64_t>(process_of_position.size()) != mesh.num_devices())
    throw Error(fmt::format("plan_writes: {} process entries for the {} positions of mesh {}",
                            process_of_position.size(), mesh.num_devices(), mesh.to_string()));
  std::vector<Grid> bases;
  std::vector<std::vector<std::vector<int>>> holders(arrays.size());
  for (std::size_t a = 0; a < arrays.size(); ++a) {
    bases.push_back(grid_of(fmt::format("#{}", a), arrays[a], mesh));
    holders[a].assign(static_cast<std::size_t>(bases[a].blocks), {});
    for (int64_t p = 0; p < mesh.num_devices(); ++p) {
      const int q = process_of_position[static_cast<std::size_t>(p)];
      if (q < 0) continue;
      if (q >= processes)
        throw Error(fmt::format("plan_writes: position {} is given to process {} of {}", p, q, processes));
      const int64_t b = block_of(arrays[a], bases[a], mesh, p);
      if (b < 0) continue;
      auto& v = holders[a][static_cast<std::size_t>(b)];
      if (std::find(v.begin(), v.end(), q) == v.end()) v.insert(std::upper_bound(v.begin(), v.end(), q), q);
    }
  }
  return plan_arrays(arrays, bases, holders, processes).plan;
}

void CheckpointDir::save(int64_t step, const std::map<std::string, HostTensor>& arrays, const Mesh& mesh,
                         const std::map<std::string, Sharding>& shardings, const SaveOptions& options) {
  for (const auto& [name, sh] : shardings)
    if (!arrays.count(name))
      throw Error(fmt::format("checkpoint {}: a sharding is given for '{}', which is not among the arrays", path_, name));
  if (const std::string e = metadata_error(options); !e.empty()) throw Error(fmt::format("checkpoint {}: {}", path_, e));
  std::vector<Item> items;
  for (const auto& [name, value] : arrays) {
    Item it;
    it.name = name;
    const auto sit = shardings.find(name);
    it.layout = {value.dtype(), value.shape(),
                 sit != shardings.end() ? sit->second : Sharding::replicated(static_cast<int>(value.shape().size()))};
    it.global = &value;
    items.push_back(std::move(it));
  }
  finish_items(items, mesh);
  if (!writer_lock_) writer_lock_ = ckpt::writer_lock(path_);  // one process: it commits
  save_step(*store_, path_, step_path(step), step, items, std::vector<std::vector<int64_t>>(items.size()), mesh, Exchange{},
            options, "");
}

SaveStats CheckpointDir::save_local(int64_t step, const std::map<std::string, LocalArray>& arrays, const Mesh& mesh,
                                    ProcessGroup* group, const SaveOptions& options) {
  Exchange ex;
  if (group) {
    ex.rank = group->rank();
    ex.size = group->size();
    ex.allgather = [group](const std::string& mine) { return group->allgather(mine); };
  }
  // A bad array here is reported through the exchange, so the other processes fail too
  // instead of waiting for this one.
  std::string err = metadata_error(options);
  std::vector<Item> items;
  std::vector<std::vector<int64_t>> held;
  try {
    for (const auto& [name, la] : arrays) {
      Item it;
      it.name = name;
      it.layout = la.layout;
      it.local = &la;
      if (!la.block) throw Error(fmt::format("array '{}' has no block function", name));
      for (int64_t p : la.devices)
        if (p < 0 || p >= mesh.num_devices())
          throw Error(fmt::format("array '{}' names mesh position {}, mesh {} has {}", name, p, mesh.to_string(),
                                  mesh.num_devices()));
      items.push_back(std::move(it));
      held.push_back(la.devices);
    }
    finish_items(items, mesh);
  } catch (const std::exception& e) {
    if (err.empty()) err = e.what();
    items.clear();
    held.clear();
  }
  // The committing process holds the folder's writer lock; a refusal goes through the
  // exchange like any other error, so every process fails.
  if (ex.rank == 0 && err.empty() && !writer_lock_) {
    try {
      writer_lock_ = ckpt::writer_lock(path_);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  return save_step(*store_, path_, step_path(step), step, items, held, mesh, ex, options, err);
}

SaveStats CheckpointDir::save(int64_t step, const std::map<std::string, ShardedArray>& arrays,
                              const LoadedExecutable& program, const SaveOptions& options) {
  std::map<std::string, LocalArray> local;
  for (const auto& [name, arr] : arrays) {
    LocalArray la;
    const Shape& shape = arr.user_shape();  // an uneven layout's padding is not saved
    la.layout = {arr.dtype(), shape, arr.sharding()};
    la.devices = arr.devices();
    const ShardedArray* a = &arr;
    la.block = [a, &program](std::size_t i) { return program.shard_to_host(*a, i); };
    local.emplace(name, std::move(la));
  }
  // The program's runtime is the group: its processes and its host exchange.
  struct RuntimeGroup : ProcessGroup {
    Runtime& rt;
    explicit RuntimeGroup(Runtime& r) : rt(r) {}
    std::string name() const override { return rt.name(); }
    int rank() const override { return rt.process_rank(); }
    int size() const override { return rt.process_count(); }
    int local_rank() const override { return 0; }
    std::vector<std::string> allgather(const std::string& mine) override { return rt.allgather_host(mine); }
  } group(program.runtime());
  return save_local(step, local, program.mesh(), group.size() > 1 ? &group : nullptr, options);
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

void AsyncCheckpointer::start(int64_t step, int64_t bytes, std::function<void()> write) {
  if (budget_ > 0 && bytes > budget_)
    throw Error(fmt::format("checkpoint {}: step {} stages {} bytes on the host, above the staging budget of {} bytes: "
                            "raise the budget or save fewer arrays",
                            dir_.path(), step, bytes, budget_));
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->busy = true;
  }
  std::shared_ptr<State> st = state_;
  state_->worker = std::thread([st, write = std::move(write)]() mutable {
    std::exception_ptr err;
    try {
      write();
    } catch (...) {
      err = std::current_exception();
    }
    write = nullptr;  // the staged arrays go back before the next save may start
    std::lock_guard<std::mutex> lk(st->mu);
    st->error = err;
    st->busy = false;
    st->cv.notify_all();
  });
}

void AsyncCheckpointer::save(int64_t step, const std::map<std::string, ShardedArray>& arrays,
                             const LoadedExecutable& program, SaveOptions options, std::shared_ptr<ProcessGroup> group) {
  const auto t0 = std::chrono::steady_clock::now();
  wait();  // one save at a time; a failure of the previous one is raised here
  Runtime& rt = program.runtime();
  if (rt.process_count() > 1 && !group)
    throw Error(fmt::format("checkpoint {}: step {}: the {} runtime has {} processes: give the AsyncCheckpointer a "
                            "process group of its own (e.g. mpi_process_group()) for its background writes",
                            dir_.path(), step, rt.name(), rt.process_count()));
  // This process's blocks on the host, each distinct block once (replicas share it).
  const Mesh& mesh = program.mesh();
  auto local = std::make_shared<std::map<std::string, LocalArray>>();
  int64_t bytes = 0;
  for (const auto& [name, arr] : arrays) {
    const Shape& shape = arr.user_shape();  // an uneven layout's padding is not saved
    auto blocks = std::make_shared<std::vector<HostTensor>>();
    auto of_device = std::make_shared<std::vector<std::size_t>>();
    std::map<std::vector<int64_t>, std::size_t> seen;
    for (std::size_t i = 0; i < arr.devices().size(); ++i) {
      const std::vector<int64_t> off = arr.sharding().without_partial().local_offset(mesh, arr.shape(), arr.devices()[i]);
      auto [it, fresh] = seen.emplace(off, blocks->size());
      if (fresh) {
        blocks->push_back(program.shard_to_host(arr, i));
        bytes += static_cast<int64_t>(blocks->back().bytes());
      }
      of_device->push_back(it->second);
    }
    LocalArray la;
    la.layout = {arr.dtype(), shape, arr.sharding()};
    la.devices = arr.devices();
    // Each block is asked for once: it is moved out, not copied again.
    la.block = [blocks, of_device](std::size_t i) { return std::move((*blocks)[(*of_device)[i]]); };
    local->emplace(name, std::move(la));
  }
  CheckpointDir dir = dir_;
  start(step, bytes, [dir, step, local, mesh, options = std::move(options), group]() mutable {
    dir.save_local(step, *local, mesh, group.get(), options);
  });
  last_blocking_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void AsyncCheckpointer::save(int64_t step, std::map<std::string, HostTensor> arrays, const Mesh& mesh,
                             std::map<std::string, Sharding> shardings, SaveOptions options) {
  const auto t0 = std::chrono::steady_clock::now();
  wait();  // one save at a time; a failure of the previous one is raised here
  int64_t bytes = 0;
  for (const auto& [name, t] : arrays) bytes += static_cast<int64_t>(t.bytes());
  CheckpointDir dir = dir_;
  start(step, bytes, [dir, step, arrays = std::move(arrays), mesh, shardings = std::move(shardings),
                      options = std::move(options)]() mutable { dir.save(step, arrays, mesh, shardings, options); });
  last_blocking_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace tessel
