// src/cli.cpp — argument parsing of the example binaries (tessel/cli.hpp). Lives in the
// library, not in examples/, so the unit tests and the libFuzzer target fuzz/fuzz_cli.cpp
// can drive it without running a program. Numbers are parsed whole with strtoull/strtoll/
// strtod and an end-pointer check: std::stoull accepts "12abc" and wraps "-1" to 2^64-1,
// std::stod accepts "nan"; each of those is a UsageError naming the flag here.
#include "tessel/cli.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <algorithm>
#include <cstdlib>

#include "tessel/core/cost.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/runtime/launch.hpp"

namespace tessel::cli {

namespace {

bool has_space_or_empty(const std::string& t) {
  if (t.empty()) return true;
  for (char c : t)
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') return true;
  return false;
}

}  // namespace

uint64_t parse_u64(const std::string& flag, const std::string& text) {
  const auto bad = [&] {
    return UsageError(fmt::format("{}: '{}' is not an unsigned 64-bit integer (expected e.g. {} 42)",
                                  flag, text, flag));
  };
  if (has_space_or_empty(text) || text[0] == '-' || text[0] == '+') throw bad();
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end != text.c_str() + text.size() || errno == ERANGE) throw bad();
  return static_cast<uint64_t>(v);
}

int64_t parse_i64(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = has_space_or_empty(text) ? 0 : std::strtoll(text.c_str(), &end, 10);
  if (has_space_or_empty(text) || end != text.c_str() + text.size() || errno == ERANGE)
    throw UsageError(fmt::format("{}: '{}' is not an integer (expected an integer in [{}, {}])",
                                 flag, text, lo, hi));
  if (v < lo || v > hi)
    throw UsageError(fmt::format("{}: {} is out of range (expected an integer in [{}, {}])", flag,
                                 text, lo, hi));
  return static_cast<int64_t>(v);
}

double parse_double(const std::string& flag, const std::string& text, double lo, double hi) {
  const auto expect = [&] { return fmt::format("expected a finite number in [{}, {}]", lo, hi); };
  errno = 0;
  char* end = nullptr;
  const double v = has_space_or_empty(text) ? 0.0 : std::strtod(text.c_str(), &end);
  if (has_space_or_empty(text) || end != text.c_str() + text.size())
    throw UsageError(fmt::format("{}: '{}' is not a number ({})", flag, text, expect()));
  if (!std::isfinite(v) || v < lo || v > hi)
    throw UsageError(fmt::format("{}: {} is out of range ({})", flag, text, expect()));
  return v;
}

std::string next_value(int& i, int argc, char** argv) {
  if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", argv[i]));
  return argv[++i];
}

bool is_help(const std::string& arg) { return arg == "-h" || arg == "--help"; }

void require_one_process(const std::string& tool) {
  const LaunchInfo li = detect_launch();
  if (li.multi_process())
    throw UsageError(fmt::format("{} runs every device as a thread of one process, but a launcher ({}) started {} "
                                 "processes, which would each run the whole job; run it without a launcher, or "
                                 "use gpt or gpt_train, which run across processes under mpirun",
                                 tool, li.source == "mpi" ? "mpirun" : "RANK/WORLD_SIZE", li.world_size));
}

bool parse_backend_is_cuda(const std::string& flag, const std::string& text) {
  if (text == "cpu") return false;
  if (text == "cuda") return true;
  throw UsageError(fmt::format("{}: '{}' is not a backend (expected cpu or cuda)", flag, text));
}

std::string usage_explain() {
  return "usage: tessel-explain FILE [--mesh data=2,model=4] [--why] [--device N] [--show VALUE]\n"
         "                      [--links SPEC|@FILE] [--dump-after=STEP] [--no-fusion]\n"
         "                      [--collective-matmul auto|on|off] [--ring auto|uni|bi]\n"
         "                      [--run [--seed N] [--tolerance X] [--trace FILE]]\n"
         "                      [--auto [--memory-budget BYTES] [--auto-seconds S]]\n"
         "                      [--stages P [--microbatches M] [--remat all|none]]\n"
         "  --stages P     cut the graph (one micro-batch's forward ending in its one output, a\n"
         "                 float scalar loss; its float inputs the parameters) into P pipeline\n"
         "                 stages on the mesh by the cost model (docs/pipeline.md): prints each\n"
         "                 stage's values, the layout it sends, its predicted time and bytes, the\n"
         "                 step and bubble, and the equal cut's; with --auto also each stage's\n"
         "                 shape of the mesh's devices, within --memory-budget per stage\n"
         "  --microbatches M  --stages: the micro-batches of a step (default 8)\n"
         "  --remat all|none  --stages: each stage's backward recomputes its forward (all, the\n"
         "                 default) or the stage keeps the activations its backward reads (none,\n"
         "                 as gpt_train's stages do by default: their bytes counted per stage)\n"
         "  --auto         choose every layout the file does not annotate (automatic sharding,\n"
         "                 docs/auto-sharding.md): prints the chosen layouts as annotations, the\n"
         "                 predicted cost and memory, and why, then explains the program as usual\n"
         "  --memory-budget BYTES  --auto: the most bytes per device a plan may use (0: no limit)\n"
         "  --write-problem FILE  --auto: write the strategy-selection problem in the IOPDDL\n"
         "                 contest's JSON form (tessel-iopddl FILE SECONDS solves it) and exit\n"
         "  --auto-seconds S  --auto: the whole search's time limit (formulation, solves and\n"
         "                 budget checks; default 0: the solver gets 0.5 s or 0.15 ms per node of\n"
         "                 the problem, whichever is longer, after the formulation)\n"
         "  --show VALUE   draw the mesh with the block of VALUE each device holds (repeatable)\n"
         "  --links SPEC   per-axis link figures, e.g. 'model=bw:50e9,alpha:5e-6;data=bw:12.5e9'\n"
         "                 (bw in bytes/s, finite and > 0; alpha in seconds, finite and >= 0);\n"
         "                 @FILE reads them from a file, e.g. one written by\n"
         "                 tessel-bench --calibrate-links (format: docs/links.md)\n"
         "  --seed N       the seed of the random inputs of --run (unsigned 64-bit)\n"
         "  --tolerance X  the largest max_rel_err --run accepts (finite, >= 0; default 1e-5)\n"
         "  --dump-after STEP  stop after STEP and print its result: parse, propagate, partition,\n"
         "                 or a lowering pass (collective-matmul, pack, combine-collectives,\n"
         "                 fuse-elementwise, async-collectives, memory-plan: the Program text\n"
         "                 form, docs/program-ir.md)\n"
         "  --no-fusion    lower (and --run) without fusing elementwise chains (as TESSEL_FUSION=0)\n"
         "  --collective-matmul MODE  all-gather->einsum and einsum->reduce-scatter as rings of\n"
         "                 permutes overlapped with partial einsums: auto (where the cost model's\n"
         "                 estimate wins; the default), on, off (docs/collective-matmul.md)\n"
         "  --ring DIR     the ring's direction: auto (the cheaper estimate), uni, bi\n";
}

ExplainOptions parse_explain_args(const std::vector<std::string>& args) {
  ExplainOptions o;
  // Flags first, values after (so that --help wins over a bad value elsewhere).
  struct Pending {
    std::string flag, text;
  };
  std::vector<Pending> pending;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto is = [&](const char* name) { return a == name || a.rfind(std::string(name) + "=", 0) == 0; };
    auto value = [&](const char* name) -> std::string {
      const std::string prefix = std::string(name) + "=";
      if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
      if (i + 1 >= args.size()) throw UsageError(fmt::format("{} needs a value", name));
      return args[++i];
    };
    if (a == "--why") o.why = true;
    else if (a == "--run") o.run = true;
    else if (a == "--auto") o.auto_shard = true;
    else if (is("--memory-budget")) pending.push_back({"--memory-budget", value("--memory-budget")});
    else if (is("--auto-seconds")) pending.push_back({"--auto-seconds", value("--auto-seconds")});
    else if (is("--write-problem")) pending.push_back({"--write-problem", value("--write-problem")});
    else if (is("--stages")) pending.push_back({"--stages", value("--stages")});
    else if (is("--microbatches")) pending.push_back({"--microbatches", value("--microbatches")});
    else if (is("--remat")) pending.push_back({"--remat", value("--remat")});
    else if (a == "--no-fusion") o.fusion = false;
    else if (a == "-h" || a == "--help") o.help = true;
    else if (is("--seed")) pending.push_back({"--seed", value("--seed")});
    else if (is("--tolerance")) pending.push_back({"--tolerance", value("--tolerance")});
    else if (is("--device")) pending.push_back({"--device", value("--device")});
    else if (is("--trace")) o.trace = value("--trace");
    else if (is("--mesh")) o.mesh = value("--mesh");
    else if (is("--links")) pending.push_back({"--links", value("--links")});
    else if (is("--show")) {
      std::string v = value("--show");
      if (!v.empty() && v[0] == '%') v = v.substr(1);
      if (v.empty()) throw UsageError("--show needs a value name, e.g. --show h (or --show %h)");
      o.show.push_back(v);
    }
    else if (is("--dump-after")) o.dump_after = value("--dump-after");
    else if (is("--collective-matmul")) o.collective_matmul = value("--collective-matmul");
    else if (is("--ring")) o.ring = value("--ring");
    else if (!a.empty() && a[0] == '-') throw UsageError(fmt::format("unknown option '{}'", a));
    else if (o.file.empty()) o.file = a;
    else throw UsageError(fmt::format("unexpected argument '{}' (one FILE only)", a));
  }
  if (o.help) return o;
  for (const Pending& p : pending) {
    if (p.flag == "--seed") {
      o.seed = parse_u64(p.flag, p.text);
      o.seed_given = true;
    } else if (p.flag == "--tolerance") {
      o.tolerance = parse_double(p.flag, p.text, 0.0, 1e300);
    } else if (p.flag == "--memory-budget") {
      o.memory_budget = parse_i64(p.flag, p.text, 0, INT64_MAX);
    } else if (p.flag == "--auto-seconds") {
      o.auto_seconds = parse_double(p.flag, p.text, 0, 3600);
    } else if (p.flag == "--write-problem") {
      if (p.text.empty()) throw UsageError("--write-problem needs a file name");
      o.write_problem = p.text;
    } else if (p.flag == "--stages") {
      o.stages = parse_i64(p.flag, p.text, 1, 4096);
    } else if (p.flag == "--microbatches") {
      o.microbatches = parse_i64(p.flag, p.text, 1, 1 << 20);
    } else if (p.flag == "--remat") {
      if (p.text != "all" && p.text != "none")
        throw UsageError(fmt::format("--remat {}: expected all or none (a pipeline stage does not take einsums)", p.text));
      o.stage_remat = p.text;
    } else if (p.flag == "--device") {
      o.device = parse_i64(p.flag, p.text, 0, INT64_MAX);
    } else if (p.flag == "--links") {
      std::string text = p.text;
      if (!text.empty() && text[0] == '@') {
        o.links_file = text.substr(1);
        if (o.links_file.empty()) throw UsageError("--links @FILE: the file name is missing");
        try {
          text = read_links_file(o.links_file);
        } catch (const Error& e) {
          throw UsageError(fmt::format("--links: {}", e.what()));
        }
      }
      CostModel check;
      try {
        check.parse_links(text);
      } catch (const Error& e) {
        throw UsageError(fmt::format("--links{}: {}", o.links_file.empty() ? "" : " @" + o.links_file, e.what()));
      }
      o.links = text;
    }
  }
  auto one_of = [](const char* flag, const std::string& v, std::vector<std::string> known) {
    if (std::find(known.begin(), known.end(), v) == known.end())
      throw UsageError(fmt::format("{}={}: expected one of {}", flag, v, join(known, ", ")));
  };
  one_of("--collective-matmul", o.collective_matmul, {"auto", "on", "off"});
  one_of("--ring", o.ring, {"auto", "uni", "bi"});
  if (!o.dump_after.empty()) {
    std::vector<std::string> known = {"parse", "propagate", "partition"};
    for (const std::string& pass : default_program_pass_names()) known.push_back(pass);
    if (std::find(known.begin(), known.end(), o.dump_after) == known.end())
      throw UsageError(fmt::format("--dump-after={}: expected one of {}", o.dump_after, join(known, ", ")));
  }
  if (!o.auto_shard)
    for (const Pending& p : pending)
      if (p.flag == "--memory-budget" || p.flag == "--auto-seconds" || p.flag == "--write-problem")
        throw UsageError(fmt::format("{} needs --auto (it sets the automatic sharding's search)", p.flag));
  if (o.stages == 0)
    for (const Pending& p : pending)
      if (p.flag == "--microbatches" || p.flag == "--remat")
        throw UsageError(fmt::format("{} needs --stages P (the pipeline's stage cuts)", p.flag));
  if (o.file.empty()) throw UsageError("no FILE given (a graph in the text form, docs/ir.md)");
  return o;
}

}  // namespace tessel::cli
