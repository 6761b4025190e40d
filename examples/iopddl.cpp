// tessel-iopddl FILE SECONDS [--seed N] [--iterations N] [--exact | --anytime] [--trace PATH]
//
// Solves one IOPDDL contest problem (ASPLOS/EuroSys 2025; .json or .json.gz) with tessel's
// auto-sharding solver and prints, as the last line of stdout, the contest's answer: the
// strategy of every node, e.g. [0, 2, 1]. Progress (better plans as they are found, the final
// cost and peak memory) goes to stderr. The answer is printed within SECONDS of the start.
//
// By default two threads race: the anytime search, and (when the coarsened integer program is
// small enough, SolveOptions::exact_max_variables) CBC on it. The better plan at the deadline
// wins; a CBC proof of optimality stops the search early. CBC looks at its clock only between
// steps of its search and was seen to overrun its limit by 20-45 s (IOPDDL A and D): it gets
// 80% of the time as its own limit, and the tool does not wait for it: at the deadline it
// prints and ends the process, CBC with it. CBC starts from the plan of a short anytime run
// of its own (a warm start), and a search that has stopped improving while CBC runs stops
// and leaves the CPU to CBC.
// Exit status: 0 with a feasible plan; 1 when no plan fits (the plan of least memory is still
// printed); 2 for bad arguments or a bad file (the message names the file and the item).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "tessel/autoshard/problem.hpp"
#include "tessel/autoshard/solver.hpp"

namespace {

const char* kUsage =
    "usage: tessel-iopddl FILE SECONDS [--seed N] [--iterations N] [--exact | --anytime | --wcsp] [--trace PATH]\n"
    "  FILE        an IOPDDL problem (.json or .json.gz)\n"
    "  SECONDS     the time limit; the answer is printed within it\n"
    "  --seed N    the search's seed (default 1)\n"
    "  --iterations N  stop after N improvement steps (deterministic plan)\n"
    "  --exact     only the integer program on CBC (small problems)\n"
    "  --anytime   only the anytime search (default: anytime, and beside it CBC when the program is\n"
    "              small, or the Lagrangian relaxation on toulbar2 when only the groups are few)\n"
    "  --wcsp      only the Lagrangian relaxation with toulbar2 for the priced problem (a lower bound)\n"
    "  --trace PATH  write every better plan's time (s since start) and cost to PATH\n";

int usage(const char* msg) {
  std::fprintf(stderr, "tessel-iopddl: %s\n%s", msg, kUsage);
  return 2;
}

// A non-negative integer, all of s.
bool parse_count(const char* s, uint64_t& out) {
  if (*s < '0' || *s > '9') return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(s, &end, 10);
  return *end == '\0' && errno == 0;
}

bool parse_number(const char* s, double& out) {
  char* end = nullptr;
  out = std::strtod(s, &end);
  return end != s && *end == '\0' && std::isfinite(out);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessel::autoshard;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("tessel-iopddl: solves an IOPDDL contest problem; the last line of stdout is the answer\n%s", kUsage);
      return 0;
    }
  if (argc < 3) return usage("expected FILE and SECONDS");
  const std::string path = argv[1];
  double seconds = 0;
  if (!parse_number(argv[2], seconds) || seconds <= 0)
    return usage(fmt::format("SECONDS must be a positive number, got '{}'", argv[2]).c_str());
  SolveOptions options;
  bool exact = false, anytime_only = false, wcsp_only = false;
  std::string trace_path;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    uint64_t v = 0;
    if ((a == "--seed" || a == "--iterations") && i + 1 < argc) {
      if (!parse_count(argv[i + 1], v) || (a == "--iterations" && v > static_cast<uint64_t>(INT64_MAX)))
        return usage(fmt::format("{} needs a non-negative integer, got '{}'", a, argv[i + 1]).c_str());
      if (a == "--seed") options.seed = v;
      else options.max_iterations = static_cast<int64_t>(v);
      ++i;
    } else if (a == "--trace" && i + 1 < argc) {
      trace_path = argv[++i];
    } else if (a == "--exact") {
      exact = true;
    } else if (a == "--anytime") {
      anytime_only = true;
    } else if (a == "--wcsp") {
      wcsp_only = true;
    } else {
      return usage(fmt::format("unknown argument '{}'", a).c_str());
    }
  }
  try {
    const Problem problem = read_iopddl(path);
    const double read_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::fprintf(stderr, "tessel-iopddl: %s: %zu nodes, %zu edges, usage limit %s, read in %.2f s\n", path.c_str(),
                 problem.nodes.size(), problem.edges.size(),
                 problem.usage_limit ? std::to_string(*problem.usage_limit).c_str() : "none", read_s);
    // Keep a margin for printing the answer (a 65,000-entry line), the last search step and
    // process exit: 1 s was 0.45 s short on IOPDDL Q on the loaded 2-core machine.
    options.time_limit_s = std::max(0.05, seconds - read_s - std::min(2.5, 0.04 * seconds));
    double last_print = -1;
    std::atomic<double> last_improvement{0.0};  // seconds since t0, of the search's last better plan
    options.on_improvement = [&](const TracePoint& tp) {
      const double now = std::chrono::duration<double>(Clock::now() - t0).count();
      last_improvement = now;
      if (now - last_print < 0.5 && last_print >= 0) return;
      last_print = now;
      std::fprintf(stderr, "  %8.2f s  cost %s  (step %lld)\n", now, cost_str(tp.cost).c_str(),
                   static_cast<long long>(tp.iteration));
    };
    // The exact method beside the anytime search (see the file comment).
    std::mutex mu;
    std::condition_variable cv;
    bool exact_done = false;
    SolveResult exact_result;
    std::atomic<bool> stop{false};
    std::thread exact_thread;
    if (static_cast<int>(exact) + static_cast<int>(anytime_only) + static_cast<int>(wcsp_only) > 1)
      return usage("give one of --exact, --anytime and --wcsp");
    const ExactProgramShape shape = exact_program_shape(problem);
    const int64_t program_size = shape.variables, groups = shape.groups;
    // The coarsening and pruning took time from the limit: the solvers get what is left.
    {
      const double spent = std::chrono::duration<double>(Clock::now() - t0).count();
      options.time_limit_s = std::max(0.05, seconds - spent - std::min(2.5, 0.04 * seconds));
    }
    // Too large for CBC but of few groups (V: 339 groups, 1.1 million variables): the Lagrangian
    // relaxation on toulbar2 beside the search instead, when toulbar2 is installed.
    const bool use_wcsp = wcsp_only || (!exact && !anytime_only && program_size > options.exact_max_variables &&
                                        groups <= 2000 && wcsp_available());
    const bool race = !exact && !anytime_only && !wcsp_only &&
                      (program_size <= options.exact_max_variables || use_wcsp);
    std::fprintf(stderr,
                 "tessel-iopddl: the exact program (over the coarsened problem: %lld groups with a choice) has %lld "
                 "variables: %s\n",
                 static_cast<long long>(groups), static_cast<long long>(program_size),
                 exact          ? "CBC alone (--exact)"
                 : anytime_only ? "the anytime search alone (--anytime)"
                 : wcsp_only    ? "the Lagrangian relaxation on toulbar2 alone (--wcsp)"
                 : race && use_wcsp
                     ? "too large for CBC; the Lagrangian relaxation on toulbar2 beside the anytime search"
                 : race ? "CBC beside the anytime search"
                        : fmt::format("above {}, the anytime search alone", options.exact_max_variables).c_str());
    options.stop = &stop;  // before the thread copies the options
    if (race) {
      exact_thread = std::thread([&] {
        SolveOptions eo = options;
        eo.on_improvement = nullptr;
        eo.stop = nullptr;
        // A warm start: a short anytime run of its own (its Lagrangian phase finds a good
        // plan in a few seconds on these small programs). It bounds CBC's search from the
        // start: IOPDDL P was proven optimal in 51 s with it, 224 s without.
        SolveOptions wo = eo;
        wo.time_limit_s = std::min(10.0, 0.1 * options.time_limit_s);
        wo.bound_under_limit = false;  // (a plan to start from; the search beside bounds the optimum)
        const auto w0 = Clock::now();
        eo.warm_start = solve_anytime(problem, wo).plan;
        // 80% of the time: CBC overran its limit by up to 45 s, and an incumbent it returns
        // after the deadline is lost (the search's plan is printed then).
        eo.time_limit_s = std::max(0.1, 0.8 * options.time_limit_s - std::chrono::duration<double>(Clock::now() - w0).count());
        SolveResult er = use_wcsp ? solve_wcsp(problem, eo) : solve_exact(problem, eo);
        er.seconds = std::chrono::duration<double>(Clock::now() - t0).count() - read_s;  // since the solve began
        std::lock_guard<std::mutex> lock(mu);
        exact_result = std::move(er);
        exact_done = true;
        if (exact_result.status == SolveStatus::optimal) stop = true;
        cv.notify_all();
      });
    }
    // While CBC runs, a search that has found nothing better for max(20 s, a quarter of the
    // limit), after its first 30%, stops and leaves the CPU to CBC (on this 2-core machine the
    // two share it with other work); the answer is still given at the deadline.
    std::atomic<bool> search_done{false};
    std::thread monitor;
    if (race)
      monitor = std::thread([&] {
        while (!search_done) {
          std::this_thread::sleep_for(std::chrono::milliseconds(250));
          const double now = std::chrono::duration<double>(Clock::now() - t0).count();
          bool cbc_running;
          {
            std::lock_guard<std::mutex> lock(mu);
            cbc_running = !exact_done;
          }
          if (cbc_running && now - read_s > 0.3 * options.time_limit_s &&
              now - std::max(last_improvement.load(), read_s) > std::max(20.0, 0.25 * options.time_limit_s)) {
            stop = true;
            return;
          }
        }
      });
    SolveResult r = exact ? solve_exact(problem, options) : wcsp_only ? solve_wcsp(problem, options)
                                                                       : solve_anytime(problem, options);
    search_done = true;
    if (monitor.joinable()) monitor.join();
    if (race) {
      const double search_bound = r.lower_bound;
      const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                     read_s + options.time_limit_s));
      std::unique_lock<std::mutex> lock(mu);
      // (a search that proved its plan optimal does not wait for CBC)
      if (r.status != SolveStatus::optimal) cv.wait_until(lock, deadline, [&] { return exact_done; });
      if (exact_done && exact_result.evaluation.feasible() &&
          (!r.evaluation.feasible() || exact_result.evaluation.cost <= r.evaluation.cost)) {
        const TracePoint tp{exact_result.seconds, exact_result.evaluation.cost, r.iterations};
        std::vector<TracePoint> trace = r.trace;
        if (trace.empty() || tp.cost < trace.back().cost) trace.push_back(tp);
        const double first = r.first_feasible_s >= 0 ? std::min(r.first_feasible_s, tp.seconds) : tp.seconds;
        const int64_t steps = r.iterations;
        r = exact_result;
        r.method = use_wcsp ? "Lagrangian + WCSP (toulbar2) beside anytime" : "exact (CBC) beside anytime";
        r.trace = std::move(trace);
        r.first_feasible_s = first;
        r.iterations = steps;
      } else if (r.status != SolveStatus::optimal) {
        r.method = exact_done ? (use_wcsp ? "anytime beside Lagrangian + WCSP (toulbar2), which found nothing better"
                                          : "anytime beside exact (CBC), which found nothing better")
                              : (use_wcsp ? "anytime (toulbar2 still running)" : "anytime (CBC still running)");
      }
      // Each method's bound is proven: the greater holds.
      r.lower_bound = std::max(search_bound, exact_done ? exact_result.lower_bound : -1.0);
    }
    const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::string first_feasible =
        r.first_feasible_s >= 0 ? fmt::format("first feasible at {:.2f} s", r.first_feasible_s + read_s) : "none feasible";
    std::fprintf(stderr, "tessel-iopddl: %s: %s, cost %s, peak usage %lld at t=%lld, %lld steps, %s, done at %.2f s\n",
                 r.method.c_str(), status_name(r.status), cost_str(r.evaluation.cost).c_str(),
                 static_cast<long long>(r.evaluation.peak_usage), static_cast<long long>(r.evaluation.peak_time),
                 static_cast<long long>(r.iterations), first_feasible.c_str(), total_s);
    if (r.lower_bound > 0 && r.evaluation.feasible())
      std::fprintf(stderr, "tessel-iopddl: lower bound %.0f: the plan costs at most %.4fx the optimum\n", r.lower_bound,
                   static_cast<double>(r.evaluation.cost) / r.lower_bound);
    else if (r.evaluation.feasible())
      std::fprintf(stderr, "tessel-iopddl: no lower bound above zero was proven within the limit (the gap to the "
                           "optimum is unknown; a longer limit gives the bound's thread more time)\n");
    if (r.status == SolveStatus::infeasible)
      std::fprintf(stderr, "tessel-iopddl: %s: no plan fits the usage limit%s; printing the plan of least memory\n",
                   path.c_str(), r.evaluation.uses_infinite ? " without an infinite cost" : "");
    else if (!r.evaluation.feasible())
      std::fprintf(stderr, "tessel-iopddl: %s: no feasible plan found within %.1f s; printing the plan of least memory\n",
                   path.c_str(), seconds);
    if (!trace_path.empty()) {
      std::FILE* f = std::fopen(trace_path.c_str(), "w");
      if (f == nullptr) {
        std::fprintf(stderr, "tessel-iopddl: cannot write the trace to %s\n", trace_path.c_str());
      } else {
        for (const TracePoint& tp : r.trace)
          std::fprintf(f, "%.4f %s\n", tp.seconds + read_s, cost_str(tp.cost).c_str());
        std::fclose(f);
      }
    }
    std::printf("%s\n", format_plan(r.plan).c_str());
    std::fflush(stdout);
    const int rc = r.evaluation.feasible() ? 0 : 1;
    if (exact_thread.joinable()) {
      bool done = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        done = exact_done;
      }
      if (!done) {  // CBC is past the deadline: end the process rather than wait for it
        std::fflush(stderr);
        std::_Exit(rc);
      }
      exact_thread.join();
    }
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessel-iopddl: %s\n", e.what());
    return 2;
  }
}
