// tessel/runtime/cpu/cpu_kernels.hpp — the CPU backend's kernels: one per OpKind, on dense
// row-major buffers of the shapes in KernelArgs (kernels.hpp). The partitioned executor on CPU
// devices and the unpartitioned reference executor (reference.hpp) call the same kernels, so a
// difference between them is a partitioning bug, never a kernel difference; they are also the
// oracle of the other backends' kernels.
#pragma once

#include "tessel/runtime/kernel_table.hpp"
#include "tessel/runtime/kernels.hpp"

namespace tessel {

using CpuKernelFn = void (*)(const KernelArgs&);
// The CPU backend's kernels, one per op kind (every kind but Input).
const KernelTable<CpuKernelFn>& cpu_kernel_table();

// Runs the kernel for args.kind. Throws RuntimeError for an unsupported dtype combination
// or a kind with no kernel (Input has none). Supports f32 everywhere, i32 for ids/labels,
// and bf16/f16 by computing in f32.
void run_cpu_kernel(const KernelArgs& args);

// True when the CPU backend has a kernel for `kind` (every kind but Input).
bool has_cpu_kernel(OpKind kind);

}  // namespace tessel
