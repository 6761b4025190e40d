// The pool runtime (tessel/planner/pool_runtime.hpp): planned model jobs run side by side on
// disjoint CPU sub-meshes; each job's losses equal its solo run's; a job moved mid-run through
// a checkpoint continues its loss curve; re-planning runs; bad requests are clear errors.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "tessel/core/common.hpp"
#include "tiny_model_job.hpp"
#include "tessel/planner/model_job.hpp"
#include "tessel/planner/pool_runtime.hpp"
#include "tessel/planner/schedule.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/train/trainer.hpp"

using namespace tessel;
using namespace tessel::planner;

namespace {

ModelJob job_of(const std::string& name, int64_t steps, int64_t d_model, uint64_t seed) {
  return tessel_test::tiny_model_job(name, steps, d_model, seed);
}

// The job alone on its layout for `steps` steps: the losses the pool must reproduce.
std::vector<double> solo_losses(const ModelJob& job, const std::string& layout, int64_t steps) {
  ModelJobStep s = build_model_step(job, Layout::parse(layout));
  ThreadRuntime rt(s.mesh.num_devices());
  Trainer tr(s.model.graph, s.model.loss, s.model.weights, s.mesh, rt, s.options);
  tr.init(initial_params(job, s.model));
  std::vector<double> out;
  for (int64_t k = 1; k <= steps; ++k) out.push_back(tr.step(model_job_batch(job, k)).loss);
  return out;
}

struct Batch {
  std::vector<ModelJob> jobs;
  std::vector<JobProfile> profiles;
  Pool pool;
};

Batch small_batch() {
  Batch b;
  b.pool.nodes = 1;
  b.pool.devices_per_node = 3;
  b.jobs = {job_of("a", 12, 16, 1), job_of("b", 8, 32, 2), job_of("c", 10, 16, 3), job_of("d", 6, 16, 4)};
  ProfileOptions po;
  po.measure = false;  // predictions only: the test is about running the plan
  for (const ModelJob& j : b.jobs) b.profiles.push_back(profile_model_job(j, b.pool, po));
  return b;
}

std::string temp_dir(const char* what) {
  const auto p = std::filesystem::temp_directory_path() /
                 ("tessel-pool-" + std::string(what) + "-" +
                  std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace

TEST_CASE("pool runtime: planned jobs run side by side and each equals its solo run", "[planner]") {
  const Batch b = small_batch();
  const Schedule plan = plan_fast(b.profiles, b.pool);
  validate_schedule(plan, b.profiles, b.pool);
  PoolRunOptions o;
  std::vector<std::string> lines;
  o.print = [&](const std::string& l) { lines.push_back(l); };
  o.progress_interval_s = 0.05;
  const PoolRunReport r = run_pool(b.jobs, b.profiles, plan, b.pool, o);
  REQUIRE(r.jobs.size() == b.jobs.size());
  for (std::size_t j = 0; j < b.jobs.size(); ++j) {
    INFO("job " << b.jobs[j].name);
    const JobRunRecord& rec = r.jobs[j];
    REQUIRE(rec.losses.size() == static_cast<std::size_t>(b.jobs[j].steps));
    REQUIRE(rec.segments.size() == 1);
    CHECK(rec.segments[0].devices == plan.jobs[j].devices);
    const std::vector<double> solo = solo_losses(b.jobs[j], rec.segments[0].layout, b.jobs[j].steps);
    for (std::size_t k = 0; k < solo.size(); ++k) CHECK(rec.losses[k] == Approx(solo[k]).epsilon(1e-6));
    CHECK(rec.losses.back() < rec.losses.front());
    CHECK(rec.end_s > rec.start_s);
  }
  // Jobs that share a device ran one after the other, in the plan's order.
  for (std::size_t i = 0; i < r.jobs.size(); ++i)
    for (std::size_t j = 0; j < r.jobs.size(); ++j) {
      if (i == j || plan.jobs[i].start_s >= plan.jobs[j].start_s) continue;
      bool share = false;
      for (int32_t d : plan.jobs[i].devices)
        share = share || std::find(plan.jobs[j].devices.begin(), plan.jobs[j].devices.end(), d) != plan.jobs[j].devices.end();
      if (share) CHECK(r.jobs[j].start_s >= r.jobs[i].end_s);
    }
  CHECK(r.makespan_s > 0);
  CHECK_THAT(r.table(), Catch::Contains("makespan: planned"));
}

TEST_CASE("pool runtime: a job moved mid-run through a checkpoint continues its loss curve", "[planner]") {
  Batch b = small_batch();
  b.jobs.resize(2);
  b.profiles.resize(2);
  // a on device 0 and b on devices 1-2; after step 5, a moves to devices 0-1 (waiting for b)
  Schedule plan = plan_fast(b.profiles, b.pool);
  plan.jobs[0].num_devices = 1;
  plan.jobs[0].devices = {0};
  plan.jobs[1].num_devices = 2;
  plan.jobs[1].devices = {1, 2};
  PoolRunOptions o;
  o.progress_interval_s = 0;
  o.checkpoint_dir = temp_dir("move");
  o.moves.push_back({"a", 5, {0, 1}});
  const PoolRunReport r = run_pool(b.jobs, b.profiles, plan, b.pool, o);
  const JobRunRecord& a = r.jobs[0];
  REQUIRE(a.segments.size() == 2);
  CHECK(a.segments[0].devices == std::vector<int32_t>{0});
  CHECK(a.segments[0].last_step == 5);
  CHECK(a.segments[1].devices == std::vector<int32_t>{0, 1});
  CHECK(a.segments[1].first_step == 6);
  CHECK(a.segments[1].start_s >= r.jobs[1].end_s);  // it waited for b's devices
  const std::vector<double> solo = solo_losses(b.jobs[0], a.segments[0].layout, b.jobs[0].steps);
  REQUIRE(a.losses.size() == solo.size());
  for (std::size_t k = 0; k < solo.size(); ++k) {
    INFO("step " << k + 1);
    CHECK(a.losses[k] == Approx(solo[k]).epsilon(1e-4));
  }
  CHECK_THAT(r.table(), Catch::Contains("moves after step 5"));
  std::filesystem::remove_all(o.checkpoint_dir);
}

TEST_CASE("pool runtime: re-planning weighs the rest with measured rates", "[planner]") {
  const Batch b = small_batch();
  const Schedule plan = plan_fast(b.profiles, b.pool);
  PoolRunOptions o;
  o.progress_interval_s = 0;
  o.replan_interval_s = 0.02;
  o.checkpoint_dir = temp_dir("replan");
  const PoolRunReport r = run_pool(b.jobs, b.profiles, plan, b.pool, o);
  for (std::size_t j = 0; j < b.jobs.size(); ++j) {
    INFO("job " << b.jobs[j].name);
    REQUIRE(r.jobs[j].losses.size() == static_cast<std::size_t>(b.jobs[j].steps));
    CHECK(std::isfinite(r.jobs[j].losses.back()));
  }
  std::filesystem::remove_all(o.checkpoint_dir);
}

TEST_CASE("pool runtime: bad requests are clear errors", "[planner]") {
  Batch b = small_batch();
  const Schedule plan = plan_fast(b.profiles, b.pool);
  PoolRunOptions o;
  o.moves.push_back({"a", 2, {0, 1}});
  CHECK_THROWS_WITH(run_pool(b.jobs, b.profiles, plan, b.pool, o), Catch::Contains("checkpoint_dir"));
  o.checkpoint_dir = "/tmp/unused";
  o.moves[0].job = "zz";
  CHECK_THROWS_WITH(run_pool(b.jobs, b.profiles, plan, b.pool, o), Catch::Contains("job 'zz'"));
  JobProfile no_layout = b.profiles[0];
  no_layout.plan.clear();
  std::vector<JobProfile> ps = b.profiles;
  ps[0] = no_layout;
  CHECK_THROWS_WITH(run_pool(b.jobs, ps, plan, b.pool, {}), Catch::Contains("job 'a' has no layout"));
}

TEST_CASE("pool runtime: the re-planner moves a running job onto idle devices and its losses continue", "[planner]") {
  Batch b = small_batch();
  b.jobs = {job_of("long", 240, 16, 11)};  // long enough for several re-plans on a loaded machine
  b.profiles.resize(1);
  ProfileOptions po;
  po.measure = false;
  b.profiles[0] = profile_model_job(b.jobs[0], b.pool, po);
  // The profile says two devices run it 1.8x faster: with three idle devices the re-planner
  // should move it once its measured rate is known.
  const double t1 = b.profiles[0].step_time_s.at(1);
  b.profiles[0].step_time_s = {{1, t1}, {2, t1 / 1.8}};
  Schedule plan = plan_fast(b.profiles, b.pool);
  plan.jobs[0].num_devices = 1;
  plan.jobs[0].devices = {0};
  plan.jobs[0].end_s = plan.makespan_s = b.profiles[0].runtime_s(1);
  PoolRunOptions o;
  o.progress_interval_s = 0;
  o.replan_interval_s = 0.001;
  o.move_cost_s = 0;
  o.checkpoint_dir = temp_dir("replan-move");
  const PoolRunReport r = run_pool(b.jobs, b.profiles, plan, b.pool, o);
  INFO(r.table());
  const JobRunRecord& rec = r.jobs[0];
  REQUIRE(rec.segments.size() >= 2);
  CHECK(rec.segments[1].devices.size() == 2);
  CHECK_THAT(r.table(), Catch::Contains("adopted") && Catch::Contains("job 'long' moves"));
  REQUIRE(rec.losses.size() == 240);
  const std::vector<double> solo = solo_losses(b.jobs[0], rec.segments[0].layout, 240);
  for (std::size_t k = 0; k < solo.size(); ++k) {
    INFO("step " << k + 1);
    CHECK(rec.losses[k] == Approx(solo[k]).epsilon(1e-4));
  }
  std::filesystem::remove_all(o.checkpoint_dir);
}

TEST_CASE("pool runtime: a pipeline layout runs as a PipelineTrainer equal to one device and moves to a plain layout through a checkpoint",
          "[planner]") {
  ModelJob j = job_of("p", 8, 16, 5);
  j.gpt.layers = 2;
  j.device_counts = {1, 2};
  Pool pool;
  pool.nodes = 1;
  pool.devices_per_node = 2;
  ProfileOptions po;
  po.measure = false;
  JobProfile prof = profile_model_job(j, pool, po);
  prof.plan[2] = "pipe=2 micro=2 data=1,model=1 zero=0 remat=none";  // the pipeline on 2 devices
  Schedule plan = plan_fast({prof}, pool);
  plan.jobs[0].num_devices = 2;
  plan.jobs[0].devices = {0, 1};
  PoolRunOptions o;
  o.progress_interval_s = 0;
  o.checkpoint_dir = temp_dir("pipe");
  o.moves.push_back({"p", 4, {0}});  // after step 4, onto one device: the Trainer resumes the pipeline's state
  const PoolRunReport r = run_pool({j}, {prof}, plan, pool, o);
  const JobRunRecord& a = r.jobs[0];
  REQUIRE(a.segments.size() == 2);
  CHECK(a.segments[0].layout == "pipe=2 micro=2 data=1,model=1 zero=0 remat=none");
  CHECK(a.segments[0].last_step == 4);
  CHECK(a.segments[1].devices == std::vector<int32_t>{0});
  const std::vector<double> solo = solo_losses(j, "data=1,model=1 zero=0 remat=none", j.steps);
  REQUIRE(a.losses.size() == solo.size());
  for (std::size_t k = 0; k < solo.size(); ++k) {
    INFO("step " << k + 1);
    CHECK(a.losses[k] == Approx(solo[k]).epsilon(1e-4));
  }
  std::filesystem::remove_all(o.checkpoint_dir);
}
