// tessel/runtime/cuda/cuda.hpp — the CUDA backend and its communicators (target tessel::cuda, built
// with TESSEL_WITH_CUDA). No CUDA, cuBLASLt or NCCL header here: everything CUDA hides behind
// the Backend / Communicator / CollectiveWorld interfaces (docs/backend-cuda.md).
//
//   int n = tessel::cuda_device_count();                // 0 without a GPU or driver: skip
//   auto be = tessel::make_cuda_backend({.device = 0});  // one (virtual) device on GPU 0
//   tessel::CudaRuntime rt(8);                            // load(exe, rt): 8 devices on GPU 0
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

#include "tessel/core/mesh.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/process_group.hpp"
#include "tessel/runtime/runtime.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {


// GPUs visible to this process; 0 when there is none or no usable driver (never throws).
int cuda_device_count();
// Why cuda_device_count() is 0: the CUDA error's name and text ("cudaErrorNoDevice: no
// CUDA-capable device is detected"), or that tessel was built without CUDA; "" when a GPU is visible.
std::string cuda_unavailable_reason();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)"; throws RuntimeError for a bad ordinal.
std::string cuda_device_name(int device);

struct CudaBackendOptions {
  int device = 0;           // CUDA ordinal of the GPU this (virtual) device lives on
  bool allow_tf32 = false;  // f32 einsums may use TF32 tensor cores (10-bit mantissa products)
  // cuBLASLt workspace per stream (bytes): a larger one lets the heuristics pick split-K.
  std::size_t gemm_workspace_bytes = std::size_t{32} << 20;
  // A product of at least this many FLOPs whose rows are not a multiple of 16 bytes (GPT-2's
  // vocabulary of 50257) runs on copies with padded rows: cuBLASLt's fast Hopper kernels need
  // 16-byte leading dimensions (on an H200 the 8192x768x50257 bf16 product took 50 ms with the
  // odd rows, the whole GPT-2 forward's time). 0 pads every product with such rows.
  double gemm_pad_min_flops = 1 << 27;
  // fused_elementwise / fused_softmax / fused_einsum epilogues: each distinct expression is
  // compiled once per process into a straight-line kernel (NVRTC); false, or the environment
  // variable TESSEL_CUDA_FUSED_JIT=0, runs them on the interpreter kernel (src/runtime/cuda/kernels/fused.cu).
  // Both give the same bits; on an H200 the GPT-2 124M forward took 17.3 ms with the JIT and
  // 32.4 ms without.
  bool fused_jit = true;
  // > 0: a debugging aid for ordering bugs between streams and devices. Before every kernel
  // and collective, with probability 1/2, a one-thread kernel spins for a random 0 to this many
  // microseconds on the stream it is enqueued on, so that work on other streams runs ahead and
  // a missing wait shows as a wrong or changing result. Also set by the environment variable
  // TESSEL_CUDA_DEBUG_DELAY_US (scripts/gpu-check phase 2 runs the stress test with it).
  int debug_delay_us = 0;
};

// One device of a mesh on GPU options.device. Throws RuntimeError naming the device when
// there is no such GPU.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});

struct CudaWorldOptions {
  // > 0: a member waiting longer than this for its peers (in seconds) aborts the world.
  double timeout_seconds = 0;
  // A multi-process NCCL world: the processes' abort channel (ProcessGroup::post_abort /
  // poll_abort). An abort here is posted to the other processes, and the watchdog aborts this
  // process's communicators when another one posts. Null: each process aborts alone.
  std::shared_ptr<ProcessGroup> processes;
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

// An NCCL world over the devices of several processes (one process per GPU, or several GPUs
// per process): this process's devices are the mesh positions `positions`, on GPUs `gpus`
// (one per position), and every process passes the same `unique_id` (nccl_unique_id() made
// on one process and shared, e.g. by ProcessGroup::allgather). Each local position joins
// with ncclCommInitRank(rank = position, nranks = mesh.num_devices()). Collective over the
// processes. Throws RuntimeError when NCCL is not built in.
std::unique_ptr<CollectiveWorld> make_nccl_world(const Mesh& mesh, const std::vector<int64_t>& positions,
                                                 const std::vector<int>& gpus, const std::string& unique_id,
                                                 const CudaWorldOptions& options = {});
// A fresh ncclUniqueId as bytes. Throws RuntimeError when NCCL is not built in.
std::string nccl_unique_id();

// The CUDA runtime: load(exe, cuda_runtime) runs on GPUs with device-resident ShardedArrays,
// donation and cancel, exactly as on the CPU runtime (loaded_executable.hpp).
//
//   tessel::CudaRuntime rt(mesh.num_devices());          // 8 virtual devices on GPU 0
//   tessel::LoadedExecutable prog = tessel::load(exe, rt);
//
// It owns DeviceThreads (device_threads.hpp) whose backends are CUDA backends: a host thread per local device walks its program; each device has its own
// compute, communication and transfer CUDA streams. Local device i lives on GPU
// backend.device + i % num_gpus (virtual devices when there are more devices than GPUs).
// Collectives: the virtual-device world (make_cuda_virtual_world) or, with use_nccl (a GPU
// per device: NCCL refuses two ranks on one GPU before 2.30), NCCL.
//
// Multi-process (processes set, process_group.hpp): one process per GPU (or per node) under
// mpirun or a RANK/WORLD_SIZE launcher. Process r owns the mesh positions [r*k, (r+1)*k) with
// k = num_devices (the same on every process). The collectives are one NCCL world over every
// process (the unique id made by rank 0 and shared through the process group at every
// make_world); to_host gathers through the process group. load, to_device, run and to_host
// are collective over the processes (SPMD). A failure or cancel aborts this process's NCCL
// communicators only; the others fail when their NCCL calls do or their collective timeout
// passes. As with MpiRuntime, a failed multi-process job is restarted, not repaired: a run
// after an abort would make a new world on this process alone and wait for the others.
//
// GPU placement of local device i: num_gpus >= 1: GPU backend.device + i % num_gpus (on
// every process alike, e.g. when the launcher gives each process its GPU through
// CUDA_VISIBLE_DEVICES). num_gpus == 0: one process: the GPUs visible from backend.device on;
// several processes: GPU (local_rank * k + i) % cuda_device_count(), so local rank r of a node
// with one process per GPU runs on GPU r. Processes that share a GPU (more processes than GPUs)
// need a distinct NCCL_HOSTID each, for testing only (not supported by NVIDIA); without it
// make_world refuses them on every process, saying what to set (docs/backend-cuda.md).
//
// Throws RuntimeError when tessel was built without CUDA, no GPU is visible, or a GPU asked
// for does not exist.
struct CudaRuntimeOptions {
  CudaBackendOptions backend;  // its device is the first GPU used
  // GPUs the local devices are spread over (the placement above).
  int num_gpus = 1;
  bool use_nccl = false;  // one process: NCCL instead of the virtual-device world
  std::shared_ptr<ProcessGroup> processes;  // several processes (then always NCCL); null: one
  int spin_us = -1;  // DeviceThreadsOptions::spin_us of the host threads
};

class CudaRuntime : public Runtime {
 public:
  // num_devices: this process's devices (one process: the mesh's device count).
  explicit CudaRuntime(int64_t num_devices, CudaRuntimeOptions options = {});
  ~CudaRuntime() override;
  CudaRuntime(const CudaRuntime&) = delete;
  CudaRuntime& operator=(const CudaRuntime&) = delete;

  const CudaRuntimeOptions& options() const;
  int64_t num_devices() const;
  int gpu(int64_t local_device) const;  // the CUDA ordinal local device i runs on
  // cuBLASLt plans (descriptors and algorithm per GEMM problem) local device i holds: load()
  // makes those of its program's einsums, so a run adds none for buffers the arena aligns.
  int64_t gemm_plans(int64_t local_device) const;

  std::string name() const override;  // "cuda" or "cuda+<process group name>"
  int process_rank() const override;
  int process_count() const override;
  std::vector<int64_t> devices_for(const Mesh& mesh) override;
  DeviceThreads& local() override;
  std::unique_ptr<CollectiveWorld> make_world(const Mesh& mesh, const std::vector<std::vector<std::string>>& axes,
                                              double timeout_s) override;
  std::vector<HostTensor> allgather_shards(const Mesh& mesh, std::vector<HostTensor> local) override;
  std::vector<std::string> allgather_host(const std::string& mine) override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The CudaRuntime that runs `mesh` from this process, as the examples use it:
//  - under a multi-process launcher (options.processes, else process_group_from_env(): mpirun,
//    or RANK/WORLD_SIZE with TESSEL_RENDEZVOUS_DIR): mesh.num_devices() / processes devices
//    (RuntimeError when that does not divide), GPUs by local rank (num_gpus = 0), NCCL;
//  - alone: every device of the mesh, one per GPU when `max_gpus` GPUs (0: every visible
//    one) are enough, otherwise virtual devices round-robin over min(max_gpus, visible) GPUs.
// options.backend and use_nccl are kept.
std::unique_ptr<CudaRuntime> make_cuda_runtime(const Mesh& mesh, CudaRuntimeOptions options = {}, int max_gpus = 0);

// Whether the CUDA backend has a kernel for `kind` (no GPU needed): the kinds without one are
// those load() keeps the lowering from producing (Backend::has_kernel).
bool cuda_has_kernel(OpKind kind);
// True when tessel was built with TESSEL_WITH_CUDA (this function is then in tessel::cuda;
// without it, in tessel, where every function of this header throws RuntimeError saying so).
bool cuda_compiled();

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

// One run of exe on a CudaRuntime made for it (mesh.num_devices() devices, round-robin over
// num_gpus GPUs): load with options.load, inputs to the devices, run (poisoned when asked),
// outputs gathered to the host (replicas checked when asked). A convenience for tests; a
// program run more than once should load on a CudaRuntime once. Throws RuntimeError naming
// the device and instruction that failed.
std::vector<HostTensor> run_on_cuda(const CompiledProgram& exe, const std::vector<HostTensor>& inputs,
                                    const CudaRunOptions& options = {});

}  // namespace tessel
