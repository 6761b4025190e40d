// Failure behaviour of compile() and Executable: every mistake and every device failure
// reaches the caller as a tessel::Error subclass whose message names what went wrong, every
// device thread stops, and nothing hangs or deadlocks.
//
// Each run goes through `tessel_test::guarded()` (test_util.hpp): it runs on a std::async
// thread and the test thread waits a bounded time. A hung run cannot be joined (the future's
// destructor would block), so on a timeout the test prints what hung and calls std::_Exit(1):
// CTest then reports a failure instead of waiting for its own 300 s timeout.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "tessel/ops/builders.hpp"
#include "tessel/executable.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/runtime/cpu/thread_communicator.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/ir/graph_text.hpp"
#include "../unit/test_util.hpp"

using namespace tessel;

namespace {

using tessel_test::guarded;

// The message of the exception of type E thrown by f (guarded); fails the test when f
// throws nothing or something else.
template <class E, class F>
std::string error_of(const std::string& what, F&& f) {
  try {
    guarded(what, std::forward<F>(f));
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL(what << ": threw the wrong exception type: " << e.what());
  }
  FAIL(what << ": did not throw");
  return {};
}

HostTensor filled(DType t, Shape s, double v = 0.5) {
  HostTensor x(t, std::move(s));
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, v);
  return x;
}

// x [8,4] sharded over data, w [4,6] replicated: y = x·w on a data=2,model=2 mesh.
struct SmallMatmul {
  Graph g;
  Mesh mesh = Mesh::parse("data=2,model=2");
  SmallMatmul() {
    Tensor x = input(g, "x", DType::f32, {8, 4});
    Tensor w = input(g, "w", DType::f32, {4, 6});
    g.annotate(x, Sharding::of({{"data"}, {}}));
    g.annotate(w, Sharding::of({{}, {"model"}}));
    g.mark_output(einsum("bd,df->bf", x, w));
  }
};

// Per-position loss over a batch sharded on `data`, then its mean over the batch: the
// mean needs an all-reduce over `data`, so every device but the failing one is blocked in
// (or on its way to) a collective when the failing device's cross_entropy throws.
//   logits [B, S, V] sharded [{data}, {}, {}], labels i32 [B, S] sharded [{data}, {}].
struct LossGraph {
  Graph g;
  Mesh mesh;
  int64_t B, S = 4, V = 16;
  explicit LossGraph(const std::string& mesh_spec) : mesh(Mesh::parse(mesh_spec)) {
    B = 2 * mesh.axis_size("data");
    Tensor logits = input(g, "logits", DType::f32, {B, S, V});
    Tensor labels = input(g, "labels", DType::i32, {B, S});
    g.annotate(logits, Sharding::of({{"data"}, {}, {}}));
    g.annotate(labels, Sharding::of({{"data"}, {}}));
    Tensor loss = cross_entropy(logits, labels);  // [B, S]
    Tensor mean = reduce_mean(loss, {0, 1});      // []
    g.mark_output(mean);
  }
  std::vector<HostTensor> inputs(uint64_t seed) const { return random_inputs(g, seed); }
};

// The devices whose shard of labels holds global row `row` (several when the labels are
// replicated over an axis: each replica fails, and any of them may be reported first).
std::vector<int64_t> owners_of_row(const Executable& exe, int64_t row) {
  const LocalValue& lv = exe.program().values[exe.program().inputs[1]];
  std::vector<int64_t> out;
  for (int64_t d = 0; d < exe.mesh().num_devices(); ++d) {
    auto off = lv.sharding.local_offset(exe.mesh(), lv.global_shape, d);
    if (row >= off[0] && row < off[0] + lv.shape[0]) out.push_back(d);
  }
  return out;
}

// The message names one of `owners` as the failing device.
void check_names_owner(const std::string& msg, const std::vector<int64_t>& owners) {
  bool named = false;
  for (int64_t d : owners) named = named || msg.find(fmt::format("device {} ", d)) != std::string::npos;
  CHECK(named);
}

// Runs exe with the reference and checks every output.
void check_against_reference(Executable& exe, const std::vector<HostTensor>& inputs,
                             const std::string& what, StreamMode mode = StreamMode::Async) {
  RunOptions ro = tessel_test::stream_options<RunOptions>(mode);
  ro.poison = true;
  ro.check_replicas = true;
  ro.collective_timeout_s = 120;  // a lost peer fails the run instead of hanging it
  auto got = guarded(what, [&] { return exe.run(inputs, ro); });
  auto want = run_reference(exe.graph(), inputs);
  REQUIRE(got.size() == want.size());
  for (std::size_t o = 0; o < got.size(); ++o) {
    CompareResult c = compare(got[o], want[o]);
    INFO(what << " output " << o << ": " << c.to_string());
    CHECK(c.max_rel_err <= 1e-5);
  }
}

// A kernel failure on the one device that owns `bad_row`: the run throws promptly, names
// that device and the op, and the same Executable runs fine afterwards.
void kernel_failure_case(const std::string& mesh_spec, int64_t bad_row, uint64_t seed, StreamMode mode) {
  INFO("mesh " << mesh_spec << " bad row " << bad_row << " seed " << seed << " streams " << stream_mode_name(mode));
  RunOptions mode_only = tessel_test::stream_options<RunOptions>(mode);
  LossGraph lg(mesh_spec);
  Executable exe = compile(lg.g, lg.mesh);
  auto inputs = lg.inputs(seed);
  const std::vector<int64_t> owners = owners_of_row(exe, bad_row);
  REQUIRE(!owners.empty());
  const int64_t bad_index = bad_row * lg.S + 1;
  HostTensor& labels = inputs[1];
  labels.set(bad_index, static_cast<double>(lg.V + 3));  // outside [0, V)

  auto t0 = std::chrono::steady_clock::now();
  std::string msg = error_of<RuntimeError>(fmt::format("run with a bad label on {}", mesh_spec),
                                           [&] { return exe.run(inputs, mode_only); });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(msg);
  check_names_owner(msg, owners);
  CHECK_THAT(msg, Catch::Contains("cross_entropy"));
  CHECK_THAT(msg, Catch::Contains(std::to_string(lg.V + 3)));     // the label
  CHECK_THAT(msg, Catch::Contains("outside the vocabulary"));
  CHECK(secs < 30);  // prompt: nobody waited for a timeout

  // The same executable is not poisoned by the failure.
  labels.set(bad_index, 1.0);
  check_against_reference(exe, inputs, fmt::format("rerun on {}", mesh_spec), mode);
  // ...and fails again, the same way, when given the bad input again.
  labels.set(bad_index, -1.0);
  std::string msg2 = error_of<RuntimeError>("second bad run", [&] { return exe.run(inputs, mode_only); });
  check_names_owner(msg2, owners);
  CHECK_THAT(msg2, Catch::Contains("cross_entropy"));
}

}  // namespace

// ---- wrong inputs to run / run_sharded ---------------------------------------------------

TEST_CASE("failures: run with the wrong number of inputs", "[integration][failures]") {
  SmallMatmul m;
  Executable exe = compile(m.g, m.mesh);
  std::string msg = error_of<RuntimeError>("run with 1 input", [&] {
    return exe.run({filled(DType::f32, {8, 4})});
  });
  CHECK_THAT(msg, Catch::Contains("2 inputs"));
  CHECK_THAT(msg, Catch::Contains("1 "));
  msg = error_of<RuntimeError>("run with 3 inputs", [&] {
    return exe.run({filled(DType::f32, {8, 4}), filled(DType::f32, {4, 6}), filled(DType::f32, {1})});
  });
  CHECK_THAT(msg, Catch::Contains("3"));
  msg = error_of<RuntimeError>("run with no inputs", [&] { return exe.run({}); });
  CHECK_THAT(msg, Catch::Contains("0"));
}

TEST_CASE("failures: run with a wrongly shaped input names it and both types",
          "[integration][failures]") {
  SmallMatmul m;
  Executable exe = compile(m.g, m.mesh);
  std::string msg = error_of<RuntimeError>("run with w [6,4]", [&] {
    return exe.run({filled(DType::f32, {8, 4}), filled(DType::f32, {6, 4})});
  });
  INFO(msg);
  CHECK_THAT(msg, Catch::Contains("%w"));
  CHECK_THAT(msg, Catch::Contains("f32[4,6]"));  // expected
  CHECK_THAT(msg, Catch::Contains("f32[6,4]"));  // given
  msg = error_of<RuntimeError>("run with x of rank 3", [&] {
    return exe.run({filled(DType::f32, {8, 4, 1}), filled(DType::f32, {4, 6})});
  });
  CHECK_THAT(msg, Catch::Contains("%x"));
  CHECK_THAT(msg, Catch::Contains("f32[8,4]"));
  CHECK_THAT(msg, Catch::Contains("f32[8,4,1]"));
}

TEST_CASE("failures: run with the wrong dtype names the input and both types",
          "[integration][failures]") {
  SmallMatmul m;
  Executable exe = compile(m.g, m.mesh);
  std::string msg = error_of<RuntimeError>("run with x i32", [&] {
    return exe.run({filled(DType::i32, {8, 4}, 1), filled(DType::f32, {4, 6})});
  });
  INFO(msg);
  CHECK_THAT(msg, Catch::Contains("%x"));
  CHECK_THAT(msg, Catch::Contains("f32[8,4]"));
  CHECK_THAT(msg, Catch::Contains("i32[8,4]"));
  msg = error_of<RuntimeError>("run with w bf16", [&] {
    return exe.run({filled(DType::f32, {8, 4}), filled(DType::bf16, {4, 6})});
  });
  CHECK_THAT(msg, Catch::Contains("%w"));
  CHECK_THAT(msg, Catch::Contains("bf16[4,6]"));
  // The executable still works after the rejected calls.
  std::vector<HostTensor> ok{filled(DType::f32, {8, 4}, 0.25), filled(DType::f32, {4, 6}, 2.0)};
  check_against_reference(exe, ok, "after rejected inputs");
}

TEST_CASE("failures: run_sharded with the wrong number of shards", "[integration][failures]") {
  SmallMatmul m;
  Executable exe = compile(m.g, m.mesh);
  std::vector<HostTensor> x = exe.scatter(0, filled(DType::f32, {8, 4}));
  std::vector<HostTensor> w = exe.scatter(1, filled(DType::f32, {4, 6}));
  REQUIRE(x.size() == 4);
  // 3 shards of x for a 4-device mesh.
  std::vector<HostTensor> x3(x.begin(), x.begin() + 3);
  std::string msg = error_of<RuntimeError>("run_sharded with 3 shards", [&] {
    return exe.run_sharded({x3, w});
  });
  INFO(msg);
  CHECK_THAT(msg, Catch::Contains("%x"));
  CHECK_THAT(msg, Catch::Contains("3 shards"));
  CHECK_THAT(msg, Catch::Contains("4 devices"));
  // 8 shards of w (a mesh twice as large).
  std::vector<HostTensor> w8 = w;
  w8.insert(w8.end(), w.begin(), w.end());
  msg = error_of<RuntimeError>("run_sharded with 8 shards", [&] { return exe.run_sharded({x, w8}); });
  CHECK_THAT(msg, Catch::Contains("%w"));
  CHECK_THAT(msg, Catch::Contains("8 shards"));
  // Wrong number of inputs.
  msg = error_of<RuntimeError>("run_sharded with 1 input", [&] { return exe.run_sharded({x}); });
  CHECK_THAT(msg, Catch::Contains("2 inputs"));
}

TEST_CASE("failures: run_sharded with a wrongly shaped shard names input / sharding and local type",
          "[integration][failures]") {
  SmallMatmul m;
  Executable exe = compile(m.g, m.mesh);
  std::vector<HostTensor> x = exe.scatter(0, filled(DType::f32, {8, 4}));
  std::vector<HostTensor> w = exe.scatter(1, filled(DType::f32, {4, 6}));
  REQUIRE(x[0].shape() == Shape{4, 4});
  REQUIRE(w[0].shape() == Shape{4, 3});
  // Device 2 passes the global x instead of its shard.
  std::vector<HostTensor> xbad = x;
  xbad[2] = filled(DType::f32, {8, 4});
  std::string msg = error_of<RuntimeError>("run_sharded with a global shard", [&] {
    return exe.run_sharded({xbad, w});
  });
  INFO(msg);
  CHECK_THAT(msg, Catch::Contains("%x"));
  CHECK_THAT(msg, Catch::Contains("[{data}, {}]"));
  CHECK_THAT(msg, Catch::Contains("f32[4,4]"));  // expected local type
  CHECK_THAT(msg, Catch::Contains("f32[8,4]"));  // given
  // A shard of the right shape and the wrong dtype.
  std::vector<HostTensor> wbad = w;
  wbad[3] = filled(DType::f16, {4, 3});
  msg = error_of<RuntimeError>("run_sharded with an f16 shard", [&] { return exe.run_sharded({x, wbad}); });
  CHECK_THAT(msg, Catch::Contains("%w"));
  CHECK_THAT(msg, Catch::Contains("{model}"));
  CHECK_THAT(msg, Catch::Contains("f32[4,3]"));
  CHECK_THAT(msg, Catch::Contains("f16[4,3]"));
  // Correct shards still run and agree with the global run.
  auto outs = guarded("run_sharded ok", [&] { return exe.run_sharded({x, w}); });
  REQUIRE(outs.size() == 1);
  HostTensor y = exe.gather(0, outs[0], true);
  for (int64_t i = 0; i < y.numel(); ++i) REQUIRE(y.get(i) == Approx(4 * 0.25));
}

TEST_CASE("failures: scatter and gather reject tensors of the wrong type",
          "[integration][failures]") {
  // The wrong tensors here are at least as large as the right ones, so that a missing check
  // shows as a test failure, not as an out-of-bounds read.
  SmallMatmul m;
  Executable exe = compile(m.g, m.mesh);
  std::string msg = error_of<RuntimeError>("scatter of a [16,4] x", [&] {
    return exe.scatter(0, filled(DType::f32, {16, 4}));
  });
  CHECK_THAT(msg, Catch::Contains("%x"));
  CHECK_THAT(msg, Catch::Contains("f32[8,4]"));
  CHECK_THAT(msg, Catch::Contains("f32[16,4]"));
  msg = error_of<RuntimeError>("scatter of an i32 x", [&] { return exe.scatter(0, filled(DType::i32, {8, 4})); });
  CHECK_THAT(msg, Catch::Contains("i32[8,4]"));
  // Output y [8,6] is [{data}, {model}]: local f32[4,3]; pass f32[4,6] shards.
  std::vector<HostTensor> shards(4, filled(DType::f32, {4, 6}));
  msg = error_of<RuntimeError>("gather of [4,6] shards", [&] { return exe.gather(0, shards); });
  CHECK_THAT(msg, Catch::Contains("f32[4,3]"));
  CHECK_THAT(msg, Catch::Contains("f32[4,6]"));
}

// ---- a kernel that throws on one device ---------------------------------------------------

TEST_CASE("failures: a kernel error on one device stops all devices and names it (4 devices)",
          "[integration][failures]") {
  // B = 4: rows 0..1 live on the data=0 devices, rows 2..3 on data=1 (each replicated over
  // model, so both replicas fail; the first in position order is reported).
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  kernel_failure_case("data=2,model=2", 3, 11, mode);
  kernel_failure_case("data=2,model=2", 0, 12, mode);
}

TEST_CASE("failures: a kernel error on one device of 8 stops all devices",
          "[integration][failures]") {
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  kernel_failure_case("data=8", 13, 21, mode);  // rows 12,13 -> device 6
  kernel_failure_case("data=8", 15, 22, mode);  // the last device
}

TEST_CASE("failures: a kernel error on one device of 64 stops all devices",
          "[integration][failures]") {
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  kernel_failure_case("data=64", 77, 31, mode);  // rows 76,77 -> device 38
  kernel_failure_case("data=16,model=4", 3, 32, mode);
}

TEST_CASE("failures: a 64-device mesh runs correctly", "[integration][failures]") {
  // Megatron MLP on data=8 x model=8: all-reduce over model, sharded batch over data.
  Graph g = parse_graph(R"(
mesh data=8, model=8
%x = input f32[16,4,32] sharding=[{data}, {}, {}]
%w1 = input f32[32,64] sharding=[{}, {model}]
%w2 = input f32[64,32] sharding=[{model}, {}]
%h = einsum(%x, %w1) eq="bsd,df->bsf"
%a = gelu(%h)
%y = einsum(%a, %w2) eq="bsf,fd->bsd"
%m = reduce_mean(%y) dims=[0]
output %y, %m
)", "mlp64.tsl");
  Executable exe = compile(g, *g.mesh);
  REQUIRE(exe.mesh().num_devices() == 64);
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  check_against_reference(exe, random_inputs(g, 64), "64-device MLP", mode);
}

// ---- collective timeout ---------------------------------------------------------------------

TEST_CASE("failures: a collective whose peer never arrives times out with a clear error",
          "[integration][failures]") {
  // Not reachable through Executable with correct programs (every device runs the same
  // instruction list), so drive the world directly: on data=2,model=4, devices 0..2 of the
  // model group {0,1,2,3} enter an all-reduce, device 3 never does.
  const Mesh mesh = Mesh::parse("data=2,model=4");
  ThreadWorldOptions o;
  o.timeout_seconds = 0.3;
  ThreadWorld world(mesh, o);
  std::vector<std::string> errors(3);
  auto t0 = std::chrono::steady_clock::now();
  guarded("all_reduce with a missing rank", [&] {
    std::vector<std::thread> ts;
    for (int64_t d = 0; d < 3; ++d)
      ts.emplace_back([&, d] {
        try {
          auto c = world.communicator(d, {"model"});
          auto stream = make_cpu_backend({StreamMode::Eager, 1})->create_stream("test");
          std::vector<float> buf(64, 1.0f);
          c->all_reduce(buf.data(), buf.data(), buf.size(), DType::f32, ReduceOp::Sum, *stream);
          errors[d] = "returned without its peer";
        } catch (const RuntimeError& e) {
          errors[d] = std::string("RuntimeError: ") + e.what();
        } catch (const std::exception& e) {
          errors[d] = std::string("other exception: ") + e.what();
        }
      });
    for (auto& t : ts) t.join();
    return 0;
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 20);
  CHECK(world.aborted());
  INFO("abort reason: " << world.abort_reason());
  CHECK_THAT(world.abort_reason(), Catch::Contains("all_reduce"));
  CHECK_THAT(world.abort_reason(), Catch::Contains("timed out"));
  CHECK_THAT(world.abort_reason(), Catch::Contains("device 3"));
  for (int d = 0; d < 3; ++d) {
    INFO("device " << d << ": " << errors[d]);
    CHECK_THAT(errors[d], Catch::StartsWith("RuntimeError: "));
  }
  // A later call on the aborted world fails at once.
  CHECK_THROWS_AS(world.communicator(4, {"model"}), RuntimeError);
}

TEST_CASE("failures: run with a collective timeout either succeeds or fails cleanly",
          "[integration][failures]") {
  // With a generous timeout nothing times out; with a tiny one, devices that wait for a
  // slower peer (8 threads on few cores) may time out: the run must then throw a
  // RuntimeError that names the collective, and never hang or crash. Either way the same
  // executable then runs correctly without a timeout.
  LossGraph lg("data=8");
  Executable exe = compile(lg.g, lg.mesh);
  auto inputs = lg.inputs(5);
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  for (double t : {1e-9, 1e-6, 1e-4}) {
    RunOptions ro = tessel_test::stream_options<RunOptions>(mode);
    ro.collective_timeout_s = t;
    try {
      guarded(fmt::format("run with collective_timeout_s={}", t), [&] { return exe.run(inputs, ro); });
    } catch (const RuntimeError& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK_THAT(msg, Catch::Contains("timed out"));
      CHECK_THAT(msg, Catch::Contains("all_reduce") || Catch::Contains("all-reduce"));
    }
  }
  check_against_reference(exe, inputs, "after timeouts", mode);
}

// ---- compile-time errors ----------------------------------------------------------------------

TEST_CASE("failures: annotation with an axis the mesh does not have", "[integration][failures]") {
  Graph g;
  Tensor x = input(g, "x", DType::f32, {16, 8});
  g.annotate(x, Sharding::of({{"batch"}, {}}));
  g.mark_output(relu(x));
  std::string msg = error_of<ShardingError>("compile with axis batch", [&] {
    return compile(g, Mesh::parse("data=2,model=2"));
  });
  INFO(msg);
  CHECK_THAT(msg, Catch::Contains("%x"));
  CHECK_THAT(msg, Catch::Contains("'batch'"));
  CHECK_THAT(msg, Catch::Contains("data=2") || Catch::Contains("data: 2"));
}

TEST_CASE("failures: a non-divisible sharding names value / dim / axis and a fix",
          "[integration][failures]") {
  Graph g;
  Tensor x = input(g, "x", DType::f32, {19, 8});
  g.annotate(x, Sharding::of({{"data"}, {}}));
  g.mark_output(relu(x));
  CompileOptions strict;
  strict.strict_even_shardings = true;  // uneven shardings are padded unless strict
  std::string msg = error_of<ShardingError>("compile 19 rows over 4", [&] {
    return compile(g, Mesh::parse("data=4"), strict);
  });
  INFO(msg);
  CHECK_THAT(msg, Catch::Contains("%x"));
  CHECK_THAT(msg, Catch::Contains("dim 0"));
  CHECK_THAT(msg, Catch::Contains("19"));
  CHECK_THAT(msg, Catch::Contains("data"));
  CHECK_THAT(msg, Catch::Contains("4 shards"));
  CHECK_THAT(msg, Catch::Contains("16 or 20"));  // the suggested fix
  // The text form accepts it (it is padded when compiled); propagating the unpadded graph
  // directly reports it like strict compilation.
  Graph pg = parse_graph("mesh data=4\n%x = input f32[19,8] sharding=[{data}, {}]\noutput %x\n", "nd.tsl");
  std::string msg2 = error_of<ShardingError>("propagate 19 rows over 4", [&] {
    return propagate(pg, Mesh::parse("data=4"));
  });
  CHECK_THAT(msg2, Catch::Contains("19"));
  CHECK_THAT(msg2, Catch::Contains("16 or 20"));
}

TEST_CASE("failures: einsum shape mismatch names op / operands and shapes",
          "[integration][failures]") {
  Graph g;
  Tensor a = input(g, "a", DType::f32, {2, 3});
  Tensor b = input(g, "b", DType::f32, {4, 5});
  std::string msg = error_of<ShapeError>("einsum mismatch", [&] { return einsum("ij,jk->ik", a, b); });
  INFO(msg);
  CHECK_THAT(msg, Catch::Contains("einsum"));
  CHECK_THAT(msg, Catch::Contains("%a"));
  CHECK_THAT(msg, Catch::Contains("%b"));
  CHECK_THAT(msg, Catch::Contains("[2,3]"));
  CHECK_THAT(msg, Catch::Contains("[4,5]"));
  CHECK_THAT(msg, Catch::Contains("'j'"));
  // In the text form the same error is a ParseError with file:line:col.
  std::string msg2 = error_of<ParseError>("einsum mismatch in text", [&] {
    return parse_graph("%a = input f32[2,3]\n%b = input f32[4,5]\n%c = einsum(%a, %b) eq=\"ij,jk->ik\"\n",
                       "bad.tsl");
  });
  CHECK_THAT(msg2, Catch::StartsWith("bad.tsl:3:"));
  CHECK_THAT(msg2, Catch::Contains("[4,5]"));
}

TEST_CASE("failures: host memory that cannot be had is an error naming the tensor and not std::bad_alloc",
          "[failures]") {
  // 2^48 f32 elements (1 PiB): refused before the allocator is asked, in every build.
  const tessel::Shape huge{int64_t{1} << 24, int64_t{1} << 24};
  try {
    tessel::HostTensor t(tessel::DType::f32, huge);
    FAIL("a 1 PiB host tensor was allocated");
  } catch (const tessel::OutOfMemoryError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("host tensor f32[16777216,16777216]"));
    CHECK_THAT(std::string(e.what()), Catch::Contains("1125899906842624 bytes"));
    CHECK(e.bytes() == std::size_t{1} << 50);
  }
  tessel::Graph g;
  tessel::Tensor w = tessel::input(g, "w_embed", tessel::DType::f32, huge);
  g.mark_output(tessel::reduce_sum(w, {0, 1}));
  try {
    (void)tessel::random_inputs(g, 1);
    FAIL("random_inputs allocated a 1 PiB input");
  } catch (const tessel::OutOfMemoryError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("random_inputs: input %w_embed: host memory"));
  }
}

namespace {

// A world whose communicators abort it once every member of a group has finished its all-reduce
// (each waits for its stream, then counts): the run's only collective completes everywhere, no
// device sees an error, and the world is aborted, as when an NCCL watchdog fires after the last
// collective was enqueued (issue 22, finding 9: ncclCommAbort drains kernels without a CUDA
// error).
class AbortAfterWorld : public CollectiveWorld {
 public:
  explicit AbortAfterWorld(std::unique_ptr<CollectiveWorld> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<Communicator> communicator(int64_t position, const std::vector<std::string>& axes) override;
  void abort(std::string reason) override { inner_->abort(std::move(reason)); }
  bool aborted() const override { return inner_->aborted(); }
  std::string abort_reason() const override { return inner_->abort_reason(); }
  std::atomic<int> finished{0};

 private:
  std::unique_ptr<CollectiveWorld> inner_;
};

class AbortAfterComm : public Communicator {
 public:
  AbortAfterComm(std::unique_ptr<Communicator> c, AbortAfterWorld& w) : c_(std::move(c)), w_(w) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  void all_gather(const void* a, void* b, std::size_t n, Stream& s) override { c_->all_gather(a, b, n, s); }
  void reduce_scatter(const void* a, void* b, std::size_t n, DType t, ReduceOp o, Stream& s) override {
    c_->reduce_scatter(a, b, n, t, o, s);
  }
  void all_reduce(const void* a, void* b, std::size_t n, DType t, ReduceOp o, Stream& s) override {
    c_->all_reduce(a, b, n, t, o, s);
    s.synchronize();  // this member's all-reduce has completed (so have its peers' sends)
    if (++w_.finished == size()) w_.abort("injected: aborted after the last collective completed");
  }
  void all_to_all(const void* a, void* b, std::size_t n, Stream& s) override { c_->all_to_all(a, b, n, s); }
  void collective_permute(const void* a, int to, void* b, int from, std::size_t n, Stream& s) override {
    c_->collective_permute(a, to, b, from, n, s);
  }
  void send(const void* b, std::size_t n, int peer, Stream& s) override { c_->send(b, n, peer, s); }
  void recv(void* b, std::size_t n, int peer, Stream& s) override { c_->recv(b, n, peer, s); }
  void broadcast(void* b, std::size_t n, int root, Stream& s) override { c_->broadcast(b, n, root, s); }
  void barrier(Stream& s) override { c_->barrier(s); }
  void group_start() override { c_->group_start(); }
  void group_end() override { c_->group_end(); }
  void abort(const std::string& reason) override { c_->abort(reason); }

 private:
  std::unique_ptr<Communicator> c_;
  AbortAfterWorld& w_;
};

std::unique_ptr<Communicator> AbortAfterWorld::communicator(int64_t position, const std::vector<std::string>& axes) {
  return std::make_unique<AbortAfterComm>(inner_->communicator(position, axes), *this);
}

class AbortAfterRuntime : public ThreadRuntime {
 public:
  using ThreadRuntime::ThreadRuntime;
  std::unique_ptr<CollectiveWorld> make_world(const Mesh& mesh, const std::vector<std::vector<std::string>>& axes,
                                              double timeout_s) override {
    return std::make_unique<AbortAfterWorld>(ThreadRuntime::make_world(mesh, axes, timeout_s));
  }
};

}  // namespace

TEST_CASE("failures: a world aborted after the last collective completed fails the run and names why",
          "[integration][failures]") {
  const Graph g = tessel_test::one_all_reduce_graph();
  const Mesh mesh = Mesh::parse("data=2");
  const Executable exe = compile(g, mesh);
  for (StreamMode mode : {StreamMode::Async, StreamMode::Eager}) {
    INFO("streams " << stream_mode_name(mode));
    ThreadRuntimeOptions tro;
    tro.stream_mode = mode;
    AbortAfterRuntime rt(2, tro);
    LoadedExecutable le = load(exe, rt);
    const std::vector<ShardedArray> in = {le.to_device("x", filled(DType::f32, {4, 8})),
                                          le.to_device("w", filled(DType::f32, {8, 4}))};
    const std::string msg = error_of<RuntimeError>("run after an abort", [&] { return le.run(in); });
    CHECK_THAT(msg, Catch::Contains("aborted during the run"));
    CHECK_THAT(msg, Catch::Contains("injected: aborted after the last collective completed"));
    CHECK_THAT(msg, Catch::Contains("cannot be trusted"));
  }
}
