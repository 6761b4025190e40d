// tessel/passes/collective_matmul.hpp — the collective-matmul pass (CollectiveEinsum): an all-gather
// feeding an einsum, and an einsum feeding a reduce-scatter, rewritten into a ring of
// collective-permutes overlapped with partial einsums, where the cost model's two-stream
// timeline says the ring wins. docs/collective-matmul.md has the algorithm, the gate and the
// measured figures.
#pragma once

#include <string>
#include <vector>

#include "tessel/core/cost.hpp"
#include "tessel/ir/program.hpp"

namespace tessel {

enum class OverlapMode { Auto, On, Off };      // Auto: where the estimate says the ring wins
enum class RingDirection { Auto, Uni, Bi };    // Bi: half of each chunk travels each way
enum class RingVariant { None, Uni, Bi };

struct CollectiveMatmulOptions {
  OverlapMode mode = OverlapMode::Auto;
  RingDirection direction = RingDirection::Auto;
  // Auto decomposes a site when the ring's estimate is below (1 - min_gain) x today's.
  double min_gain = 0.05;
  // The figures the gate uses: flops, memory bandwidth, links per axis, the dispatch cost per
  // instruction and the compute sharing. The defaults model H100s; for CPU device threads
  // set cost.compute_sharing = compute_sharing(devices, cores) and cost.dispatch_s to the
  // machine's (docs/collective-matmul.md, "The gate").
  CostModel cost;
};

// One candidate site and what the gate made of it (tessel-explain prints these).
struct CollectiveMatmulSite {
  int instr = -1;  // the all-gather / reduce-scatter in the partitioned program
  bool gather = true;
  int64_t ring = 0;
  std::vector<std::string> axes;
  std::string description;
  double before_s = 0;  // collective + einsum, one after the other
  double uni_s = 0;     // the unidirectional ring (two-stream timeline)
  double bi_s = -1;     // the bidirectional ring, -1 where the chunk does not halve
  // The terms of the estimates beyond flops and bytes (CostModel): the seconds each
  // instruction pays on its stream (dispatch_s x compute_sharing), the instructions each ring
  // runs (the pair "as is" runs 2), and the device programs sharing one device's compute.
  double dispatch_s = 0;
  int64_t uni_instrs = 0;
  int64_t bi_instrs = 0;
  double compute_sharing = 1;
  RingVariant variant = RingVariant::None;
  std::string reason;
  std::string line() const;
};

// Every all-gather → einsum and einsum → reduce-scatter of a partitioned program (synchronous
// collectives), with both estimates and the decision; also the candidates the pass cannot
// rewrite, and why (e.g. the gathered value has other readers). Throws Error when the cost
// model's figures are invalid (CostModel::validate), as does the pass.
std::vector<CollectiveMatmulSite> collective_matmul_sites(const Program& partitioned,
                                                          const CollectiveMatmulOptions& options = {});

// Program → Program. Runs on the partitioned program (before async-collectives; throws Error
// on a program with started collectives). Each chosen site becomes n ring steps: permutes of
// the chunk (or the accumulator) on the way to the ring neighbour, partial einsums on the
// chunk held now, ring-indexed copies (IndexExpr with a modulus) for the operand blocks and
// the result blocks, adds for the partial sums. The result keeps its value id and layout.
Program collective_matmul_pass(Program p, const CollectiveMatmulOptions& options = {});

}  // namespace tessel
