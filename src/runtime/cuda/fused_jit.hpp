// src/runtime/cuda/fused_jit.hpp — fused expressions compiled to straight-line CUDA kernels at
// run time (NVRTC), instead of interpreted per element.
//
// The interpreter (src/runtime/cuda/kernels/fused.cu) walks the program's steps for every element: a switch per
// step, the step values in local memory, the op's own switch inside. On an H200 that made the
// GPT-2 forward's fused chains 5-15x slower than their memory traffic. Here each distinct
// program (its steps, dtypes, rank and which operands are dense, not its shape) becomes one
// generated source: the coordinates and values in registers, each step one line calling the
// unfused op's own per-element code (src/runtime/cuda/kernels/elementwise_math.cuh, compiled into the source),
// each float step rounded to its dtype exactly as the interpreter rounds it. So a JIT kernel
// and the interpreter give the same bits.
//
// Compiled once per process, GPU architecture and program (NVRTC for the GPU's own sm_XY, a
// cubin loaded with cudaLibraryLoadData), cached until the process exits. A program that fails to compile or load
// is said once on stderr and runs on the interpreter; CudaBackendOptions::fused_jit = false (or
// TESSEL_CUDA_FUSED_JIT=0) keeps every program on the interpreter.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "launchers.hpp"
#include "tessel/core/common.hpp"
#include "tessel/runtime/kernels.hpp"

namespace tessel::cuda {

namespace ck = tessel::cuda_kernels;

// The kernel source of program `p` (its steps, operand dtypes, rank and the result dtype
// out_t; shapes and strides are kernel arguments): `tessel_fused_elementwise` and, for a float
// result, `tessel_fused_softmax` (softmax over the last axis, rows of at most 1024). Pure; no
// GPU needed. Throws RuntimeError for a program the interpreter would refuse too.
std::string fused_jit_source(const ck::FusedProgram& p, DType out_t);

// The device program the CUDA fused kernels run for `a` (kind FusedElementwise, or
// FusedSoftmax with positional = true): parsed, typed and checked as the kernels do; the
// pointers are a's. Throws RuntimeError naming the op on a bad expression.
ck::FusedProgram cuda_fused_program(const KernelArgs& a, bool positional);

// NVRTC: `source` compiled for sm_<arch> (e.g. 90) into a cubin. No GPU needed. ok false with
// NVRTC's log when it does not compile.
struct NvrtcResult {
  bool ok = false;
  std::string log;
  std::vector<char> cubin;
  double seconds = 0;
};
NvrtcResult nvrtc_compile(const std::string& source, int arch);
// "13.0": NVRTC's version.
std::string nvrtc_version();

// The compiled programs of one GPU architecture, shared by every backend of the process (the
// loaded libraries are context-independent: one compile serves every GPU and virtual device).
// Thread-safe.
class FusedJit {
 public:
  // The instance for GPU `device`'s compute capability. Throws RuntimeError when it cannot be read.
  static FusedJit& shared(int device);
  ~FusedJit();
  FusedJit(const FusedJit&) = delete;
  FusedJit& operator=(const FusedJit&) = delete;

  // Enqueue out = p's values on `stream` (a cudaStream_t) and return true; false when this
  // program has no JIT kernel (its compile or load failed: said once), launching nothing.
  bool elementwise(const ck::FusedProgram& p, void* out, DType out_t, void* stream);
  // out = softmax over the last axis of p's values, in one pass; false when the program has no
  // JIT kernel or the rows are longer than 1024 (then nothing is launched).
  bool softmax_last_axis(const ck::FusedProgram& p, void* out, DType out_t, void* stream);

  struct Stats {
    int64_t compiled = 0;   // programs compiled and loaded
    int64_t failed = 0;     // programs that fell back to the interpreter
    int64_t launches = 0;   // JIT kernel launches
    double compile_seconds = 0;
  };
  Stats stats() const;

 private:
  struct Entry;
  explicit FusedJit(int arch);
  const Entry* get(const ck::FusedProgram& p, DType out_t);
  int arch_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>> cache_;
  Stats stats_;
};

}  // namespace tessel::cuda
