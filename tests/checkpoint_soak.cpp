// The process that scripts/soak --checkpoint kills with SIGKILL at random moments, and the
// checks that follow each kill:
//   tessel_checkpoint_soak save DIR SEED [async] [devices]
//                                            saves steps latest+1, latest+2, ... forever
//                                            (each step's arrays a pure function of SEED and the
//                                            step; options vary by step, with the default chunk
//                                            checksums), keeping the last 3; `async`: through an
//                                            AsyncCheckpointer, the next step staged while the
//                                            last one is written; `devices`: the arrays are put
//                                            on the devices of a loaded program (the Trainer's
//                                            path) and saved from there. Under mpirun (required
//                                            there: `devices`) every process saves its own
//                                            devices' blocks, collectively; an async save's
//                                            workers meet in a process group of their own.
//   tessel_checkpoint_soak verify DIR SEED   every committed step must read back exactly what
//                                            its save wrote; prints the steps and temporaries
//   tessel_checkpoint_soak corrupt DIR SEED  damages one committed step at random (a flipped
//                                            byte, a zeroed 4 KiB block, a truncated or deleted
//                                            shard, a shard replaced by another step's or
//                                            position's, two array folders swapped) and prints
//                                            which
//   tessel_checkpoint_soak verify DIR SEED refuse=N   as verify, but step N must be refused
//                                            (an Error naming what is wrong), never returned
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <fstream>
#include <vector>
#include <string>

#include "tessel/checkpoint/checkpoint.hpp"
#include "tessel/executable.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/runtime/launch.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/make_runtime.hpp"
#include "tessel/runtime/process_group.hpp"

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

// Saves from the devices of a loaded program (every input one of the arrays, in its layout),
// on this process's runtime: threads alone, an MpiRuntime under mpirun.
[[noreturn]] void save_from_devices(CheckpointDir& ck, uint64_t seed, bool async) {
  const Mesh mesh = Mesh::parse("data=2,model=2");
  Graph g;
  for (const auto& [name, t] : arrays_of(seed, 0)) {
    Tensor in = input(g, name, t.dtype(), t.shape());
    const auto s = kShardings.find(name);
    if (s != kShardings.end()) g.annotate(in, s->second);
    if (name == "w") g.mark_output(neg(in));
  }
  g.mesh = mesh;
  const Executable exe = compile(g, mesh);
  const auto rt = make_cpu_runtime(RuntimeRequest("cpu", mesh));
  const LoadedExecutable prog = load(exe, *rt);
  std::shared_ptr<ProcessGroup> group;  // the async workers' own group (several processes only)
  if (launched_by_mpi() && detect_launch().world_size > 1) group = mpi_process_group();
  const bool commits = !launched_by_mpi() || detect_launch().rank == 0;
  std::optional<AsyncCheckpointer> ac;
  if (async) ac.emplace(ck);
  for (int64_t step = ck.latest().value_or(0) + 1;; ++step) {
    std::map<std::string, ShardedArray> arrays;
    for (const auto& [name, t] : arrays_of(seed, step)) arrays.emplace(name, prog.to_device(name, t));
    SaveOptions o;
    o.inner_chunk_bytes = 16 << 10;
    o.zstd = step % 2 == 0;
    if (async) ac->save(step, arrays, prog, o, group);
    else ck.save(step, arrays, prog, o);
    if (commits) ck.keep_last(3);  // the committing process (rank 0) holds the writer lock
    std::printf("saved %lld\n", static_cast<long long>(step));
    std::fflush(stdout);
  }
}

std::string fmt_at(const char* what, int64_t at, const std::string& file) {
  return std::string(what) + " " + std::to_string(at) + " of " + file;
}

}  // namespace

// Damages one committed step of `ck` at random; returns the step and prints what was done.
int64_t corrupt(CheckpointDir& ck, uint64_t seed) {
  namespace fs = std::filesystem;
  const std::vector<int64_t> steps = ck.steps();
  if (steps.empty()) return -1;
  std::mt19937_64 rng(seed);
  const int64_t step = steps[rng() % steps.size()];
  std::vector<std::string> shards;
  for (const auto& e : fs::recursive_directory_iterator(ck.step_path(step)))
    if (e.is_regular_file() && e.path().filename() != "zarr.json") shards.push_back(e.path().string());
  std::sort(shards.begin(), shards.end());
  if (shards.empty()) return -1;
  const std::string f = shards[rng() % shards.size()];
  const int64_t size = static_cast<int64_t>(fs::file_size(f));
  const int kind = static_cast<int>(rng() % 6);
  std::string what;
  if (kind == 0 || kind == 1) {  // a flipped byte, or a zeroed block of up to 4 KiB
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    const int64_t at = static_cast<int64_t>(rng() % static_cast<uint64_t>(std::max<int64_t>(1, size)));
    const int64_t n = kind == 0 ? 1 : std::min<int64_t>(4096, size - at);
    std::vector<char> buf(static_cast<std::size_t>(n));
    io.seekg(at);
    io.read(buf.data(), n);
    bool changed = false;
    for (char& c : buf) {
      const char was = c;
      c = kind == 0 ? static_cast<char>(c ^ (1 << (rng() % 8))) : 0;
      changed = changed || c != was;
    }
    if (!changed) buf[0] = static_cast<char>(buf[0] ^ 1);  // zeros over zeros: damage it anyway
    io.seekp(at);
    io.write(buf.data(), n);
    what = kind == 0 ? fmt_at("flipped a bit of byte", at, f) : fmt_at("zeroed 4 KiB from byte", at, f);
  } else if (kind == 2) {
    fs::resize_file(f, static_cast<uintmax_t>(size / 2));
    what = "truncated " + f + " to half";
  } else if (kind == 3) {
    fs::remove(f);
    what = "deleted " + f;
  } else if (kind == 5) {  // the shard replaced by a file of its size: its own in another step, or another of the step
    const std::string rel = fs::relative(f, ck.step_path(step)).string();
    std::vector<std::string> others;
    for (int64_t s2 : steps)
      if (s2 != step && fs::exists(ck.step_path(s2) + "/" + rel)) others.push_back(ck.step_path(s2) + "/" + rel);
    for (const std::string& g : shards)
      if (g != f && fs::path(g).parent_path().parent_path() == fs::path(f).parent_path().parent_path() &&
          fs::file_size(g) == static_cast<uintmax_t>(size))
        others.push_back(g);
    if (others.empty()) {  // nothing alike to copy: delete it instead
      fs::remove(f);
      what = "deleted " + f;
    } else {
      const std::string from = others[rng() % others.size()];
      fs::copy_file(from, f, fs::copy_options::overwrite_existing);
      what = "replaced " + f + " by a copy of " + from;
    }
  } else {  // two array folders of the step swapped
    const Manifest m = ck.manifest(step);
    const std::string a = ck.step_path(step) + "/" + m.arrays[0].folder, b = ck.step_path(step) + "/" + m.arrays[1].folder;
    fs::rename(a, a + ".swap");
    fs::rename(b, a);
    fs::rename(a + ".swap", b);
    what = "swapped the folders " + a + " and " + b;
  }
  std::printf("corrupted step %lld: %s\n", static_cast<long long>(step), what.c_str());
  return step;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  bool async = false, devices = false, ok_flags = true;
  for (int i = 4; mode == "save" && i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "async" && !async) async = true;
    else if (f == "devices" && !devices) devices = true;
    else ok_flags = false;
  }
  const bool ok_args = (mode == "save" && argc >= 4 && argc <= 6 && ok_flags) ||
                       (mode == "verify" && (argc == 4 || (argc == 5 && std::string(argv[4]).rfind("refuse=", 0) == 0))) ||
                       (mode == "corrupt" && argc == 4);
  if (!ok_args) {
    std::fprintf(stderr, "usage: tessel_checkpoint_soak save DIR SEED [async] [devices] | verify DIR SEED [refuse=STEP] | "
                         "corrupt DIR SEED\n");
    return 2;
  }
  const std::string dir = argv[2];
  const uint64_t seed = std::stoull(argv[3]);
  try {
    CheckpointDir ck(dir);
    if (mode == "save" && (devices || launched_by_mpi())) {
      if (!devices) throw Error("tessel_checkpoint_soak save: under mpirun every process saves its devices' blocks: "
                                "add `devices`");
      save_from_devices(ck, seed, async);
    }
    if (mode == "save") {
      const Mesh mesh = Mesh::parse("data=2,model=2");
      std::optional<AsyncCheckpointer> ac;
      if (async) ac.emplace(ck);
      for (int64_t step = ck.latest().value_or(0) + 1;; ++step) {
        SaveOptions o;  // the default chunk checksums: every damage is detectable
        o.inner_chunk_bytes = 16 << 10;
        o.zstd = step % 2 == 0;
        if (async) {
          ac->save(step, arrays_of(seed, step), mesh, kShardings, o);  // returns once handed over
        } else {
          ck.save(step, arrays_of(seed, step), mesh, kShardings, o);
        }
        ck.keep_last(3);
        std::printf("saved %lld\n", static_cast<long long>(step));
        std::fflush(stdout);
      }
    }
    if (mode == "corrupt") return corrupt(ck, seed) < 0 ? 1 : 0;
    const int64_t refuse = argc == 5 ? std::stoll(std::string(argv[4]).substr(7)) : -1;
    int64_t temporaries = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      temporaries += e.path().filename().string().find(".tmp-") != std::string::npos ||
                     e.path().filename().string().find(".del-") != std::string::npos;
    const std::vector<int64_t> steps = ck.steps();
    bool refused = false;
    for (int64_t step : steps) {
      const auto want = arrays_of(seed, step);
      std::map<std::string, HostTensor> got;
      try {
        got = ck.read_all(step);
      } catch (const Error& e) {
        if (step != refuse) throw;
        std::printf("refused step %lld: %s\n", static_cast<long long>(step), e.what());
        refused = true;
        continue;
      }
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
    if (refuse >= 0 && !refused) {
      std::fprintf(stderr, "step %lld was damaged but read back without an error\n", static_cast<long long>(refuse));
      return 1;
    }
    std::printf("verified %zu committed step(s)%s%s; %lld hidden folder%s of killed saves and deletions\n",
                steps.size() - (refused ? 1 : 0),
                steps.empty() ? "" : ", latest ", steps.empty() ? "" : std::to_string(steps.back()).c_str(),
                static_cast<long long>(temporaries), temporaries == 1 ? "" : "s");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessel_checkpoint_soak %s: %s\n", mode.c_str(), e.what());
    return 1;
  }
}
