// Checkpoint bandwidth (issue 23 item 10), on the disk of TESSEL_BENCH_DIR (default: the
// system's temporary folder), for a state of <MiB> MiB (four f32 arrays laid out on
// data=2,model=2, 1 MiB inner chunks):
//   BM_CheckpointSave/<MiB>      CheckpointDir::save: every file written and fsynced, committed
//   BM_DdFsync/<MiB>             `dd bs=4M conv=fsync` of the same bytes (from a file), same disk
//   BM_CheckpointRestore/<MiB>   read_all of the saved step (the page cache is dropped first
//                                when the process may: label "cold", else "page cache warm")
//   BM_CheckpointAsyncBlocking/<MiB>  the part of an AsyncCheckpointer::save that blocks the
//                                caller, beside a plain copy of the same host arrays (copy_s)
//   BM_CheckpointRestoreToDevice/<pair>  one 256 MiB array saved on data=2,model=2 restored
//                                with restore_to_device onto 4 meshes and layouts (label)
// Counters: bytes_per_second (GB/s = 1e9 bytes), and for the blocking case its ratio to the copy.
#include <unistd.h>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "tessel/checkpoint/checkpoint.hpp"
#include "tessel/executable.hpp"
#include "tessel/ir/graph_text.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

namespace {

namespace fs = std::filesystem;

std::string bench_dir(const std::string& what) {
  const char* env = std::getenv("TESSEL_BENCH_DIR");
  const fs::path base = env && *env ? fs::path(env) : fs::temp_directory_path();
  const fs::path p = base / fmt::format("tessel-bench-{}-{}", what, ::getpid());
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::map<std::string, tessel::HostTensor> state_of(int64_t mib) {
  std::map<std::string, tessel::HostTensor> s;
  const int64_t per = mib * (1 << 20) / 4 / 4;  // four f32 arrays
  const int64_t cols = 1024, rows = per / cols;
  std::mt19937 rng(1);
  for (const char* name : {"w1", "w2", "adam.m.w1", "adam.v.w1"}) {
    tessel::HostTensor t(tessel::DType::f32, {rows, cols});
    auto* p = t.as<uint32_t>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng();  // random bits: nothing compresses
    s.emplace(name, std::move(t));
  }
  return s;
}

std::map<std::string, tessel::Sharding> shardings_of(const std::map<std::string, tessel::HostTensor>& s) {
  std::map<std::string, tessel::Sharding> out;
  for (const auto& [name, t] : s) out[name] = tessel::Sharding::of({{"data"}, {"model"}});
  return out;
}

bool drop_page_cache() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  return static_cast<bool>(f.flush());
}

const tessel::Mesh& mesh() {
  static const tessel::Mesh m = tessel::Mesh::parse("data=2,model=2");
  return m;
}

// Arg 0: MiB of state; arg 1: chunk checksums (1, the default) or not (0): the cost of integrity.
void BM_CheckpointSave(benchmark::State& state) {
  const int64_t mib = state.range(0);
  const auto s = state_of(mib);
  const auto sh = shardings_of(s);
  const std::string dir = bench_dir("save");
  tessel::CheckpointDir ck(dir);
  tessel::SaveOptions o;
  o.chunk_checksums = state.range(1) != 0;
  int64_t step = 0;
  for (auto _ : state) {
    ck.save(++step, s, mesh(), sh, o);
    state.PauseTiming();
    ck.keep_last(1);
    state.ResumeTiming();
  }
  state.SetBytesProcessed(state.iterations() * mib * (1 << 20));
  fs::remove_all(dir);
}
BENCHMARK(BM_CheckpointSave)->ArgsProduct({{1024, 8192}, {1, 0}})->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_DdFsync(benchmark::State& state) {
  const int64_t mib = state.range(0);
  const std::string dir = bench_dir("dd");
  {  // the state's own bytes as dd's source (random: a disk that skips zeros gains nothing)
    std::ofstream src(dir + "/src.bin", std::ios::binary);
    for (const auto& [name, t] : state_of(mib)) src.write(static_cast<const char*>(t.data()), static_cast<std::streamsize>(t.bytes()));
  }
  const std::string cmd = fmt::format("dd if={0}/src.bin of={0}/dd.bin bs=4M conv=fsync status=none", dir);
  for (auto _ : state) {
    state.PauseTiming();
    std::filesystem::remove(dir + "/dd.bin");
    state.ResumeTiming();
    if (std::system(cmd.c_str()) != 0) state.SkipWithError(("failed: " + cmd).c_str());
  }
  state.SetBytesProcessed(state.iterations() * mib * (1 << 20));
  fs::remove_all(dir);
}
BENCHMARK(BM_DdFsync)->Arg(1024)->Arg(8192)->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CheckpointRestore(benchmark::State& state) {
  const int64_t mib = state.range(0);
  const std::string dir = bench_dir("restore");
  tessel::CheckpointDir ck(dir);
  {
    const auto s = state_of(mib);
    ck.save(1, s, mesh(), shardings_of(s));
  }
  bool cold = true;
  for (auto _ : state) {
    state.PauseTiming();
    cold = drop_page_cache() && cold;
    state.ResumeTiming();
    tessel::ReadStats st;
    auto back = ck.read_all(1, &st);
    benchmark::DoNotOptimize(back);
    state.counters["read_amplification"] = static_cast<double>(st.bytes_read) / static_cast<double>(st.bytes_needed);
  }
  state.SetBytesProcessed(state.iterations() * mib * (1 << 20));
  state.SetLabel(cold ? "cold (page cache dropped)" : "page cache warm (cannot drop it here)");
  fs::remove_all(dir);
}
BENCHMARK(BM_CheckpointRestore)->Arg(1024)->Arg(8192)->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CheckpointAsyncBlocking(benchmark::State& state) {
  const int64_t mib = state.range(0);
  const auto s = state_of(mib);
  const std::string dir = bench_dir("async");
  tessel::AsyncCheckpointer ac{tessel::CheckpointDir(dir)};
  int64_t step = 0;
  double blocking = 0, copy = 0;
  for (auto _ : state) {
    // The copy a caller makes anyway (device -> host, here host -> host), then the save call.
    const auto t0 = std::chrono::steady_clock::now();
    std::map<std::string, tessel::HostTensor> staged = s;
    const auto t1 = std::chrono::steady_clock::now();
    ac.save(++step, std::move(staged), mesh(), shardings_of(s));
    copy += std::chrono::duration<double>(t1 - t0).count();
    blocking += ac.last_blocking_seconds();
    state.PauseTiming();
    ac.wait();  // the next iteration measures a call that does not wait for this save
    ac.dir().keep_last(1);
    state.ResumeTiming();
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["copy_s"] = copy / n;
  state.counters["blocking_s"] = blocking / n;
  state.counters["copy_plus_blocking_over_copy"] = (copy + blocking) / copy;
  fs::remove_all(dir);
}
BENCHMARK(BM_CheckpointAsyncBlocking)->Arg(1024)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

namespace {

// Restoring one array saved on data=2,model=2 ([{data}, {model}], 256 MiB of f32) onto another
// mesh and layout with restore_to_device (each device's block read from its inner chunks):
// 0 the same mesh and layout, 1 data=4 rows, 2 model=8 columns, 3 one device (replicated);
// second argument: the host budget in MiB (RestoreOptions::host_budget_bytes; 32 is the
// default), with the most host memory the restore held (host_peak_MiB).
void BM_CheckpointRestoreToDevice(benchmark::State& state) {
  static const char* kTargets[][2] = {{"data=2,model=2", "[{data}, {model}]"},
                                      {"data=4", "[{data}, {}]"},
                                      {"model=8", "[{}, {model}]"},
                                      {"x=1", "[{}, {}]"}};
  const auto& [mesh_text, layout] = kTargets[state.range(0)];
  const int64_t rows = 8192, cols = 8192;
  const std::string dir = bench_dir("to-device");
  tessel::CheckpointDir ck(dir);
  {
    tessel::HostTensor w(tessel::DType::f32, {rows, cols});
    auto* p = w.as<uint32_t>();
    std::mt19937 rng(2);
    for (int64_t i = 0; i < w.numel(); ++i) p[i] = rng();
    ck.save(1, {{"w", w}}, mesh(), {{"w", tessel::Sharding::of({{"data"}, {"model"}})}});
  }
  tessel::Graph g = tessel::parse_graph(fmt::format("mesh {}\n%w = input f32[{},{}] sharding={}\n%y = neg(%w)\noutput %y\n",
                                                    mesh_text, rows, cols, layout),
                                        "restore.tsl");
  tessel::Executable exe = tessel::compile(g, *g.mesh);
  tessel::ThreadRuntime rt(g.mesh->num_devices());
  tessel::LoadedExecutable le = tessel::load(exe, rt);
  bool cold = true;
  double amplification = 0;
  int64_t peak = 0;
  for (auto _ : state) {
    state.PauseTiming();
    cold = drop_page_cache() && cold;
    state.ResumeTiming();
    tessel::ReadStats st;
    tessel::RestoreOptions ro;
    ro.host_budget_bytes = state.range(1) << 20;
    tessel::ShardedArray a = ck.restore_to_device(1, "w", le, "w", &st, ro);
    benchmark::DoNotOptimize(a);
    amplification = static_cast<double>(st.bytes_read) / static_cast<double>(rows * cols * 4);
    peak = st.host_peak_bytes;
  }
  state.SetBytesProcessed(state.iterations() * rows * cols * 4);
  state.counters["bytes_read_over_array"] = amplification;
  state.counters["host_peak_MiB"] = static_cast<double>(peak) / (1 << 20);
  state.SetLabel(fmt::format("saved on data=2,model=2 [{{data}}, {{model}}] -> {} {}{}", mesh_text, layout,
                             cold ? "" : " (page cache warm)"));
  fs::remove_all(dir);
}
BENCHMARK(BM_CheckpointRestoreToDevice)->ArgsProduct({{0, 1, 2, 3}, {256, 64, 32, 16}})->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
