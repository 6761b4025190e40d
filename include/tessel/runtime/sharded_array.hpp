// tessel/runtime/sharded_array.hpp — a global tensor that lives on the devices: its global
// type, its sharding on the mesh, and one buffer per device holding that device's local
// shard (like JAX's Array). Runs take and return ShardedArrays, so values such as weights
// stay on the devices between steps; moving data to or from the host is explicit
// (LoadedExecutable::to_device / to_host).
//
// On a multi-process runtime (MpiRuntime) an array holds only the shards of this process's
// devices (devices() lists their mesh positions), like a JAX Array's addressable shards.
//
// An array made by to_device or run remembers the mesh of its program: a program on a mesh
// with the same axes in another order (or other device ids) refuses it, since the same
// sharding text puts the blocks on other devices there.
//
// Copies share the buffers (an array is an immutable value). Donating an array to a run
// (LoadOptions::donate) deletes it: every copy then reports deleted() and refuses to be used
// again, as in JAX. Thread-safe: a donation takes the array atomically. A transfer or run
// that reads the array on another thread holds it (read()) while it copies or runs, and a
// donation waits for those reads to end before the run may overwrite the buffers; a read that
// starts after the donation fails with an error saying the array was donated. So to_host
// against a donating run returns the old values or that error, never a torn read.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/core/sharding.hpp"

namespace tessel {

class ShardedArray {
 public:
  ShardedArray() = default;
  ShardedArray(std::string name, DType dtype, Shape global_shape, Sharding sharding, Shape local_shape,
               std::vector<std::shared_ptr<Buffer>> shards);
  // Shards of the devices at mesh positions `devices` only (same length as shards).
  ShardedArray(std::string name, DType dtype, Shape global_shape, Sharding sharding, Shape local_shape,
               std::vector<std::shared_ptr<Buffer>> shards, std::vector<int64_t> devices);
  // The same, made for programs on `mesh` (what to_device and run produce): the blocks are laid
  // out by that mesh's axis order and device ids, which run() checks.
  ShardedArray(std::string name, DType dtype, Shape global_shape, Sharding sharding, Shape local_shape,
               std::vector<std::shared_ptr<Buffer>> shards, std::vector<int64_t> devices, Mesh mesh);

  const std::string& name() const { return name_; }  // the program value it was made for
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }  // global (padded, for an uneven layout)
  // The user's shape: the global shape less an uneven layout's padding (compiler/uneven.hpp),
  // what to_host returns and a checkpoint saves; equal to shape() when nothing is padded.
  const Shape& user_shape() const { return user_shape_.empty() ? shape_ : user_shape_; }
  // Internal (transfers and runs): records the user's shape of a padded array (a copy's own).
  void set_user_shape(Shape s) { user_shape_ = std::move(s); }
  const Sharding& sharding() const { return sharding_; }
  const Shape& local_shape() const { return local_shape_; }
  // Empty (default-constructed) arrays have no storage; donated ones are deleted.
  bool valid() const { return storage_ && !storage_->deleted.load(std::memory_order_acquire); }
  bool deleted() const { return storage_ && storage_->deleted.load(std::memory_order_acquire); }
  // The same array: copies of one ShardedArray share their storage (and its donation).
  bool shares_storage(const ShardedArray& other) const { return storage_ && storage_ == other.storage_; }
  // The shards this process holds (every device of the mesh on a single-process runtime).
  int64_t num_shards() const { return static_cast<int64_t>(devices_.size()); }
  // Their mesh positions, in local device order.
  const std::vector<int64_t>& devices() const { return devices_; }
  // The mesh whose device layout places the blocks; nullptr for an array built without one.
  const Mesh* mesh() const { return mesh_ ? &*mesh_ : nullptr; }
  // The buffer of the device at mesh position `device` (throws RuntimeError when the array is
  // empty or deleted, or when this process does not hold that device). Not held against a
  // donation: use read() to read its contents while another thread may donate the array.
  std::shared_ptr<Buffer> shard(int64_t device) const;
  // "f32[8,16] [{data}, {}] (%x, 4 shards)"
  std::string to_string() const;

 private:
  struct Storage {
    std::mutex mu;
    std::condition_variable cv;  // readers dropped to 0
    std::vector<std::shared_ptr<Buffer>> shards;
    int readers = 0;                 // guarded by mu
    std::atomic<bool> deleted{false};  // written under mu
  };

 public:
  // Internal (transfers and runs): the array's buffers, held against a donation until the
  // Reading is destroyed. Throws RuntimeError naming `what` and the array when it is empty
  // or was donated.
  class Reading {
   public:
    Reading(Reading&& o) noexcept : storage_(std::move(o.storage_)), shards_(std::move(o.shards_)) {}
    Reading& operator=(Reading&&) = delete;
    Reading(const Reading&) = delete;
    ~Reading();
    // The buffer of local device i (devices() order).
    const std::shared_ptr<Buffer>& local(std::size_t i) const { return shards_.at(i); }

   private:
    friend class ShardedArray;
    Reading(std::shared_ptr<Storage> s, std::vector<std::shared_ptr<Buffer>> shards)
        : storage_(std::move(s)), shards_(std::move(shards)) {}
    std::shared_ptr<Storage> storage_;
    std::vector<std::shared_ptr<Buffer>> shards_;
  };
  Reading read(const std::string& what) const;
  // Internal (donation): waits for the reads in flight, then takes every shard's buffer out
  // and marks the array deleted (atomically: one donation wins). Throws RuntimeError naming
  // `what` and the array when it is empty or already donated.
  std::vector<std::shared_ptr<Buffer>> take_shards(const std::string& what) const;

 private:
  std::string name_;
  DType dtype_ = DType::f32;
  Shape shape_;
  Shape user_shape_;  // empty: shape_
  Sharding sharding_;
  Shape local_shape_;
  std::vector<int64_t> devices_;
  std::optional<Mesh> mesh_;
  std::shared_ptr<Storage> storage_;
};

// The local block of every device of `mesh` of a global host tensor (position order).
std::vector<HostTensor> scatter_host(const Mesh& mesh, const Sharding& sharding, const Shape& local_shape,
                                     const HostTensor& global);
// The global tensor from every device's block; `check_replicas`: devices holding the same
// block must agree bit for bit (RuntimeError naming `name` and both devices otherwise).
// Elements no device holds stay poisoned.
HostTensor gather_host(const Mesh& mesh, const Sharding& sharding, DType dtype, const Shape& global_shape,
                       const std::vector<HostTensor>& shards, bool check_replicas, const std::string& name);

}  // namespace tessel
