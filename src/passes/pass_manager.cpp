// src/passes/pass_manager.cpp — the Program pass manager (program_passes.hpp) and the default
// lowering pipeline: collective-matmul, pack, combine-collectives, fuse-elementwise,
// async-collectives, offload-activations, memory-plan — the order, and why, is told beside
// each step; each pass lives in its own file of src/passes/.
#include "tessel/passes/program_passes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <time.h>

#include <cstdlib>
#include <cstring>
#include <set>

#include "tessel/ir/program_text.hpp"
#include "tessel/ir/program_verify.hpp"
#include "tessel/passes/collective_matmul.hpp"

namespace tessel {
namespace {

// This thread's processor time: a pass runs on the calling thread, and on a machine shared with
// other work the wall clock would count the other processes' turns too.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

ProgramPassManager& ProgramPassManager::add(std::string name, ProgramPassFn fn) {
  for (const auto& pr : passes_)
    if (pr.first == name) throw Error(fmt::format("pass manager: pass '{}' is added twice", name));
  passes_.emplace_back(std::move(name), std::move(fn));
  return *this;
}

ProgramPassManager& ProgramPassManager::verify_each(bool on) {
  verify_ = on;
  return *this;
}

ProgramPassManager& ProgramPassManager::dump_after(std::string pass) {
  dump_after_.push_back(std::move(pass));
  return *this;
}

std::vector<std::string> ProgramPassManager::pass_names() const {
  std::vector<std::string> names;
  for (const auto& pr : passes_) names.push_back(pr.first);
  return names;
}

Program ProgramPassManager::run(Program p) {
  const auto names = pass_names();
  for (const auto& d : dump_after_)
    if (std::find(names.begin(), names.end(), d) == names.end())
      throw Error(fmt::format("--dump-after={}: no such Program pass (the passes: {})", d, join(names, ", ")));
  dumps_.clear();
  seconds_.clear();
  if (verify_) {
    try {
      verify_program(p);
    } catch (const ProgramError& e) {
      throw ProgramError(e.instruction(), fmt::format("before the first pass: {}", e.what()));
    }
  }
  for (auto& [name, fn] : passes_) {
    const double t0 = thread_seconds();
    p = fn(std::move(p));
    seconds_.emplace_back(name, thread_seconds() - t0);
    if (verify_) {
      try {
        verify_program(p);
      } catch (const ProgramError& e) {
        throw ProgramError(e.instruction(), fmt::format("after pass '{}': {}", name, e.what()));
      }
    }
    if (std::find(dump_after_.begin(), dump_after_.end(), name) != dump_after_.end()) dumps_[name] = print_program(p);
  }
  return p;
}

// noexcept, and no std::string: it initialises a member of every options aggregate, and a
// throwing initialiser there gives each `RunOptions{}` an exception path that destroys the
// members built before it (GCC 12 then reports CostModel::links as maybe-uninitialized).
bool ProgramPassOptions::fusion_default() noexcept {
  const char* v = std::getenv("TESSEL_FUSION");
  return !(v && std::strcmp(v, "0") == 0);
}

ProgramPassManager default_program_pipeline(const ProgramPassOptions& options) {
  ProgramPassManager pm;
  // First: it matches the partitioner's synchronous all-gathers and reduce-scatters next to
  // their einsums, and its permutes and ring copies are lowered like any others.
  const CollectiveMatmulOptions cm = options.collective_matmul;
  pm.add("collective-matmul", [cm](Program p) { return collective_matmul_pass(std::move(p), cm); });
  pm.add("pack", pack_pass);
  // After pack (every collective then moves one contiguous buffer), before async-collectives
  // (which gives the combined collective one start/done and places its waits).
  const int64_t threshold = options.combine_threshold_bytes;
  const int span = options.combine_span_instrs;
  pm.add("combine-collectives",
         [threshold, span](Program p) { return combine_collectives_pass(std::move(p), threshold, span); });
  // After pack and combine-collectives (the kernels are final: combining adds concats and
  // views, which fusion leaves alone), before async-collectives (a fused kernel stands at its
  // root's place on compute; the async pass then places dones and waits for the fused
  // program, and memory-plan sees only the values that still reach memory).
  const bool fuse = options.fuse_elementwise, epilogues = options.fuse_einsum_epilogue;
  pm.add("fuse-elementwise",
         [fuse, epilogues](Program p) { return fuse ? fuse_elementwise_pass(std::move(p), epilogues) : p; });
  pm.add("async-collectives", async_collectives_pass);
  if (options.offload_min_bytes > 0) {
    const int64_t bytes = options.offload_min_bytes;
    const int gap = options.offload_min_gap, prefetch = options.offload_prefetch;
    pm.add("offload-activations",
           [bytes, gap, prefetch](Program p) { return offload_activations_pass(std::move(p), bytes, gap, prefetch); });
  }
  pm.add("memory-plan", memory_plan_pass);
#ifndef NDEBUG
  pm.verify_each(true);
#endif
  return pm;
}

std::vector<std::string> default_program_pass_names() { return default_program_pipeline().pass_names(); }

Program lower_program(const Program& partitioned, bool verify, const ProgramPassOptions& options) {
  ProgramPassManager pm = default_program_pipeline(options);
  if (verify) pm.verify_each(true);
  return pm.run(partitioned);
}

std::string dump_program_after(const Program& partitioned, const std::string& pass,
                               const ProgramPassOptions& options) {
  if (pass == "partition") return print_program(partitioned);
  ProgramPassManager pm = default_program_pipeline(options);
  const auto names = pm.pass_names();
  if (std::find(names.begin(), names.end(), pass) == names.end())
    throw Error(fmt::format("--dump-after={}: no such Program pass (partition, {})", pass, join(names, ", ")));
  pm.dump_after(pass);
  pm.run(partitioned);
  return pm.dumps().at(pass);
}

}  // namespace tessel
