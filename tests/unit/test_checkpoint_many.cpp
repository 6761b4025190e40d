// Checkpoints saved by many processes (tessel/checkpoint/checkpoint.hpp, issue 23 item 4):
// each process writes only blocks it holds, a replicated block once, the bytes balanced
// (plan_writes: max/mean <= 1.1 for GPT training states on data x model meshes at every ZeRO
// stage); the processes here are threads with a file process group (the protocol is the same
// under mpirun, tests/mpi); a process that fails makes every process fail and lists nothing; a
// process that never arrives leaves no visible step; a Trainer's device state saved block by
// block and restored onto another mesh continues with the uninterrupted run's losses.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "checkpoint_util.hpp"
#include "mlp_model.hpp"
#include "tessel/checkpoint/checkpoint.hpp"
#include "tessel/checkpoint/array_store.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/process_group.hpp"
#include "tessel/train/trainer.hpp"
#include "test_util.hpp"

using namespace tessel;
namespace fs = std::filesystem;

namespace {

using tessel_test::TempDir;
using tessel_test::random_tensor;
using tessel_test::same_bits;

// The block of mesh position p of a global tensor for `sharding`: ceil(shape / shards) per dim,
// what lies beyond the tensor left at 0 (the padding an uneven layout's device holds).
HostTensor block_of(const HostTensor& global, const Sharding& s, const Mesh& mesh, int64_t p) {
  const Shape& shape = global.shape();
  const std::size_t r = shape.size();
  Shape block(r);
  std::vector<int64_t> start(r);
  for (std::size_t d = 0; d < r; ++d) {
    const int64_t n = mesh.axes_size(s.dims[d].axes);
    block[d] = std::max<int64_t>(1, (shape[d] + n - 1) / n);
    start[d] = (s.dims[d].axes.empty() ? 0 : s.shard_index(static_cast<int>(d), mesh, p)) * block[d];
  }
  HostTensor out(global.dtype(), block);
  std::memset(out.data(), 0, out.bytes());
  const auto gs = contiguous_strides(shape);
  for (int64_t i = 0; i < out.numel(); ++i) {
    int64_t rest = i, g = 0;
    bool inside = true;
    for (std::size_t d = r; d-- > 0;) {
      const int64_t c = rest % block[d];
      rest /= block[d];
      inside = inside && start[d] + c < shape[d];
      g += (start[d] + c) * gs[d];
    }
    if (inside) std::memcpy(static_cast<char*>(out.data()) + i * static_cast<int64_t>(dtype_size(out.dtype())),
                            static_cast<const char*>(global.data()) + g * static_cast<int64_t>(dtype_size(out.dtype())),
                            dtype_size(out.dtype()));
  }
  return out;
}

// Runs fn(rank, group) on `n` threads, each a process of one file process group; returns each
// rank's exception message ("" when it returned).
std::vector<std::string> run_processes(int n, const std::string& rendezvous, double timeout_s,
                                       const std::function<void(int, ProcessGroup&)>& fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  const std::string key = "k" + std::to_string(std::rand());
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        FileRendezvousOptions o;
        o.rank = r;
        o.size = n;
        o.dir = rendezvous;
        o.key = key;
        o.timeout_s = timeout_s;
        auto g = file_process_group(o);
        fn(r, *g);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
        if (errors[static_cast<std::size_t>(r)].empty()) errors[static_cast<std::size_t>(r)] = "(empty message)";
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

bool no_temporaries(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(".step_", 0) == 0) return false;
  return true;
}

}  // namespace

TEST_CASE("plan_writes balances the bytes written per process for GPT training states", "[checkpoint][unit]") {
  GptConfig cfg;
  cfg.layers = 2;
  cfg.d_model = 64;
  cfg.vocab = 256;
  cfg.seq = 16;
  for (const char* mesh_text : {"data=2,model=2", "data=4,model=2", "data=2,model=4"}) {
    const Mesh mesh = Mesh::parse(mesh_text);
    const int64_t n = mesh.num_devices();
    ThreadRuntime rt(n);
    for (int zero = 0; zero <= 3; ++zero) {
      GptGraph m = build_gpt(cfg);
      TrainerOptions o;
      o.train.zero = zero;
      Trainer tr(m.graph, m.loss, m.weights, mesh, rt, o);
      std::vector<ArrayLayout> layouts;
      const Program& up = tr.executable().program();
      for (const auto& [name, sh] : tr.state_shardings()) {
        const std::size_t in = tr.program().input_index(name);
        layouts.push_back({up.values[static_cast<std::size_t>(up.inputs[in])].dtype, tr.program().input_shape(in), sh});
      }
      for (int per : {1, 2}) {  // devices per process, consecutive positions
        const int procs = static_cast<int>(n / per);
        std::vector<int> proc(static_cast<std::size_t>(n));
        for (int64_t p = 0; p < n; ++p) proc[static_cast<std::size_t>(p)] = static_cast<int>(p / per);
        const WritePlan plan = plan_writes(layouts, mesh, proc, procs);
        int64_t total = 0, want = 0;
        for (int64_t b : plan.bytes) total += b;
        for (const ArrayLayout& l : layouts) {
          int64_t e = static_cast<int64_t>(dtype_size(l.dtype));
          for (int64_t d : l.shape) e *= d;
          want += e;
        }
        INFO(mesh_text << " zero " << zero << ", " << procs << " processes: imbalance " << plan.imbalance());
        CHECK(total == want);  // every byte once
        CHECK(plan.unheld_blocks == 0);
        CHECK(plan.imbalance() <= 1.1);
        // Each block's writer holds it.
        for (std::size_t a = 0; a < layouts.size(); ++a)
          for (int w : plan.writer[a]) CHECK((w >= 0 && w < procs));
      }
    }
  }
  // A block no process holds is reported, not silently dropped.
  const Mesh mesh = Mesh::parse("x=4");
  const WritePlan plan = plan_writes({{DType::f32, {8, 4}, Sharding::of({{"x"}, {}})}}, mesh, {0, 0, -1, 1}, 2);
  CHECK(plan.unheld_blocks == 1);
  CHECK(plan.writer[0] == std::vector<int>{0, 0, -1, 1});
  CHECK_THROWS_WITH(plan_writes({}, mesh, {0, 1}, 2), Catch::Contains("2 process entries for the 4 positions"));
}

TEST_CASE("four processes save one step together and write each block once", "[checkpoint][unit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("checkpoint saved by four processes", seed, 1);
  std::mt19937_64 rng(seed);
  TempDir dir("many-four"), rv("many-four-rv");
  fs::create_directories(rv.path);
  const Mesh mesh = Mesh::parse("data=2,model=2");
  // Replicated, model-split, both-split, uneven (37 rows over data) and a scalar.
  const std::map<std::string, std::pair<HostTensor, Sharding>> arrays = {
      {"w", {random_tensor(DType::f32, {64, 48}, rng), Sharding::of({{}, {"model"}})}},
      {"adam.m.w", {random_tensor(DType::f32, {64, 48}, rng), Sharding::of({{"data"}, {"model"}})}},
      {"b", {random_tensor(DType::bf16, {48}, rng), Sharding::of({{}})}},
      {"u", {random_tensor(DType::i32, {37, 5}, rng), Sharding::of({{"data"}, {}})}},
      {"step", {random_tensor(DType::f32, {}, rng), Sharding::of({})}}};
  std::vector<SaveStats> stats(4);
  std::vector<std::vector<std::string>> asked(4);  // the blocks each process was asked for
  const auto errors = run_processes(4, rv.path, 60, [&](int r, ProcessGroup& g) {
    std::map<std::string, LocalArray> local;
    for (const auto& [name, v] : arrays) {
      LocalArray la;
      la.layout = {v.first.dtype(), v.first.shape(), v.second};
      la.devices = {r};  // one device per process
      const HostTensor* t = &v.first;
      const Sharding* s = &v.second;
      const std::string n = name;
      la.block = [&, t, s, n, r](std::size_t i) {
        CHECK(i == 0);
        asked[static_cast<std::size_t>(r)].push_back(n);
        return block_of(*t, *s, mesh, r);
      };
      local.emplace(name, std::move(la));
    }
    SaveOptions o;
    o.inner_chunk_bytes = 256;
    o.metadata_json = "{\"data_position\": 12}";
    CheckpointDir ck(dir.path);
    stats[static_cast<std::size_t>(r)] = ck.save_local(5, local, mesh, &g, o);
    // Every process returns after the commit: the step is visible to all of them.
    CHECK(ck.latest() == std::optional<int64_t>(5));
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(errors[static_cast<std::size_t>(r)] == "");
  }
  CheckpointDir ck(dir.path);
  REQUIRE(ck.steps() == std::vector<int64_t>{5});
  CHECK(no_temporaries(dir.path));
  const auto back = ck.read_all(5);
  for (const auto& [name, v] : arrays) {
    INFO(name);
    CHECK(same_bits(back.at(name), v.first));
  }
  CHECK(ck.manifest(5).metadata_json == "{\"data_position\":12}");
  // Each block once: the bytes written add up to the arrays' bytes, and no process copied a
  // block it does not write.
  int64_t written = 0, blocks = 0, want = 0;
  for (const SaveStats& s : stats) {
    written += s.bytes_written;
    blocks += s.blocks_written;
    CHECK(s.processes == 4);
  }
  for (const auto& [name, v] : arrays) want += static_cast<int64_t>(v.first.bytes());
  CHECK(written == want);
  std::size_t copies = 0;
  for (const auto& a : asked) copies += a.size();
  CHECK(static_cast<int64_t>(copies) <= blocks);  // a block copied only by a process writing (part of) it
  // Zarr shards: w's 2 blocks (model) each cut in 2 for its 2 replicas, adam.m.w's 4 blocks, b
  // cut in 4 for its 4 replicas, u's 2 blocks (19 and 18 rows, 5 columns: nothing divides by
  // 2), the scalar step.
  CHECK(blocks == 4 + 4 + 4 + 2 + 1);
  CHECK(fs::exists(dir.path + "/step_5/w/c/1/1"));
  CHECK(zarr_v3_store().open(dir.path + "/step_5/b")->chunk_shape() == Shape{12});
  INFO("imbalance " << stats[0].imbalance);
  CHECK(stats[0].imbalance <= 1.5);  // five small arrays over four processes
}

TEST_CASE("a many-process save that fails on one process fails on all and lists nothing", "[checkpoint][unit]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("checkpoint save failing on one process", seed, 3);
  std::mt19937_64 rng(seed);
  TempDir dir("many-fail"), rv("many-fail-rv");
  fs::create_directories(rv.path);
  const Mesh mesh = Mesh::parse("x=4");
  const HostTensor w = random_tensor(DType::f32, {16, 8}, rng);
  const Sharding s = Sharding::of({{"x"}, {}});
  auto local_of = [&](int r, bool wrong_shape, bool throw_block) {
    LocalArray la;
    la.layout = {DType::f32, {16, 8}, s};
    la.devices = {r};
    la.block = [&, r, wrong_shape, throw_block](std::size_t) {
      if (throw_block) throw Error("device copy failed on purpose");
      return wrong_shape ? HostTensor(DType::f32, {3, 8}) : block_of(w, s, mesh, r);
    };
    return std::map<std::string, LocalArray>{{"w", la}};
  };
  SECTION("a block that cannot be copied") {
    const auto errors = run_processes(4, rv.path, 60, [&](int r, ProcessGroup& g) {
      CheckpointDir(dir.path).save_local(1, local_of(r, false, r == 2), mesh, &g);
    });
    for (const std::string& e : errors) {
      CHECK_THAT(e, Catch::Contains("step 1: rank 2: device copy failed on purpose"));
    }
  }
  SECTION("a block of the wrong shape") {
    const auto errors = run_processes(4, rv.path, 60, [&](int r, ProcessGroup& g) {
      CheckpointDir(dir.path).save_local(1, local_of(r, r == 1, false), mesh, &g);
    });
    for (const std::string& e : errors) {
      CHECK_THAT(e, Catch::Contains("rank 1: the block of mesh position 1 of array 'w' is f32[3,8]") &&
                        Catch::Contains("makes blocks of f32[4,8]"));
    }
  }
  SECTION("processes that save different arrays") {
    const auto errors = run_processes(4, rv.path, 60, [&](int r, ProcessGroup& g) {
      auto local = local_of(r, false, false);
      if (r == 3) local["w"].layout.shape = {16, 9};
      CheckpointDir(dir.path).save_local(1, local, mesh, &g);
    });
    for (const std::string& e : errors) {
      CHECK_THAT(e, Catch::Contains("rank 3 saves other arrays or another mesh than rank 0"));
    }
  }
  SECTION("a process that never arrives") {
    // Rank 3 dies before the save: the others wait out the group's deadline and fail.
    const auto errors = run_processes(4, rv.path, 2, [&](int r, ProcessGroup& g) {
      if (r == 3) return;
      CheckpointDir(dir.path).save_local(1, local_of(r, false, false), mesh, &g);
    });
    for (int r = 0; r < 3; ++r) CHECK_FALSE(errors[static_cast<std::size_t>(r)].empty());
  }
  CheckpointDir ck(dir.path);
  CHECK(ck.steps().empty());
  CHECK(ck.latest() == std::nullopt);
}

TEST_CASE("a Trainer checkpoints its device state block by block and resumes on another mesh with the same losses",
          "[checkpoint][trainer]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("checkpoint of the device state", seed, 6);
  TempDir tmp("many-device-state");
  tessel_test::Mlp m = tessel_test::build_mlp(8);
  std::mt19937_64 rng(seed);
  std::vector<std::vector<HostTensor>> batches;
  for (int s = 0; s < 6; ++s)
    batches.push_back({random_tensor(DType::f32, {8, 16}, rng), random_tensor(DType::f32, {8, 16}, rng)});
  TrainerOptions o;
  o.train.zero = 3;
  o.lr = LrSchedule::constant(1e-2);
  ThreadRuntime rt4(4);
  std::vector<double> want;
  CheckpointDir ck(tmp.path);
  {
    Trainer tr(m.g, m.loss, m.params, Mesh::parse("data=2,model=2"), rt4, o);
    tr.init(tessel_test::init_params(m, seed));
    for (int s = 0; s < 6; ++s) {
      want.push_back(tr.step(batches[static_cast<std::size_t>(s)]).loss);
      if (s == 2) {
        SaveOptions so;
        so.metadata_json = "{\"note\": \"after 3\"}";
        const SaveStats st = tr.save_checkpoint(ck, so);  // as step steps_done() = 3
        CHECK(st.processes == 1);
        CHECK(st.blocks_written > 0);
        CHECK(ck.manifest(3).metadata_json == "{\"note\":\"after 3\"}");
        // The state gathered and the checkpoint agree bit for bit.
        const auto back = ck.read_all(3);
        for (const auto& [name, v] : tr.state().values) {
          INFO(name);
          CHECK(same_bits(back.at(name), v));
        }
      }
    }
  }
  // Restored straight onto the devices of another mesh and ZeRO stage.
  TrainerOptions o1 = o;
  o1.train.zero = 1;
  Trainer tr(m.g, m.loss, m.params, Mesh::parse("data=4,model=1"), rt4, o1);
  ReadStats rs;
  tr.restore_checkpoint(ck, 3, {}, &rs);
  CHECK(rs.bytes_needed > 0);
  CHECK(tr.steps_done() == 3);
  for (const auto& [name, v] : ck.read_all(3)) {
    INFO(name);
    CHECK(same_bits(tr.state().values.at(name), v));
  }
  for (int s = 3; s < 6; ++s) {
    const double got = tr.step(batches[static_cast<std::size_t>(s)]).loss;
    INFO("seed " << seed << " step " << s + 1 << ": resumed " << got << ", uninterrupted " << want[static_cast<std::size_t>(s)]);
    CHECK(std::fabs(got - want[static_cast<std::size_t>(s)]) <= 1e-5 * std::fabs(want[static_cast<std::size_t>(s)]));
  }
  // A step that is not committed, or that lacks a value of the state, is refused naming it, and
  // the trainer is left as it was.
  CHECK_THROWS_WITH(tr.restore_checkpoint(ck, 4), Catch::Contains("step 4 is not committed") && Catch::Contains("3"));
  ck.save(9, {{"w1_0", ck.read(3, "w1_0")}}, Mesh::parse("data=1"));
  CHECK_THROWS_WITH(tr.restore_checkpoint(ck, 9), Catch::Contains("step 9 of " + tmp.path + " has no 'adam.m.w1_0'") &&
                                                      Catch::Contains("it holds: w1_0"));
  CHECK(tr.steps_done() == 6);
  // A state missing a value, or one laid out for another program, is refused naming it.
  std::map<std::string, ShardedArray> state;
  for (const auto& [name, sh] : tr.state_shardings()) state[name] = ck.restore_to_device(3, name, tr.program(), name);
  state.erase("w1_0");
  CHECK_THROWS_WITH(tr.set_device_state(3, state), Catch::Contains("the state has no 'w1_0'"));
  ThreadRuntime rt2(2);
  Trainer other(m.g, m.loss, m.params, Mesh::parse("data=2,model=1"), rt2, o1);
  std::map<std::string, ShardedArray> foreign;
  for (const auto& [name, sh] : other.state_shardings()) foreign[name] = ck.restore_to_device(3, name, other.program(), name);
  CHECK_THROWS_WITH(tr.set_device_state(3, foreign), Catch::Contains("restore it onto program()'s input"));
}

TEST_CASE("an asynchronous save of a Trainer's device state copies the blocks and writes them while training goes on",
          "[checkpoint][trainer]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("asynchronous save of the device state", seed, 3);
  TempDir tmp("many-async-device");
  tessel_test::Mlp m = tessel_test::build_mlp(8);
  std::mt19937_64 rng(seed);
  TrainerOptions o;
  o.train.zero = 2;
  ThreadRuntime rt4(4);
  Trainer tr(m.g, m.loss, m.params, Mesh::parse("data=2,model=2"), rt4, o);
  tr.init(tessel_test::init_params(m, seed));
  AsyncCheckpointer ac{CheckpointDir(tmp.path)};
  std::map<int64_t, TrainState> saved;
  for (int s = 0; s < 3; ++s) {
    tr.step({random_tensor(DType::f32, {8, 16}, rng), random_tensor(DType::f32, {8, 16}, rng)});
    saved[tr.steps_done()] = tr.state();
    ac.save(tr.steps_done(), tr.device_state(), tr.program());
    // The next step donates the arrays saved above: the save holds host copies.
  }
  ac.wait();
  CheckpointDir ck(tmp.path);
  REQUIRE(ck.steps() == std::vector<int64_t>{1, 2, 3});
  for (const auto& [step, st] : saved) {
    const auto back = ck.read_all(step);
    for (const auto& [name, v] : st.values) {
      INFO("step " << step << " " << name);
      CHECK(same_bits(back.at(name), v));
    }
  }
  AsyncCheckpointer small{CheckpointDir(tmp.path), 100};
  CHECK_THROWS_WITH(small.save(4, tr.device_state(), tr.program()), Catch::Contains("above the staging budget of 100 bytes"));
}
