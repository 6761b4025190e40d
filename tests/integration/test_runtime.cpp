// Runtime v2: compile -> load -> run over device-resident ShardedArrays on a ThreadRuntime,
// in both stream modes: correctness against the reference over several steps, names,
// donation, option validation, device-thread start failures, concurrent runs, cancel, and
// trace paths checked before the run. Every run goes through `guarded` (a hang fails).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <limits>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "../unit/test_util.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/executable.hpp"
#include "tessel/ir/program_text.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/runtime/cpu/thread_communicator.hpp"
#include "tessel/ir/graph_text.hpp"

using namespace tessel;

namespace {

using tessel_test::guarded;

// Megatron MLP on data=2 x model=2 plus a replicated mean: all-reduces over model and data.
Graph mlp_graph(const std::string& mesh = "data=2, model=2") {
  return parse_graph(fmt::format(R"(
mesh {}
%x = input f32[8,4,16] sharding=[{{data}}, {{}}, {{}}]
%w1 = input f32[16,32] sharding=[{{}}, {{model}}]
%w2 = input f32[32,16] sharding=[{{model}}, {{}}]
%h = einsum(%x, %w1) eq="bsd,df->bsf"
%a = gelu(%h)
%y = einsum(%a, %w2) eq="bsf,fd->bsd"
%m = reduce_mean(%y) dims=[0,1,2]
output %y, %m
)", mesh), "mlp.tsl");
}

void check_outputs(const std::vector<HostTensor>& got, const std::vector<HostTensor>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t o = 0; o < got.size(); ++o) {
    CompareResult c = compare(got[o], want[o]);
    INFO(what << " output " << o << ": " << c.to_string());
    CHECK(c.max_rel_err <= 1e-5);
  }
}

std::vector<HostTensor> to_host_all(const LoadedExecutable& le, const RunResult& r) {
  std::vector<HostTensor> out;
  for (const auto& a : r.outputs) out.push_back(le.to_host(a, /*check_replicas=*/true));
  return out;
}

}  // namespace

TEST_CASE("runtime: load once and run steps over device-resident arrays", "[integration][runtime]") {
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  INFO("streams " << stream_mode_name(mode));
  Graph g = mlp_graph();
  Executable exe = compile(g, *g.mesh);
  ThreadRuntimeOptions ro = tessel_test::stream_options<ThreadRuntimeOptions>(mode);
  ThreadRuntime rt(exe.mesh().num_devices(), ro);
  LoadedExecutable le = load(exe, rt);
  CHECK(le.input_names() == std::vector<std::string>{"x", "w1", "w2"});
  CHECK(le.output_names() == std::vector<std::string>{"y", "m"});
  auto inputs = random_inputs(g, 7);
  // Weights go to the devices once; only x changes between steps.
  ShardedArray w1 = le.to_device("w1", inputs[1]);
  ShardedArray w2 = le.to_device(2, inputs[2]);
  CHECK(w1.num_shards() == 4);
  CHECK(w1.local_shape() == Shape{16, 16});
  for (int step = 0; step < 3; ++step) {
    auto step_inputs = random_inputs(g, 100 + static_cast<uint64_t>(step));
    step_inputs[1] = inputs[1];
    step_inputs[2] = inputs[2];
    ShardedArray x = le.to_device("x", step_inputs[0]);
    RunOptions opts;
    opts.poison = true;
    RunResult r = guarded("step", [&] { return le.run({x, w1, w2}, opts); });
    CHECK(r.stats.measured_peak_bytes.size() == 4);
    check_outputs(to_host_all(le, r), run_reference(g, step_inputs), fmt::format("step {}", step));
    CHECK(le.output(r, "m").shape() == Shape{});
    CHECK(w1.valid());  // not donated: stays on the devices
  }
  // By name.
  RunResult r = guarded("named", [&] {
    return le.run_named({{"w2", w2}, {"x", le.to_device("x", inputs[0])}, {"w1", w1}});
  });
  check_outputs(to_host_all(le, r), run_reference(g, inputs), "named run");
  // Mistakes are named.
  CHECK_THROWS_WITH(le.input_index("w3"), Catch::Contains("%w3") && Catch::Contains("%w1"));
  CHECK_THROWS_WITH(le.run({w1, w1, w2}), Catch::Contains("%x") && Catch::Contains("f32[8,4,16]"));
  CHECK_THROWS_WITH(le.run({w1, w2}), Catch::Contains("3 inputs"));
  CHECK_THROWS_WITH(le.to_device("x", inputs[1]), Catch::Contains("%x") && Catch::Contains("f32[16,32]"));
  ThreadRuntime small(2, ro);
  CHECK_THROWS_WITH(load(exe, small), Catch::Contains("4 devices") && Catch::Contains("2"));
}

TEST_CASE("runtime: a donated input's buffer becomes the output", "[integration][runtime]") {
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  INFO("streams " << stream_mode_name(mode));
  // w is dead after tanh, before w_new is written: its buffer can be reused in place.
  Graph g = tessel_test::donated_update_graph();
  Executable exe = compile(g, *g.mesh);
  ThreadRuntimeOptions ro = tessel_test::stream_options<ThreadRuntimeOptions>(mode);
  ThreadRuntime rt(4, ro);
  LoadOptions lo;
  lo.donate = {{"w", "w_new"}};
  LoadedExecutable le = load(exe, rt, lo);
  auto inputs = random_inputs(g, 3);
  ShardedArray w = le.to_device("w", inputs[0]);
  std::vector<const void*> old;
  for (int64_t d = 0; d < 4; ++d) old.push_back(w.shard(d)->data());
  ShardedArray alias = w;  // a copy shares the storage: donation deletes both
  RunResult r = guarded("donating run", [&] { return le.run({w}); });
  CHECK(w.deleted());
  CHECK(alias.deleted());
  for (int64_t d = 0; d < 4; ++d) CHECK(r.outputs[0].shard(d)->data() == old[static_cast<std::size_t>(d)]);
  check_outputs({le.to_host(r.outputs[0], true)}, run_reference(g, inputs), "donated");
  CHECK_THROWS_WITH(le.run({w}), Catch::Contains("donated") && Catch::Contains("%w"));
  // The output feeds the next step (an optimizer loop).
  const HostTensor w1_host = le.to_host(r.outputs[0]);
  ShardedArray next = r.outputs[0];
  RunResult r2 = guarded("second step", [&] { return le.run({next}); });
  CHECK(r.outputs[0].deleted());  // it was donated through `next`
  check_outputs({le.to_host(r2.outputs[0])}, run_reference(g, {w1_host}), "step 2");
  // Donation needs the same type and sharding.
  Graph g2 = parse_graph(R"(
mesh data=2, model=2
%w = input f32[8,16] sharding=[{data}, {model}]
%s = reduce_sum(%w) dims=[1]
output %s
)", "bad.tsl");
  Executable exe2 = compile(g2, *g2.mesh);
  LoadOptions bad;
  bad.donate = {{"w", "s"}};
  CHECK_THROWS_WITH(load(exe2, rt, bad), Catch::Contains("%w") && Catch::Contains("%s") && Catch::Contains("same"));
}

TEST_CASE("runtime: collective_timeout_s is validated and inf means no timeout", "[integration][runtime]") {
  Graph g = mlp_graph();
  Executable exe = compile(g, *g.mesh);
  ThreadRuntime rt(4);
  for (double bad : {std::nan(""), -1.0, -std::numeric_limits<double>::infinity()}) {
    LoadOptions lo;
    lo.collective_timeout_s = bad;
    CHECK_THROWS_WITH(load(exe, rt, lo), Catch::Contains("collective_timeout_s"));
    RunOptions ro;
    ro.collective_timeout_s = bad;
    CHECK_THROWS_WITH(exe.run(random_inputs(g, 1), ro), Catch::Contains("collective_timeout_s"));
  }
  ThreadWorldOptions wo;
  wo.timeout_seconds = std::nan("");
  CHECK_THROWS_WITH(ThreadWorld(exe.mesh(), wo), Catch::Contains("timeout_seconds"));
  auto inputs = random_inputs(g, 2);
  const auto want = run_reference(g, inputs);
  // Huge values must not overflow the deadline (they used to time out at once).
  for (double t : {std::numeric_limits<double>::infinity(), 1e300, 1e10, 9.3e9, 1e9}) {
    RunOptions ro;
    ro.collective_timeout_s = t;
    ro.poison = true;
    check_outputs(guarded("huge timeout", [&] { return exe.run(inputs, ro); }), want, fmt::format("timeout {}", t));
  }
}

TEST_CASE("runtime: a device thread that cannot start is an error and not std::terminate", "[integration][runtime]") {
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  ThreadRuntimeOptions ro = tessel_test::stream_options<ThreadRuntimeOptions>(mode);
  std::atomic<int> started{0};
  ro.before_thread_start = [&](int64_t d) {
    if (d == 5) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    ++started;
  };
  std::string msg;
  guarded("failing runtime", [&] {
    try {
      ThreadRuntime rt(8, ro);
    } catch (const RuntimeError& e) {
      msg = e.what();
    }
    return 0;
  });
  INFO(msg);
  CHECK(started == 4);  // devices 1..4: device 0 runs on the caller and has no thread
  CHECK_THAT(msg, Catch::Contains("device 5 of 8"));
  CHECK_THAT(msg, Catch::Contains("thread"));
  CHECK_THAT(msg, Catch::Contains("stopped"));
  // The process is fine: a runtime without the fault works.
  ro.before_thread_start = nullptr;
  ThreadRuntime ok(8, ro);
  CHECK(ok.num_devices() == 8);
}

TEST_CASE("runtime: runs from several threads at once are serialised and each gets its own result",
          "[integration][runtime]") {
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  INFO("streams " << stream_mode_name(mode));
  Graph g = mlp_graph();
  Executable exe = compile(g, *g.mesh);
  ThreadRuntimeOptions ro = tessel_test::stream_options<ThreadRuntimeOptions>(mode);
  ThreadRuntime rt(4, ro);
  LoadedExecutable le = load(exe, rt);
  constexpr int kThreads = 4, kRuns = 3;
  std::vector<std::vector<HostTensor>> in(kThreads), want(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    in[t] = random_inputs(g, 50 + static_cast<uint64_t>(t));
    want[t] = run_reference(g, in[t]);
  }
  std::vector<std::vector<std::vector<HostTensor>>> got(kThreads);
  std::vector<std::vector<HostTensor>> got_exe(kThreads);
  guarded("concurrent runs", [&] {
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        for (int k = 0; k < kRuns; ++k) {
          std::vector<ShardedArray> a;
          for (std::size_t i = 0; i < in[t].size(); ++i) a.push_back(le.to_device(i, in[t][i]));
          RunResult r = le.run(a);
          got[t].push_back(to_host_all(le, r));
        }
        RunOptions opts = tessel_test::stream_options<RunOptions>(mode);
        got_exe[t] = exe.run(in[t], opts);  // the convenience too
        (void)exe.last_stats();
      });
    for (auto& th : ts) th.join();
    return 0;
  });
  for (int t = 0; t < kThreads; ++t) {
    for (const auto& outs : got[t]) check_outputs(outs, want[t], fmt::format("thread {}", t));
    check_outputs(got_exe[t], want[t], fmt::format("Executable::run on thread {}", t));
  }
}

TEST_CASE("runtime: cancel from another thread stops every device", "[integration][runtime]") {
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  INFO("streams " << stream_mode_name(mode));
  Graph g = mlp_graph("data=4, model=2");
  Executable exe = compile(g, *g.mesh);
  ThreadRuntimeOptions ro = tessel_test::stream_options<ThreadRuntimeOptions>(mode);
  ThreadRuntime rt(8, ro);
  LoadedExecutable le = load(exe, rt);
  auto inputs = random_inputs(g, 9);
  const auto want = run_reference(g, inputs);
  std::vector<ShardedArray> a;
  for (std::size_t i = 0; i < inputs.size(); ++i) a.push_back(le.to_device(i, inputs[i]));
  CHECK_FALSE(le.cancel("nothing in flight"));
  std::atomic<bool> stop{false};
  int cancelled = 0, completed = 0;
  guarded("runs under cancel", [&] {
    std::thread canceller([&] {
      while (!stop.load()) {
        le.cancel("test cancel");
        std::this_thread::yield();
      }
    });
    for (int k = 0; k < 200 && cancelled < 3; ++k) {
      try {
        RunResult r = le.run(a);
        check_outputs(to_host_all(le, r), want, "uncancelled run");
        ++completed;
      } catch (const RuntimeError& e) {
        INFO(e.what());
        CHECK_THAT(e.what(), Catch::Contains("cancel"));
        ++cancelled;
      }
    }
    stop = true;
    canceller.join();
    return 0;
  });
  INFO("cancelled " << cancelled << ", completed " << completed);
  CHECK(cancelled + completed > 0);
  // After cancellations the loaded program runs normally on fresh communicators.
  RunResult r = guarded("after cancel", [&] { return le.run(a); });
  check_outputs(to_host_all(le, r), want, "after cancel");
}

TEST_CASE("runtime: a trace_path in a missing folder fails before the run starts", "[integration][runtime]") {
  Graph g = parse_graph(R"(
mesh data=2
%w = input f32[8,4] sharding=[{data}, {}]
%t = tanh(%w)
output %t
)", "trace.tsl");
  Executable exe = compile(g, *g.mesh);
  ThreadRuntime rt(2);
  LoadOptions lo;
  lo.donate = {{"w", "t"}};
  LoadedExecutable le = load(exe, rt, lo);
  auto inputs = random_inputs(g, 1);
  ShardedArray w = le.to_device("w", inputs[0]);
  RunOptions ro;
  ro.trace_path = "/nonexistent-tessel-dir/sub/trace.json";
  CHECK_THROWS_WITH(le.run({w}, ro), Catch::Contains("/nonexistent-tessel-dir/sub/trace.json") &&
                                         Catch::Contains("nothing was run"));
  CHECK(w.valid());  // not donated: the run never started
  CHECK_THROWS_WITH(exe.run(inputs, ro), Catch::Contains("trace"));
  // A writable path gets a trace with both streams' events.
  ro.trace_path = std::string(TESSEL_BINARY_DIR) + "/runtime_trace_test.json";
  RunResult r = guarded("traced run", [&] { return le.run({w}, ro); });
  check_outputs({le.to_host(r.outputs[0])}, run_reference(g, inputs), "traced");
}

TEST_CASE("runtime: a program with nothing to overlap runs inline on the device threads", "[integration][runtime]") {
  // Three programs: one device (no collective at all); two devices with an all-reduce of
  // 4 KiB per device between two kernels (on the critical path: nothing can run beside it);
  // and an all-gather -> einsum decomposed into a ring of permutes overlapped with partial
  // einsums (4 KiB per device that can overlap). Inline unless inlining is off, or the
  // threshold is 0 and there are collectives, or the overlappable bytes are above it, or a
  // link model is on. Every variant == reference, steps repeated over the same loaded
  // executable.
  struct Case {
    std::string text;
    bool has_comm;
    bool ring;  // collective matmul forced on: comm that overlaps
  };
  for (const Case& c : {Case{"mesh d=1\n%x = input f32[64,32]\n%w = input f32[32,16]\n"
                             "%y = einsum(%x, %w) eq=\"ij,jk->ik\"\n%z = gelu(%y)\noutput %z\n",
                             false, false},
                        Case{"mesh d=2\n%x = input f32[64,32] sharding=[{}, {d}]\n%w = input f32[32,16] "
                             "sharding=[{d}, {}]\n%y = einsum(%x, %w) eq=\"ij,jk->ik\"\n%z = gelu(%y)\noutput %z\n",
                             true, false},
                        Case{"mesh d=2\n%x = input f32[64,32] sharding=[{d}, {}]\n%w = input f32[32,16] "
                             "sharding=[{}, {d}]\n%y = einsum(%x, %w) eq=\"ij,jk->ik\" sharding=[{}, {d}]\n"
                             "%z = gelu(%y)\noutput %z\n",
                             true, true}}) {
    Graph g = parse_graph(c.text, "inline.tsl");
    Executable exe = compile(g, *g.mesh);
    const auto inputs = random_inputs(g, 5);
    const auto want = run_reference(g, inputs);
    LoadOptions lo;
    lo.lowering.collective_matmul.mode = c.ring ? OverlapMode::On : OverlapMode::Off;
    struct Variant {
      bool allow;
      int64_t max_comm_bytes;
      bool link;
      bool want_inline;
    };
    for (const Variant& v : {Variant{true, 256 << 10, false, true}, Variant{false, 256 << 10, false, false},
                             Variant{true, 1024, false, !c.ring}, Variant{true, 0, false, !c.has_comm},
                             Variant{true, 256 << 10, true, !c.has_comm}}) {
      ThreadRuntimeOptions ro;
      ro.inline_serial_programs = v.allow;
      ro.inline_max_comm_bytes = v.max_comm_bytes;
      if (v.link) ro.link_model = LinkModel::parse("alpha_us=1,gbps=100");
      ThreadRuntime rt(exe.mesh().num_devices(), ro);
      LoadedExecutable le = load(exe, rt, lo);
      INFO(c.text << "inline allowed: " << v.allow << ", max comm bytes " << v.max_comm_bytes << ", link model " << v.link
                  << "\n" << print_program(le.program()));
      if (c.ring) REQUIRE(le.program().summary().collective_permute > 0);
      CHECK(le.runs_inline() == v.want_inline);
      std::vector<ShardedArray> in;
      for (std::size_t i = 0; i < inputs.size(); ++i) in.push_back(le.to_device(i, inputs[i]));
      for (int step = 0; step < 3; ++step) {
        RunOptions opts;
        opts.poison = true;
        RunResult r = guarded("inline run", [&] { return le.run(in, opts); });
        CompareResult cmp = compare(le.to_host(r.outputs[0], true), want[0]);
        INFO(cmp.to_string());
        CHECK(cmp.max_rel_err <= 1e-5);
      }
    }
  }
}

TEST_CASE("runtime: waits among the device threads alone spin when the cores cover those threads", "[integration][runtime]") {
  // The runtime's budget counts every thread a step may keep busy (3 per device with async
  // streams); an inline program's waits (job hand-offs, collectives) involve the device
  // threads only, so their budget counts num_devices threads.
  for (int requested : {0, 7}) {
    ThreadRuntimeOptions o;
    o.spin_us = requested;
    ThreadRuntime rt(2, o);
    CHECK(rt.spin_us() == requested);
    CHECK(rt.inline_spin_us() == requested);
  }
  const char* env = std::getenv("TESSEL_SPIN_US");
  if (env == nullptr || *env == '\0') {
    const int64_t hw = static_cast<int64_t>(std::thread::hardware_concurrency());
    for (int64_t devices : {1, 2, 4}) {
      ThreadRuntime rt(devices);
      INFO(devices << " devices, " << hw << " hardware threads");
      CHECK(rt.spin_us() == (hw >= 3 * devices ? 20 : 0));
      CHECK(rt.inline_spin_us() == (hw >= devices ? 20 : 0));
    }
  }
  ThreadWorld w(Mesh::parse("d=2"));
  CHECK_THROWS_WITH(w.set_spin_us(-1), Catch::Contains("negative"));
}

TEST_CASE("runtime: a chain of collective-permute reshards is not issued as one group", "[integration][runtime]") {
  // Regression (random multi-op graphs, seed 1795417098386041332 case 288): [{y},{x}] ->
  // [{z},{x}] -> [{z},{y}] lowers to two collective-permutes in a row, the second sending what
  // the first received; pairing them into one communicator group (meant for the two directions
  // of a bidirectional ring) sent the second's data before it had arrived.
  Graph g = parse_graph(R"(
mesh x=2, y=2, z=2
%x = input f32[4,4] sharding=[{y}, {}]
%v0 = softmax(%x) axis=1
%w0 = input f32[4] sharding=[{x}]
%v1 = add(%v0, %w0)
%v2 = sharding_constraint(%v1) sharding=[{z}, {x}]
%w1 = input f32[4,8] sharding=[{y}, {}]
%v3 = einsum(%v2, %w1) eq="ak,kn->an"
output %v3
)", "chain.tsl");
  Executable exe = compile(g, *g.mesh);
  int permutes = 0;
  for (const Instr& in : exe.program().instrs)
    permutes += in.kind == InstrKind::Collective && in.collective == CollectiveKind::CollectivePermute;
  REQUIRE(permutes == 2);
  const uint64_t seed = tessel_test::seed();
  INFO("seed " << seed);
  const auto inputs = random_inputs(g, seed);
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  RunOptions ro = tessel_test::stream_options<RunOptions>(mode);
  ro.poison = true;
  ro.check_replicas = true;
  check_outputs(guarded("permute chain", [&] { return exe.run(inputs, ro); }), run_reference(g, inputs),
                stream_mode_name(mode));
}

TEST_CASE("runtime: one array given for a donated input and for another input is refused before the run",
          "[integration][runtime]") {
  Graph g = parse_graph(R"(
mesh data=2, model=2
%w = input f32[8,16] sharding=[{data}, {model}]
%g = input f32[8,16] sharding=[{data}, {model}]
%w_new = sub(%w, %g)
output %w_new
)", "sgd.tsl");
  Executable exe = compile(g, *g.mesh);
  ThreadRuntime rt(4);
  LoadOptions lo;
  lo.donate = {{"w", "w_new"}};
  LoadedExecutable le = load(exe, rt, lo);
  auto inputs = random_inputs(g, 5);
  ShardedArray w = le.to_device("w", inputs[0]);
  // The donated array as the other input too, after it and before it.
  CHECK_THROWS_WITH(le.run({w, w}), Catch::Contains("input #0 %w is donated (to output %w_new)") &&
                                        Catch::Contains("also given for input #1 %g") &&
                                        Catch::Contains("nothing was run"));
  CHECK(w.valid());  // refused before anything was taken
  ShardedArray g_arr = le.to_device("g", inputs[1]);
  RunResult r = le.run({w, g_arr});  // the same arrays, each once: fine
  check_outputs({le.to_host(r.outputs[0])}, run_reference(g, inputs), "sgd");
}

TEST_CASE("runtime: spin_us past a second and a StreamMode out of range are errors naming them",
          "[integration][runtime]") {
  ThreadRuntimeOptions o;
  o.spin_us = 100000000;
  CHECK_THROWS_WITH(ThreadRuntime(2, o), Catch::Contains("spin_us = 100000000") && Catch::Contains("1000000"));
  ThreadRuntimeOptions m;
  m.stream_mode = static_cast<StreamMode>(7);
  CHECK_THROWS_WITH(ThreadRuntime(2, m), Catch::Contains("stream_mode 7"));
  CpuBackendOptions b;
  b.mode = static_cast<StreamMode>(-1);
  CHECK_THROWS_WITH(make_cpu_backend(b), Catch::Contains("mode -1"));
  b.mode = StreamMode::Async;
  b.spin_us = 2000000;
  CHECK_THROWS_WITH(make_cpu_backend(b), Catch::Contains("spin_us = 2000000"));
  ThreadWorld world(Mesh::parse("x=2"));
  CHECK_THROWS_WITH(world.set_spin_us(100000000), Catch::Contains("outside [0, 1000000]"));
}

TEST_CASE("runtime: an array made for a mesh with the axes in another order is refused", "[integration][runtime]") {
  const char* text = R"(
%x = input f32[8,16] sharding=[{data}, {model}]
%y = tanh(%x) sharding=[{data}, {model}]
output %y
)";
  Graph g1 = parse_graph(std::string("mesh data=2, model=2") + text, "a.tsl");
  Graph g2 = parse_graph(std::string("mesh model=2, data=2") + text, "b.tsl");
  Executable e1 = compile(g1, *g1.mesh), e2 = compile(g2, *g2.mesh);
  ThreadRuntime rt(4);
  LoadedExecutable l1 = load(e1, rt), l2 = load(e2, rt);
  const auto inputs = random_inputs(g1, 9);
  ShardedArray x1 = l1.to_device("x", inputs[0]);
  // Same global type, same sharding text, same device list: before, l2 ran it and was wrong.
  CHECK_THROWS_WITH(l2.run({x1}), Catch::Contains("run: input #0 %x was made for mesh {data=2, model=2} but this "
                                                  "program runs on mesh {model=2, data=2}"));
  RunResult r1 = l1.run({x1});
  CHECK_THROWS_WITH(l2.run({r1.outputs[0]}), Catch::Contains("was made for mesh {data=2, model=2}"));
  // Moved through the host, it runs and matches the reference.
  RunResult r2 = l2.run({l2.to_device("x", l1.to_host(x1))});
  check_outputs({l2.to_host(r2.outputs[0])}, run_reference(g2, inputs), "moved");
}
