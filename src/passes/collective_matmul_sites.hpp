// collective_matmul_sites.hpp (private) — what the two halves of the collective-matmul pass
// share: a site (the collective, its einsum and how the ring dim meets the einsum), found and
// gated in collective_matmul_plan.cpp, rewritten into a ring in collective_matmul.cpp.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tessel/ir/program.hpp"
#include "tessel/passes/collective_matmul.hpp"

namespace tessel {
namespace cm_detail {

// A site: the collective, the einsum, and how the ring dim meets the einsum.
struct Site {
  int coll = -1;       // index of the all-gather / reduce-scatter
  int einsum = -1;     // index of the einsum
  bool gather = true;  // all-gather → einsum (else einsum → reduce-scatter)
  int operand = -1;    // gather: the gathered operand; scatter: an operand holding the ring dim
  std::vector<int> op_dim{-1, -1};  // per einsum operand: the ring dim in it, or -1
  int out_dim = -1;    // the ring dim in the einsum's result, or -1 (gather: contracted)
  int64_t n = 1;       // ring size
  int64_t chunk = 0;   // extent of one ring block along the ring dim
  std::vector<std::string> axes;
};

// Finds the sites of the program (synchronous all-gathers and reduce-scatters only: the pass
// runs before async-collectives). Adds (instruction, why) to `declined` for a candidate that
// cannot be rewritten.
std::vector<Site> find_sites(const Program& p, std::vector<std::pair<int, std::string>>* declined);
// The gate: the two-stream timeline of the ring against the collective then the einsum, and
// the variant it picks (or none, with the reason).
CollectiveMatmulSite decide(const Program& p, const Site& s, const CollectiveMatmulOptions& o);

}  // namespace cm_detail
}  // namespace tessel
