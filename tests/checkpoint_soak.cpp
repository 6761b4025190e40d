// The process that scripts/soak --checkpoint kills with SIGKILL at random moments, and the
// check that follows each kill:
//   tessel_checkpoint_soak save DIR SEED     saves steps latest+1, latest+2, ... forever (each
//                                            step's arrays a pure function of SEED and the
//                                            step; options vary by step), keeping the last 3
//   tessel_checkpoint_soak verify DIR SEED   every committed step must read back exactly what
//                                            its save wrote; prints the steps and temporaries
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "tessel/checkpoint/checkpoint.hpp"

using namespace tessel;

namespace {

std::map<std::string, HostTensor> arrays_of(uint64_t seed, int64_t step) {
  std::mt19937_64 rng(seed ^ (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull));
  std::normal_distribution<double> n(0, 1);
  auto rnd = [&](DType t, Shape s) {
    HostTensor h(t, std::move(s));
    for (int64_t i = 0; i < h.numel(); ++i) h.set(i, t == DType::i32 ? std::round(n(rng) * 1e5) : n(rng));
    return h;
  };
  return {{"w", rnd(DType::f32, {256, 384})},   {"adam.m.w", rnd(DType::f32, {256, 384})},
          {"emb", rnd(DType::bf16, {500, 64})}, {"ids", rnd(DType::i32, {1000})},
          {"step", rnd(DType::i32, {})}};
}

const std::map<std::string, Sharding> kShardings = {{"w", Sharding::of({{"data"}, {"model"}})},
                                                    {"adam.m.w", Sharding::of({{"data"}, {"model"}})},
                                                    {"emb", Sharding::of({{"model"}, {}})}};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::string(argv[1]) != "save" && std::string(argv[1]) != "verify")) {
    std::fprintf(stderr, "usage: tessel_checkpoint_soak save|verify DIR SEED\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  const uint64_t seed = std::stoull(argv[3]);
  try {
    CheckpointDir ck(dir);
    if (mode == "save") {
      const Mesh mesh = Mesh::parse("data=2,model=2");
      for (int64_t step = ck.latest().value_or(0) + 1;; ++step) {
        SaveOptions o;
        o.inner_chunk_bytes = 16 << 10;
        o.zstd = step % 2 == 0;
        o.chunk_checksums = step % 3 == 0;
        ck.save(step, arrays_of(seed, step), mesh, kShardings, o);
        ck.keep_last(3);
        std::printf("saved %lld\n", static_cast<long long>(step));
        std::fflush(stdout);
      }
    }
    int64_t temporaries = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      temporaries += e.path().filename().string().find(".tmp-") != std::string::npos ||
                     e.path().filename().string().find(".del-") != std::string::npos;
    const std::vector<int64_t> steps = ck.steps();
    for (int64_t step : steps) {
      const auto want = arrays_of(seed, step);
      const auto got = ck.read_all(step);
      if (got.size() != want.size()) {
        std::fprintf(stderr, "step %lld: %zu arrays, saved %zu\n", static_cast<long long>(step), got.size(), want.size());
        return 1;
      }
      for (const auto& [name, t] : want) {
        const HostTensor& g = got.at(name);
        if (g.shape() != t.shape() || std::memcmp(g.data(), t.data(), t.bytes()) != 0) {
          std::fprintf(stderr, "step %lld: array %s differs from what was saved\n", static_cast<long long>(step),
                       name.c_str());
          return 1;
        }
      }
    }
    std::printf("verified %zu committed step(s)%s%s; %lld hidden folder%s of killed saves and deletions\n", steps.size(),
                steps.empty() ? "" : ", latest ", steps.empty() ? "" : std::to_string(steps.back()).c_str(),
                static_cast<long long>(temporaries), temporaries == 1 ? "" : "s");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessel_checkpoint_soak %s: %s\n", mode.c_str(), e.what());
    return 1;
  }
}
