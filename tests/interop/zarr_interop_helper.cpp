// The tessel side of the zarr interoperability test (tests/interop/zarr_interop.py):
//   tessel_zarr_interop write DIR SEED   a checkpoint in DIR (steps 1-4: plain, zstd, chunk
//                                        crc32c, bf16 as uint16) of seeded random arrays of
//                                        every dtype, and DIR/expected.json naming each
//                                        array's raw little-endian bytes (DIR/expected/*.bin)
//   tessel_zarr_interop read ARRAY OUT   reads the zarr v3 array folder ARRAY (any writer)
//                                        with tessel and writes its raw bytes to OUT; prints
//                                        "dtype shape"
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "tessel/checkpoint/checkpoint.hpp"

using namespace tessel;

namespace {

void write_bytes(const std::string& path, const HostTensor& t) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.bytes()));
  if (!f) throw Error("cannot write " + path);
}

int write_checkpoint(const std::string& dir, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0, 2);
  auto rnd = [&](DType t, Shape s) {
    HostTensor h(t, std::move(s));
    for (int64_t i = 0; i < h.numel(); ++i) h.set(i, t == DType::i32 ? std::round(n(rng) * 1e4) : n(rng));
    return h;
  };
  const Mesh mesh = Mesh::parse("data=2,model=2");
  // Uneven extents (the edge shards are partial), a scalar, every dtype.
  const std::map<std::string, HostTensor> arrays = {
      {"w", rnd(DType::f32, {37, 20})},          {"adam.m.w", rnd(DType::f32, {37, 20})},
      {"emb", rnd(DType::bf16, {50, 16})},        {"half", rnd(DType::f16, {7, 9, 5})},
      {"ids", rnd(DType::i32, {33})},             {"scalar", rnd(DType::f32, {})},
  };
  const std::map<std::string, Sharding> sh = {{"w", Sharding::of({{"data"}, {"model"}})},
                                              {"adam.m.w", Sharding::of({{"data"}, {"model"}})},
                                              {"emb", Sharding::of({{"model"}, {}})},
                                              {"ids", Sharding::of({{"data"}})}};
  CheckpointDir ck(dir);
  nlohmann::json expected = nlohmann::json::array();
  std::filesystem::create_directories(dir + "/expected");
  for (int step = 1; step <= 4; ++step) {
    SaveOptions o;
    o.inner_chunk_bytes = 96;  // several inner chunks per shard
    o.zstd = step == 2;
    o.chunk_checksums = step == 3;
    o.bf16_as_uint16 = step == 4;
    ck.save(step, arrays, mesh, sh, o);
    const Manifest m = ck.manifest(step);
    for (const CheckpointArray& a : m.arrays) {
      const std::string bin = dir + "/expected/" + std::to_string(step) + "_" + a.folder + ".bin";
      write_bytes(bin, arrays.at(a.name));
      expected.push_back({{"step", step},
                          {"name", a.name},
                          {"path", ck.step_path(step) + "/" + a.folder},
                          {"dtype", dtype_name(a.dtype)},
                          {"shape", a.shape},
                          {"bin", bin},
                          {"bf16_as_uint16", o.bf16_as_uint16}});
    }
  }
  std::ofstream(dir + "/expected.json") << expected.dump(2) << "\n";
  std::printf("wrote steps 1-4 (%zu arrays each) in %s\n", arrays.size(), dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "write" && argc == 4) return write_checkpoint(argv[2], std::stoull(argv[3]));
    if (cmd == "read" && argc == 4) {
      const std::unique_ptr<StoredArray> held = zarr_v3_store().open(argv[2]);
      const StoredArray& a = *held;
      write_bytes(argv[3], a.read_all());
      std::printf("%s %s\n", dtype_name(a.dtype()), shape_str(a.shape()).c_str());
      return 0;
    }
    std::fprintf(stderr, "usage: tessel_zarr_interop write DIR SEED | read ARRAY_DIR OUT.bin\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessel_zarr_interop: %s\n", e.what());
    return 1;
  }
}
