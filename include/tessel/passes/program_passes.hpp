// tessel/passes/program_passes.hpp — Program→Program passes and the pass manager that runs them.
//
// The partitioner emits kernels, synchronous collectives and shard slices, all on `compute`.
// The default pipeline lowers that into what the executor runs (docs/program-ir.md):
//
//   collective-matmul  an all-gather feeding an einsum, or an einsum feeding a reduce-scatter,
//                      becomes a ring of collective-permutes overlapped with partial einsums
//                      where the cost model's two-stream estimate says it wins
//                      (collective_matmul.hpp; ProgramPassOptions::collective_matmul).
//   pack               every layout decision the executor used to make at run time becomes an
//                      instruction: a collective over a non-leading dim gets explicit `copy`
//                      instructions packing the dim into rank-major blocks (and unpacking
//                      them), so every collective moves one contiguous buffer; a shard slice
//                      becomes a `copy` of the device's block; a relabel becomes a `view`.
//   combine-collectives  independent all-reduces over the same axis group, reduce op and dtype
//                      become one: operands packed into one buffer (views + concat), one
//                      all-reduce, results unpacked as views (XLA's AllReduceCombiner), up to
//                      ProgramPassOptions::combine_threshold_bytes per combined buffer.
//   fuse-elementwise   each chain (a DAG) of elementwise kernels whose intermediates nothing else
//                      reads becomes one fused_elementwise kernel: one pass over memory
//                      (ProgramPassOptions::fuse_elementwise; off: the pass changes nothing);
//                      an einsum that only such a chain reads takes it as its epilogue
//                      (fused_einsum; ProgramPassOptions::fuse_einsum_epilogue).
//   async-collectives  each collective becomes `X_start` on `comm` (after `wait compute @comm`)
//                      and `done` just before the first reader of its result, with a `wait`
//                      wherever a value crosses streams.
//   memory-plan        places every intermediate value in one arena per device (greedy by
//                      size over live ranges, see memory_plan_pass); peak bytes are then known.
//
// A pass is a pure function Program → Program. The pass manager runs them in order, verifies
// after each (when asked: tests and debug builds), and keeps the text after the passes named
// in dump_after (tessel-explain --dump-after=PASS).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tessel/passes/collective_matmul.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/ir/program.hpp"

namespace tessel {

// Options of the default pipeline (LoadOptions::lowering passes them to load()).
struct ProgramPassOptions {
  // combine-collectives: a combined collective's buffer grows to at most this many bytes per
  // device (XLA's combine_threshold_in_bytes); a collective larger than it alone stays as it
  // is. 0 disables combining.
  int64_t combine_threshold_bytes = int64_t{32} << 20;
  // combine-collectives: a reduce-scatter joins a group only within this many instructions of
  // its first member, since the combined one keeps every member's operand alive until its last
  // member (ZeRO-2/3's gradients, which per-parameter reduce-scatters free as they come); the
  // pass narrows it further while the planned peak would grow by more than 1%. 0: only
  // all-reduces are combined.
  int combine_span_instrs = 64;
  // collective-matmul: mode (auto: gated by the cost model; on; off), ring direction, and the
  // cost model the gate uses.
  CollectiveMatmulOptions collective_matmul;
  // offload-activations (after async-collectives; off when offload_min_bytes is 0): a value of
  // at least offload_min_bytes per device that no instruction reads for offload_min_gap
  // instructions or more is copied to host memory before the gap and back offload_prefetch
  // instructions before its next reader.
  int64_t offload_min_bytes = 0;
  int offload_min_gap = 64;
  int offload_prefetch = 8;
  // fuse-elementwise: chains of elementwise kernels become one fused_elementwise kernel each.
  // Default: on, unless the environment variable TESSEL_FUSION is "0" (so a whole test run
  // can go unfused: TESSEL_FUSION=0 ./scripts/test). tessel-explain: --no-fusion.
  bool fuse_elementwise = fusion_default();
  static bool fusion_default() noexcept;
  // With fuse_elementwise: an einsum and the elementwise chain that alone reads its product
  // become one fused_einsum (the chain as the einsum's epilogue: oneDNN matmul post-ops on the
  // CPU). Only backends with a fused_einsum kernel can run it (the CPU's); a backend without
  // one turns fuse_elementwise off (the CUDA runner does).
  bool fuse_einsum_epilogue = true;
};

Program pack_pass(Program p);
// Merges independent synchronous collectives of one kind that agree on axis group, reduce op
// and dtype (docs/program-ir.md, "combine-collectives"): all-reduces; reduce-scatters and
// all-gathers whose dim's blocks are contiguous (after pack), the all-gathers only when their
// result is a program output (ZeRO-1/2's updated parameters; other gathers stay where they are
// used, so their copies die soon). Candidates are taken in program order; each joins the open
// group of its kind unless it depends (transitively, also through earlier merges) on a member
// or a member depends on it, the group's bytes would exceed `threshold_bytes`, or (a
// reduce-scatter) it is more than `span_instrs` instructions after the group's first member;
// then it opens a new group. Reduce-scatters and all-gathers are combined only when the
// program's planned peak memory grows by at most 1%; the span is narrowed 4x at a time until
// it does (down to 1), else only the all-reduces are combined. A group of k >= 2 becomes: a `view` of each operand (flat, or
// [n, block] / [1, block] for n ranks), one `concat` into `%combined.in`, one collective into
// `%combined.out`, and per result a `view` (a view + `copy` for a program output; an
// all-gather's member first copies its columns out) placed just before its first reader.
// Instructions are then re-listed in their original order except that whatever reads a
// combined result moves after the combined collective. Throws Error on a program that already
// has async collectives or waits (run it before async-collectives).
Program combine_collectives_pass(Program p, int64_t threshold_bytes = ProgramPassOptions{}.combine_threshold_bytes,
                                 int span_instrs = ProgramPassOptions{}.combine_span_instrs);
// Fuses maximal groups of elementwise kernels (and the scalar constants they read) whose
// intermediate values have no reader outside the group and are not outputs into one
// `fused_elementwise` kernel each, placed at the group's last instruction (docs/program-ir.md,
// "fuse-elementwise"). Producers with fewer elements than the group's result (broadcast
// statistics) and other streams' kernels stay outside. A softmax with its elementwise (and
// causal_mask) producers becomes one `fused_softmax`. With `einsum_epilogues`, an einsum whose
// result only such a group reads (same shape and dtype as the group's result) joins it as its
// head: one `fused_einsum` whose epilogue is the group's expression ($0 the product). A pure
// function; idempotent.
Program fuse_elementwise_pass(Program p, bool einsum_epilogues = true);
Program async_collectives_pass(Program p);
// Activation offload (src/passes/offload.cpp, docs/program-ir.md "offload-activations"): for each
// intermediate value defined and read on `compute` only, not viewed, of at least `min_bytes`,
// whose longest stretch between two consecutive accesses is at least `min_gap` instructions:
// after the access before the stretch, `wait compute @comm` and `%v.host = copy(%v) @comm`
// (a host-memory value); `prefetch` instructions later `wait comm @compute` (the arena bytes
// are free from there); `prefetch` instructions before the reader, `wait compute @comm` and
// `%v.reload = copy(%v.host) @comm`; `wait comm @compute` before the reader, which reads
// %v.reload from then on. Runs on a program with async collectives (after that pass). A
// no-op when min_bytes <= 0; Error when min_gap < 2 or prefetch < 1.
Program offload_activations_pass(Program p, int64_t min_bytes, int min_gap = 64, int prefetch = 8);
// Liveness from compute_liveness (program_verify.hpp); the values defined by instructions,
// except outputs and views, are placed greedily by size, largest first (ties: earliest
// definition), each at the lowest offset of the smallest gap between already-placed values
// whose live ranges intersect its own (best fit), 64-byte aligned. Replaces any earlier plan.
Program memory_plan_pass(Program p);

// Donation (LoadOptions::donate), decided before anything runs so that the plan and the
// executor agree. Per input of p: the last instruction that reads its storage (directly,
// through a view, or as an async collective's operand until its done), or -1.
std::vector<int> input_last_use(const Program& p);
// Per output of p: the input whose buffer the executor writes it into, given `donate` (per
// input: the index of the output it is donated to, or -1), or -1 when the output gets a
// buffer of its own (the donated buffer is then freed at the end of the run). An output takes
// its donor's buffer when their bytes agree and the donor is dead before the instruction that
// defines the output, or that instruction reads the donor last and writes in place: a fused
// elementwise kernel with the donor's shape among its operands (it reads every element of a
// block before writing it), or adamw updating the donor (parameter, m or v) into this result.
std::vector<int> donated_outputs(const Program& p, const std::vector<int>& donate, const std::vector<int>& input_last);
// Sets p.memory.donated_bytes to the bytes of the outputs donated_outputs gives a donor, so
// that MemoryPlan::peak_bytes() counts each of them once. Load calls it once donation is
// known; Error when `donate` does not have one entry per input.
void plan_donations(Program& p, const std::vector<int>& donate);
// The same from (input name, output name) pairs of `g`, the graph p was partitioned from (its
// inputs and outputs in p's order), as LoadOptions::donate names them; a pair naming no input
// or output of g is skipped. Then p.memory_plan().peak_bytes() is the peak per device of the
// program load() runs (e.g. a training step's parameters and moments updated in place).
void plan_donations(Program& p, const Graph& g, const std::vector<std::pair<std::string, std::string>>& donations);

using ProgramPassFn = std::function<Program(Program)>;

class ProgramPassManager {
 public:
  // Appends a pass; names are unique (throws Error on a repeat).
  ProgramPassManager& add(std::string name, ProgramPassFn fn);
  // Verify the input and the result of every pass (verify_program); the error names the pass.
  ProgramPassManager& verify_each(bool on);
  // Keep print_program's text after `pass` (checked against the pass names at run()).
  ProgramPassManager& dump_after(std::string pass);

  std::vector<std::string> pass_names() const;
  // Runs every pass in order. Throws Error naming an unknown dump_after pass (and the known
  // ones), and ProgramError (prefixed with the pass) when verification fails.
  Program run(Program p);
  // pass name -> text after it, for the passes named in dump_after (filled by run()).
  const std::map<std::string, std::string>& dumps() const { return dumps_; }
  // (pass name, processor seconds it took on the calling thread) of the last run(), in pipeline
  // order; verification after a pass is not counted (bench_compile.cpp times each lowering
  // pass with it).
  const std::vector<std::pair<std::string, double>>& seconds() const { return seconds_; }

 private:
  std::vector<std::pair<std::string, ProgramPassFn>> passes_;
  std::vector<std::string> dump_after_;
  std::map<std::string, std::string> dumps_;
  std::vector<std::pair<std::string, double>> seconds_;
  bool verify_ = false;
};

// collective-matmul, pack, combine-collectives, fuse-elementwise, async-collectives,
// [offload-activations when options.offload_min_bytes > 0,] memory-plan.
ProgramPassManager default_program_pipeline(const ProgramPassOptions& options = {});
std::vector<std::string> default_program_pass_names();

// The default pipeline over a partitioned program: what load() runs. `verify`: after each
// pass (always on in tests; load verifies the result once).
Program lower_program(const Program& partitioned, bool verify = false, const ProgramPassOptions& options = {});

// For tessel-explain --dump-after=PASS: the text of the program after `pass` of the default
// pipeline, or "partition" for its input. Throws Error naming the known passes otherwise.
std::string dump_program_after(const Program& partitioned, const std::string& pass,
                               const ProgramPassOptions& options = {});

}  // namespace tessel
