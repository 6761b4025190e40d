// tessel-bench's main: Google Benchmark, plus link calibration and the training step's dump.
//
//   tessel-bench [benchmark flags]                 the benchmarks (docs/benchmarks.md)
//   tessel-bench --dump-train-step DIR [--config 0|1]   one step's inputs and outputs as .npy
//                                                  (bench_train.cpp; gpt_jax.py train-check)
//   tessel-bench --calibrate-links --mesh data=2,model=4 [--out links.txt]
//                [--large-bytes N] [--small-bytes N] [--iters N] [--stream-mode async|eager]
//
// --calibrate-links measures α and bus bandwidth per mesh axis with the in-process thread
// communicator (one device thread per device of the mesh; calibrate_links in
// tessel/runtime/calibrate.hpp) and writes them in the --links format (docs/links.md) to
// --out (stdout without it), with a table of the raw figures on stderr. Pass the file to
// tessel-explain --links @links.txt. The MPI runtime's figures: tessel-bench-mpi
// --calibrate-links under mpirun (bench/mpi/bench_mpi.cpp).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tessel/cli.hpp"
#include "tessel/runtime/calibrate.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

namespace {

const char* kUsage =
    "usage: tessel-bench --calibrate-links --mesh data=2,model=4 [--out FILE]\n"
    "                    [--large-bytes N] [--small-bytes N] [--iters N] [--stream-mode async|eager]\n"
    "       tessel-bench --dump-train-step DIR [--config 0|1]\n"
    "       tessel-bench [Google Benchmark flags, see --help]\n";

int calibrate(const std::vector<std::string>& args) {
  std::string mesh_spec, out, mode = "async";
  tessel::CalibrationOptions o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw tessel::UsageError(fmt::format("{} needs a value", a));
      return args[++i];
    };
    if (a == "--calibrate-links") continue;
    if (a == "--mesh") mesh_spec = value();
    else if (a == "--out") out = value();
    else if (a == "--large-bytes") o.large_bytes = static_cast<std::size_t>(tessel::cli::parse_i64(a, value(), 8, int64_t{1} << 34));
    else if (a == "--small-bytes") o.small_bytes = static_cast<std::size_t>(tessel::cli::parse_i64(a, value(), 4, int64_t{1} << 30));
    else if (a == "--iters") o.iterations = static_cast<int>(tessel::cli::parse_i64(a, value(), 1, 100000));
    else if (a == "--stream-mode") mode = value();
    else throw tessel::UsageError(fmt::format("unknown option '{}' with --calibrate-links", a));
  }
  if (mesh_spec.empty()) throw tessel::UsageError("--calibrate-links needs --mesh, e.g. --mesh data=2,model=4");
  if (mode != "async" && mode != "eager")
    throw tessel::UsageError(fmt::format("--stream-mode {}: expected async or eager", mode));
  const tessel::Mesh mesh = tessel::Mesh::parse(mesh_spec);
  tessel::ThreadRuntimeOptions ro;
  ro.stream_mode = mode == "async" ? tessel::StreamMode::Async : tessel::StreamMode::Eager;
  tessel::ThreadRuntime rt(mesh.num_devices(), ro);
  const tessel::LinkCalibration cal = tessel::calibrate_links(rt, mesh, o);
  std::fprintf(stderr, "%-10s %6s %14s %14s %14s %14s\n", "axis", "n", "alpha (us)", "t_large (us)",
               "busbw (GB/s)", "bw fit (GB/s)");
  for (const auto& a : cal.axes)
    std::fprintf(stderr, "%-10s %6lld %14.3f %14.1f %14.3f %14.3f\n", a.axis.c_str(),
                 static_cast<long long>(a.group_size), a.link.alpha_s * 1e6, a.large_seconds * 1e6, a.busbw / 1e9,
                 a.link.bandwidth / 1e9);
  const std::string text = cal.to_links_file(fmt::format("{} device threads, {} streams", mesh.num_devices(), mode));
  if (out.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    std::ofstream f(out);
    f << text;
    f.close();
    if (!f) throw tessel::Error(fmt::format("--out {}: cannot write the file", out));
    std::fprintf(stderr, "link figures written to %s (tessel-explain FILE --links @%s)\n", out.c_str(), out.c_str());
  }
  return 0;
}

}  // namespace

int dump_train_step(const std::vector<std::string>& args);  // bench_train.cpp

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  bool calib = false, dump = false;
  for (const auto& a : args) calib = calib || a == "--calibrate-links";
  for (const auto& a : args) dump = dump || a == "--dump-train-step";
  if (calib || dump) {
    try {
      return calib ? calibrate(args) : dump_train_step(args);
    } catch (const tessel::UsageError& e) {
      std::fprintf(stderr, "tessel-bench: error: %s\n%s", e.what(), kUsage);
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tessel-bench: error: %s\n", e.what());
      return 1;
    }
  }
  for (const auto& a : args)
    if (a == "--help" || a == "-h") std::fputs(kUsage, stdout);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
