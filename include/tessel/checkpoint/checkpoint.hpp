// tessel/checkpoint/checkpoint.hpp — numbered, atomically committed checkpoints of named
// arrays in an open format, restorable onto any mesh. The format is an ArrayStore
// (array_store.hpp): zarr v3 by default, the layout below.
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
// is either all there or not listed. Restoring reads through the store; zarr v3 checks a crc32c
// on every shard index (and on every inner chunk with SaveOptions::chunk_checksums), an Error
// naming the array and the chunk on a mismatch.
//
// Saving, three ways:
//  - save(step, host tensors, mesh, shardings): global tensors from one process;
//  - save(step, device arrays, program): the arrays on a loaded program's devices (a Trainer's
//    device_state()), collective over the program's processes (every process of an MpiRuntime,
//    or the one process of a ThreadRuntime): each process copies to the host and writes only
//    blocks its devices hold, and a block held by several devices (replicas) is written once,
//    by the process plan_writes picks so that the bytes written per process are balanced;
//  - save_local(step, local blocks, mesh, group): the same from blocks on the host, with any
//    ProcessGroup (mpi_process_group(), file_process_group(), or nullptr for one process).
// The processes of a many-process save meet four times (allgather): to agree on the arrays and
// the temporary folder, after rank 0 made the folder and the arrays' zarr.json, after every
// process wrote and fsynced its shards, and after rank 0 renamed the step into place. A process
// that fails makes every process throw the same Error naming it, and rank 0 removes the
// temporary; a process that dies leaves the others waiting in the group (MPI ends the job, a
// file group times out), and the step is never listed: only rank 0 commits, and only after
// every process said its shards are durable.
// Restoring onto another mesh: read_all then the new program's to_device (or Trainer::set_state),
// or restore_to_device, which reads only each local device's block.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/checkpoint/array_store.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/core/sharding.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/process_group.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

struct SaveOptions {
  int64_t inner_chunk_bytes = int64_t{1} << 20;  // inner chunks of at most this many bytes
  bool zstd = false;                             // compress inner chunks
  int zstd_level = 3;
  // A crc32c on every inner chunk (the shard index always has one), checked on every read: a
  // flipped bit or a zeroed block is an error naming the chunk, never restored. On by default
  // (issue 37 D2; its cost: docs/checkpoints.md); off only for a reader that cannot check it.
  bool chunk_checksums = true;
  bool bf16_as_uint16 = false;   // bf16 stored as uint16 (+ attribute) for readers without bfloat16
  std::string metadata_json = "{}";  // a JSON object kept in the manifest (e.g. the data position)
};

struct RestoreOptions {
  // The most host memory restore_to_device holds at once: each device block is read and sent in
  // slabs (contiguous runs of its rows) small enough that a slab, its copy to the devices' staging
  // buffer and the reader's buffers (one encoded and one decoded inner chunk, a shard index) stay
  // under it, whatever the size of the array. Too small for one inner chunk and one element: an
  // Error naming both.
  int64_t host_budget_bytes = int64_t{32} << 20;
};

struct CheckpointArray {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  Sharding sharding;  // the saving layout
  std::string folder; // its zarr array, relative to the step's folder
  // Each shard's digest (ShardWritten::digest) by its key, as saved with chunk checksums (empty
  // without them, and in checkpoints written before digests were kept): a read checks them.
  std::map<std::string, uint32_t> shard_digests;
};

struct Manifest {
  int64_t step = 0;
  std::string mesh;            // the saving mesh, Mesh::to_string
  std::string tessel_version;
  std::vector<CheckpointArray> arrays;
  std::string metadata_json = "{}";
  const CheckpointArray* find(const std::string& name) const;
};

// An array as saved: its type, global (unpadded) shape and saving layout.
struct ArrayLayout {
  DType dtype = DType::f32;
  Shape shape;
  Sharding sharding;  // on the saving mesh; rank 0 (not given) for an array of rank > 0: one block
};

// One array as this process holds it (CheckpointDir::save_local).
struct LocalArray {
  ArrayLayout layout;
  std::vector<int64_t> devices;  // the mesh positions whose blocks this process holds
  // The block of devices[i] on the host: the local shape of the layout, ceil(shape / shards)
  // per dim (what a device of an uneven, padded layout holds; what lies beyond `shape` is not
  // saved). Called on the saving thread, once per block this process writes, never for the
  // blocks other processes write.
  std::function<HostTensor(std::size_t i)> block;
};

// Who writes what in a many-process save. The zarr shards of an array are its devices' blocks,
// each cut along one dim into r parts when every block is held by r >= 2 processes (replicas;
// the longest dim that r divides, none when no dim does), so the replicas share the writing.
// Each shard goes to the holding process with the fewest bytes so far: the shards with the
// fewest holders first, then the largest (LPT); ties go to the lowest rank, so every process
// computes the same plan.
struct WritePlan {
  // [array][zarr shard, row-major over the array's shard grid]: the writing process, -1 for a
  // shard no process holds.
  std::vector<std::vector<int>> writer;
  std::vector<int64_t> bytes;  // bytes written by each process
  int64_t unheld_blocks = 0;   // device blocks no process holds
  double imbalance() const;    // max / mean of `bytes` (1 when balanced; 1 with no bytes)
};
// `process_of_position[p]`: the process holding mesh position p (-1: none).
WritePlan plan_writes(const std::vector<ArrayLayout>& arrays, const Mesh& mesh,
                      const std::vector<int>& process_of_position, int processes);

// What one process did in a save.
struct SaveStats {
  int64_t bytes_written = 0;   // array bytes this process wrote (before compression)
  int64_t blocks_written = 0;  // zarr shards this process wrote
  int processes = 1;
  double imbalance = 1;        // WritePlan::imbalance of the whole save
};

class CheckpointDir {
 public:
  // The checkpoint folder `path` (created, with its parents, when missing). Throws Error when
  // it is a file or cannot be created.
  // Its arrays and step groups are written and read through `store` (the file format; zarr v3
  // by default), which must outlive the CheckpointDir.
  explicit CheckpointDir(std::string path, const ArrayStore& store = zarr_v3_store());
  const std::string& path() const { return path_; }
  const ArrayStore& store() const { return *store_; }

  // Saves `arrays` (global tensors by name) as step `step` (>= 0) and commits it. A name not in
  // `shardings` is saved as one block (replicated). Throws Error naming the step when it is
  // already committed, the array whose sharding does not fit its shape or the mesh, or the file
  // that could not be written; nothing is listed then.
  void save(int64_t step, const std::map<std::string, HostTensor>& arrays, const Mesh& mesh,
            const std::map<std::string, Sharding>& shardings = {}, const SaveOptions& options = {});

  // Saves the arrays on the devices of `program` (each ShardedArray of this process's devices;
  // the global shape is the program input's user shape when the array's name is an input,
  // else the array's) as step `step`. Collective over the program's processes: every process
  // calls it with the same names and layouts. Returns what this process wrote.
  SaveStats save(int64_t step, const std::map<std::string, ShardedArray>& arrays, const LoadedExecutable& program,
                 const SaveOptions& options = {});
  // The same from this process's blocks on the host. `group` nullptr: this process holds every
  // block it saves. Collective over `group`. Throws the same Error on every process when one
  // fails, naming that process (rank) and the array or file; nothing is listed then.
  SaveStats save_local(int64_t step, const std::map<std::string, LocalArray>& arrays, const Mesh& mesh,
                       ProcessGroup* group, const SaveOptions& options = {});

  std::vector<int64_t> steps() const;      // committed steps, ascending
  std::optional<int64_t> latest() const;   // the last committed step
  // Removes every committed step but the last n (n >= 1), and the temporaries of writers that
  // are no longer running.
  void keep_last(int n);

  // The step's manifest. Throws Error naming the step when it is not committed.
  Manifest manifest(int64_t step) const;
  std::string step_path(int64_t step) const;
  // The array `name` of the step, opened for reading. Throws Error naming the file and what is
  // wrong when the folder holds another array (its metadata's tessel_name), another dtype or
  // shape; its reads throw for a missing shard (tessel writes every one: a missing shard is
  // lost data, never read as zeros), a truncated file or a checksum mismatch.
  std::unique_ptr<StoredArray> array(int64_t step, const std::string& name) const;
  HostTensor read(int64_t step, const std::string& name, ReadStats* stats = nullptr) const;
  std::map<std::string, HostTensor> read_all(int64_t step, ReadStats* stats = nullptr) const;

  // Array `name` of `step` straight onto the devices of `program`, as its input `input` (any
  // mesh, any layout: the target is the input's sharding there): each local device's block is
  // read from the inner chunks that overlap it, a block held by several devices once, in slabs
  // within options.host_budget_bytes of host memory (stats->host_peak_bytes: what was held).
  // Throws Error naming the array when its dtype or shape differs from the input's.
  ShardedArray restore_to_device(int64_t step, const std::string& name, const LoadedExecutable& program,
                                 const std::string& input, ReadStats* stats = nullptr,
                                 const RestoreOptions& options = {}) const;

 private:
  std::unique_ptr<StoredArray> open_checked(int64_t step, const CheckpointArray& a) const;
  std::string path_;
  const ArrayStore* store_;
  // The folder's writer lock (DIR/.tessel-writer.lock, an flock), taken by the first save or
  // keep_last of this object (and its copies) in the committing process and held until the last
  // of them is destroyed: a second process writing to the folder is refused, naming the
  // holder's pid, where two writers' keep_last deleted each other's steps (issue 37 D9).
  std::shared_ptr<void> writer_lock_;
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
  // Device arrays of `program` (a Trainer's device_state()): the caller blocks only while this
  // process's blocks are copied to the host (each distinct block once, no gather); the worker
  // writes them as CheckpointDir::save_local does. On a multi-process runtime pass `group`, a
  // process group of the checkpointer's own (e.g. a second mpi_process_group(): the workers
  // meet there, beside the training's own exchanges); every process calls save in the same
  // order. Error naming the runtime when it has several processes and no group is given.
  void save(int64_t step, const std::map<std::string, ShardedArray>& arrays, const LoadedExecutable& program,
            SaveOptions options = {}, std::shared_ptr<ProcessGroup> group = nullptr);
  // Waits for the save in flight; rethrows its failure.
  void wait();
  // Seconds the last save() blocked (waiting for the previous save and taking the arrays).
  double last_blocking_seconds() const { return last_blocking_; }
  CheckpointDir& dir() { return dir_; }

 private:
  struct State;
  // Checks the staging budget, marks a save in flight and runs `write` (which owns the staged
  // arrays) on the worker thread; its failure is kept for the next call.
  void start(int64_t step, int64_t bytes, std::function<void()> write);
  CheckpointDir dir_;
  int64_t budget_;
  double last_blocking_ = 0;
  std::shared_ptr<State> state_;
};

}  // namespace tessel
