// The pool runtime's process form under mpirun (planner/pool_runtime.hpp, PoolRunOptions::
// processes): one process per device, each job on an MpiRuntime over its devices' processes
// (MpiRuntimeOptions::ranks). The oracle is the same plan run as threads of rank 0.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <filesystem>

#include "../unit/test_util.hpp"
#include "../unit/tiny_model_job.hpp"
#include "tessel/executable.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/planner/model_job.hpp"
#include "tessel/planner/pool_runtime.hpp"
#include "tessel/planner/schedule.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/mpi/mpi_runtime.hpp"
#include "tessel/runtime/process_group.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/train/trainer.hpp"

using namespace tessel;
using namespace tessel::planner;

namespace {

ModelJob job_of(const std::string& name, int64_t steps, int64_t d_model, uint64_t seed) {
  return tessel_test::tiny_model_job(name, steps, d_model, seed);
}

}  // namespace

TEST_CASE("mpi: runtimes over disjoint sets of processes run different programs side by side", "[mpi][pool]") {
  auto pg = mpi_process_group();
  const int n = pg->size();
  const int me = pg->rank();
  if (n < 2) return;
  // Halves (n = 2: one process each, two devices per process; n = 4: two processes each).
  const bool first = me < n / 2;
  std::vector<int> ranks;
  for (int r = first ? 0 : n / 2; r < (first ? n / 2 : n); ++r) ranks.push_back(r);
  MpiRuntimeOptions ro;
  ro.ranks = ranks;
  ro.timeout_s = 60;
  MpiRuntime rt(ro);
  CHECK(rt.world_size() == static_cast<int>(ranks.size()));
  CHECK(rt.rank() == me - ranks[0]);
  // A process group of the same processes (what NCCL bootstraps through in the GPU form).
  auto sub = mpi_process_group(ranks, 7);
  CHECK(sub->size() == static_cast<int>(ranks.size()));
  CHECK(sub->rank() == me - ranks[0]);
  const std::vector<std::string> got_ranks = sub->allgather(std::to_string(me));
  for (std::size_t i = 0; i < ranks.size(); ++i) CHECK(got_ranks[i] == std::to_string(ranks[i]));
  sub->send(0, 3, fmt::format("from {}", me));
  if (sub->rank() == 0) {
    std::vector<std::string> heard;
    while (heard.size() < ranks.size())
      if (auto m = sub->try_recv(3)) heard.push_back(m->bytes);
    std::sort(heard.begin(), heard.end());
    for (int r : ranks) CHECK(std::count(heard.begin(), heard.end(), fmt::format("from {}", r)) == 1);
  }
  sub->allgather("");  // every message was received before the group goes
  // Each half its own program: a matmul summed over data (an all-reduce across processes for
  // n = 4), or a sum of squares.
  const uint64_t seed = std::stoull(pg->allgather(std::to_string(tessel_test::seed()))[0]);  // rank 0's
  tessel_test::announce("mpi: runtimes over disjoint sets of processes", seed, 1);
  INFO("seed " << seed);
  Graph g;
  const int64_t d = 2 * static_cast<int64_t>(ranks.size());
  const Mesh mesh = Mesh::parse(fmt::format("data={}", d));
  g.mesh = mesh;
  auto x = input(g, "x", DType::f32, {4 * d, 6});
  Tensor y;
  if (first) {
    auto w = input(g, "w", DType::f32, {6, 5});
    y = reduce_sum(matmul(x, w), {0});
  } else {
    y = reduce_sum(mul(x, x), {0});
  }
  g.annotate(x, Sharding::of({{"data"}, {}}));
  g.mark_output(y);
  Executable exe = compile(g, mesh);
  LoadedExecutable prog = load(exe, rt);
  const std::vector<HostTensor> in = random_inputs(g, seed);
  std::vector<ShardedArray> args;
  for (std::size_t i = 0; i < in.size(); ++i) args.push_back(prog.to_device(prog.input_names()[i], in[i]));
  auto r = prog.run(args);
  const HostTensor got = prog.to_host(r.outputs[0]);
  const HostTensor want = run_reference(g, in).at(0);
  REQUIRE(got.numel() == want.numel());
  // Sums of up to 96 products of [-1, 1) draws in another order: float rounding of about 1e-7
  // per term. An absolute margin too, since a sum near zero has no relative precision (seed
  // 1795750968030391099 gave -0.008514896 against -0.0085150339).
  for (int64_t i = 0; i < got.numel(); ++i) CHECK(got.get(i) == Approx(want.get(i)).epsilon(1e-5).margin(1e-5));
}

TEST_CASE("mpi: an MpiRuntime over ranks refuses a process not listed and repeated ranks", "[mpi][pool]") {
  auto pg = mpi_process_group();
  if (pg->size() < 2) return;
  MpiRuntimeOptions ro;
  ro.ranks = {pg->rank() == 0 ? 1 : 0};
  CHECK_THROWS_WITH(MpiRuntime(ro), Catch::Contains("is not one of the runtime's ranks"));
  ro.ranks = {pg->rank(), pg->rank()};
  CHECK_THROWS_WITH(MpiRuntime(ro), Catch::Contains("must be distinct"));
  ro.ranks = {pg->rank(), pg->size()};
  CHECK_THROWS_WITH(MpiRuntime(ro), Catch::Contains("must be distinct ranks of MPI_COMM_WORLD"));
}

TEST_CASE("mpi: a pool with one process per device runs the plan as threads do with a moved job",
          "[mpi][pool]") {
  auto pg = mpi_process_group();
  const int n = pg->size();
  Pool pool;
  pool.nodes = 1;
  pool.devices_per_node = n;
  std::vector<ModelJob> jobs = {job_of("a", 10, 16, 1), job_of("b", 7, 32, 2)};
  if (n >= 4) {
    jobs.push_back(job_of("c", 8, 16, 3));
    jobs.push_back(job_of("d", 5, 16, 4));
  }
  const std::string ck = fmt::format("{}/mpi-pool-checkpoints-{}", TESSEL_BINARY_DIR, n);
  PoolRunOptions o;
  o.progress_interval_s = 0.05;
  o.checkpoint_dir = ck + "/processes";
  if (n >= 2) o.moves.push_back({"a", 4, {0, 1}});
  std::vector<std::string> lines;
  o.print = [&](const std::string& l) { lines.push_back(l); };
  o.processes = pg;
  int made = 0;  // segments whose runtime this process made through make_runtime
  o.make_runtime = [&made](const std::vector<int>& ranks, int tag) -> std::unique_ptr<Runtime> {
    ++made;
    MpiRuntimeOptions ro;
    ro.ranks = ranks;
    ro.group_tag = tag;
    return std::make_unique<MpiRuntime>(ro);
  };
  if (pg->rank() != 0) {
    // Serving only: no profiles, no plan.
    const PoolRunReport r = run_pool(jobs, {}, {}, pool, o);
    CHECK(r.jobs.empty());
    return;
  }
  std::filesystem::remove_all(ck);
  ProfileOptions po;
  po.measure = false;
  std::vector<JobProfile> profiles;
  for (const ModelJob& j : jobs) profiles.push_back(profile_model_job(j, pool, po));
  Schedule plan = plan_fast(profiles, pool);
  // a starts on device 0 alone, so that its move to {0, 1} changes its layout.
  plan.jobs[0].num_devices = 1;
  plan.jobs[0].devices = {0};
  const PoolRunReport got = run_pool(jobs, profiles, plan, pool, o);

  CHECK(made >= 2);  // job a's two segments both hold device 0
  PoolRunOptions t = o;  // the oracle: the same plan and move on threads of this process
  t.processes = nullptr;
  t.make_runtime = nullptr;
  t.checkpoint_dir = ck + "/threads";
  t.print = [](const std::string&) {};
  const PoolRunReport want = run_pool(jobs, profiles, plan, pool, t);

  REQUIRE(got.jobs.size() == jobs.size());
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    INFO("job " << jobs[j].name);
    const JobRunRecord& a = got.jobs[j];
    const JobRunRecord& b = want.jobs[j];
    REQUIRE(a.losses.size() == static_cast<std::size_t>(jobs[j].steps));
    REQUIRE(a.segments.size() == b.segments.size());
    for (std::size_t s = 0; s < a.segments.size(); ++s) {
      CHECK(a.segments[s].devices == b.segments[s].devices);
      CHECK(a.segments[s].layout == b.segments[s].layout);
      CHECK(a.segments[s].first_step == b.segments[s].first_step);
      CHECK(a.segments[s].last_step == b.segments[s].last_step);
    }
    for (std::size_t k = 0; k < a.losses.size(); ++k) {
      INFO("step " << k + 1);
      CHECK(a.losses[k] == Approx(b.losses[k]).epsilon(1e-5));
    }
    CHECK(a.end_s > a.start_s);
  }
  if (n >= 2) {
    REQUIRE(got.jobs[0].segments.size() == 2);
    CHECK(got.jobs[0].segments[0].last_step == 4);
    CHECK(got.jobs[0].segments[1].devices == std::vector<int32_t>{0, 1});
    CHECK_THAT(got.table(), Catch::Contains("moves after step 4"));
  }
  bool progress = false;
  for (const std::string& l : lines) progress = progress || l.find("tok/s") != std::string::npos;
  CHECK(progress);
  std::filesystem::remove_all(ck);
}

TEST_CASE("mpi: in a pool of processes the re-planner moves a running job and its loss curve continues",
          "[mpi][pool]") {
  auto pg = mpi_process_group();
  if (pg->size() < 2) return;
  Pool pool;
  pool.nodes = 1;
  pool.devices_per_node = pg->size();
  const std::vector<ModelJob> jobs = {job_of("long", 240, 16, 11)};
  const std::string ck = fmt::format("{}/mpi-pool-replan-{}", TESSEL_BINARY_DIR, pg->size());
  PoolRunOptions o;
  o.progress_interval_s = 0;
  o.replan_interval_s = 0.001;
  o.move_cost_s = 0;
  o.checkpoint_dir = ck;
  o.processes = pg;
  if (pg->rank() != 0) {
    CHECK(run_pool(jobs, {}, {}, pool, o).jobs.empty());
    return;
  }
  std::filesystem::remove_all(ck);
  // The profile says two devices run it 1.8x faster: with idle devices beside it the re-planner
  // moves it once its measured rate is known (its move goes through the leader's decision).
  ProfileOptions po;
  po.measure = false;
  std::vector<JobProfile> profiles = {profile_model_job(jobs[0], pool, po)};
  const double t1 = profiles[0].step_time_s.at(1);
  profiles[0].step_time_s = {{1, t1}, {2, t1 / 1.8}};
  Schedule plan = plan_fast(profiles, pool);
  plan.jobs[0].num_devices = 1;
  plan.jobs[0].devices = {0};
  plan.jobs[0].end_s = plan.makespan_s = profiles[0].runtime_s(1);
  const PoolRunReport r = run_pool(jobs, profiles, plan, pool, o);
  INFO(r.table());
  const JobRunRecord& rec = r.jobs.at(0);
  REQUIRE(rec.segments.size() >= 2);
  CHECK(rec.segments[1].devices.size() == 2);
  CHECK_THAT(r.table(), Catch::Contains("adopted") && Catch::Contains("job 'long' moves"));
  REQUIRE(rec.losses.size() == 240);
  // The oracle: the job alone, never moved, on threads.
  ModelJobStep s = build_model_step(jobs[0], Layout::parse(rec.segments[0].layout));
  ThreadRuntime rt(s.mesh.num_devices());
  Trainer tr(s.model.graph, s.model.loss, s.model.weights, s.mesh, rt, s.options);
  tr.init(initial_params(jobs[0], s.model));
  for (int64_t k = 1; k <= 240; ++k) {
    const double want = tr.step(model_job_batch(jobs[0], k)).loss;
    INFO("step " << k);
    CHECK(rec.losses[static_cast<std::size_t>(k - 1)] == Approx(want).epsilon(1e-4));
  }
  std::filesystem::remove_all(ck);
}

TEST_CASE("mpi: a job that fails in a pool of processes stops the pool on every process naming the job", "[mpi][pool]") {
  auto pg = mpi_process_group();
  Pool pool;
  pool.nodes = 1;
  pool.devices_per_node = pg->size();
  std::vector<ModelJob> jobs = {job_of("bad", 3, 16, 1)};
  PoolRunOptions o;
  o.progress_interval_s = 0;
  o.processes = pg;
  // Rank 0's profiles (predictions only) and plan; the other processes pass none.
  auto planned = [&](std::vector<JobProfile>& profiles, Schedule& plan) {
    if (pg->rank() != 0) return false;
    ProfileOptions po;
    po.measure = false;
    profiles.push_back(profile_model_job(jobs[0], pool, po));
    plan = plan_fast(profiles, pool);
    return true;
  };
  std::vector<JobProfile> profiles;
  Schedule plan;
  if (planned(profiles, plan))
    for (auto& [g, layout] : profiles[0].plan) layout = "data=7 zero=9";  // not a layout
  CHECK_THROWS_WITH(run_pool(jobs, profiles, plan, pool, o), Catch::Contains("job 'bad' failed"));
  // A process that stays silent (here: its runtime takes 4 s to make, against a report timeout of
  // 1.5 s) fails the pool on every process, naming it, instead of leaving rank 0 waiting.
  if (pg->size() >= 2) {
    PoolRunOptions slow = o;
    slow.report_timeout_s = 1.5;
    slow.make_runtime = [](const std::vector<int>& ranks, int tag) -> std::unique_ptr<Runtime> {
      std::this_thread::sleep_for(std::chrono::seconds(4));
      MpiRuntimeOptions ro;
      ro.ranks = ranks;
      ro.group_tag = tag;
      return std::make_unique<MpiRuntime>(ro);
    };
    std::vector<JobProfile> ok_profiles;
    Schedule on_1;
    if (planned(ok_profiles, on_1)) {
      on_1.jobs[0].num_devices = 1;
      on_1.jobs[0].devices = {1};
    }
    CHECK_THROWS_WITH(run_pool(jobs, ok_profiles, on_1, pool, slow),
                      Catch::Contains("process 1 (the first of devices 1) has reported nothing"));
  }
  // A pool that does not have one process per device is refused on every process alike.
  Pool wrong = pool;
  wrong.devices_per_node = pg->size() + 1;
  CHECK_THROWS_WITH(run_pool(jobs, profiles, plan, wrong, o), Catch::Contains("one process per device"));
}
