// calibrate_links (tessel/runtime/calibrate.hpp) on the in-process thread communicator: one
// entry per axis of size > 1 with positive finite figures, and a file that
// CostModel::parse_links reads back to the same figures. No timing assertions: the figures
// of a shared machine are whatever they are; only their form is checked.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tessel/compiler/compiled_program.hpp"
#include "tessel/core/cost.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/runtime/backend_cost.hpp"
#include "tessel/runtime/calibrate.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

using namespace tessel;

TEST_CASE("calibrate_links: alpha and bandwidth per axis in the --links format", "[calibrate][runtime]") {
  const Mesh mesh = Mesh::parse("data=2,one=1,model=2");
  ThreadRuntime rt(mesh.num_devices());
  CalibrationOptions o;
  o.large_bytes = 256u << 10;
  o.iterations = 3;
  o.warmup = 1;
  const LinkCalibration cal = calibrate_links(rt, mesh, o);
  REQUIRE(cal.runtime == "threads");
  REQUIRE(cal.axes.size() == 2);  // the size-1 axis moves nothing
  CHECK(cal.axes[0].axis == "data");
  CHECK(cal.axes[1].axis == "model");
  for (const auto& a : cal.axes) {
    INFO(a.axis);
    CHECK(a.group_size == 2);
    CHECK(std::isfinite(a.link.alpha_s));
    CHECK(a.link.alpha_s > 0);
    CHECK(std::isfinite(a.link.bandwidth));
    CHECK(a.link.bandwidth > 0);
    CHECK(a.busbw > 0);
  }
  const std::string file = cal.to_links_file("test machine");
  INFO(file);
  CHECK_THAT(file, Catch::StartsWith("# tessel link figures"));
  CHECK_THAT(file, Catch::Contains("machine test machine"));
  CostModel cm;
  cm.parse_links(file);
  REQUIRE(cm.links.size() == 2);
  for (const auto& a : cal.axes) {
    const LinkSpec& l = cm.links.at(a.axis);
    CHECK(l.bandwidth == Approx(a.link.bandwidth).epsilon(1e-5));
    CHECK(l.alpha_s == Approx(a.link.alpha_s).epsilon(1e-5));
  }
  // The cost model then prices a collective over the axis with the measured figures.
  const double s = cm.collective_seconds(CollectiveKind::AllReduce, mesh, {"model"}, 1 << 20);
  CHECK(s == Approx(cal.axes[1].link.alpha_s + (1 << 20) * 1.0 / cal.axes[1].link.bandwidth));
}

TEST_CASE("calibrate_links: bad options and a mesh the runtime cannot run are errors", "[calibrate][runtime]") {
  ThreadRuntime rt(2);
  CalibrationOptions o;
  o.small_bytes = 6;
  CHECK_THROWS_WITH(calibrate_links(rt, Mesh::parse("x=2"), o), Catch::Contains("multiples of 4"));
  o = CalibrationOptions{};
  o.iterations = 0;
  CHECK_THROWS_WITH(calibrate_links(rt, Mesh::parse("x=2"), o), Catch::Contains("iterations"));
  CHECK_THROWS_AS(calibrate_links(rt, Mesh::parse("x=4"), CalibrationOptions{}), RuntimeError);
  // Nothing to measure on a one-device mesh: an empty, still parseable file.
  ThreadRuntime one(1);
  const LinkCalibration cal = calibrate_links(one, Mesh::parse("x=1"), CalibrationOptions{});
  CHECK(cal.axes.empty());
  CostModel cm;
  cm.parse_links(cal.to_links_file());
  CHECK(cm.links.empty());
}

TEST_CASE("parse_links: the file form takes newlines and comments and blanks", "[calibrate][cost]") {
  CostModel cm;
  cm.parse_links("# measured on a test box\n"
                 "data=bw:12.5e9,alpha:2e-5   # slow links\n"
                 "\n"
                 "  model=bw:4.5e11\r\n"
                 "x=alpha:1e-6;y=bw:1e9\n");
  REQUIRE(cm.links.size() == 4);
  CHECK(cm.links.at("data").bandwidth == 12.5e9);
  CHECK(cm.links.at("data").alpha_s == 2e-5);
  CHECK(cm.links.at("model").bandwidth == 4.5e11);
  CHECK(cm.links.at("model").alpha_s == cm.default_link.alpha_s);
  CHECK(cm.links.at("x").alpha_s == 1e-6);
  CHECK(cm.links.at("y").bandwidth == 1e9);
  // format_links writes what parse_links reads.
  CostModel back;
  back.parse_links(format_links(cm.links));
  for (const auto& kv : cm.links) {
    CHECK(back.links.at(kv.first).bandwidth == Approx(kv.second.bandwidth));
    CHECK(back.links.at(kv.first).alpha_s == Approx(kv.second.alpha_s));
  }
  // Errors still name the entry.
  CHECK_THROWS_WITH(cm.parse_links("data=bw:1e9\nmodel=bw:fast\n"), Catch::Contains("model=bw:fast"));
  CHECK_THROWS_WITH(read_links_file("/nonexistent/links.txt"), Catch::Contains("/nonexistent/links.txt"));
  // A wrong path to something endless fails at once.
  CHECK_THROWS_WITH(read_links_file("/dev/zero"), Catch::Contains("larger than 1 MiB"));
}

TEST_CASE("calibrate_compute and measured_cost_model: this host's figures in the cost model", "[calibrate][runtime]") {
  CalibrationOptions o;
  o.large_bytes = 256u << 10;
  o.iterations = 3;
  o.warmup = 1;
  const ComputeCalibration c = calibrate_compute(o);
  CHECK(c.gemm_seconds > 0);
  CHECK(c.stream_seconds > 0);
  CHECK(std::isfinite(c.flops_per_s));
  CHECK(c.flops_per_s == Approx(2.0 * 512 * 512 * 512 / c.gemm_seconds));
  CHECK(c.memory_bandwidth == Approx(3.0 * (16 << 20) / c.stream_seconds));
  const Mesh mesh = Mesh::parse("data=2,model=2");
  ThreadRuntime rt(mesh.num_devices());
  const CostModel cm = measured_cost_model(rt, mesh, o);
  CHECK(cm.links.size() == 2);
  CHECK(cm.flops_per_s > 0);
  CHECK(cm.memory_bandwidth > 0);
  CHECK(cm.compute_sharing == Approx(compute_sharing(4, static_cast<int64_t>(std::thread::hardware_concurrency()))));
  CHECK(cm.dispatch_s >= 0);  // calibrate_dispatch's, per instruction over the sharing
  CHECK(cm.run_s > 0);
  CHECK_NOTHROW(cm.validate());
  o.iterations = 0;
  CHECK_THROWS_WITH(calibrate_compute(o), Catch::Contains("iterations"));
}

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string d = (std::filesystem::temp_directory_path() / ("tessel-test-" + name + "-" +
                                                                    std::to_string(::getpid()))).string();
  std::filesystem::remove_all(d);
  return d;
}

}  // namespace

TEST_CASE("backend_cost_model: CPU devices are measured once and then read from the cache", "[calibrate][runtime]") {
  const Mesh mesh = Mesh::parse("data=2,model=2");
  ThreadRuntime rt(mesh.num_devices());
  BackendCostOptions o;
  o.cache_dir = fresh_dir("cost-cache");
  o.calibration.large_bytes = 256u << 10;
  o.calibration.iterations = 3;
  o.calibration.warmup = 1;
  const BackendCost first = backend_cost_model(rt, mesh, o);
  CHECK(first.measured_now);
  REQUIRE(!first.cache_file.empty());
  CHECK(std::filesystem::exists(first.cache_file));
  CHECK(first.cache_file.find("cost-threads-data=2,model=2-") != std::string::npos);
  CHECK_THAT(first.source, Catch::Contains("this machine's measured figures") && Catch::Contains("saved in"));
  CHECK(first.cost != CostModel{});
  CHECK(first.cost.links.size() == 2);
  const BackendCost second = backend_cost_model(rt, mesh, o);
  CHECK(!second.measured_now);
  CHECK_THAT(second.source, Catch::Contains("read from " + first.cache_file));
  CHECK(second.cost == first.cost);  // the plan's figures do not move between runs
  // Another mesh is another key.
  const Mesh other = Mesh::parse("data=4");
  CHECK(backend_cost_model(rt, other, o).measured_now);
  // A damaged file is measured again and replaced.
  // The figures a plan prices dispatch and runs with are kept too.
  CHECK(second.cost.dispatch_s == first.cost.dispatch_s);
  CHECK(second.cost.run_s == first.cost.run_s);
  // (a fit: 0 when the machine's noise swamps a step's fixed cost, as under a loaded ctest -j2)
  CHECK(first.cost.run_s >= 0);
  CHECK(second.cost.launch_s == first.cost.launch_s);
  CHECK(first.cost.launch_s >= 0);
  CHECK(first.cost.launch_s <= first.cost.run_s);
  // A file of an earlier format (no dispatch_s, run_s, launch_s) is measured again.
  {
    std::ifstream in(first.cache_file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string old;
    std::istringstream lines(text);
    for (std::string l; std::getline(lines, l);)
      if (l.rfind("dispatch_s=", 0) != 0 && l.rfind("run_s=", 0) != 0 && l.rfind("launch_s=", 0) != 0)
        old += l + "\n";
    std::ofstream(first.cache_file) << old;
  }
  const BackendCost refreshed = backend_cost_model(rt, mesh, o);
  CHECK(refreshed.measured_now);
  CHECK_THAT(refreshed.source, Catch::Contains("dispatch_s, run_s or launch_s is missing"));
  { std::ofstream(first.cache_file) << "# tessel cost model v1\nflops_per_s=banana\n"; }
  const BackendCost third = backend_cost_model(rt, mesh, o);
  CHECK(third.measured_now);
  CHECK_THAT(third.source, Catch::Contains("was unreadable") && Catch::Contains("banana"));
  CHECK(!backend_cost_model(rt, mesh, o).measured_now);
  // Without the cache nothing is read or written.
  BackendCostOptions none = o;
  none.use_cache = false;
  const BackendCost uncached = backend_cost_model(rt, mesh, none);
  CHECK(uncached.measured_now);
  CHECK(uncached.cache_file.empty());
  CHECK_THAT(uncached.source, Catch::Contains("not cached"));
  // An unwritable directory: the figures are still used, and the source says why they were not saved.
  BackendCostOptions bad = o;
  bad.cache_dir = "/proc/tessel-cannot-write-here";
  const BackendCost unsaved = backend_cost_model(rt, mesh, bad);
  CHECK(unsaved.cost.links.size() == 2);
  CHECK_THAT(unsaved.source, Catch::Contains("not cached: cannot write"));
  std::filesystem::remove_all(o.cache_dir);
}

TEST_CASE("backend_cost_model: the cache directory follows TESSEL_CACHE_DIR then XDG_CACHE_HOME then HOME", "[calibrate]") {
  const char* keep[] = {"TESSEL_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
  std::vector<std::optional<std::string>> saved;
  for (const char* k : keep) saved.push_back(std::getenv(k) ? std::optional<std::string>(std::getenv(k)) : std::nullopt);
  ::setenv("TESSEL_CACHE_DIR", "/a", 1);
  ::setenv("XDG_CACHE_HOME", "/b", 1);
  ::setenv("HOME", "/c", 1);
  CHECK(default_cost_cache_dir() == "/a");
  ::unsetenv("TESSEL_CACHE_DIR");
  CHECK(default_cost_cache_dir() == "/b/tessel");
  ::unsetenv("XDG_CACHE_HOME");
  CHECK(default_cost_cache_dir() == "/c/.cache/tessel");
  ::unsetenv("HOME");
  CHECK(default_cost_cache_dir().empty());
  for (std::size_t i = 0; i < 3; ++i)
    if (saved[i]) ::setenv(keep[i], saved[i]->c_str(), 1);
  CHECK_THAT(machine_description(), Catch::Contains("hardware threads, host "));
}

TEST_CASE("calibrate_dispatch: the runtime's cost per instruction and per run", "[calibrate][runtime]") {
  const Mesh mesh = Mesh::parse("data=2");
  ThreadRuntime rt(mesh.num_devices());
  CalibrationOptions o;
  o.iterations = 5;
  o.warmup = 1;
  const DispatchCalibration d = calibrate_dispatch(rt, mesh, o);
  CHECK(d.short_seconds > 0);
  CHECK(d.long_seconds > 0);
  CHECK(d.per_instruction_s >= 0);
  CHECK(d.per_run_s >= 0);
  CHECK(d.resident_seconds > 0);
  CHECK(d.per_launch_s >= 0);
  CHECK(d.per_launch_s <= d.per_run_s);  // the run alone: no transfer
  // The fit: the short chain's time is its run plus its instructions (when the long one took longer);
  // a noisy pair whose line crosses zero clamps the per-run cost at 0, and then the instructions
  // alone already reach past the short chain's time.
  const double fitted = d.per_run_s + static_cast<double>(d.short_chain) * d.per_instruction_s;
  if (d.long_seconds > d.short_seconds) {
    if (d.per_run_s > 0)
      CHECK(fitted == Approx(d.short_seconds));
    else
      CHECK(fitted >= d.short_seconds);
  }
  o.iterations = 0;
  CHECK_THROWS_WITH(calibrate_dispatch(rt, mesh, o), Catch::Contains("iterations"));
}

TEST_CASE("time_kernels and predict_program: a program's kernels timed as its devices run them", "[calibrate][runtime]") {
  // A small MLP step on data=2: products, a gelu, a loss; every kernel runs on made-up inputs.
  Graph g;
  Tensor x = input(g, "x", DType::f32, {32, 64});
  Tensor w1 = input(g, "w1", DType::f32, {64, 256});
  Tensor w2 = input(g, "w2", DType::f32, {256, 64});
  Tensor y = einsum("bf,fd->bd", gelu(einsum("bd,df->bf", x, w1)), w2);
  g.mark_output(reduce_sum(mul(y, y), {0, 1}));
  g.annotate(x, Sharding::parse("[{data}, {}]"));
  const Mesh mesh = Mesh::parse("data=2");
  const Program low = lower_program(compile_program(g, mesh).program);
  CalibrationOptions o;
  o.iterations = 5;
  o.warmup = 1;
  const KernelTimes one = time_kernels(low, 1, o), two = time_kernels(low, 2, o);
  // Devices that wait for each other at a collective between kernels (the all-reduce of the
  // loss's partial sums, then a kernel after it), and devices that do not.
  {
    Graph g2 = g.clone();
    g2.outputs.clear();
    const Tensor loss = g2.tensor(g.outputs.at(0));
    g2.mark_output(mul(loss, loss));
    const Program low2 = lower_program(compile_program(g2, mesh).program);
    bool between = false, kernel_seen = false;
    for (const Instr& in : low2.instrs) {
      if (in.kind == InstrKind::Kernel) kernel_seen = true;
      if (in.kind == InstrKind::CollectiveDone && kernel_seen) between = true;
    }
    CHECK(between);
    CalibrationOptions free = o;
    free.sync_at_collectives = false;
    const KernelTimes waited = time_kernels(low2, 2, o), straight = time_kernels(low2, 2, free);
    CHECK(waited.sequence_s > 0);
    CHECK(straight.sequence_s > 0);
    CHECK(waited.sync_points == 1);  // the kernel after the all-reduce
    CHECK(straight.sync_points == 0);
    // The collectives are priced in full either way, α too (bench/results/2026-12-04T0649: priced
    // at their bandwidth terms alone, the hand layouts' many collectives came out 18% fast and
    // the slower layouts ran in one round of five).
    CostModel c2;
    c2.links["data"] = LinkSpec{5e-5, 1e9};
    CHECK(predict_program(low2, c2, &waited).comm_s == Approx(low2.comm_seconds(c2)));
    CHECK(predict_program(low2, c2, &straight).comm_s == Approx(low2.comm_seconds(c2)));
  }
  int64_t kernels = 0;
  for (const Instr& in : low.instrs) kernels += in.kind == InstrKind::Kernel;
  CHECK(one.kernels == kernels);
  CHECK(one.untimed.empty());
  CHECK(one.sequence_s > 0);
  CHECK(two.devices == 2);
  for (std::size_t i = 0; i < low.instrs.size(); ++i) {
    CHECK(one.timed[i] == (low.instrs[i].kind == InstrKind::Kernel));
    if (one.timed[i]) CHECK(one.seconds[i] > 0);
  }
  // The prediction adds the terms; timed, its compute is the devices' pass over the kernels.
  CostModel cost;
  cost.run_s = 1e-4;
  const ProgramPrediction p = predict_program(low, cost, &one);
  CHECK(p.timed);
  CHECK(p.compute_s >= one.sequence_s);
  CHECK(p.comm_s == Approx(low.comm_seconds(cost)));
  CHECK(p.dispatch_s == Approx(low.dispatch_seconds(cost)));
  CHECK(p.run_s == 1e-4);
  CHECK(p.total() == Approx(p.compute_s + p.comm_s + p.dispatch_s + p.run_s));
  CHECK_THAT(p.to_string(), Catch::Contains("[timed kernels]"));
  // A run of resident inputs: the launch instead of the transfers.
  cost.launch_s = 4e-5;
  const ProgramPrediction pl = predict_program(low, cost, &one);
  CHECK(pl.launch_s == 4e-5);
  CHECK(pl.resident_total() == Approx(pl.compute_s + pl.comm_s + pl.dispatch_s + 4e-5));
  CHECK(pl.resident_total() < pl.total());
  cost.launch_s = 2e-4;  // more than run_s: refused
  CHECK_THROWS_WITH(cost.validate(), Catch::Contains("launch_s"));
  cost.launch_s = 0;
  const ProgramPrediction roof = predict_program(low, cost);
  CHECK(!roof.timed);
  CHECK_THAT(roof.to_string(), Catch::Contains("[roofline]"));
  // predict_on a thread runtime times the kernels on its local devices.
  ThreadRuntime rt(2);
  CHECK(predict_on(low, cost, rt).timed);
  // The plan replaces other layouts only when predicted at least 10% faster (one process: its own answer).
  ProgramPrediction fast = p, slow = p;
  slow.run_s = p.run_s + p.total();  // twice the time
  CHECK(plan_predicted_faster(fast, slow, rt));
  CHECK_FALSE(plan_predicted_faster(slow, fast, rt));
  CHECK_FALSE(plan_predicted_faster(p, p, rt));  // equal: not 10% faster
  CHECK(plan_predicted_faster(p, p, rt, 1.0));
  CHECK_THROWS_WITH(plan_predicted_faster(p, p, rt, 0), Catch::Contains("margin 0"));
  // Kernel times of another program are refused.
  KernelTimes wrong = one;
  wrong.seconds.pop_back();
  CHECK_THROWS_WITH(predict_program(low, cost, &wrong), Catch::Contains("time the program itself"));
  CHECK_THROWS_WITH(time_kernels(low, 0, o), Catch::Contains("devices_at_once 0"));
  // Untimed passes for at least warmup_s before the timed ones (fresh threads on shared cores
  // run slower at first); a negative or NaN warm-up is refused naming it.
  {
    CalibrationOptions warm = o;
    warm.warmup_s = 0.3;
    const auto t0 = std::chrono::steady_clock::now();
    const KernelTimes w = time_kernels(low, 2, warm);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= 0.3);
    CHECK(w.sequence_s > 0);
    for (std::size_t i = 0; i < low.instrs.size(); ++i) CHECK(w.timed[i] == (low.instrs[i].kind == InstrKind::Kernel));
    warm.warmup_s = -1;
    CHECK_THROWS_WITH(time_kernels(low, 2, warm), Catch::Contains("warmup_s (-1)"));
    warm.warmup_s = std::nan("");
    CHECK_THROWS_WITH(time_kernels(low, 2, warm), Catch::Contains("warmup_s (nan)"));
  }
}
