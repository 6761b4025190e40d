// program_builders.cpp — scratch values, copy and view instructions for the Program passes
// (program_builders.hpp).
#include "program_builders.hpp"

#include <fmt/format.h>

#include <utility>

namespace tessel {
namespace detail {

ScratchValues::ScratchValues(Program& p) : p_(p) {
  for (const auto& v : p_.values) names_.insert(v.name);
}

int ScratchValues::add(const std::string& base, DType dt, const Shape& shape) {
  std::string name = base;
  for (int k = 1; names_.count(name); ++k) name = fmt::format("{}.{}", base, k);
  names_.insert(name);
  LocalValue lv;
  lv.name = name;
  lv.shape = shape;
  lv.global_shape = shape;
  lv.dtype = dt;
  lv.sharding = Sharding::replicated(static_cast<int>(shape.size()));
  p_.values.push_back(std::move(lv));
  return static_cast<int>(p_.values.size()) - 1;
}

CopyBlock whole_block(std::size_t rank) {
  CopyBlock c;
  c.src.resize(rank);
  c.dst.resize(rank);
  return c;
}

Instr copy_instr(int src, int dst, const Shape& block, std::vector<CopyBlock> copies, const std::string& stream,
                 int graph_op) {
  Instr c;
  c.kind = InstrKind::Copy;
  c.in = {src};
  c.out = dst;
  c.block = block;
  c.copies = std::move(copies);
  c.stream = stream;
  c.graph_op = graph_op;
  return c;
}

Instr view_instr(int src, int dst, int64_t offset, const std::string& stream, int graph_op) {
  Instr v;
  v.kind = InstrKind::View;
  v.in = {src};
  v.out = dst;
  v.view_offset = offset;
  v.stream = stream;
  v.graph_op = graph_op;
  return v;
}

}  // namespace detail
}  // namespace tessel
