// src/runtime/cpu/onednn_ops.hpp — internal: softmax, layer normalisation and GELU on oneDNN
// primitives (src/runtime/cpu/onednn_ops.cpp), measured against the hand-written kernels of
// cpu_kernels_nn.cpp (softmax, layer_norm) and cpu_kernels_elementwise.cpp (GELU) with
// BM_RowOp (bench/bench_onednn_ops.cpp). Which of them the CPU kernel table runs, and the
// figures that decided it: docs/cpu-backend.md. The hand-written kernels stay the fallback
// and the test oracle.
#pragma once

#include "tessel/runtime/kernels.hpp"

namespace tessel {

// Each runs `args` (already validated by the calling kernel: shapes consistent) on oneDNN and
// returns true, or returns false having written nothing when oneDNN does not take it: a
// dtype other than all-f32, an empty tensor, no optimised oneDNN implementation (`ref:`), or
// (softmax) an axis other than the last. With `prepare_only` they create (or find) the
// primitive and return whether a run would use oneDNN, touching no data. Thread-safe;
// primitives are cached by (op, shape). Without TESSEL_WITH_ONEDNN they always return false.
//
// softmax over the last axis; a row whose every element is -inf gives zeros, as the
// hand-written kernel defines it (oneDNN alone gives NaN there).
bool onednn_softmax(const KernelArgs& args, bool prepare_only = false);
// layer_norm(x, gamma, beta) over the last dim, eps from the attrs; statistics in f32
// (the hand-written kernel sums in double).
bool onednn_layer_norm(const KernelArgs& args, bool prepare_only = false);
// GELU, tanh approximation (oneDNN's eltwise_gelu_tanh).
bool onednn_gelu(const KernelArgs& args, bool prepare_only = false);

// Empties this file's primitive cache (onednn_clear_primitive_cache calls it).
void onednn_clear_op_cache();

// The hand-written CPU kernel for args.kind, never oneDNN (tests and BM_RowOp: the oracle).
// Defined in cpu_kernels.cpp.
void run_handwritten_kernel(const KernelArgs& args);

}  // namespace tessel
