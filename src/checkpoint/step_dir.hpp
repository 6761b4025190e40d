// src/checkpoint/step_dir.hpp — what saving and reading a checkpoint step share: the names of
// the step folders and of the array folders in them, the durable-folder fsync, and the blocks
// (zarr shards) of an array's saving layout.
#pragma once

#include <memory>
#include <string>

#include "tessel/core/common.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/core/sharding.hpp"

namespace tessel::ckpt {

inline constexpr const char* kStepPrefix = "step_";  // DIR/step_<N>; temporaries DIR/.step_<N>.tmp-...

// An array name as a folder name: [A-Za-z0-9._-] kept, every other byte %XX; a leading '.'
// (hidden, or "." / "..") and "__" (reserved by zarr) escaped too.
std::string folder_of(const std::string& name);

// The writer lock of checkpoint folder `dir`: an exclusive flock on dir/.tessel-writer.lock,
// held while the returned token lives (tokens for one folder in one process are shared, so
// several CheckpointDir objects of a process agree). Throws Error naming the other process's
// pid when another process holds it. flock is per host: writers on two hosts sharing a file
// system are not told apart.
std::shared_ptr<void> writer_lock(const std::string& dir);

// Removes the temporaries (".step_N.tmp-<pid>-...", ".step_N.del-<pid>-...") in `dir` whose
// process no longer runs on this host: what killed saves and deletions left. keep_last and
// every save (its committing process) call it, so they do not pile up without --keep.
void remove_dead_temporaries(const std::string& dir);

// fsync of every folder under `root` (deepest first) and of root itself: the new entries are
// durable.
void fsync_tree(const std::string& root);

// The shard (block) shape of an array of `shape` saved with `sharding` on `mesh`: per dim
// ceil(size / shards), at least 1 (a dim that does not divide has a short last block, as an
// uneven layout's padded devices do); the whole shape when `sharding` is not given (rank 0 for
// an array of rank > 0). Throws Error naming the array when the sharding does not fit.
Shape block_shape_of(const std::string& name, const Shape& shape, const Sharding& sharding, const Mesh& mesh);

}  // namespace tessel::ckpt
