// tessel-bench-mpi: bus bandwidth of the MPI runtime's collectives against memcpy.
//
//   mpirun -np 2 build/bin/tessel-bench-mpi [--max-mib 64] [--iters N]
//   mpirun -np 2 build/bin/tessel-bench-mpi --calibrate-links --mesh data=2,model=2 [--out FILE]
//
// --calibrate-links: α and bus bandwidth per mesh axis of the MPI runtime (calibrate_links,
// tessel/runtime/calibrate.hpp), written by rank 0 in the --links format (docs/links.md) to
// --out (stdout without it).
//
// One device per process on a mesh x=<np>; each collective is enqueued on the device's
// communication stream (as the executor does) and timed over N calls after a warm-up.
// busbw as nccl-tests defines it: all_reduce algbw·2(n-1)/n, all_gather and reduce_scatter
// algbw·(n-1)/n, with algbw = bytes of the full buffer / time. memcpy: one thread copying
// the same number of bytes (rank 0), the ceiling of a shared-memory transport. Rank 0 prints.
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tessel/cli.hpp"
#include "tessel/runtime/calibrate.hpp"
#include "tessel/runtime/mpi/mpi_runtime.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

using namespace tessel;

namespace {

const char* kUsage =
    "usage: mpirun -np N tessel-bench-mpi [--max-mib 64] [--iters N]\n"
    "       mpirun -np N tessel-bench-mpi --calibrate-links [--mesh data=2,model=2] [--iters N] [--out FILE]\n"
    "Bus bandwidth of the MPI runtime's all_reduce, all_gather and reduce_scatter against memcpy (one\n"
    "device per process); --calibrate-links measures alpha and bus bandwidth per mesh axis and writes\n"
    "them in the --links format (docs/links.md) to FILE, or stdout.\n";

}  // namespace

int main(int argc, char** argv) {
  int max_mib = 64, iters = 0;
  bool calibrate = false;
  std::string mesh_spec, out;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&] { return tessel::cli::next_value(i, argc, argv); };
      if (tessel::cli::is_help(a)) {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (a == "--calibrate-links") calibrate = true;
      else if (a == "--max-mib") max_mib = static_cast<int>(tessel::cli::parse_i64(a, next(), 1, 1 << 16));
      else if (a == "--iters") iters = static_cast<int>(tessel::cli::parse_i64(a, next(), 1, 1 << 30));
      else if (a == "--mesh") mesh_spec = next();
      else if (a == "--out") out = next();
      else throw tessel::UsageError(fmt::format("unknown option '{}'", a));
    }
  } catch (const tessel::UsageError& e) {
    std::fprintf(stderr, "tessel-bench-mpi: error: %s\n%s", e.what(), kUsage);
    return 2;
  }
  try {
    MpiRuntime rt;
    if (calibrate) {
      const Mesh mesh = Mesh::parse(mesh_spec.empty() ? fmt::format("x={}", rt.world_size()) : mesh_spec);
      CalibrationOptions o;
      if (iters > 0) o.iterations = iters;
      const LinkCalibration cal = calibrate_links(rt, mesh, o);
      if (rt.rank() == 0) {
        const std::string text = cal.to_links_file(fmt::format("{} MPI processes", rt.world_size()));
        if (out.empty()) {
          std::fputs(text.c_str(), stdout);
        } else {
          std::ofstream f(out);
          f << text;
          if (!f) throw Error(fmt::format("--out {}: cannot write the file", out));
        }
      }
      return 0;
    }
    const int n = rt.world_size();
    Mesh mesh = Mesh::parse(fmt::format("x={}", n));
    auto mine = rt.devices_for(mesh);
    auto world = rt.make_world(mesh, {{"x"}}, 0);
    auto comm = world->communicator(mine[0], {"x"});
    DeviceThreads& lr = rt.local();
    Backend& be = lr.backend(0);
    Stream& s = lr.comm_stream(0);
    if (rt.rank() == 0)
      fmt::print("{:<15} {:>10} {:>8} {:>12} {:>12} {:>14}\n", "collective", "bytes", "iters", "time (us)",
                 "busbw (GB/s)", "memcpy (GB/s)");
    for (std::size_t bytes = 64 << 10; bytes <= (static_cast<std::size_t>(max_mib) << 20); bytes *= 4) {
      const std::size_t count = bytes / 4;
      auto a = be.allocate(bytes), b = be.allocate(bytes);
      std::vector<char> host(bytes, 1);
      be.copy_from_host(*a, host.data(), bytes, s);
      be.copy_from_host(*b, host.data(), bytes, s);
      s.synchronize();
      const int it = iters > 0 ? iters : static_cast<int>(std::max<std::size_t>(3, (256u << 20) / bytes));
      // memcpy baseline on rank 0 (the others wait at the barrier).
      double memcpy_gbs = 0;
      if (rt.rank() == 0) {
        std::vector<char> x(bytes, 1), y(bytes);
        std::memcpy(y.data(), x.data(), bytes);
        auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < it; ++k) {
          std::memcpy(y.data(), x.data(), bytes);
          x[k % bytes] = y[(k * 7) % bytes];
        }
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / it;
        memcpy_gbs = static_cast<double>(bytes) / sec / 1e9;
      }
      MPI_Barrier(MPI_COMM_WORLD);
      struct Case {
        const char* name;
        double factor;
      };
      for (const Case c : {Case{"all_reduce", 2.0 * (n - 1) / n}, Case{"all_gather", 1.0 * (n - 1) / n},
                           Case{"reduce_scatter", 1.0 * (n - 1) / n}}) {
        auto one = [&] {
          if (c.name[4] == 'r') comm->all_reduce(a->data(), b->data(), count, DType::f32, ReduceOp::Sum, s);
          else if (c.name[4] == 'g') comm->all_gather(a->data(), b->data(), bytes / static_cast<std::size_t>(n), s);
          else comm->reduce_scatter(a->data(), b->data(), count / static_cast<std::size_t>(n), DType::f32, ReduceOp::Sum, s);
        };
        one();
        s.synchronize();
        MPI_Barrier(MPI_COMM_WORLD);
        auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < it; ++k) one();
        s.synchronize();
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / it;
        const double busbw = static_cast<double>(bytes) / sec / 1e9 * c.factor;
        if (rt.rank() == 0)
          fmt::print("{:<15} {:>10} {:>8} {:>12.1f} {:>12.2f} {:>14.2f}\n", c.name, bytes, it, sec * 1e6, busbw,
                     memcpy_gbs);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessel-bench-mpi: error: %s\n", e.what());
    return 1;
  }
}
