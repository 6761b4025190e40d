// make_cpu_runtime (runtime/make_runtime.hpp): the CPU runtimes — threads of this process, or
// an MpiRuntime under mpirun — chosen from the request and the launch environment, the one
// place that makes that choice.
#include <fmt/format.h>

#include "tessel/core/common.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/launch.hpp"
#include "tessel/runtime/make_runtime.hpp"
#include "tessel/runtime/mpi/mpi_runtime.hpp"

namespace tessel {
namespace {

std::unique_ptr<Runtime> threads_runtime(const RuntimeRequest& r) {
  ThreadRuntimeOptions o;
  o.kernel_threads = r.kernel_threads;
  return std::make_unique<ThreadRuntime>(r.mesh.num_devices(), o);
}

std::unique_ptr<Runtime> mpi_runtime(const RuntimeRequest& r) {
  MpiRuntimeOptions o;
  o.kernel_threads = r.kernel_threads;
  o.timeout_s = r.timeout_s;
  o.ranks = r.mpi_ranks;
  o.group_tag = r.mpi_group_tag;
  return std::make_unique<MpiRuntime>(o);
}

}  // namespace

const std::vector<std::string>& runtime_backends() {
  static const std::vector<std::string> names = {"cpu", "threads", "mpi", "cuda"};
  return names;
}

std::unique_ptr<Runtime> make_cpu_runtime(const RuntimeRequest& r) {
  if (r.kernel_threads < 1)
    throw Error(fmt::format("make_runtime: kernel_threads must be >= 1, got {}", r.kernel_threads));
  if (r.backend == "threads") return threads_runtime(r);
  if (r.backend == "mpi") return mpi_runtime(r);
  if (r.backend == "cpu") {
    if (launched_by_mpi()) return mpi_runtime(r);
    const LaunchInfo li = detect_launch();
    if (li.multi_process())
      throw RuntimeError(fmt::format(
          "RANK={} WORLD_SIZE={}: a launcher started this process as one of {} without MPI, but the CPU runtime "
          "runs across processes only under MPI; launch with `mpirun -np {} ...` (docs/runtime-mpi.md), or unset "
          "RANK and WORLD_SIZE to run every device as a thread of one process (--backend cuda uses RANK/WORLD_SIZE "
          "with TESSEL_RENDEZVOUS_DIR to bootstrap NCCL)",
          li.rank, li.world_size, li.world_size, li.world_size));
    return threads_runtime(r);
  }
  if (r.backend == "cuda")
    throw Error("make_cpu_runtime: backend 'cuda' is not a CPU backend; call make_runtime (runtime/make_runtime.hpp)");
  throw Error(fmt::format("make_runtime: unknown backend '{}' (one of {})", r.backend, join(runtime_backends(), ", ")));
}

}  // namespace tessel
