// tessel/tessel.hpp — umbrella header: the whole public API, stage by stage (docs/concepts.md
// has the map of folders). Every header here also compiles on its own (tests/CMakeLists.txt
// builds one translation unit per public header), so a user may include only what they use.
#pragma once

// core — the layout algebra: mesh, sharding, cost model, basic types
#include "tessel/core/common.hpp"
#include "tessel/core/cost.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/core/sharding.hpp"

// ir — the two IRs and their text forms: Graph, Program, fused expressions, verifier
#include "tessel/ir/fused_expr.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/ir/graph_text.hpp"
#include "tessel/ir/program.hpp"
#include "tessel/ir/program_text.hpp"
#include "tessel/ir/program_verify.hpp"

// ops — the op registry and the graph builders
#include "tessel/ops/builders.hpp"
#include "tessel/ops/op_attrs.hpp"
#include "tessel/ops/op_list.hpp"
#include "tessel/ops/registry.hpp"

// compiler — the compiler stages: propagation, padding, partitioning, resharding, checks
#include "tessel/autoshard/auto_shard.hpp"
#include "tessel/autoshard/problem.hpp"
#include "tessel/autoshard/solver.hpp"
#include "tessel/compiler/checks.hpp"
#include "tessel/compiler/partition.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/compiler/reshard.hpp"
#include "tessel/compiler/uneven.hpp"
#include "tessel/compiler/visualize.hpp"

// passes — the Program passes: collective matmul, combining, fusion, offload, async, memory plan
#include "tessel/passes/collective_matmul.hpp"
#include "tessel/passes/program_passes.hpp"

// train — training: autodiff, the training step and the trainer (the loop as an object)
#include "tessel/train/autodiff.hpp"
#include "tessel/train/train_step.hpp"
#include "tessel/train/trainer.hpp"

// models — models built on the API
#include "tessel/models/gpt.hpp"

// infer — generation with a KV cache: prefill and decode programs, continuous batching
#include "tessel/infer/generate.hpp"
#include "tessel/infer/server.hpp"

// pipeline — pipeline schedules (GPipe, 1F1B, interleaved) as objects
#include "tessel/pipeline/schedule.hpp"

// runtime — the runtime contract: compile -> load -> run, arrays, transfers, launch
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/block_copy.hpp"
#include "tessel/runtime/calibrate.hpp"
#include "tessel/runtime/communicator.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/executor.hpp"
#include "tessel/runtime/kernel_table.hpp"
#include "tessel/runtime/kernels.hpp"
#include "tessel/runtime/launch.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/process_group.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/runtime/runtime.hpp"
#include "tessel/runtime/sharded_array.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/runtime/trace.hpp"

// runtime/cpu — the CPU backend: device threads and the in-process communicator
#include "tessel/runtime/cpu/thread_communicator.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

// runtime/mpi — the multi-process runtime (throws without TESSEL_WITH_MPI)
#include "tessel/runtime/mpi/mpi_runtime.hpp"

// runtime/cuda — the CUDA backend (throws without TESSEL_WITH_CUDA)
#include "tessel/runtime/cuda/cuda.hpp"

// tessel/ — the entry points: compile() and Executable, command-line parsing of the tools
#include "tessel/cli.hpp"
#include "tessel/executable.hpp"
