// tessel/runtime/cuda.hpp — the CUDA backend and its communicators (target tessel::cuda, built
// with TESSEL_WITH_CUDA). No CUDA, cuBLASLt or NCCL header here: everything CUDA hides behind
// the Backend / Communicator / CollectiveWorld interfaces (docs/backend-cuda.md).
//
//   int n = tessel::cuda_device_count();                // 0 without a GPU or driver: skip
//   auto be = tessel::make_cuda_backend({.device = 0});  // one (virtual) device on GPU 0
//
// A CudaBackend is one *device* of a mesh: its own streams (cudaStream_t), events, memory from
// the GPU's stream-ordered pool, pinned staging for host transfers, and the kernels of
// kernels/ (einsums through cuBLASLt). Several backends on the same GPU are *virtual devices*:
// with make_cuda_virtual_world they run any mesh on one GPU, the collectives being
// device-to-device copies and reduction kernels ordered by events.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/mesh.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/runtime.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

class Executable;

// GPUs visible to this process; 0 when there is none or no usable driver (never throws).
int cuda_device_count();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)"; throws RuntimeError for a bad ordinal.
std::string cuda_device_name(int device);

struct CudaBackendOptions {
  int device = 0;           // CUDA ordinal of the GPU this (virtual) device lives on
  bool allow_tf32 = false;  // f32 einsums may use TF32 tensor cores (10-bit mantissa products)
  // cuBLASLt workspace per stream (bytes): a larger one lets the heuristics pick split-K.
  std::size_t gemm_workspace_bytes = std::size_t{32} << 20;
};

// One device of a mesh on GPU options.device. Throws RuntimeError naming the device when
// there is no such GPU.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});

struct CudaWorldOptions {
  // > 0: a member waiting longer than this for its peers (in seconds) aborts the world.
  double timeout_seconds = 0;
};

// The collectives of `mesh` among virtual devices of one process (any number per GPU, any
// GPUs): member buffers are exchanged by pointer at a host rendezvous, then every member
// pulls (device-to-device copies, or a reduction kernel over all members' buffers) on its own
// stream after waiting for the others' "ready" events; a second event exchange keeps each
// member's buffers untouched until every peer has read them. The streams passed to the
// communicators must be streams of CUDA backends.
std::unique_ptr<CollectiveWorld> make_cuda_virtual_world(const Mesh& mesh, const CudaWorldOptions& options = {});

// NCCL (built with TESSEL_WITH_NCCL): one world communicator over the mesh's devices of this
// process (ncclCommInitAll over `gpus`, one per position), then one ncclCommSplit per axis
// group at communicator(). Several positions on one GPU need NCCL >= 2.30 with
// NCCL_MULTI_RANK_GPU_ENABLE=1. Throws RuntimeError when NCCL is not built in.
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh& mesh, const std::vector<int>& gpus,
                                                 const CudaWorldOptions& options = {});
bool nccl_available();

// How run_on_cuda runs a compiled program.
struct CudaRunOptions {
  bool poison = true;           // NaN / INT32_MIN in every buffer the run allocates, first
  bool check_replicas = true;   // replicas of an output must agree bit for bit
  bool use_nccl = false;        // collectives over NCCL instead of the virtual-device world
  double collective_timeout_s = 120;
  CudaBackendOptions backend;   // its device is the first GPU used
  int num_gpus = 1;             // devices are spread round-robin over GPUs device..device+num_gpus-1
  LoadOptions load;             // lowering options
};

// Compiles nothing: lowers exe's program (lower_program), makes one CUDA backend per mesh
// device (virtual devices, round-robin over num_gpus GPUs), a host thread per device, the
// collective world, copies the global inputs' shards to the devices, runs the program once and
// returns the gathered global outputs. The executors are the CPU runtime's (DeviceExecutor),
// so exactly the program the CPU runs runs here. Throws RuntimeError naming the device and
// instruction that failed.
std::vector<HostTensor> run_on_cuda(const Executable& exe, const std::vector<HostTensor>& inputs,
                                    const CudaRunOptions& options = {});

}  // namespace tessel
