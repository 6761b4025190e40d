// tessel/cli.hpp — command-line parsing of the example binaries (tessel-explain, gpt, mlp),
// kept in the library so that it is unit-tested and fuzzed (fuzz/fuzz_cli.cpp) without
// running anything.
//
// Every number a flag takes is parsed whole (no trailing characters, no silent wrap of a
// negative into an unsigned, no NaN or infinity unless the flag allows it); a bad value is
// a tessel::UsageError naming the flag, the text and what the flag expects, e.g.
//   --seed: 'x' is not an unsigned 64-bit integer (expected e.g. --seed 42)
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/common.hpp"

namespace tessel {

// A mistake in the command line (the binaries exit with status 2 on it).
class UsageError : public Error {
 public:
  using Error::Error;
};

namespace cli {

// Whole-string number parsers for flag values; `flag` names the flag in the message.
uint64_t parse_u64(const std::string& flag, const std::string& text);
int64_t parse_i64(const std::string& flag, const std::string& text, int64_t lo, int64_t hi);
// A finite double in [lo, hi].
double parse_double(const std::string& flag, const std::string& text, double lo, double hi);
// The tools' argument loop: the value after the flag argv[i], advancing i (UsageError "FLAG
// needs a value" when there is none), and whether an argument asks for the usage.
std::string next_value(int& i, int argc, char** argv);
bool is_help(const std::string& arg);
// --backend of the examples: "cpu" (false) or "cuda" (true); UsageError naming the flag otherwise.
bool parse_backend_is_cuda(const std::string& flag, const std::string& text);
// For the tools that run every device as a thread of one process (mlp, tessel-explain --run):
// a UsageError naming `tool` when a launcher started several processes (mpirun -np N, or
// RANK/WORLD_SIZE), since each process would run the whole job on its own; gpt and gpt_train
// run across processes.
void require_one_process(const std::string& tool);

// tessel-explain's options (see examples/explain.cpp for what each does).
struct ExplainOptions {
  std::string file;
  std::string mesh;        // --mesh (empty: the file's mesh)
  std::string links;       // --links SPEC or the text of --links @FILE, validated with CostModel::parse_links
  std::string links_file;  // the FILE of --links @FILE ("" otherwise)
  std::string dump_after;  // --dump-after: "", "parse", "propagate" or "partition"
  std::string trace;       // --trace
  std::string collective_matmul = "auto";  // --collective-matmul auto|on|off
  std::string ring = "auto";               // --ring auto|uni|bi
  std::vector<std::string> show;  // --show VALUE (repeatable; with or without the '%')
  bool why = false;
  bool run = false;
  bool auto_shard = false;          // --auto: tessel chooses the layouts (autoshard/auto_shard.hpp)
  int64_t memory_budget = 0;        // --memory-budget BYTES per device (with --auto; 0: none)
  double auto_seconds = 0;          // --auto-seconds S: the solver's time limit (0: AutoShardOptions' automatic one)
  std::string write_problem;        // --write-problem FILE (with --auto): the formulation in the IOPDDL contest's JSON
  int64_t stages = 0;               // --stages P: pipeline stage cuts by the cost model (pipeline/auto_stages.hpp)
  int64_t microbatches = 8;         // --microbatches M (with --stages): the step's micro-batches
  std::string stage_remat = "all";  // --remat none|all (with --stages): the stages keep or recompute their activations
  bool help = false;       // -h / --help: print usage_explain() and exit 0
  bool fusion = true;      // false: --no-fusion (the fuse-elementwise pass changes nothing)
  bool seed_given = false;
  uint64_t seed = 0;
  double tolerance = 1e-5;  // finite, >= 0
  int64_t device = 0;       // >= 0 (checked against the mesh by the caller)
};

// Parses argv[1..] of tessel-explain; throws UsageError. With --help the rest is not
// validated beyond recognising the flags.
ExplainOptions parse_explain_args(const std::vector<std::string>& args);
std::string usage_explain();

}  // namespace cli
}  // namespace tessel
