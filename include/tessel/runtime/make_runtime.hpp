// tessel/runtime/make_runtime.hpp — one factory above the backends: the runtime a program runs
// on, from a backend name and the launch environment, so no tool, example or library part
// writes the choice again (src/runtime/factory/, the one place that knows every backend).
//
//   auto rt = tessel::make_runtime({.backend = "cpu", .mesh = mesh});     // threads or mpirun
//   tessel::LoadedExecutable prog = tessel::load(exe, *rt);
//
// backend "cpu": under mpirun an MpiRuntime (this process owns a block of the mesh's devices,
// docs/runtime-mpi.md); under a RANK/WORLD_SIZE launcher without MPI an error saying to use
// mpirun; otherwise a ThreadRuntime with every device of the mesh a thread of this process.
// "threads" and "mpi" ask for one of those whatever the environment. "cuda": make_cuda_runtime
// (runtime/cuda/cuda.hpp: alone, or one NCCL world over the launcher's processes); without
// CUDA or a GPU, the CUDA runtime's clear error. Anything else is an Error naming the
// backends.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/mesh.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel {

struct RuntimeRequest {
  RuntimeRequest() = default;
  RuntimeRequest(std::string backend_, Mesh mesh_, int kernel_threads_ = 1, double timeout_s_ = -1, int max_gpus_ = 0)
      : backend(std::move(backend_)), mesh(std::move(mesh_)), kernel_threads(kernel_threads_), timeout_s(timeout_s_),
        max_gpus(max_gpus_) {}

  std::string backend = "cpu";  // "cpu" (threads, or mpi under mpirun), "threads", "mpi", "cuda"
  Mesh mesh;                    // the program's mesh: how many devices
  int kernel_threads = 1;       // threads each CPU device's kernels may use
  // CPU: a collective waiting longer for its peers fails (MpiRuntimeOptions::timeout_s; < 0:
  // the MPI runtime's default). Threads: unused (LoadOptions::collective_timeout_s).
  double timeout_s = -1;
  int max_gpus = 0;             // CUDA: make_cuda_runtime's max_gpus (0: every visible GPU)
  // MPI: the MPI_COMM_WORLD ranks of this runtime (empty: all) and the tag of concurrent
  // sub-group runtimes (MpiRuntimeOptions::ranks, group_tag).
  // CUDA with mpi_ranks: one GPU per process, NCCL over those ranks' processes (the planner's
  // pool): a CudaRuntime of one device on GPU `cuda_device` (-1: this process's local rank).
  std::vector<int> mpi_ranks;
  int mpi_group_tag = 0;
  int cuda_device = -1;
};

// Every backend. Defined with the CUDA backend when it is built (link tessel::cuda, as the
// examples do), in tessel otherwise (where "cuda" is the CUDA stub's clear error).
std::unique_ptr<Runtime> make_runtime(const RuntimeRequest& request);

// The CPU backends only ("cpu", "threads", "mpi"; "cuda" is an Error saying to call
// make_runtime): what the library's own parts use (the planner's pool), in tessel.
std::unique_ptr<Runtime> make_cpu_runtime(const RuntimeRequest& request);

// The backend names make_runtime takes, for help texts and errors.
const std::vector<std::string>& runtime_backends();

}  // namespace tessel
