// tessel/compiler/compiled_program.hpp — the artifact between the compiler and the runtime:
// what load() needs of a compiled program and nothing of how it was made.
//
//   tessel::CompiledProgram p = tessel::compile_program(graph, mesh);   // pad, propagate, partition
//   tessel::LoadedExecutable prog = tessel::load(p, runtime);             // runtime/loaded_executable.hpp
//
// CompiledProgram is runtime-neutral (a Program, its mesh, its inputs' and outputs' names and
// the user's input shapes) and compiler-neutral (no graph, no layouts): automatic sharding
// prices it, load() runs it, and a tool could write it to a file. compile() (executable.hpp)
// is the convenience over compile_graph: it fuses attention and runs automatic sharding
// first, and keeps the graph and its layouts for scatter, gather and explanations; an
// Executable converts to its CompiledProgram, so load(exe, runtime) works as it did.
#pragma once

#include <string>
#include <vector>

#include "tessel/compiler/partition.hpp"
#include "tessel/compiler/propagate.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/ir/program.hpp"

namespace tessel {

struct CompiledProgram {
  Program program;  // one SPMD program for every device of `mesh`
  Mesh mesh;
  std::vector<std::string> input_names;   // the graph's inputs, in order
  std::vector<std::string> output_names;  // the graph's outputs, in order
  // The user's shape of each input (before padding for an uneven layout; load's to_device
  // pads an input given in this shape with zeros). Empty: the program's shapes.
  std::vector<Shape> user_input_shapes;
  // The user's shape of each output: an output of an uneven layout stays padded on the devices
  // (its arrays carry this as ShardedArray::user_shape; to_host trims to it). Empty: the
  // program's shapes.
  std::vector<Shape> user_output_shapes;
};

struct CompileProgramOptions {
  PropagationOptions propagation;
  PartitionOptions partition;
  // An annotation that does not divide its dim is padded as GSPMD does (uneven.hpp); with
  // strict_even_shardings it is a ShardingError naming the value, dim and shard count.
  bool strict_even_shardings = false;
};

// The graph the program was partitioned from (the input, or its padded rewrite), every value's
// layout, and the artifact.
struct Compilation {
  Graph graph;
  PropagationResult shardings;
  CompiledProgram compiled;
};

// Checks, pads uneven layouts, propagates and partitions `graph` for `mesh` (pure). The
// program's warnings (checks.hpp) are those of `warnings_for` when given (the user's graph
// before a rewrite), else of `graph`. Throws Error for a graph with no output.
Compilation compile_graph(const Graph& graph, const Mesh& mesh, const CompileProgramOptions& options = {},
                          const Graph* warnings_for = nullptr);
CompiledProgram compile_program(const Graph& graph, const Mesh& mesh, const CompileProgramOptions& options = {});

// The artifact of a graph already partitioned (names from the graph, no padding).
CompiledProgram compiled_program_of(const Graph& graph, const Mesh& mesh, Program program,
                                    std::vector<Shape> user_input_shapes = {},
                                    std::vector<Shape> user_output_shapes = {});

}  // namespace tessel
