// src/checkpoint/zarr.hpp (private) — zarr v3 arrays on a local file system: the ArrayStore
// (tessel/checkpoint/array_store.hpp) a tessel checkpoint is made of, readable by zarr-python
// and TensorStore, and able to read what they write. Only src/checkpoint and the tests that
// check the format itself include it; everything else goes through the ArrayStore.
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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/checkpoint/array_store.hpp"
#include "tessel/core/common.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel::zarr {

class ReadFile;  // file_io.hpp

// Creates folder `dir` (its parents must exist; it must not exist) with zarr.json. Throws Error
// naming the folder, or the spec's field that is inconsistent.
void create_array(const std::string& dir, const ArraySpec& spec);

// Writes the shard at grid position `shard_index` from `block`: the shard's region of the
// array, clipped to the array's bounds (block.shape() == that clipped shape, block.dtype() ==
// spec.dtype). Returns its bytes, key and digest (ShardWritten). The file is written and
// fsynced; the caller commits.
ShardWritten write_shard(const std::string& dir, const ArraySpec& spec, const std::vector<int64_t>& shard_index,
                         const HostTensor& block);
// The same, the block read in place from `source` at `origin` (e.g. the whole array): no copy
// of the block is made.
ShardWritten write_shard(const std::string& dir, const ArraySpec& spec, const std::vector<int64_t>& shard_index,
                         const HostTensor& source, const std::vector<int64_t>& origin);

// The ArrayStore over these functions (zarr_v3_store() returns one).
class Store final : public ArrayStore {
 public:
  const char* format() const override { return "zarr v3"; }
  void create_array(const std::string& dir, const ArraySpec& spec) const override;
  ShardWritten write_shard(const std::string& dir, const ArraySpec& spec, const std::vector<int64_t>& shard_index,
                           const HostTensor& source, const std::vector<int64_t>& origin) const override;
  using ArrayStore::write_shard;
  std::unique_ptr<StoredArray> open(const std::string& dir) const override;
  // zarr.json with node_type "group" and the attributes.
  void write_group(const std::string& dir, const std::string& attributes_json) const override;
  std::optional<std::string> read_group(const std::string& dir) const override;
  bool has_group(const std::string& dir) const override;
  std::string group_file(const std::string& dir) const override { return dir + "/zarr.json"; }
};

class Array final : public StoredArray {
 public:
  // Opens the array in `dir` (its zarr.json). Throws Error naming the file and what it does not
  // support or cannot parse.
  static Array open(const std::string& dir);

  const std::string& dir() const override { return dir_; }
  const Shape& shape() const override { return shape_; }
  DType dtype() const override { return dtype_; }  // the tessel dtype (bfloat16 for uint16 + tessel_dtype)
  const Shape& chunk_shape() const override { return chunk_shape_; }  // the grid's: one file per shard
  const Shape& inner_chunk_shape() const override { return inner_shape_; }
  // One encoded and one decoded inner chunk (at most; a compressed chunk is smaller) and one
  // shard index.
  int64_t read_buffer_bytes() const override;
  const std::string& attributes_json() const override { return attributes_; }
  // Reads only the inner chunks overlapping the region; a crc32c mismatch names the file and chunk.
  HostTensor read(const std::vector<int64_t>& start, const Shape& shape, ReadStats* stats = nullptr) const override;
  using StoredArray::read_all;
  void require_every_chunk() override { every_chunk_ = true; }
  void expect_shard_digests(std::map<std::string, uint32_t> by_key) override { digests_ = std::move(by_key); }

 private:
  // The shard in `path` (chunk key `key`, open as `f`; its chunks' (offset, bytes) in `where`,
  // crc_of: the crc32c of those already read, -1 for the others, read here) digests to what
  // expect_shard_digests recorded for `key`; else an Error naming the file.
  void check_digest(const std::string& path, const std::string& key, const ReadFile& f,
                    const std::vector<std::pair<uint64_t, uint64_t>>& where, int64_t data_lo, int64_t data_hi,
                    std::vector<int64_t>& crc_of, ReadStats* stats) const;
  bool every_chunk_ = false;  // require_every_chunk: a missing shard or chunk is an error
  std::map<std::string, uint32_t> digests_;  // expect_shard_digests: by the shard's chunk key
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

}  // namespace tessel::zarr
