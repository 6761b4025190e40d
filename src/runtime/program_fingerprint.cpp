// src/runtime/program_fingerprint.cpp — the fingerprint every process exchanges at load
// (program_fingerprint.hpp says why).
#include "program_fingerprint.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <sstream>
#include <vector>

#include "tessel/ir/program_text.hpp"

#ifndef TESSEL_VERSION_STRING
#define TESSEL_VERSION_STRING "unknown"
#endif

namespace tessel::detail {
namespace {

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

std::string program_fingerprint(const Mesh& mesh, const Program& lowered) {
  std::string f = fmt::format("tessel {}\nmesh {} devices=[{}]\n", TESSEL_VERSION_STRING, mesh.to_string(),
                              fmt::join(mesh.device_ids(), ","));
  const auto value_line = [&](const char* kind, int v) {
    const LocalValue& lv = lowered.values[static_cast<std::size_t>(v)];
    return fmt::format("{} %{} {} sharding {}\n", kind, lv.name, type_str(lv.dtype, lv.global_shape),
                       lv.sharding.to_string());
  };
  for (int v : lowered.inputs) f += value_line("input", v);
  for (int v : lowered.outputs) f += value_line("output", v);
  const std::string text = print_program(lowered);
  f += fmt::format("program {} instructions, text hash {:016x}\n", lowered.instrs.size(), fnv1a_64(text));
  return f;
}

void check_same_program(Runtime& rt, const Mesh& mesh, const Program& lowered) {
  if (rt.process_count() <= 1) return;
  std::vector<std::string> all;
  try {
    all = rt.allgather_host(program_fingerprint(mesh, lowered));
  } catch (const RuntimeError& e) {
    throw RuntimeError(fmt::format("load, exchanging the program fingerprints: {}", e.what()));
  }
  std::vector<std::string> differ;
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differ.push_back(std::to_string(r));
  if (differ.empty()) return;
  const std::size_t first = std::stoul(differ[0]);
  const std::vector<std::string> a = lines(all[0]), b = lines(all[first]);
  std::size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  const std::string ra = k < a.size() ? a[k] : "(nothing)", rb = k < b.size() ? b[k] : "(nothing)";
  throw RuntimeError(fmt::format(
      "load on rank {}: the processes loaded different programs; SPMD needs the same graph, mesh, options and tessel "
      "version on every rank: rank 0 has '{}' where rank {} has '{}' (rank{} {} differ{} from rank 0); build every "
      "rank's program from the same inputs",
      rt.process_rank(), ra, first, rb, differ.size() == 1 ? "" : "s", join(differ, ", "),
      differ.size() == 1 ? "s" : ""));
}

}  // namespace tessel::detail
