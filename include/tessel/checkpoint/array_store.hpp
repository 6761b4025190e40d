// tessel/checkpoint/array_store.hpp — the seam between checkpoints and their file format: a
// checkpoint (checkpoint.hpp) writes and reads sharded arrays and one group of metadata per
// step through an ArrayStore and never names the format. zarr_v3_store() is the one
// implementation (src/checkpoint/zarr.cpp: zarr v3 with the sharding_indexed codec, readable
// by zarr-python and TensorStore); a new format is one more ArrayStore (docs/architecture.md).
//
// An array lives in a folder of its own and is written shard by shard: the shards are the
// blocks of a regular grid (ArraySpec::shard_shape), each split into inner chunks (the unit a
// read decodes). A group is a folder holding arrays, with a JSON object of attributes: a
// checkpoint's step is one, its manifest the attributes.
//
// Errors (tessel::Error) name the folder, the file and the chunk: a checksum mismatch, a
// truncated file, an unsupported codec or data type. Nothing corrupted is returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

struct ArraySpec {
  Shape shape;
  DType dtype = DType::f32;
  Shape shard_shape;  // the chunk grid: one file per shard; empty: one shard for the whole array
  Shape inner_shape;  // inner chunks, dividing shard_shape dim by dim; empty: one per shard
  bool zstd = false;
  int zstd_level = 3;
  bool chunk_crc32c = false;    // a crc32c after each inner chunk (checked on every read)
  bool bf16_as_uint16 = false;  // bf16 stored as uint16 with attribute tessel_dtype = bfloat16
  std::string attributes_json = "{}";  // a JSON object: the array's user attributes
};

struct ReadStats {
  int64_t bytes_read = 0;    // file bytes read (indexes and encoded chunks)
  int64_t bytes_needed = 0;  // bytes of the region requested
  int64_t chunks_read = 0;
  // restore_to_device: the most host bytes it held at once (a slab, its staging copy, the
  // reader's buffers), the largest over its calls with these stats.
  int64_t host_peak_bytes = 0;
};

// A shard as written. Its digest tells it from another shard file with valid checksums (one
// copied from another step, or from another position of the same array): the crc32c of its
// stored chunks' crc32c values in index order, which a reader recomputes from the file.
struct ShardWritten {
  int64_t bytes = 0;               // the file's
  std::string key;                 // the shard's chunk key inside the array's folder
  std::optional<uint32_t> digest;  // with chunk checksums (ArraySpec::chunk_crc32c)
};

// An array opened for reading.
class StoredArray {
 public:
  virtual ~StoredArray() = default;
  virtual const std::string& dir() const = 0;
  virtual const Shape& shape() const = 0;
  virtual DType dtype() const = 0;               // the tessel dtype (bf16 also when stored as uint16)
  virtual const Shape& chunk_shape() const = 0;  // the grid's: one file per shard (or plain chunk)
  // The unit a read decodes: the inner chunk (the chunk itself without sharding).
  virtual const Shape& inner_chunk_shape() const = 0;
  // Host bytes a region read holds besides its result (its decode buffers).
  virtual int64_t read_buffer_bytes() const = 0;
  virtual const std::string& attributes_json() const = 0;
  // The region [start, start + shape). Throws Error for a region outside the array, a
  // checksum mismatch or a truncated file, naming the file and the chunk. Reads only the inner
  // chunks that overlap the region.
  virtual HostTensor read(const std::vector<int64_t>& start, const Shape& shape, ReadStats* stats = nullptr) const = 0;
  HostTensor read_all(ReadStats* stats = nullptr) const { return read(std::vector<int64_t>(shape().size(), 0), shape(), stats); }
  // From now on a shard or chunk that is not stored is an error naming its file, not the fill
  // value: an array whose writer stores every one (a tessel checkpoint's) lost it.
  virtual void require_every_chunk() = 0;
  // From now on every shard a read touches must digest (ShardWritten::digest) to `by_key`'s
  // value for its key, else an Error naming the file: the writer recorded them (a step's
  // manifest). Empty: no check. Each shard touched is checked whole (its chunks outside the
  // region: their checksums only, 4 bytes each).
  virtual void expect_shard_digests(std::map<std::string, uint32_t> by_key) = 0;
};

class ArrayStore {
 public:
  virtual ~ArrayStore() = default;
  virtual const char* format() const = 0;  // "zarr v3"

  // Creates folder `dir` (its parents must exist; it must not exist) holding the array's
  // metadata. Throws Error naming the folder, or the spec's field that is inconsistent.
  virtual void create_array(const std::string& dir, const ArraySpec& spec) const = 0;
  // Writes the shard at grid position `shard_index`, its region of the array (clipped to the
  // array's bounds) read in place from `source` at `origin` (no copy of the block is made).
  // Returns its bytes, key and digest. The file is written and fsynced; the caller commits.
  virtual ShardWritten write_shard(const std::string& dir, const ArraySpec& spec,
                                   const std::vector<int64_t>& shard_index, const HostTensor& source,
                                   const std::vector<int64_t>& origin) const = 0;
  // The same from `block`, exactly the shard's clipped region.
  ShardWritten write_shard(const std::string& dir, const ArraySpec& spec, const std::vector<int64_t>& shard_index,
                           const HostTensor& block) const {
    return write_shard(dir, spec, shard_index, block, std::vector<int64_t>(block.shape().size(), 0));
  }
  // Opens the array in `dir`. Throws Error naming the file and what it cannot read.
  virtual std::unique_ptr<StoredArray> open(const std::string& dir) const = 0;

  // The group metadata of folder `dir` (which exists), written durably (fsynced).
  virtual void write_group(const std::string& dir, const std::string& attributes_json) const = 0;
  // The attributes of the group in `dir` (a JSON object's text); nullopt when `dir` holds none.
  // Throws Error naming the file when it is there but unreadable.
  virtual std::optional<std::string> read_group(const std::string& dir) const = 0;
  // Whether `dir` holds a group (without reading it).
  virtual bool has_group(const std::string& dir) const = 0;
  // The file that holds the group metadata of `dir`, for messages (zarr v3: `dir`/zarr.json).
  virtual std::string group_file(const std::string& dir) const { return dir; }
};

// zarr v3 on a local file system (src/checkpoint/zarr.cpp). Stateless: one shared instance.
const ArrayStore& zarr_v3_store();

// Inner chunks for a shard: each dim of `shard` divided by its smallest divisors, largest dim
// first, until a chunk holds at most target_bytes (or every dim is 1).
Shape choose_inner_shape(const Shape& shard, std::size_t elem_bytes, int64_t target_bytes);

// CRC-32C (Castagnoli, the iSCSI polynomial): crc32c("123456789") = 0xE3069283; chainable:
// crc32c(b, crc32c(a)) == crc32c(a followed by b). ISA-L's instruction-accelerated version.
uint32_t crc32c(const void* data, std::size_t n, uint32_t crc = 0);

}  // namespace tessel
