// zarr v3 arrays: see zarr.hpp.
#include "zarr.hpp"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "box.hpp"
#include "file_io.hpp"

namespace tessel {

uint32_t crc32c(const void* data, std::size_t n, uint32_t crc) {
  // ISA-L's crc32_iscsi keeps the register un-inverted: the standard CRC-32C is its complement.
  uint32_t reg = ~crc;
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const int part = static_cast<int>(std::min<std::size_t>(n, 1u << 30));
    reg = crc32_iscsi(const_cast<unsigned char*>(p), part, reg);
    p += part;
    n -= static_cast<std::size_t>(part);
  }
  return ~reg;
}

namespace zarr {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();

const char* stored_type_name(DType t, bool bf16_as_uint16) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return bf16_as_uint16 ? "uint16" : "bfloat16";
    case DType::i32: return "int32";
    default: break;
  }
  throw Error(fmt::format("zarr: dtype {} has no zarr data type here (f32, f16, bf16 or i32)", dtype_name(t)));
}

int64_t product(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

json bytes_codec() { return {{"name", "bytes"}, {"configuration", {{"endian", "little"}}}}; }

std::string chunk_key(const std::vector<int64_t>& idx, const std::string& encoding, char sep) {
  std::string k = encoding == "v2" ? "" : "c";
  if (idx.empty()) return encoding == "v2" ? "0" : "c";
  for (std::size_t d = 0; d < idx.size(); ++d) {
    if (d > 0 || encoding != "v2") k += sep;
    k += std::to_string(idx[d]);
  }
  return k;
}

std::vector<int64_t> unravel(int64_t flat, const Shape& grid) {
  std::vector<int64_t> idx(grid.size(), 0);
  for (std::size_t d = grid.size(); d-- > 0;) {
    idx[d] = flat % grid[d];
    flat /= grid[d];
  }
  return idx;
}

void put_u64(std::string& s, uint64_t v) {
  for (int b = 0; b < 8; ++b) s.push_back(static_cast<char>((v >> (8 * b)) & 0xff));
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int b = 7; b >= 0; --b) v = (v << 8) | p[b];
  return v;
}
uint32_t get_u32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
void put_u32(std::string& s, uint32_t v) {
  for (int b = 0; b < 4; ++b) s.push_back(static_cast<char>((v >> (8 * b)) & 0xff));
}

void check_spec(const std::string& dir, const ArraySpec& spec, Shape& shard, Shape& inner) {
  shard = spec.shard_shape.empty() ? spec.shape : spec.shard_shape;
  inner = spec.inner_shape.empty() ? shard : spec.inner_shape;
  if (shard.size() != spec.shape.size() || inner.size() != spec.shape.size())
    throw Error(fmt::format("zarr array {}: shape {}, shard {} and inner chunk {} need one rank", dir,
                            shape_str(spec.shape), shape_str(shard), shape_str(inner)));
  for (std::size_t d = 0; d < shard.size(); ++d) {
    if (spec.shape[d] < 0 || shard[d] < 1 || inner[d] < 1 || shard[d] % inner[d] != 0)
      throw Error(fmt::format("zarr array {}: dim {}: shard extent {} must be >= 1 and divided by the inner chunk "
                              "extent {} (array extent {})",
                              dir, d, shard[d], inner[d], spec.shape[d]));
  }
}

}  // namespace
}  // namespace zarr

Shape choose_inner_shape(const Shape& shard, std::size_t elem_bytes, int64_t target_bytes) {
  Shape c = shard;
  auto bytes = [&] { return zarr::product(c) * static_cast<int64_t>(elem_bytes); };
  while (bytes() > target_bytes) {
    std::size_t best = c.size();
    for (std::size_t d = 0; d < c.size(); ++d)
      if (c[d] > 1 && (best == c.size() || c[d] > c[best])) best = d;
    if (best == c.size()) break;
    int64_t p = 2;
    while (p * p <= c[best] && c[best] % p != 0) ++p;
    if (c[best] % p != 0) p = c[best];  // prime: the whole extent
    c[best] /= p;
  }
  return c;
}

namespace zarr {

void create_array(const std::string& dir, const ArraySpec& spec) {
  Shape shard, inner;
  check_spec(dir, spec, shard, inner);
  json attrs;
  try {
    attrs = json::parse(spec.attributes_json);
  } catch (const json::exception& e) {
    throw Error(fmt::format("zarr array {}: attributes are not JSON: {}", dir, e.what()));
  }
  if (!attrs.is_object()) throw Error(fmt::format("zarr array {}: attributes must be a JSON object", dir));
  if (spec.dtype == DType::bf16 && spec.bf16_as_uint16) attrs["tessel_dtype"] = "bfloat16";
  json codecs = json::array({bytes_codec()});
  if (spec.zstd) codecs.push_back({{"name", "zstd"}, {"configuration", {{"level", spec.zstd_level}, {"checksum", false}}}});
  if (spec.chunk_crc32c) codecs.push_back({{"name", "crc32c"}});
  json meta = {
      {"zarr_format", 3},
      {"node_type", "array"},
      {"shape", spec.shape},
      {"data_type", stored_type_name(spec.dtype, spec.bf16_as_uint16)},
      {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", shard}}}}},
      {"chunk_key_encoding", {{"name", "default"}, {"configuration", {{"separator", "/"}}}}},
      {"codecs",
       json::array({{{"name", "sharding_indexed"},
                     {"configuration",
                      {{"chunk_shape", inner},
                       {"codecs", codecs},
                       {"index_codecs", json::array({bytes_codec(), {{"name", "crc32c"}}})},
                       {"index_location", "end"}}}}})},
      {"attributes", attrs},
  };
  meta["fill_value"] = spec.dtype == DType::i32 ? json(0) : json(0.0);
  std::error_code ec;
  if (fs::exists(dir, ec)) throw Error(fmt::format("zarr array {}: already exists", dir));
  if (!fs::create_directory(dir, ec))
    throw Error(fmt::format("zarr array {}: cannot create the folder: {}", dir, ec.message()));
  write_file_synced(dir + "/zarr.json", meta.dump(2) + "\n");
}

ShardWritten write_shard(const std::string& dir, const ArraySpec& spec, const std::vector<int64_t>& shard_index,
                         const HostTensor& block) {
  return write_shard(dir, spec, shard_index, block, std::vector<int64_t>(block.shape().size(), 0));
}

ShardWritten write_shard(const std::string& dir, const ArraySpec& spec, const std::vector<int64_t>& shard_index,
                         const HostTensor& source, const std::vector<int64_t>& origin) {
  Shape shard, inner;
  check_spec(dir, spec, shard, inner);
  const std::size_t r = spec.shape.size();
  if (shard_index.size() != r)
    throw Error(fmt::format("zarr array {}: shard index of rank {} for an array of rank {}", dir, shard_index.size(), r));
  Shape clipped(r);
  for (std::size_t d = 0; d < r; ++d) {
    const int64_t origin = shard_index[d] * shard[d];
    if (shard_index[d] < 0 || origin >= std::max<int64_t>(spec.shape[d], 1))
      throw Error(fmt::format("zarr array {}: shard {} is outside the grid", dir, shape_str(shard_index)));
    clipped[d] = std::min(shard[d], spec.shape[d] - origin);
  }
  bool fits = source.dtype() == spec.dtype && source.shape().size() == r && origin.size() == r;
  for (std::size_t d = 0; fits && d < r; ++d)
    fits = origin[d] >= 0 && origin[d] + clipped[d] <= source.shape()[d];
  if (!fits)
    throw Error(fmt::format("zarr array {}: shard {} needs a {} block of {}, got {} of {} at {}", dir,
                            shape_str(shard_index), dtype_name(spec.dtype), shape_str(clipped),
                            dtype_name(source.dtype()), shape_str(source.shape()), shape_str(origin)));
  const std::size_t elem = dtype_size(spec.dtype);
  Shape grid(r);
  for (std::size_t d = 0; d < r; ++d) grid[d] = shard[d] / inner[d];
  const int64_t nchunks = product(grid);
  const std::string key = chunk_key(shard_index, "default", '/');
  const std::string path = dir + "/" + key;
  fs::create_directories(fs::path(path).parent_path());
  SyncedFile out(path);
  std::string index;
  std::string crcs;  // the stored chunks' crc32c values, in index order: the shard's digest
  uint64_t offset = 0;
  std::vector<char> chunk(static_cast<std::size_t>(product(inner)) * elem);
  std::vector<char> packed;
  for (int64_t c = 0; c < nchunks; ++c) {
    const std::vector<int64_t> ci = unravel(c, grid);
    Shape box(r);
    std::vector<int64_t> at(r), zero(r, 0);
    bool inside = true;
    for (std::size_t d = 0; d < r; ++d) {
      at[d] = ci[d] * inner[d];
      box[d] = std::min(inner[d], clipped[d] - at[d]);
      inside = inside && box[d] > 0;
      at[d] += origin[d];  // in the source
    }
    if (!inside) {  // wholly outside the array: not stored
      put_u64(index, kEmpty);
      put_u64(index, kEmpty);
      continue;
    }
    bool partial = false;
    for (std::size_t d = 0; d < r; ++d) partial = partial || box[d] != inner[d];
    // A whole chunk written as is: straight from the source's rows (writev), no copy of ours,
    // when its rows are long enough and few enough.
    if (!partial && !spec.zstd && r > 0) {
      std::size_t k = r - 1;
      int64_t run = box[k];
      while (k > 0 && box[k] == source.shape()[k]) run *= box[--k];
      const int64_t runs = product(box) / run;
      if (runs <= 4096 && run * static_cast<int64_t>(elem) >= 1024) {
        const auto st = contiguous_strides(source.shape());
        std::vector<std::pair<const char*, std::size_t>> pieces;
        pieces.reserve(static_cast<std::size_t>(runs));
        const std::size_t run_bytes = static_cast<std::size_t>(run) * elem;
        uint32_t crc = 0;
        for (int64_t q = 0; q < runs; ++q) {
          // Row q: its coordinates in dims < k (row-major over box), then dim k's start.
          int64_t off = 0, left = q;
          for (std::size_t d = k; d-- > 0;) {
            off += (at[d] + left % box[d]) * st[d];
            left /= box[d];
          }
          for (std::size_t d = k; d < r; ++d) off += at[d] * st[d];
          const char* p = static_cast<const char*>(source.data()) + off * static_cast<int64_t>(elem);
          pieces.emplace_back(p, run_bytes);
          if (spec.chunk_crc32c) crc = crc32c(p, run_bytes, crc);
        }
        out.write_pieces(pieces);
        uint64_t stored = static_cast<uint64_t>(runs) * run_bytes;
        if (spec.chunk_crc32c) {
          std::string c4;
          put_u32(c4, crc);
          out.write(c4.data(), c4.size());
          crcs += c4;
          stored += 4;
        }
        put_u64(index, offset);
        put_u64(index, stored);
        offset += stored;
        continue;
      }
    }
    if (partial) std::fill(chunk.begin(), chunk.end(), 0);  // the fill value 0 beyond the array's edge
    copy_box(static_cast<const char*>(source.data()), source.shape(), at, chunk.data(), inner, zero, box, elem);
    const char* bytes = chunk.data();
    std::size_t n = chunk.size();
    if (spec.zstd) {
      packed.resize(ZSTD_compressBound(n) + 4);
      const std::size_t z = ZSTD_compress(packed.data(), packed.size(), bytes, n, spec.zstd_level);
      if (ZSTD_isError(z)) throw Error(fmt::format("zarr array {}: zstd: {}", dir, ZSTD_getErrorName(z)));
      packed.resize(z);
      bytes = packed.data();
      n = z;
    }
    out.write(bytes, n);
    uint64_t stored = n;
    if (spec.chunk_crc32c) {
      std::string crc;
      put_u32(crc, crc32c(bytes, n));
      out.write(crc.data(), crc.size());
      crcs += crc;
      stored += 4;
    }
    put_u64(index, offset);
    put_u64(index, stored);
    offset += stored;
  }
  put_u32(index, crc32c(index.data(), index.size()));
  out.write(index.data(), index.size());
  out.commit();
  ShardWritten w;
  w.bytes = static_cast<int64_t>(offset + index.size());
  w.key = key;
  if (spec.chunk_crc32c) w.digest = crc32c(crcs.data(), crcs.size());
  return w;
}

// ---- reading ------------------------------------------------------------------------------------

namespace {

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  throw Error(fmt::format("zarr: {}: {}", file, what));
}

std::vector<std::string> inner_codecs(const json& codecs, const std::string& file) {
  if (!codecs.is_array() || codecs.empty()) bad(file, "codecs must be a non-empty list");
  std::vector<std::string> out;
  for (std::size_t i = 0; i < codecs.size(); ++i) {
    const std::string name = codecs[i].value("name", "");
    if (i == 0) {
      if (name != "bytes") bad(file, fmt::format("codec '{}' first: only 'bytes' (little-endian) is read here", name));
      const json cfg = codecs[i].value("configuration", json::object());
      if (cfg.value("endian", "little") != "little") bad(file, "big-endian arrays are not read here");
      continue;
    }
    if (name != "zstd" && name != "crc32c")
      bad(file, fmt::format("codec '{}' after 'bytes': only zstd and crc32c are read here", name));
    out.push_back(name);
  }
  return out;
}

Shape shape_of(const json& j, const std::string& file, const char* what) {
  if (!j.is_array()) bad(file, fmt::format("'{}' must be a list of integers", what));
  Shape s;
  for (const json& v : j) {
    if (!v.is_number_integer()) bad(file, fmt::format("'{}' must be a list of integers", what));
    s.push_back(v.get<int64_t>());
  }
  return s;
}

double parse_fill(const json& f, const std::string& file) {
  if (f.is_null()) return 0;
  if (f.is_number()) return f.get<double>();
  if (f.is_string()) {
    const std::string s = f.get<std::string>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  bad(file, "fill_value " + f.dump() + " is not read here (a number, NaN or +-Infinity)");
}

}  // namespace

Array Array::open(const std::string& dir) {
  const std::string file = dir + "/zarr.json";
  std::string text;
  if (!read_file(file, text)) throw Error(fmt::format("zarr: {}: cannot read it (is {} a zarr v3 array?)", file, dir));
  json m;
  try {
    m = json::parse(text);
  } catch (const json::exception& e) {
    bad(file, std::string("not JSON: ") + e.what());
  }
  if (m.value("zarr_format", 0) != 3) bad(file, "zarr_format must be 3");
  if (m.value("node_type", "") != "array") bad(file, "node_type must be 'array'");
  Array a;
  a.dir_ = dir;
  a.shape_ = shape_of(m["shape"], file, "shape");
  a.stored_type_ = m.value("data_type", "");
  const json attrs = m.value("attributes", json::object());
  a.attributes_ = attrs.dump();
  if (a.stored_type_ == "float32") a.dtype_ = DType::f32;
  else if (a.stored_type_ == "float16") a.dtype_ = DType::f16;
  else if (a.stored_type_ == "bfloat16") a.dtype_ = DType::bf16;
  else if (a.stored_type_ == "int32") a.dtype_ = DType::i32;
  else if (a.stored_type_ == "uint16" && attrs.value("tessel_dtype", "") == "bfloat16") a.dtype_ = DType::bf16;
  else bad(file, fmt::format("data_type '{}' is not read here (float32, float16, bfloat16, int32; uint16 with "
                             "attribute tessel_dtype=bfloat16)", a.stored_type_));
  const json grid = m.value("chunk_grid", json::object());
  if (grid.value("name", "") != "regular") bad(file, "chunk_grid must be 'regular'");
  a.chunk_shape_ = shape_of(grid["configuration"]["chunk_shape"], file, "chunk_shape");
  if (a.chunk_shape_.size() != a.shape_.size()) bad(file, "chunk_shape and shape differ in rank");
  const json kenc = m.value("chunk_key_encoding", json::object());
  a.key_encoding_ = kenc.value("name", "default");
  if (a.key_encoding_ != "default" && a.key_encoding_ != "v2") bad(file, "chunk_key_encoding must be default or v2");
  const std::string sep = kenc.value("configuration", json::object()).value("separator", a.key_encoding_ == "v2" ? "." : "/");
  if (sep != "/" && sep != ".") bad(file, "the chunk key separator must be '/' or '.'");
  a.separator_ = sep[0];
  a.fill_ = parse_fill(m.value("fill_value", json()), file);
  const json codecs = m.value("codecs", json::array());
  if (codecs.is_array() && codecs.size() == 1 && codecs[0].value("name", "") == "sharding_indexed") {
    const json cfg = codecs[0].value("configuration", json::object());
    a.sharded_ = true;
    a.inner_shape_ = shape_of(cfg["chunk_shape"], file, "sharding chunk_shape");
    if (a.inner_shape_.size() != a.shape_.size()) bad(file, "the inner chunk_shape and shape differ in rank");
    for (std::size_t d = 0; d < a.inner_shape_.size(); ++d)
      if (a.inner_shape_[d] < 1 || a.chunk_shape_[d] % a.inner_shape_[d] != 0)
        bad(file, "the inner chunk_shape must divide the shard's chunk_shape");
    a.chunk_codecs_ = inner_codecs(cfg.value("codecs", json::array()), file);
    const std::vector<std::string> ic = inner_codecs(cfg.value("index_codecs", json::array()), file);
    if (ic.size() > 1 || (ic.size() == 1 && ic[0] != "crc32c")) bad(file, "index_codecs must be bytes [+ crc32c]");
    a.index_crc_ = ic.size() == 1;
    const std::string loc = cfg.value("index_location", "end");
    if (loc != "end" && loc != "start") bad(file, "index_location must be start or end");
    a.index_at_end_ = loc == "end";
  } else {
    a.chunk_codecs_ = inner_codecs(codecs, file);
    a.inner_shape_ = a.chunk_shape_;
  }
  return a;
}


int64_t Array::read_buffer_bytes() const {
  const int64_t chunk = product(inner_shape_) * static_cast<int64_t>(dtype_size(dtype_));
  int64_t ninner = 1;
  for (std::size_t d = 0; d < chunk_shape_.size(); ++d) ninner *= chunk_shape_[d] / inner_shape_[d];
  return 2 * chunk + (sharded_ ? ninner * 16 + 4 : 0);
}

HostTensor Array::read(const std::vector<int64_t>& start, const Shape& shape, ReadStats* stats) const {
  const std::size_t r = shape_.size();
  if (start.size() != r || shape.size() != r)
    throw Error(fmt::format("zarr array {}: region of rank {} in an array of rank {}", dir_, shape.size(), r));
  for (std::size_t d = 0; d < r; ++d)
    if (start[d] < 0 || shape[d] < 0 || start[d] + shape[d] > shape_[d])
      throw Error(fmt::format("zarr array {}: region at {} of {} is outside the array {}", dir_, shape_str(start),
                              shape_str(shape), shape_str(shape_)));
  HostTensor out(dtype_, shape);  // zero-filled: a fill value of 0 needs nothing more
  const std::size_t elem = dtype_size(dtype_);
  if (fill_ != 0 || std::signbit(fill_)) {
    HostTensor one(dtype_, {1});
    one.set(0, fill_);
    char* p = static_cast<char*>(out.data());
    for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(p + static_cast<std::size_t>(i) * elem, one.data(), elem);
  }
  if (stats) stats->bytes_needed += out.numel() * static_cast<int64_t>(elem);
  if (out.numel() == 0) return out;
  // Grid cells (shards or plain chunks) overlapping the region.
  Shape lo(r), cells(r);
  for (std::size_t d = 0; d < r; ++d) {
    lo[d] = start[d] / chunk_shape_[d];
    cells[d] = (start[d] + shape[d] - 1) / chunk_shape_[d] - lo[d] + 1;
  }
  Shape inner_grid(r);
  for (std::size_t d = 0; d < r; ++d) inner_grid[d] = chunk_shape_[d] / inner_shape_[d];
  const int64_t ninner = product(inner_grid);
  const std::size_t chunk_bytes = static_cast<std::size_t>(product(inner_shape_)) * elem;
  std::vector<char> raw, decoded(chunk_bytes);
  for (int64_t c = 0; c < product(cells); ++c) {
    std::vector<int64_t> cell = unravel(c, cells);
    for (std::size_t d = 0; d < r; ++d) cell[d] += lo[d];
    const std::string key = chunk_key(cell, key_encoding_, separator_);
    const std::string path = dir_ + "/" + key;
    ReadFile f;
    if (!f.open(path)) {
      if (every_chunk_)  // a tessel checkpoint writes every shard: this one was lost
        bad(path, "missing: its writer stores every shard of this array, so the data there was lost (the file was "
                  "deleted, or the step was copied without it); restore from another step");
      continue;  // a missing shard or chunk: the fill value
    }
    const int64_t fsize = f.size();
    // (offset, nbytes) of each inner chunk of this cell.
    std::vector<std::pair<uint64_t, uint64_t>> where(static_cast<std::size_t>(ninner));
    int64_t data_lo = 0, data_hi = fsize;
    if (sharded_) {
      const int64_t ib = ninner * 16 + (index_crc_ ? 4 : 0);
      if (fsize < ib) bad(path, fmt::format("truncated: {} bytes, the shard index alone is {}", fsize, ib));
      std::vector<unsigned char> idx(static_cast<std::size_t>(ib));
      const int64_t at = index_at_end_ ? fsize - ib : 0;
      f.read_at(at, idx.data(), idx.size(), path);
      if (stats) stats->bytes_read += ib;
      if (index_crc_) {
        const uint32_t want = get_u32(idx.data() + ninner * 16), got = crc32c(idx.data(), static_cast<std::size_t>(ninner) * 16);
        if (want != got)
          bad(path, fmt::format("the shard index fails its crc32c check (stored {:08x}, computed {:08x}): the file is "
                                "corrupted; nothing of this shard is loaded",
                                want, got));
      }
      for (int64_t k = 0; k < ninner; ++k)
        where[static_cast<std::size_t>(k)] = {get_u64(idx.data() + 16 * k), get_u64(idx.data() + 16 * k + 8)};
      if (index_at_end_) data_hi = at;
      else data_lo = ib;
    } else {
      where[0] = {0, static_cast<uint64_t>(fsize)};
    }
    // The shard's digest (expect_shard_digests): every stored chunk's crc32c, from the chunks
    // read below and, for the others, their last 4 bytes.
    const bool digest = !digests_.empty();
    const bool outer_crc = !chunk_codecs_.empty() && chunk_codecs_.back() == "crc32c";
    if (digest && !outer_crc)
      bad(path, "the step's manifest records shard digests, but this array's chunks have no crc32c to check them by");
    std::vector<int64_t> crc_of(digest ? static_cast<std::size_t>(ninner) : 0, -1);
    for (int64_t k = 0; k < ninner; ++k) {
      const std::vector<int64_t> ki = unravel(k, inner_grid);
      // The inner chunk's global origin and its overlap with the region.
      std::vector<int64_t> origin(r), src_at(r), dst_at(r);
      Shape box(r);
      bool overlap = true;
      for (std::size_t d = 0; d < r; ++d) {
        origin[d] = cell[d] * chunk_shape_[d] + ki[d] * inner_shape_[d];
        const int64_t a = std::max(origin[d], start[d]);
        const int64_t b = std::min(origin[d] + inner_shape_[d], start[d] + shape[d]);
        box[d] = b - a;
        overlap = overlap && box[d] > 0;
        src_at[d] = a - origin[d];
        dst_at[d] = a - start[d];
      }
      if (!overlap) continue;
      const auto [off, n] = where[static_cast<std::size_t>(k)];
      if (off == kEmpty && n == kEmpty) {
        if (every_chunk_)
          bad(fmt::format("{} inner chunk {}", path, shape_str(ki)),
              "marked not stored, but its writer stores every chunk inside the array: the shard's index was altered");
        continue;  // not stored: the fill value
      }
      const std::string chunk_name = fmt::format("{} inner chunk {}", path, shape_str(ki));
      if (static_cast<int64_t>(off) < data_lo || n > static_cast<uint64_t>(data_hi) ||
          static_cast<int64_t>(off) > data_hi - static_cast<int64_t>(n))
        bad(chunk_name, fmt::format("its index entry (offset {}, {} bytes) points outside the file's data [{}, {})",
                                    off, n, data_lo, data_hi));
      raw.resize(static_cast<std::size_t>(n));
      f.read_at(static_cast<int64_t>(off), raw.data(), raw.size(), path);
      if (stats) {
        stats->bytes_read += static_cast<int64_t>(n);
        ++stats->chunks_read;
      }
      if (digest && n >= 4) crc_of[static_cast<std::size_t>(k)] = get_u32(reinterpret_cast<const unsigned char*>(raw.data()) + n - 4);
      std::size_t len = raw.size();
      const char* bytes = raw.data();
      for (auto it = chunk_codecs_.rbegin(); it != chunk_codecs_.rend(); ++it) {
        if (*it == "crc32c") {
          if (len < 4) bad(chunk_name, "shorter than its crc32c");
          const uint32_t want = get_u32(reinterpret_cast<const unsigned char*>(bytes) + len - 4);
          const uint32_t got = crc32c(bytes, len - 4);
          if (want != got)
            bad(chunk_name, fmt::format("fails its crc32c check (stored {:08x}, computed {:08x}): corrupted, not loaded",
                                        want, got));
          len -= 4;
        } else {  // zstd
          const std::size_t z = ZSTD_decompress(decoded.data(), decoded.size(), bytes, len);
          if (ZSTD_isError(z) || z != chunk_bytes)
            bad(chunk_name, fmt::format("zstd: {} (expected {} bytes): corrupted, not loaded",
                                        ZSTD_isError(z) ? ZSTD_getErrorName(z) : std::to_string(z) + " bytes",
                                        chunk_bytes));
          bytes = decoded.data();
          len = z;
        }
      }
      if (len != chunk_bytes)
        bad(chunk_name, fmt::format("{} bytes where the chunk has {}: corrupted or another layout", len, chunk_bytes));
      copy_box(bytes, inner_shape_, src_at, static_cast<char*>(out.data()), shape, dst_at, box, elem);
    }
    if (digest) check_digest(path, key, f, where, data_lo, data_hi, crc_of, stats);
  }
  return out;
}

void Array::check_digest(const std::string& path, const std::string& key, const ReadFile& f,
                         const std::vector<std::pair<uint64_t, uint64_t>>& where, int64_t data_lo, int64_t data_hi,
                         std::vector<int64_t>& crc_of, ReadStats* stats) const {
  const auto want = digests_.find(key);
  if (want == digests_.end())
    bad(path, "the step's manifest records no digest for this shard: it was not written by this step's save "
              "(copied in from elsewhere?); restore from another step");
  std::string crcs;
  for (std::size_t k = 0; k < where.size(); ++k) {
    const auto [off, n] = where[k];
    if (off == kEmpty && n == kEmpty) continue;
    if (crc_of[k] < 0) {
      if (n < 4 || static_cast<int64_t>(off) < data_lo || n > static_cast<uint64_t>(data_hi) ||
          static_cast<int64_t>(off) > data_hi - static_cast<int64_t>(n))
        bad(path, fmt::format("inner chunk {}: its index entry (offset {}, {} bytes) points outside the file's data "
                              "[{}, {})", k, off, n, data_lo, data_hi));
      unsigned char c4[4];
      f.read_at(static_cast<int64_t>(off + n - 4), c4, 4, path);
      if (stats) stats->bytes_read += 4;
      crc_of[k] = get_u32(c4);
    }
    put_u32(crcs, static_cast<uint32_t>(crc_of[k]));
  }
  const uint32_t got = crc32c(crcs.data(), crcs.size());
  if (got != want->second)
    bad(path, fmt::format("its chunks digest to {:08x}, the step's manifest records {:08x} for this shard: the file "
                          "holds another shard's data (copied from another step or position); restore from another "
                          "step",
                          got, want->second));
}


void Store::create_array(const std::string& dir, const ArraySpec& spec) const { zarr::create_array(dir, spec); }

ShardWritten Store::write_shard(const std::string& dir, const ArraySpec& spec, const std::vector<int64_t>& shard_index,
                           const HostTensor& source, const std::vector<int64_t>& origin) const {
  return zarr::write_shard(dir, spec, shard_index, source, origin);
}

std::unique_ptr<StoredArray> Store::open(const std::string& dir) const {
  return std::make_unique<Array>(Array::open(dir));
}

void Store::write_group(const std::string& dir, const std::string& attributes_json) const {
  json attrs;
  try {
    attrs = json::parse(attributes_json);
  } catch (const json::exception& e) {
    throw Error(fmt::format("zarr group {}: attributes are not JSON: {}", dir, e.what()));
  }
  const json group = {{"zarr_format", 3}, {"node_type", "group"}, {"attributes", attrs}};
  write_file_synced(dir + "/zarr.json", group.dump(2) + "\n");
}

std::optional<std::string> Store::read_group(const std::string& dir) const {
  const std::string file = dir + "/zarr.json";
  std::string text;
  if (!read_file(file, text)) return std::nullopt;
  json g;
  try {
    g = json::parse(text);
  } catch (const json::exception& e) {
    bad(file, std::string("not JSON: ") + e.what());
  }
  if (!g.is_object() || g.value("zarr_format", 0) != 3 || g.value("node_type", "") != "group")
    bad(file, "not a zarr v3 group (zarr_format 3, node_type 'group')");
  return g.value("attributes", json::object()).dump();
}

bool Store::has_group(const std::string& dir) const { return fs::exists(fs::path(dir) / "zarr.json"); }

}  // namespace zarr

const ArrayStore& zarr_v3_store() {
  static const zarr::Store store;
  return store;
}

}  // namespace tessel
