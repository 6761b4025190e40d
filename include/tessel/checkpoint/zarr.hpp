// tessel/checkpoint/zarr.hpp — zarr v3 arrays on a local file system: what a tessel checkpoint
// is made of, readable by zarr-python and TensorStore, and able to read what they write.
//
// An array is a folder: zarr.json (the metadata) and one file per shard of a regular grid,
// keyed `c/i/j` (chunk_key_encoding "default", separator "/"; a 0-d array's key is `c`). tessel
// writes every array with the `sharding_indexed` codec:
//   - the shard (a block of the saving layout) holds inner chunks that divide it, each encoded
//     with [bytes little-endian] plus optionally [zstd] and [crc32c];
//   - the shard index, at the end of the file, is one (offset, nbytes) pair of little-endian
//     uint64 per inner chunk in row-major order over the shard's chunk grid, then the crc32c of
//     those bytes (index_codecs [bytes little-endian, crc32c], always written);
//   - an inner chunk wholly outside the array is not stored: offset = nbytes = 2^64 - 1.
// bf16 is written as the data type `bfloat16` (TensorStore's name) or, with bf16_as_uint16, as
// `uint16` with the attribute "tessel_dtype": "bfloat16" for readers without bfloat16.
//
// Reading accepts more than tessel writes: plain chunks (no sharding), index at the start or
// the end, an index without crc32c, zstd and crc32c inner codecs, inner chunks stored in any
// order (Morton too: the index says where), missing shards or chunks (the fill value), the
// "v2" chunk key encoding. Reading a region touches only the inner chunks that overlap it and
// keeps one decoded chunk at a time besides the result.
//
// Errors (tessel::Error) name the array folder, the shard file and the inner chunk: a crc32c
// mismatch, a truncated file, an unsupported codec or data type. Nothing corrupted is returned.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel::zarr {

struct ArraySpec {
  Shape shape;
  DType dtype = DType::f32;
  Shape shard_shape;  // the chunk grid: one file per shard; empty: one shard for the whole array
  Shape inner_shape;  // inner chunks, dividing shard_shape dim by dim; empty: one per shard
  bool zstd = false;
  int zstd_level = 3;
  bool chunk_crc32c = false;   // a crc32c after each inner chunk (checked on every read)
  bool bf16_as_uint16 = false;  // bf16 stored as uint16 with attribute tessel_dtype = bfloat16
  std::string attributes_json = "{}";  // a JSON object: the array's user attributes
};

// Inner chunks for a shard: each dim of `shard` divided by its smallest divisors, largest dim
// first, until a chunk holds at most target_bytes (or every dim is 1).
Shape choose_inner_shape(const Shape& shard, std::size_t elem_bytes, int64_t target_bytes);

// Creates folder `dir` (its parents must exist; it must not exist) with zarr.json. Throws Error
// naming the folder, or the spec's field that is inconsistent.
void create_array(const std::string& dir, const ArraySpec& spec);

// Writes the shard at grid position `shard_index` from `block`: the shard's region of the
// array, clipped to the array's bounds (block.shape() == that clipped shape, block.dtype() ==
// spec.dtype). Returns the bytes written. The file is written and fsynced; the caller commits.
int64_t write_shard(const std::string& dir, const ArraySpec& spec, const std::vector<int64_t>& shard_index,
                    const HostTensor& block);
// The same, the block read in place from `source` at `origin` (e.g. the whole array): no copy
// of the block is made.
int64_t write_shard(const std::string& dir, const ArraySpec& spec, const std::vector<int64_t>& shard_index,
                    const HostTensor& source, const std::vector<int64_t>& origin);

struct ReadStats {
  int64_t bytes_read = 0;    // file bytes read (indexes and encoded chunks)
  int64_t bytes_needed = 0;  // bytes of the region requested
  int64_t chunks_read = 0;
  // restore_to_device: the most host bytes it held at once (a slab, its staging copy, the
  // reader's buffers), the largest over its calls with these stats.
  int64_t host_peak_bytes = 0;
};

class Array {
 public:
  // Opens the array in `dir` (its zarr.json). Throws Error naming the file and what it does not
  // support or cannot parse.
  static Array open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }        // the tessel dtype (bfloat16 for uint16 + tessel_dtype)
  const Shape& chunk_shape() const { return chunk_shape_; }  // the grid's: one file per shard (or plain chunk)
  // The unit a read decodes: the inner chunk (the chunk itself without sharding).
  const Shape& inner_chunk_shape() const { return inner_shape_; }
  // Host bytes a region read holds besides its result: one encoded and one decoded inner
  // chunk (at most; a compressed chunk is smaller) and one shard index.
  int64_t read_buffer_bytes() const;
  const std::string& attributes_json() const { return attributes_; }

  // The region [start, start + shape) (whole array: read_all). Throws Error for a region outside
  // the array, a crc32c mismatch or a truncated file, naming the file and the inner chunk.
  HostTensor read(const std::vector<int64_t>& start, const Shape& shape, ReadStats* stats = nullptr) const;
  HostTensor read_all(ReadStats* stats = nullptr) const;

 private:
  std::string dir_;
  Shape shape_;
  DType dtype_ = DType::f32;
  std::string stored_type_;  // the zarr data_type
  Shape chunk_shape_;        // the grid's (shard or plain chunk)
  bool sharded_ = false;
  Shape inner_shape_;
  bool index_at_end_ = true;
  bool index_crc_ = false;
  std::vector<std::string> chunk_codecs_;  // after bytes: "zstd", "crc32c" in encoding order
  std::string key_encoding_ = "default";
  char separator_ = '/';
  double fill_ = 0;
  std::string attributes_ = "{}";
};

// CRC-32C (Castagnoli, the iSCSI polynomial): crc32c("123456789") = 0xE3069283; chainable:
// crc32c(b, crc32c(a)) == crc32c(a followed by b). ISA-L's instruction-accelerated version.
uint32_t crc32c(const void* data, std::size_t n, uint32_t crc = 0);

}  // namespace tessel::zarr
