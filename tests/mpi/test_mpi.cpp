// Tests of the MPI runtime, run under mpiexec with 2 and 4 processes (tests/mpi/mpi_tests.cmake):
// every process runs every test case in the same order (SPMD). Failures across processes
// (a throwing or killed rank) are tested by tessel-mpi-failure (run_failure.cmake), since a
// failed job cannot continue in the same processes.
#include <mpi.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <cmath>
#include <optional>
#include <random>
#include <thread>

#include "../unit/test_util.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/checkpoint/checkpoint.hpp"
#include "tessel/executable.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/runtime/compare.hpp"
#include "tessel/runtime/launch.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/mpi/mpi_runtime.hpp"
#include "tessel/runtime/process_group.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/ir/graph_text.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/pipeline/runner.hpp"
#include "tessel/pipeline/stages.hpp"

using namespace tessel;

namespace {

// The same value on every process (rank 0's).
uint64_t bcast(uint64_t v) {
  unsigned long long x = v;
  MPI_Bcast(&x, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  return x;
}

MpiRuntimeOptions test_options(StreamMode mode = StreamMode::Async) {
  MpiRuntimeOptions o;
  o.stream_mode = mode;
  o.inline_max_comm_bytes = 0;  // the stream workers, not the inline path, are under test
  o.timeout_s = 120;
  return o;
}

// Value of element i of device p's send buffer.
float val(int64_t p, std::size_t i) { return static_cast<float>((p + 1) * 100 + static_cast<int64_t>(i % 37)) * 0.5f; }

}  // namespace

TEST_CASE("mpi: rank and world size agree with the launcher's environment", "[mpi]") {
  MpiRuntime rt(test_options());
  LaunchInfo l = detect_launch();
  CHECK(l.source == "mpi");
  CHECK(l.rank == rt.rank());
  CHECK(l.world_size == rt.world_size());
  CHECK(l.local_rank == rt.local_rank());
  CHECK(launched_by_mpi());
  CHECK(mpi_compiled());
}

TEST_CASE("mpi: collectives of groups within and across processes", "[mpi]") {
  const StreamMode mode = GENERATE(StreamMode::Async, StreamMode::Eager);
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // x=W,y=2: y groups are inside a process, x groups have a member per process; x=2,y=W:
  // groups with several members in one process and processes in several groups.
  for (const std::string& spec : {fmt::format("x={},y=2", world), fmt::format("x=2,y={}", world)}) {
    Mesh mesh = Mesh::parse(spec);
    MpiRuntime rt(test_options(mode));
    std::vector<int64_t> mine = rt.devices_for(mesh);
    REQUIRE(static_cast<int64_t>(mine.size()) * world == mesh.num_devices());
    const std::vector<std::vector<std::string>> axes_list = {{"x"}, {"y"}, {"x", "y"}};
    auto cw = rt.make_world(mesh, axes_list, 60);
    DeviceThreads& lr = rt.local();
    for (const auto& axes : axes_list) {
      INFO("mesh " << spec << " axes " << join(axes, ",") << " streams " << stream_mode_name(mode));
      const std::size_t count = 10;  // elements per rank block (not a multiple of the group size)
      std::vector<std::string> failures(mine.size());
      auto errors = lr.run_on_devices([&](int64_t d) {
        const int64_t p = mine[static_cast<std::size_t>(d)];
        auto group = mesh.group(p, axes);
        const int n = static_cast<int>(group.size());
        const int me = static_cast<int>(mesh.index_in_group(p, axes));
        auto comm = cw->communicator(p, axes);
        Backend& be = lr.backend(d);
        Stream& s = lr.comm_stream(d);
        const std::size_t total = count * static_cast<std::size_t>(n);
        std::vector<float> host(total);
        for (std::size_t i = 0; i < total; ++i) host[i] = val(p, i);
        auto send = be.allocate(total * 4), recv = be.allocate(total * 4);
        std::vector<float> out(total);
        auto fail = [&](const std::string& what, std::size_t i, float got, float want) {
          if (failures[d].empty())
            failures[d] = fmt::format("device {} {}: element {} is {} but should be {}", p, what, i, got, want);
        };
        // all_reduce (sum, f32), in place.
        be.copy_from_host(*send, host.data(), total * 4, s);
        comm->all_reduce(send->data(), send->data(), total, DType::f32, ReduceOp::Sum, s);
        be.copy_to_host(out.data(), *send, total * 4, s);
        s.synchronize();
        for (std::size_t i = 0; i < total; ++i) {
          float want = 0;
          for (int64_t q : group) want += val(q, i);
          if (std::fabs(out[i] - want) > 1e-3f * std::fabs(want)) fail("all_reduce", i, out[i], want);
        }
        // all_gather of each member's first block.
        be.copy_from_host(*send, host.data(), count * 4, s);
        comm->all_gather(send->data(), recv->data(), count * 4, s);
        be.copy_to_host(out.data(), *recv, total * 4, s);
        s.synchronize();
        for (int j = 0; j < n; ++j)
          for (std::size_t i = 0; i < count; ++i)
            if (out[j * count + i] != val(group[j], i)) fail("all_gather", j * count + i, out[j * count + i], val(group[j], i));
        // reduce_scatter (max).
        be.copy_from_host(*send, host.data(), total * 4, s);
        comm->reduce_scatter(send->data(), recv->data(), count, DType::f32, ReduceOp::Max, s);
        be.copy_to_host(out.data(), *recv, count * 4, s);
        s.synchronize();
        for (std::size_t i = 0; i < count; ++i) {
          float want = -1e30f;
          for (int64_t q : group) want = std::max(want, val(q, me * count + i));
          if (out[i] != want) fail("reduce_scatter", i, out[i], want);
        }
        // all_to_all: block j of member k goes to member j.
        be.copy_from_host(*send, host.data(), total * 4, s);
        comm->all_to_all(send->data(), recv->data(), count * 4, s);
        be.copy_to_host(out.data(), *recv, total * 4, s);
        s.synchronize();
        for (int j = 0; j < n; ++j)
          for (std::size_t i = 0; i < count; ++i)
            if (out[j * count + i] != val(group[j], me * count + i))
              fail("all_to_all", j * count + i, out[j * count + i], val(group[j], me * count + i));
        // broadcast from the last member; barrier.
        be.copy_from_host(*send, host.data(), count * 4, s);
        comm->broadcast(send->data(), count * 4, n - 1, s);
        comm->barrier(s);
        be.copy_to_host(out.data(), *send, count * 4, s);
        s.synchronize();
        for (std::size_t i = 0; i < count; ++i)
          if (out[i] != val(group[n - 1], i)) fail("broadcast", i, out[i], val(group[n - 1], i));
        // collective_permute: a ring, inside a group call.
        be.copy_from_host(*send, host.data(), count * 4, s);
        comm->group_start();
        comm->collective_permute(send->data(), (me + 1) % n, recv->data(), (me + n - 1) % n, count * 4, s);
        comm->group_end();
        be.copy_to_host(out.data(), *recv, count * 4, s);
        s.synchronize();
        for (std::size_t i = 0; i < count; ++i)
          if (out[i] != val(group[(me + n - 1) % n], i)) fail("collective_permute", i, out[i], val(group[(me + n - 1) % n], i));
        // bf16 and i32 all_reduce: every member gets the same bits.
        std::vector<uint16_t> hb(total);
        for (std::size_t i = 0; i < total; ++i) hb[i] = f32_to_bf16(val(p, i) * 0.01f);
        be.copy_from_host(*send, hb.data(), total * 2, s);
        comm->all_reduce(send->data(), recv->data(), total, DType::bf16, ReduceOp::Sum, s);
        std::vector<uint16_t> ob(total);
        be.copy_to_host(ob.data(), *recv, total * 2, s);
        std::vector<int32_t> hi(total), oi(total);
        for (std::size_t i = 0; i < total; ++i) hi[i] = static_cast<int32_t>(p * 1000 + static_cast<int64_t>(i));
        be.copy_from_host(*send, hi.data(), total * 4, s);
        comm->all_reduce(send->data(), recv->data(), total, DType::i32, ReduceOp::Sum, s);
        be.copy_to_host(oi.data(), *recv, total * 4, s);
        s.synchronize();
        for (std::size_t i = 0; i < total; ++i) {
          float want = 0;
          for (int64_t q : group) want += bf16_to_f32(f32_to_bf16(val(q, i) * 0.01f));
          if (std::fabs(bf16_to_f32(ob[i]) - want) > 0.02f * std::fabs(want)) fail("bf16 all_reduce", i, bf16_to_f32(ob[i]), want);
          int64_t wi = 0;
          for (int64_t q : group) wi += q * 1000 + static_cast<int64_t>(i);
          if (oi[i] != wi) fail("i32 all_reduce", i, static_cast<float>(oi[i]), static_cast<float>(wi));
        }
      });
      for (std::size_t d = 0; d < errors.size(); ++d) {
        if (errors[d]) {
          try {
            std::rethrow_exception(errors[d]);
          } catch (const std::exception& e) {
            FAIL("device " << mine[d] << ": " << e.what());
          }
        }
        INFO(failures[d]);
        CHECK(failures[d].empty());
      }
    }
  }
}

TEST_CASE("mpi: a launch that does not fit the mesh is an error at load", "[mpi]") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Graph g;
  auto x = input(g, "x", DType::f32, {8});
  g.mark_output(neg(x));
  {
    Mesh mesh = Mesh::parse(fmt::format("x={}", world + 1));  // world + 1 is never divisible by world > 1
    g.mesh = mesh;
    Executable exe = compile(g, mesh);
    MpiRuntime rt(test_options());
    try {
      load(exe, rt);
      FAIL("load should throw");
    } catch (const RuntimeError& e) {
      const std::string msg = e.what();
      CHECK(msg.find(fmt::format("world size {}", world)) != std::string::npos);
      CHECK(msg.find(mesh.to_string()) != std::string::npos);
    }
  }
  {
    Mesh mesh = Mesh::parse(fmt::format("x={}", world));
    g.mesh = mesh;
    Executable exe = compile(g, mesh);
    MpiRuntimeOptions o = test_options();
    o.process_of_device.assign(static_cast<std::size_t>(world), 0);  // rank 0 owns everything
    MpiRuntime rt(o);
    CHECK_THROWS_WITH(load(exe, rt), Catch::Contains("rank 1 owns no device"));
  }
}

TEST_CASE("mpi: ranks that load different programs or meshes are refused on every rank", "[mpi]") {
  MpiRuntime rt(test_options());  // initialises MPI when this test runs first
  const int world = rt.world_size(), rank = rt.rank();
  if (world < 2) return;
  // A weight [16,12] on rank 0 and [16,8] elsewhere: before, one rank failed on an MPI status
  // and the other returned garbage.
  {
    Graph g;
    const Mesh mesh = Mesh::parse(fmt::format("data={}", world));
    auto x = input(g, "x", DType::f32, {2 * world, 16});
    auto w = input(g, "w", DType::f32, {16, rank == 0 ? 12 : 8});
    g.annotate(x, Sharding::parse("[{data}, {}]"));
    g.mark_output(reduce_sum(einsum("bd,df->bf", x, w), {0, 1}));
    Executable exe = compile(g, mesh);
    try {
      load(exe, rt);
      FAIL("load of different programs should throw");
    } catch (const RuntimeError& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(fmt::format("load on rank {}: the processes loaded different programs", rank)) !=
            std::string::npos);
      CHECK(msg.find("rank 0 has 'input %w f32[16,12]") != std::string::npos);
      CHECK(msg.find("where rank 1 has 'input %w f32[16,8]") != std::string::npos);
    }
  }
  // The same axes in another order on rank 0: the blocks would land on other devices.
  {
    Graph g;
    const Mesh mesh = Mesh::parse(rank == 0 ? fmt::format("data={},model=1", world) : fmt::format("model=1,data={}", world));
    auto x = input(g, "x", DType::f32, {2 * world, 4});
    g.annotate(x, Sharding::parse("[{data}, {}]"));
    g.mark_output(neg(x));
    Executable exe = compile(g, mesh);
    CHECK_THROWS_WITH(load(exe, rt), Catch::Contains("rank 0 has 'mesh {data=") && Catch::Contains("has 'mesh {model=1"));
  }
  // The runtime is still usable: the same program on every rank loads and runs.
  {
    Graph g;
    const Mesh mesh = Mesh::parse(fmt::format("data={}", world));
    auto x = input(g, "x", DType::f32, {2 * world, 4});
    g.annotate(x, Sharding::parse("[{data}, {}]"));
    g.mark_output(neg(x));
    Executable exe = compile(g, mesh);
    LoadedExecutable le = load(exe, rt);
    HostTensor xs(DType::f32, {2 * world, 4});
    for (int64_t i = 0; i < xs.numel(); ++i) xs.set(i, static_cast<double>(i));
    const HostTensor y = le.to_host(le.run({le.to_device("x", xs)}).outputs[0]);
    CHECK(y.get(3) == -3.0);
  }
}

TEST_CASE("mpi: explicit device map with named inputs and sharded outputs gathered on every process", "[mpi]") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Mesh mesh = Mesh::parse(fmt::format("data={},model=2", world));
  Graph g;
  auto x = input(g, "x", DType::f32, {4 * world, 6});
  auto w = input(g, "w", DType::f32, {6, 8});
  auto y = einsum("bd,df->bf", x, w);
  g.annotate(x, Sharding::of({{"data"}, {}}));
  g.annotate(w, Sharding::of({{}, {"model"}}));
  g.mark_output(y);
  g.mesh = mesh;
  Executable exe = compile(g, mesh);
  MpiRuntimeOptions o = test_options();
  // Round-robin: device p on rank p % world (not contiguous).
  for (int64_t p = 0; p < mesh.num_devices(); ++p) o.process_of_device.push_back(static_cast<int>(p % world));
  MpiRuntime rt(o);
  LoadedExecutable prog = load(exe, rt);
  for (int64_t p : prog.local_devices()) CHECK(p % world == rt.rank());
  auto inputs = random_inputs(g, 7);
  auto r = prog.run_named({{"x", prog.to_device("x", inputs[0])}, {"w", prog.to_device("w", inputs[1])}});
  HostTensor got = prog.to_host(r.outputs[0], /*check_replicas=*/true);
  auto want = run_reference(g, inputs);
  CHECK(compare(got, want[0], max_abs(inputs)).max_rel_err <= 1e-5);
  CHECK(prog.shards_to_host(r.outputs[0]).size() == static_cast<std::size_t>(mesh.num_devices()));
}

TEST_CASE("mpi: file rendezvous between the processes", "[mpi]") {
  MpiRuntime rt(test_options());
  const uint64_t id = bcast(static_cast<uint64_t>(std::random_device{}()));
  const std::string dir = fmt::format("{}/mpi-rendezvous-{}", TESSEL_BINARY_DIR, id);
  auto all = file_rendezvous(dir, "job", rt.rank(), rt.world_size(), fmt::format("hello from {}\n\0x", rt.rank()), 60);
  REQUIRE(static_cast<int>(all.size()) == rt.world_size());
  for (int r = 0; r < rt.world_size(); ++r) CHECK(all[r] == fmt::format("hello from {}\n\0x", r));
}

TEST_CASE("mpi: process groups (MPI and file) allgather every rank's bytes in rank order", "[mpi]") {
  // What a CudaRuntime bootstraps NCCL with (cuda.hpp): rank 0's unique id reaches every rank.
  std::shared_ptr<ProcessGroup> pg = process_group_from_env();
  REQUIRE(pg);
  CHECK(pg->name() == "mpi");
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(pg->rank() == rank);
  CHECK(pg->size() == size);
  for (int round = 0; round < 3; ++round) {  // empty, short and uneven payloads
    const std::string mine = round == 0 ? std::string() : std::string(static_cast<std::size_t>(rank * round), char('a' + rank));
    const auto all = pg->allgather(mine);
    REQUIRE(static_cast<int>(all.size()) == size);
    for (int r = 0; r < size; ++r)
      CHECK(all[static_cast<std::size_t>(r)] ==
            (round == 0 ? std::string() : std::string(static_cast<std::size_t>(r * round), char('a' + r))));
  }
  // The file rendezvous with the same ranks, in a directory every process names alike.
  FileRendezvousOptions fo;
  fo.rank = rank, fo.size = size, fo.local_rank = pg->local_rank(), fo.timeout_s = 60;
  fo.dir = fmt::format("{}/pg-rendezvous-{}", TESSEL_BINARY_DIR, bcast(static_cast<uint64_t>(std::random_device{}())));
  auto fg = file_process_group(fo);
  for (int round = 0; round < 2; ++round) {
    const auto all = fg->allgather(fmt::format("{}:{}", round, rank));
    for (int r = 0; r < size; ++r) CHECK(all[static_cast<std::size_t>(r)] == fmt::format("{}:{}", round, r));
  }
  // The abort channel of both: the last rank posts, every other rank sees its notice (once),
  // the poster sees none of its own.
  for (ProcessGroup* g : {pg.get(), fg.get()}) {
    INFO("process group " << g->name());
    const int last = size - 1;
    if (rank == last) g->post_abort(fmt::format("rank {} failed", last));
    if (rank != last) {
      std::optional<AbortNotice> n;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!n && std::chrono::steady_clock::now() < deadline) {
        n = g->poll_abort();
        if (!n) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      REQUIRE(n);
      CHECK(n->rank == last);
      CHECK(n->reason == fmt::format("rank {} failed", last));
    }
    g->allgather("");  // every notice delivered before anyone polls again
    CHECK_FALSE(g->poll_abort());
  }
}

TEST_CASE("mpi: property: partitioned run on the MPI runtime == reference", "[mpi][property]") {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const uint64_t seed = bcast(tessel_test::seed());
  const int cases = tessel_test::cases(40);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) fmt::print("mpi property test: seed {} (TESSEL_SEED), {} cases, {} processes\n", seed, cases, world);
  std::mt19937_64 rng(seed);
  std::vector<OpKind> kinds;
  for (OpKind k : all_op_kinds())
    if (op_def(k).sample && k != OpKind::Input) kinds.push_back(k);
  int done = 0;
  for (int c = 0; c < cases; ++c) {
    OpKind k = kinds[static_cast<std::size_t>(c) % kinds.size()];
    const uint64_t case_seed = rng();
    std::mt19937_64 crng(case_seed);
    Mesh mesh = tessel_test::random_mesh(crng);
    while (mesh.num_devices() % world != 0) mesh = tessel_test::random_mesh(crng);
    SampleGen cr{crng, [&](const Shape& s) { return tessel_test::random_sharding_for(crng, mesh, s, false); }};
    Graph g;
    Tensor out = op_def(k).sample(g, cr);
    g.mark_output(out);
    for (int v : g.inputs)
      if (cr.coin(0.8)) g.annotate(v, tessel_test::random_sharding_for(crng, mesh, g.values[v].shape, false));
    g.mesh = mesh;
    INFO("seed " << seed << " (TESSEL_SEED) case " << c << " op " << op_name(k) << " on " << world
                 << " processes\n" << print_graph(g));
    Executable exe = compile(g, mesh);
    auto inputs = random_inputs(g, case_seed);
    MpiRuntime rt(test_options(c % 2 ? StreamMode::Eager : StreamMode::Async));
    LoadedExecutable prog = load(exe, rt);
    std::vector<ShardedArray> args;
    for (std::size_t i = 0; i < inputs.size(); ++i) args.push_back(prog.to_device(i, inputs[i]));
    RunOptions ro;
    ro.poison = true;
    auto r = prog.run(args, ro);
    auto want = run_reference(g, inputs);
    REQUIRE(r.outputs.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CompareResult cmp = compare(prog.to_host(r.outputs[i], /*check_replicas=*/true), want[i], max_abs(inputs));
      INFO(cmp.to_string());
      REQUIRE(cmp.max_rel_err <= 1e-5);
    }
    ++done;
  }
  CHECK(done == cases);
}

TEST_CASE("mpi: collective-matmul rings across processes == reference", "[mpi][collective_matmul]") {
  // The sequence-parallel MLP on a ring of 4 spread over the processes: the permutes of the
  // rings (uni and bi) cross process boundaries.
  MpiRuntime rt(test_options(StreamMode::Async));
  tessel_test::check_sequence_parallel_rings(rt, bcast(tessel_test::seed()));
}

TEST_CASE("mpi: a checkpoint of device arrays is written by every process and restored onto another layout",
          "[mpi][checkpoint]") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const uint64_t seed = bcast(tessel_test::seed());
  if (rank == 0) tessel_test::announce("mpi checkpoint of device arrays", seed, 1);
  // w split over model and replicated over data (each block written by its data replicas
  // together), m split over both, b replicated everywhere; 2 devices per process.
  const Mesh mesh = Mesh::parse(fmt::format("data={},model=2", world));
  Graph g = parse_graph(fmt::format(R"(
mesh data={},model=2
%w = input f32[64,40] sharding=[{{}}, {{model}}]
%m = input f32[64,40] sharding=[{{data}}, {{model}}]
%b = input bf16[24] sharding=[{{}}]
%y = add(%w, %m)
output %y
)", world), "ckpt.tsl");
  MpiRuntime rt(test_options());
  LoadedExecutable le = load(compile(g, mesh), rt);
  const auto inputs = random_inputs(g, seed);
  std::map<std::string, ShardedArray> arrays = {
      {"w", le.to_device("w", inputs[0])}, {"m", le.to_device("m", inputs[1])}, {"b", le.to_device("b", inputs[2])}};
  // One folder for the job: rank 0's name.
  const std::string dir = fmt::format("{}/tessel-mpi-ckpt-{}", std::filesystem::temp_directory_path().string(),
                                      bcast(static_cast<uint64_t>(::getpid())));
  if (rank == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  CheckpointDir ck(dir);
  const SaveStats st = ck.save(3, arrays, le);
  CHECK(st.processes == world);
  CHECK(st.imbalance <= 1.1);
  // Every byte once: the processes' bytes add up to the arrays'.
  long long mine = st.bytes_written, total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  CHECK(total == static_cast<long long>(inputs[0].bytes() + inputs[1].bytes() + inputs[2].bytes()));
  CHECK(ck.steps() == std::vector<int64_t>{3});
  const auto back = ck.read_all(3);
  for (std::size_t i = 0; i < 3; ++i) {
    const std::string name = i == 0 ? "w" : i == 1 ? "m" : "b";
    INFO(name);
    CHECK(std::memcmp(back.at(name).data(), inputs[i].data(), inputs[i].bytes()) == 0);
  }
  // Restored onto the other layout of another program, each process reading its blocks.
  Graph g2 = parse_graph(fmt::format(R"(
mesh data={},model=2
%w = input f32[64,40] sharding=[{{data}}, {{}}]
%m = input f32[64,40] sharding=[{{}}, {{}}]
%y = add(%w, %m)
output %y
)", world), "ckpt2.tsl");
  LoadedExecutable le2 = load(compile(g2, mesh), rt);
  const ShardedArray w2 = ck.restore_to_device(3, "w", le2, "w");
  const ShardedArray m2 = ck.restore_to_device(3, "m", le2, "m");
  const HostTensor y = le2.to_host(le2.run({w2, m2}).outputs[0]);
  const auto want = run_reference(g2, {inputs[0], inputs[1]});
  CHECK(std::memcmp(y.data(), want[0].data(), y.bytes()) == 0);
  // A second save of the same step is refused on every process.
  CHECK_THROWS_WITH(ck.save(3, arrays, le), Catch::Contains("step 3 is already committed"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

// Issue 39: a pipeline whose stages run on processes of their own (PipelineOptions::processes,
// each stage an MpiRuntime over its processes, the values between stages as host messages)
// computes what the same stages compute in one process (thread runtimes); a stage failing on its
// processes stops every process, each rethrowing the failing stage's error.
TEST_CASE("mpi: pipeline stages on processes of their own equal the stages in one process and a failing stage stops every process",
          "[mpi][pipeline]") {
  std::shared_ptr<ProcessGroup> pg = mpi_process_group();
  const int N = pg->size(), k = N / 2;  // two stages of N/2 processes
  const uint64_t seed = bcast(std::random_device{}());
  INFO("seed " << seed);
  GptConfig c;
  c.batch = 2 * k;  // one micro-batch's rows, split over the stage's data axis
  c.seq = 8;
  c.d_model = 16;
  c.heads = 2;
  c.layers = 2;
  c.vocab = 32;
  const Mesh stage_mesh = gpt_mesh(Mesh::parse(fmt::format("data={}", k)), c);
  GptGraph m = build_gpt(c);
  std::vector<HostTensor> in = random_inputs(m.graph, seed);
  gpt_init(m.graph, in);
  std::map<std::string, HostTensor> init;
  for (const Tensor& t : m.weights)
    for (std::size_t i = 0; i < m.graph.inputs.size(); ++i)
      if (m.graph.inputs[i] == t.id) init[t.name()] = in[i];
  std::mt19937_64 rng(seed);
  std::vector<std::map<std::string, HostTensor>> micro(4);
  for (auto& mb : micro)
    for (const char* n : {"tokens", "labels"}) {
      HostTensor t(DType::i32, {c.batch, c.seq});
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(rng() % static_cast<uint64_t>(c.vocab)));
      mb.emplace(n, t);
    }
  PipelineOptions o;
  o.schedule = ScheduleKind::OneFOneB;
  o.micro = 4;

  // In this process: two thread runtimes.
  ThreadRuntime t0(stage_mesh.num_devices()), t1(stage_mesh.num_devices());
  PipelineTrainer one(split_stages(m.graph, m.loss, m.weights, {m.checkpoints.at(1)}), stage_mesh, {&t0, &t1}, init,
                      o);
  // Across processes: this process's stage only.
  const int64_t mine = pg->rank() / k;
  MpiRuntimeOptions mo = test_options();
  mo.ranks = pipeline_stage_ranks(N, 2, mine);
  MpiRuntime rt(mo);
  std::vector<Runtime*> rts = {nullptr, nullptr};
  rts[static_cast<std::size_t>(mine)] = &rt;
  o.processes = pg;
  o.timeout_s = 60;
  PipelineTrainer many(split_stages(m.graph, m.loss, m.weights, {m.checkpoints.at(1)}), stage_mesh, rts, init, o);
  for (int t = 1; t <= 2; ++t) {
    const PipelineStepReport a = one.step(micro, 1e-2, t), b = many.step(micro, 1e-2, t);
    CHECK(std::fabs(a.loss - b.loss) <= 1e-5 * std::fabs(a.loss));
    CHECK(std::fabs(a.grad_norm - b.grad_norm) <= 1e-5 * a.grad_norm);
    CHECK(b.peak_in_flight == std::vector<int64_t>{2, 1});
  }
  const std::map<std::string, HostTensor> pa = one.state(), pb = many.state();
  REQUIRE(pa.size() == pb.size());
  for (const auto& [n, v] : pa) {
    INFO(n);
    CHECK(compare(pb.at(n), v).max_rel_err <= 1e-5);
  }
  // Stage 0's processes fail (tokens of another shape than the program's): every process throws
  // its error, stage 1's too (it was waiting for stage 0's activations).
  micro[0]["tokens"] = HostTensor(DType::i32, {c.batch + 1, c.seq});
  CHECK_THROWS_WITH(many.step(micro, 1e-2, 3),
                    Catch::Contains("pipeline stage 0, the forward of micro-batch 0") && Catch::Contains("tokens"));
  // The stage pattern that does not fit: a process count the stages do not split.
  CHECK_THROWS_WITH(pipeline_stage_ranks(3, 2, 0), Catch::Contains("3 processes for 2 stages"));
}
