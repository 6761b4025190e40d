// program_builders.hpp (private) — small builders the Program passes share (pack.cpp,
// offload.cpp, collective_matmul.cpp, combine_collectives.cpp): fresh
// scratch values, and the copy and view instructions the passes insert.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "tessel/ir/program.hpp"

namespace tessel {
namespace detail {

// Adds scratch values to a program: per-device data with no global meaning; its global type
// is its local type and it is "replicated" (so the layout invariants hold trivially). Names
// are `base`, else `base.1`, `base.2`, ... whichever is not yet taken.
class ScratchValues {
 public:
  explicit ScratchValues(Program& p);  // p outlives this; its values' names are taken
  int add(const std::string& base, DType dt, const Shape& shape);  // the new value's id

 private:
  Program& p_;
  std::unordered_set<std::string> names_;
};

// A block at offset 0 of both sides, for a copy of a whole rank-`rank` tensor.
CopyBlock whole_block(std::size_t rank);

// `dst = copy(src) block=.. copies=..` on `stream`, for graph op `graph_op`.
Instr copy_instr(int src, int dst, const Shape& block, std::vector<CopyBlock> copies, const std::string& stream,
                 int graph_op);

// `dst = view(src) offset=..` (bytes) on `stream`, for graph op `graph_op`.
Instr view_instr(int src, int dst, int64_t offset, const std::string& stream, int graph_op);

}  // namespace detail
}  // namespace tessel
