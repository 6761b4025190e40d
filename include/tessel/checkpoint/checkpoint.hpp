// tessel/checkpoint/checkpoint.hpp — numbered, atomically committed checkpoints of named
// arrays in an open format (zarr v3, tessel/checkpoint/zarr.hpp), restorable onto any mesh.
//
//   tessel::CheckpointDir ck("run1/ckpt");
//   ck.save(step, trainer.state().values, mesh, shardings, {});   // step_<step>/, committed
//   if (auto last = ck.latest()) state.values = ck.read_all(*last); // any mesh, any layout
//   ck.keep_last(3);
//
// Layout on disk: DIR/step_<N>/ is a zarr v3 group (zarr.json, node_type "group") whose
// attributes hold the manifest under "tessel": the step, the saving mesh, each array's name,
// dtype, global shape and saving sharding, the tessel version and the user's metadata. Each
// array is a child folder (its name, with characters outside [A-Za-z0-9._-] written %XX), a
// zarr v3 array whose shards are the blocks of its saving sharding on the saving mesh (a
// replicated dim is one block), cut into inner chunks of at most SaveOptions::inner_chunk_bytes.
// zarr.open_group("DIR/step_N") in zarr-python and TensorStore's zarr3 driver open it.
//
// Commit: a step is written under DIR/.step_<N>.tmp-<pid>-<nonce>, every file and folder is
// fsynced, and one rename makes it DIR/step_<N>; steps() lists only committed steps, so a step
// is either all there or not listed. Restoring reads through zarr::Array: crc32c on every shard
// index (and on every inner chunk with SaveOptions::chunk_checksums), an Error naming the array
// and the chunk on a mismatch.
//
// Saving takes global host tensors (a Trainer's state(), gathered) from one process.
// Restoring onto another mesh: read_all then the new program's to_device (or Trainer::set_state),
// or restore_to_device, which reads only each local device's block.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/checkpoint/zarr.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/core/sharding.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

struct SaveOptions {
  int64_t inner_chunk_bytes = int64_t{1} << 20;  // inner chunks of at most this many bytes
  bool zstd = false;                             // compress inner chunks
  int zstd_level = 3;
  bool chunk_checksums = false;  // a crc32c on every inner chunk (the shard index always has one)
  bool bf16_as_uint16 = false;   // bf16 stored as uint16 (+ attribute) for readers without bfloat16
  std::string metadata_json = "{}";  // a JSON object kept in the manifest (e.g. the data position)
};

struct CheckpointArray {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  Sharding sharding;  // the saving layout
  std::string folder; // its zarr array, relative to the step's folder
};

struct Manifest {
  int64_t step = 0;
  std::string mesh;            // the saving mesh, Mesh::to_string
  std::string tessel_version;
  std::vector<CheckpointArray> arrays;
  std::string metadata_json = "{}";
  const CheckpointArray* find(const std::string& name) const;
};

class CheckpointDir {
 public:
  // The checkpoint folder `path` (created, with its parents, when missing). Throws Error when
  // it is a file or cannot be created.
  explicit CheckpointDir(std::string path);
  const std::string& path() const { return path_; }

  // Saves `arrays` (global tensors by name) as step `step` (>= 0) and commits it. A name not in
  // `shardings` is saved as one block (replicated). Throws Error naming the step when it is
  // already committed, the array whose sharding does not fit its shape or the mesh, or the file
  // that could not be written; nothing is listed then.
  void save(int64_t step, const std::map<std::string, HostTensor>& arrays, const Mesh& mesh,
            const std::map<std::string, Sharding>& shardings = {}, const SaveOptions& options = {});

  std::vector<int64_t> steps() const;      // committed steps, ascending
  std::optional<int64_t> latest() const;   // the last committed step
  // Removes every committed step but the last n (n >= 1), and the temporaries of writers that
  // are no longer running.
  void keep_last(int n);

  // The step's manifest. Throws Error naming the step when it is not committed.
  Manifest manifest(int64_t step) const;
  std::string step_path(int64_t step) const;
  zarr::Array array(int64_t step, const std::string& name) const;
  HostTensor read(int64_t step, const std::string& name, zarr::ReadStats* stats = nullptr) const;
  std::map<std::string, HostTensor> read_all(int64_t step, zarr::ReadStats* stats = nullptr) const;

  // Array `name` of `step` straight onto the devices of `program`, as its input `input` (any
  // mesh, any layout: the target is the input's sharding there): each local device's block is
  // read from the inner chunks that overlap it, a block held by several devices once. Host
  // memory is this process's blocks of this one array, never the whole array on one host
  // unless it is replicated. Throws Error naming the array when its dtype or shape differs
  // from the input's.
  ShardedArray restore_to_device(int64_t step, const std::string& name, const LoadedExecutable& program,
                                 const std::string& input, zarr::ReadStats* stats = nullptr) const;

 private:
  std::string path_;
};

// Saving in the background: save() returns once the arrays are handed over (the caller's
// device -> host copy, e.g. Trainer::state(), is the only part that blocks training); a
// worker thread writes and commits the step while the caller goes on. One save at a time:
// the next save() waits for the previous one. A failure in the background is raised by the
// next save(), wait() or finish(). The staging budget bounds the host bytes handed over per
// save (0: no bound): a larger state is an Error naming its size and the budget.
class AsyncCheckpointer {
 public:
  explicit AsyncCheckpointer(CheckpointDir dir, int64_t staging_budget_bytes = 0);
  // Waits for the save in flight; a failure then is written to stderr (a destructor cannot throw).
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  void save(int64_t step, std::map<std::string, HostTensor> arrays, const Mesh& mesh,
            std::map<std::string, Sharding> shardings = {}, SaveOptions options = {});
  // Waits for the save in flight; rethrows its failure.
  void wait();
  // Seconds the last save() blocked (waiting for the previous save and taking the arrays).
  double last_blocking_seconds() const { return last_blocking_; }
  CheckpointDir& dir() { return dir_; }

 private:
  struct State;
  CheckpointDir dir_;
  int64_t budget_;
  double last_blocking_ = 0;
  std::shared_ptr<State> state_;
};

}  // namespace tessel
