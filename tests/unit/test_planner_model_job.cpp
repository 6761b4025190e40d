// Model jobs of the multi-job planner (planner/model_job.hpp): the job-file entry and its errors,
// the layouts per device count, the prediction and the memory limit, the trials (at most two per
// count, timed on CPU virtual devices) and what runs a chosen layout. Tiny GPTs: a few seconds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "tessel/core/common.hpp"
#include "tessel/planner/jobs.hpp"
#include "tessel/planner/model_job.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/train/trainer.hpp"

using namespace tessel;
using namespace tessel::planner;

namespace {

// batch 4, seq 8, d_model 16, heads 2, one layer, vocab 32: heads do not split 4 ways.
const char* kTinyJob = R"({"name": "tiny", "steps": 100,
  "gpt": {"batch": 4, "seq": 8, "d_model": 16, "heads": 2, "layers": 1, "vocab": 32},
  "device_counts": [1, 2, 4], "seed": 7, "lr": 0.003})";

ModelJob tiny_job() { return parse_model_job(kTinyJob, "jobs.json"); }

Pool pool_of(int32_t devices_per_node, double memory_bytes = 0) {
  Pool p;
  p.nodes = 1;
  p.devices_per_node = devices_per_node;
  p.memory_bytes = memory_bytes;
  return p;
}

// Two CPU cores' worth of compute shared by the device threads, and no trials unless asked.
ProfileOptions predict_only() {
  ProfileOptions o;
  o.shared_cores = 2;
  o.measure = false;
  return o;
}

std::vector<const Candidate*> of_count(const ModelJobReport& r, int32_t g) {
  std::vector<const Candidate*> out;
  for (const Candidate& c : r.candidates)
    if (c.layout.devices() == g) out.push_back(&c);
  return out;
}

const Candidate& chosen_of(const ModelJobReport& r, int32_t g) {
  const Candidate* found = nullptr;
  for (const Candidate* c : of_count(r, g))
    if (c->chosen) {
      REQUIRE(found == nullptr);  // one per count
      found = c;
    }
  REQUIRE(found != nullptr);
  return *found;
}

std::string with(const std::string& field) {
  return std::string(R"({"name": "j", "steps": 10, "gpt": {"batch": 4, "heads": 2, "d_model": 16}, )") + field + "}";
}

}  // namespace

TEST_CASE("model job: parse a gpt job with its defaults", "[planner]") {
  const ModelJob j = tiny_job();
  CHECK(j.name == "tiny");
  CHECK(j.steps == 100);
  CHECK(j.gpt.batch == 4);
  CHECK(j.gpt.seq == 8);
  CHECK(j.gpt.d_model == 16);
  CHECK(j.gpt.heads == 2);
  CHECK(j.gpt.layers == 1);
  CHECK(j.gpt.vocab == 32);
  CHECK(j.gpt.ffn_mult == GptConfig{}.ffn_mult);
  CHECK(j.device_counts == std::vector<int32_t>{1, 2, 4});
  CHECK(j.seed == 7);
  CHECK(j.lr == 0.003);
  const ModelJob d = parse_model_job(R"({"name": "d", "steps": 5, "gpt": {"mixed": true}})", "x.json");
  CHECK(d.gpt.d_model == GptConfig{}.d_model);
  CHECK(d.gpt.compute == DType::bf16);
  CHECK(d.gpt.dtype == DType::f32);
  CHECK(d.device_counts.empty());
  CHECK(d.seed == 1);
  // A job file's model entry (JobEntry::model_json) reads the same, its scheduling fields too.
  const std::vector<JobEntry> entries = parse_job_file(
      R"({"jobs": [{"name": "m", "steps": 3, "gpt": {"batch": 2}, "may_span_nodes": true, "requested_devices": 2,
                    "device_counts": [4, 1, 2, 2]}]})",
      "jobs.json");
  REQUIRE(entries.size() == 1);
  REQUIRE(entries[0].is_model());
  const ModelJob m = parse_model_job(entries[0].model_json, "jobs.json");
  CHECK(m.name == "m");
  CHECK(m.gpt.batch == 2);
  CHECK(m.may_span_nodes);
  CHECK(m.requested_devices == 2);
  CHECK(m.device_counts == std::vector<int32_t>{1, 2, 4});  // sorted, repeats dropped
}

TEST_CASE("model job: errors name the file and the job and the field", "[planner]") {
  const auto fails = [](const std::string& text, const std::vector<std::string>& parts) {
    INFO(text);
    try {
      parse_model_job(text, "jobs.json");
      FAIL("no error");
    } catch (const PlanError& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find("jobs.json") != std::string::npos);
      for (const std::string& p : parts) CHECK(what.find(p) != std::string::npos);
    }
  };
  fails("{", {"not valid JSON"});
  fails(R"({"steps": 1, "gpt": {}})", {"\"name\""});
  fails(R"({"name": "j", "gpt": {}})", {"job 'j'", "\"steps\"", "nothing"});
  fails(R"({"name": "j", "steps": -2, "gpt": {}})", {"job 'j'", "\"steps\"", "-2"});
  fails(R"({"name": "j", "steps": 2})", {"job 'j'", "\"gpt\""});
  fails(R"({"name": "j", "steps": 2, "train_step": "step.tsl"})", {"job 'j'", "\"train_step\"", "not supported"});
  fails(with(R"("speed": 3)"), {"job 'j'", "unknown field \"speed\""});
  fails(R"({"name": "j", "steps": 2, "gpt": {"widht": 3}})", {"job 'j'", "\"widht\"", "known: batch"});
  fails(R"({"name": "j", "steps": 2, "gpt": {"heads": 0}})", {"job 'j'", "\"heads\" = 0", ">= 1"});
  fails(R"({"name": "j", "steps": 2, "gpt": {"batch": 2.5}})", {"job 'j'", "\"batch\" = 2.5"});
  fails(R"({"name": "j", "steps": 2, "gpt": {"d_model": 10, "heads": 4}})", {"job 'j'", "\"d_model\" = 10", "heads"});
  fails(R"({"name": "j", "steps": 2, "gpt": {"mixed": 1}})", {"job 'j'", "\"mixed\""});
  fails(with(R"("device_counts": [1, 0])"), {"job 'j'", "\"device_counts\"", "0"});
  fails(with(R"("device_counts": [])"), {"job 'j'", "\"device_counts\""});
  fails(with(R"("lr": -1)"), {"job 'j'", "\"lr\" = -1"});
  fails(with(R"("seed": "x")"), {"job 'j'", "\"seed\""});
  fails(with(R"("may_span_nodes": 1)"), {"job 'j'", "\"may_span_nodes\""});
}

// Issue 36 item 5: tessel-plan refuses a job it cannot run before it times any. check_model_job
// knows it without compiling; price_model_job with the cost model alone; time_model_job then
// runs the trials, and the two halves are profile_model_job.
TEST_CASE("model job: a job that cannot be placed or laid out is refused before any pricing", "[planner]") {
  check_model_job(tiny_job(), pool_of(4));  // fine
  const auto refused = [](const std::string& text, const Pool& pool, const std::vector<std::string>& parts) {
    INFO(text);
    try {
      check_model_job(parse_model_job(text, "jobs.json"), pool);
      FAIL("no error");
    } catch (const PlanError& e) {
      const std::string what = e.what();
      INFO(what);
      for (const std::string& p : parts) CHECK(what.find(p) != std::string::npos);
    }
  };
  refused(R"({"name": "wide", "steps": 5, "device_counts": [16], "gpt": {"batch": 4, "heads": 2, "d_model": 16}})",
          pool_of(8),
          {"job 'wide' has no plan on any device count", "no device count of the job is placeable in the pool",
           "16 devices: not placeable in the pool (1 nodes x 8 devices; the job may not span nodes)"});
  // Batch 3 and 3 heads split over neither data=2 nor model=2.
  refused(R"({"name": "odd", "steps": 5, "device_counts": [2], "gpt": {"batch": 3, "heads": 3, "d_model": 12}})",
          pool_of(8), {"job 'odd' has no plan on any device count", "2 devices: no layout: batch 3"});
  // The same error from profile_model_job (nothing compiled there either).
  CHECK_THROWS_WITH(profile_model_job(parse_model_job(R"({"name": "wide", "steps": 5, "device_counts": [16],
                                                          "gpt": {"batch": 4, "heads": 2, "d_model": 16}})",
                                                      "jobs.json"),
                                      pool_of(8), predict_only()),
                    Catch::Contains("16 devices: not placeable"));
  // Priced, then timed: the profile of profile_model_job.
  const ModelJob j = tiny_job();
  ModelJobReport whole, halves;
  const JobProfile p = profile_model_job(j, pool_of(4), predict_only(), &whole);
  price_model_job(j, pool_of(4), predict_only(), halves);
  CHECK(halves.candidates.size() == whole.candidates.size());
  for (const Candidate& c : halves.candidates) CHECK_FALSE(c.chosen);
  const JobProfile q = time_model_job(j, pool_of(4), predict_only(), halves);
  CHECK(q.step_time_s == p.step_time_s);
  CHECK(q.plan == p.plan);
  CHECK(halves.notes == whole.notes);
  // No layout fits the memory: price_model_job refuses it, before any trial would run.
  ProfileOptions timed = predict_only();
  timed.measure = true;
  ModelJobReport r;
  CHECK_THROWS_WITH(price_model_job(j, pool_of(4, 1000), timed, r),
                    Catch::Contains("job 'tiny' has no plan on any device count") &&
                        Catch::Contains("no layout fits") && Catch::Contains("the least peak"));
  CHECK(r.trials == 0);
}

TEST_CASE("model job: a layout's text reads back", "[planner]") {
  Layout l;
  l.data = 2;
  l.model = 4;
  l.zero = 3;
  l.remat = RematPolicy::all;
  CHECK(l.to_string() == "data=2,model=4 zero=3 remat=all");
  CHECK(Layout::parse(l.to_string()) == l);
  l.offload = true;
  CHECK(l.to_string() == "data=2,model=4 zero=3 remat=all offload");
  CHECK(Layout::parse(l.to_string()) == l);
  CHECK(Layout::parse("data=1,model=1 zero=0 remat=none").devices() == 1);
  for (const char* bad : {"", "data=2 zero=0 remat=none", "data=2,model=x zero=0 remat=none",
                          "data=2,model=2 zero=4 remat=none", "data=2,model=2 zero=0 remat=some",
                          "data=2,model=2 zero=0 remat=none swap", "data=0,model=2 zero=0 remat=none"})
    CHECK_THROWS_AS(Layout::parse(bad), PlanError);
  CHECK_THROWS_WITH(Layout::parse("data=2,model=2 zero=9 remat=none"), Catch::Contains("zero=9"));
  // A pipeline: pipe stages of data x model devices over micro micro-batches.
  Layout p;
  p.pipe = 2;
  p.micro = 4;
  p.data = 2;
  p.zero = 1;
  CHECK(p.to_string() == "pipe=2 micro=4 data=2,model=1 zero=1 remat=none");
  CHECK(Layout::parse(p.to_string()) == p);
  CHECK(p.devices() == 4);
  CHECK(p.mesh_spec() == "data=2,model=1");
  for (const char* bad : {"pipe=2 data=2,model=1 zero=0 remat=none", "pipe=1 micro=2 data=1,model=1 zero=0 remat=none",
                          "pipe=2 micro=0 data=1,model=1 zero=0 remat=none",
                          "pipe=2 micro=2 data=2,model=1 zero=3 remat=none",
                          "pipe=2 micro=2 data=1,model=1 zero=0 remat=einsums",
                          "pipe=2 micro=2 data=1,model=1 zero=0 remat=all offload"})
    CHECK_THROWS_AS(Layout::parse(bad), PlanError);
  CHECK_THROWS_WITH(Layout::parse("pipe=2 micro=2 data=2,model=1 zero=3 remat=none"),
                    Catch::Contains("a pipeline takes ZeRO 0 to 2"));
}

TEST_CASE("model job: pipeline layouts among the candidates", "[planner]") {
  ModelJob j = tiny_job();
  j.gpt.layers = 4;
  j.gpt.batch = 8;
  std::set<std::string> seen;
  for (const Layout& l : enumerate_layouts(j.gpt, 4, {RematPolicy::none}, true)) {
    CHECK(l.devices() == 4);
    if (l.pipe == 1) continue;
    seen.insert(l.to_string());
    CHECK(l.pipe <= j.gpt.layers);
    CHECK(j.gpt.batch % l.micro == 0);
    CHECK((j.gpt.batch / l.micro) % l.data == 0);
    CHECK(l.zero <= 2);
    CHECK(l.remat == RematPolicy::none);  // as asked
  }
  // Both remat none and all when asked; never einsums within a stage.
  std::set<RematPolicy> pipe_remat;
  for (const Layout& l : enumerate_layouts(j.gpt, 4, {RematPolicy::none, RematPolicy::einsums, RematPolicy::all}, true))
    if (l.pipe > 1) pipe_remat.insert(l.remat);
  CHECK(pipe_remat == std::set<RematPolicy>{RematPolicy::none, RematPolicy::all});
  CHECK(Layout::parse("pipe=2 micro=4 data=2,model=1 zero=1 remat=all").remat == RematPolicy::all);
  CHECK_THROWS_WITH(Layout::parse("pipe=2 micro=4 data=2,model=1 zero=1 remat=einsums"),
                    Catch::Contains("a pipeline takes remat=none (each stage keeps its activations) or remat=all"));
  CHECK(seen.count("pipe=2 micro=4 data=2,model=1 zero=0 remat=none"));
  CHECK(seen.count("pipe=2 micro=4 data=1,model=2 zero=0 remat=none"));
  CHECK(seen.count("pipe=4 micro=8 data=1,model=1 zero=0 remat=none"));
  for (const Layout& l : enumerate_layouts(j.gpt, 4)) CHECK(l.pipe == 1);  // only when asked
  j.gpt.layers = 1;
  for (const Layout& l : enumerate_layouts(j.gpt, 4, {RematPolicy::none}, true)) CHECK(l.pipe == 1);
  // Priced: a pipeline's prediction is its stages', its peak the largest stage's; where the pool's
  // memory is below every other layout's peak on 4 devices the profile picks a pipeline.
  j.gpt.layers = 4;
  j.device_counts = {4};
  ProfileOptions po;
  po.measure = false;
  ModelJobReport rep;
  price_model_job(j, pool_of(4), po, rep);
  double least_plain = 1e300, least_pipe = 1e300;
  for (const Candidate& c : rep.candidates) {
    CHECK(c.predicted_step_s > 0);
    CHECK(c.peak_bytes > 0);
    (c.layout.pipe > 1 ? least_pipe : least_plain) =
        std::min(c.layout.pipe > 1 ? least_pipe : least_plain, c.peak_bytes);
  }
  REQUIRE(least_pipe < least_plain);
  Pool tight = pool_of(4);
  tight.memory_bytes = 0.5 * (least_pipe + least_plain);
  const JobProfile prof = profile_model_job(j, tight, po);
  CHECK(Layout::parse(prof.plan.at(4)).pipe > 1);
  po.pipeline = false;
  CHECK_THROWS_AS(profile_model_job(j, tight, po), PlanError);  // nothing else fits
}

TEST_CASE("model job: candidate layouts per device count", "[planner]") {
  const ModelJob j = tiny_job();
  const auto meshes = [&](int32_t g) {
    std::set<std::string> out;
    for (const Layout& l : enumerate_layouts(j.gpt, g)) {
      CHECK(l.devices() == g);
      CHECK((l.data > 1 || l.zero == 0));  // ZeRO only where there is a data axis to shard over
      out.insert(l.mesh_spec());
    }
    return out;
  };
  CHECK(meshes(1) == std::set<std::string>{"data=1,model=1"});
  CHECK(meshes(2) == std::set<std::string>{"data=2,model=1", "data=1,model=2"});
  // 2 heads do not split over model=4, the batch of 4 not over data=8.
  CHECK(meshes(4) == std::set<std::string>{"data=4,model=1", "data=2,model=2"});
  CHECK(meshes(8) == std::set<std::string>{"data=4,model=2"});
  CHECK(meshes(16).empty());
  CHECK(enumerate_layouts(j.gpt, 1).size() == 2);       // remat none and all
  CHECK(enumerate_layouts(j.gpt, 2).size() == 4 * 2 + 2);  // data=2: ZeRO 0..3; model=2: ZeRO 0
  CHECK(enumerate_layouts(j.gpt, 4).size() == 4 * 2 + 4 * 2);
  CHECK(enumerate_layouts(j.gpt, 2, {RematPolicy::none}).size() == 5);

  // Device counts: the job's, or powers of two up to a node and the whole node; whole nodes
  // beyond only when spanning is allowed.
  CHECK(candidate_counts(j, pool_of(8)) == std::vector<int32_t>{1, 2, 4});
  CHECK(candidate_counts(j, pool_of(2)) == std::vector<int32_t>{1, 2});
  ModelJob d = j;
  d.device_counts.clear();
  CHECK(candidate_counts(d, pool_of(8)) == std::vector<int32_t>{1, 2, 4, 8});
  CHECK(candidate_counts(d, pool_of(6)) == std::vector<int32_t>{1, 2, 4, 6});
  Pool two = pool_of(4);
  two.nodes = 2;
  CHECK(candidate_counts(d, two) == std::vector<int32_t>{1, 2, 4});
  two.allow_spanning = true;
  CHECK(candidate_counts(d, two) == std::vector<int32_t>{1, 2, 4, 8});
}

TEST_CASE("model job: the plan of each count is its least predicted fitting layout", "[planner]") {
  const ModelJob j = tiny_job();
  ModelJobReport r;
  const JobProfile p = profile_model_job(j, pool_of(4), predict_only(), &r);
  INFO(r.table());
  CHECK(p.name == "tiny");
  CHECK(p.steps == 100);
  CHECK(r.trials == 0);
  CHECK(r.trial_seconds == 0);
  CHECK(r.predict_seconds > 0);
  CHECK(r.candidates.size() == 2 + 10 + 16);
  for (int32_t g : {1, 2, 4}) {
    INFO("devices " << g);
    const Candidate& c = chosen_of(r, g);
    for (const Candidate* o : of_count(r, g)) {
      CHECK(o->predicted_step_s > 0);
      CHECK(o->predicted_step_s == Approx(o->predicted_compute_s + o->predicted_comm_s + o->predicted_dispatch_s));
      CHECK(o->predicted_dispatch_s > 0);
      CHECK(o->peak_bytes > 0);
      CHECK(o->fits);
      CHECK(o->measured_step_s < 0);
      CHECK(c.predicted_step_s <= o->predicted_step_s);
    }
    REQUIRE(p.step_time_s.count(g) == 1);
    CHECK(p.step_time_s.at(g) == c.predicted_step_s);
    CHECK(p.peak_bytes.at(g) == c.peak_bytes);
    CHECK(Layout::parse(p.plan.at(g)) == c.layout);
  }
  // One device communicates nothing; ZeRO-3 on data=4 holds less of the state than data=4 alone.
  for (const Candidate* o : of_count(r, 1)) CHECK(o->predicted_comm_s == 0);
  const auto find = [&](const std::string& text) {
    for (const Candidate& c : r.candidates)
      if (c.layout.to_string() == text) return c;
    FAIL("no candidate " << text);
    return Candidate{};
  };
  CHECK(find("data=4,model=1 zero=3 remat=none").peak_bytes < find("data=4,model=1 zero=0 remat=none").peak_bytes);
  CHECK(find("data=4,model=1 zero=0 remat=none").predicted_comm_s > 0);
  CHECK(r.table().find("<- chosen") != std::string::npos);

  // The pool's link figure is the cost model's: a slower link, more communication time.
  Pool slow = pool_of(4);
  slow.intra_node_gbps = 0.01;
  ModelJobReport rs;
  profile_model_job(j, slow, predict_only(), &rs);
  REQUIRE(rs.candidates.size() == r.candidates.size());
  for (std::size_t i = 0; i < r.candidates.size(); ++i)
    if (r.candidates[i].predicted_comm_s > 0) CHECK(rs.candidates[i].predicted_comm_s > r.candidates[i].predicted_comm_s);
}

TEST_CASE("model job: a layout above the pool's memory is never chosen", "[planner]") {
  const ModelJob j = tiny_job();
  ModelJobReport free_r;
  profile_model_job(j, pool_of(4), predict_only(), &free_r);
  // A limit between the least and the largest peak of 2 devices: some layouts there are out.
  double least = std::numeric_limits<double>::infinity(), most = 0, least_all = least;
  for (const Candidate* c : of_count(free_r, 2)) least = std::min(least, c->peak_bytes), most = std::max(most, c->peak_bytes);
  for (const Candidate& c : free_r.candidates) least_all = std::min(least_all, c.peak_bytes);
  REQUIRE(least < most);
  const double limit = 0.5 * (least + most);
  ModelJobReport r;
  const JobProfile p = profile_model_job(j, pool_of(4, limit), predict_only(), &r);
  INFO(r.table());
  int out = 0;
  for (const Candidate& c : r.candidates) {
    CHECK(c.fits == (c.peak_bytes <= limit));
    if (!c.fits) {
      ++out;
      CHECK(!c.chosen);
      CHECK(c.note.find("> the pool's memory") != std::string::npos);
    }
  }
  CHECK(out > 0);
  for (const auto& [g, b] : p.peak_bytes) CHECK(b <= limit);
  for (const auto& [g, plan] : p.plan) {
    const Candidate& c = chosen_of(r, g);
    for (const Candidate* o : of_count(r, g))
      if (o->fits) CHECK(c.predicted_step_s <= o->predicted_step_s);
  }
  // A count where nothing fits is left out of the profile, and the report says why.
  for (const auto& [g, note] : r.notes) {
    CHECK(p.step_time_s.count(g) == 0);
    CHECK(note.find("no layout fits") != std::string::npos);
  }
  CHECK(usable_counts(p, pool_of(4, limit)).size() == p.step_time_s.size());

  // Below every layout's peak: no count fits, a clear error.
  try {
    profile_model_job(j, pool_of(4, 0.5 * least_all), predict_only());
    FAIL("no error");
  } catch (const PlanError& e) {
    const std::string what = e.what();
    CHECK(what.find("job 'tiny' has no plan on any device count") != std::string::npos);
    CHECK(what.find("no layout fits") != std::string::npos);
    CHECK(what.find("the least peak") != std::string::npos);
  }
}

TEST_CASE("model job: a layout above the memory gets an offload variant", "[planner]") {
  // Activations of 64 KiB per device: the offload pass (16 KiB and up) has something to move.
  const ModelJob j = parse_model_job(R"({"name": "act", "steps": 10, "device_counts": [1],
    "gpt": {"batch": 4, "seq": 64, "d_model": 64, "heads": 2, "layers": 2, "vocab": 64}})",
                                     "jobs.json");
  ModelJobReport free_r;
  profile_model_job(j, pool_of(1), predict_only(), &free_r);
  REQUIRE(free_r.candidates.size() == 2);  // remat none and all: nothing is short of memory
  const Candidate& none = free_r.candidates[0];
  REQUIRE(none.layout.remat == RematPolicy::none);
  ModelJobReport r;
  const JobProfile p = profile_model_job(j, pool_of(1, none.peak_bytes - 1), predict_only(), &r);
  INFO(r.table());
  const Candidate* off = nullptr;
  for (const Candidate& c : r.candidates)
    if (c.layout.offload) {
      CHECK(c.layout.remat == RematPolicy::none);
      off = &c;
    }
  REQUIRE(off != nullptr);
  CHECK(off->peak_bytes < none.peak_bytes);
  CHECK(off->predicted_step_s > none.predicted_step_s);  // the host copies cost time
  CHECK(!r.candidates[0].fits);
  const Candidate& c = chosen_of(r, 1);
  CHECK(c.fits);
  CHECK(Layout::parse(p.plan.at(1)) == c.layout);
  // Timed: offload and remat are two ways to fit, both tried, and the offload one runs.
  ProfileOptions o = predict_only();
  o.measure = true;
  o.timed_steps = 1;
  o.second_trial_margin = std::numeric_limits<double>::infinity();
  ModelJobReport timed;
  profile_model_job(j, pool_of(1, none.peak_bytes - 1), o, &timed);
  INFO(timed.table());
  CHECK(timed.trials == 2);
  for (const Candidate& x : timed.candidates) CHECK((x.measured_step_s > 0) == (x.fits));
  // The offload variant's options carry the offload to the Trainer.
  CHECK(build_model_step(j, off->layout).options.load.lowering.offload_min_bytes > 0);
  CHECK(build_model_step(j, none.layout).options.load.lowering.offload_min_bytes == 0);
}

TEST_CASE("model job: trials time at most two layouts per count on CPU devices", "[planner]") {
  ModelJob j = tiny_job();
  j.device_counts = {1, 2};
  ProfileOptions o = predict_only();
  o.measure = true;
  o.timed_steps = 2;
  o.second_trial_margin = std::numeric_limits<double>::infinity();  // always a second trial where one differs
  ModelJobReport r;
  const JobProfile p = profile_model_job(j, pool_of(2), o, &r);
  INFO(r.table());
  double sum = 0;
  for (int32_t g : {1, 2}) {
    INFO("devices " << g);
    const Candidate& c = chosen_of(r, g);
    std::vector<const Candidate*> tried;
    for (const Candidate* x : of_count(r, g)) {
      if (x->measured_step_s < 0) continue;
      tried.push_back(x);
      sum += x->trial_seconds;
      CHECK(x->measured_step_s > 0);
      CHECK(x->measured_peak_bytes > 0);
      CHECK(x->trial_seconds > x->measured_step_s);
      CHECK(c.measured_step_s <= x->measured_step_s);  // the trial of least measured time wins
    }
    CHECK(c.measured_step_s > 0);
    CHECK(p.step_time_s.at(g) == c.measured_step_s);
    CHECK(p.peak_bytes.at(g) == std::max(c.peak_bytes, c.measured_peak_bytes));
    // One device has one mesh: its remat variant trades time for memory and is not timed. Two
    // have data=2 and model=2: both timed.
    REQUIRE(tried.size() == (g == 1 ? 1u : 2u));
    if (tried.size() == 2) {
      CHECK(!(tried[0]->layout.data == tried[1]->layout.data && tried[0]->layout.zero == tried[1]->layout.zero));
    }
    // The best prediction is timed; an untried layout predicted below a tried one repeats it (its
    // mesh and ZeRO stage, or its very program).
    double best = std::numeric_limits<double>::infinity();
    for (const Candidate* x : of_count(r, g)) best = std::min(best, x->predicted_step_s);
    CHECK(std::any_of(tried.begin(), tried.end(), [&](const Candidate* t) { return t->predicted_step_s == best; }));
    for (const Candidate* x : of_count(r, g)) {
      if (x->measured_step_s >= 0) continue;
      for (const Candidate* t : tried)
        if (x->predicted_step_s < t->predicted_step_s)
          CHECK(std::any_of(tried.begin(), tried.end(), [&](const Candidate* u) {
            return (u->layout.data == x->layout.data && u->layout.zero == x->layout.zero) ||
                   (u->predicted_step_s == x->predicted_step_s && u->peak_bytes == x->peak_bytes);
          }));
    }
  }
  CHECK(r.trials == 3);
  CHECK(r.trial_seconds == Approx(sum));

  // A second candidate predicted far behind the best is not timed; one trial per count at most.
  o.second_trial_margin = 0;
  o.timed_steps = 1;
  ModelJobReport one;
  profile_model_job(j, pool_of(2), o, &one);
  CHECK(one.trials == 2);
  o.trials_per_count = 1;
  o.second_trial_margin = 0.5;
  profile_model_job(j, pool_of(2), o, &one);
  CHECK(one.trials == 2);

  o.trials_per_count = 3;
  CHECK_THROWS_WITH(profile_model_job(j, pool_of(2), o), Catch::Contains("at most 2 trials"));
  o.trials_per_count = 1;
  o.timed_steps = 0;
  CHECK_THROWS_WITH(profile_model_job(j, pool_of(2), o), Catch::Contains("timed_steps = 0"));
  o.timed_steps = 1;
  o.second_trial_margin = -1;
  CHECK_THROWS_WITH(profile_model_job(j, pool_of(2), o), Catch::Contains("second_trial_margin = -1"));
}

TEST_CASE("model job: a chosen layout runs and hands its state to another layout", "[planner]") {
  const ModelJob j = tiny_job();
  // The batches are a pure function of the seed and the step.
  const std::vector<HostTensor> b1 = model_job_batch(j, 1), b1again = model_job_batch(j, 1), b2 = model_job_batch(j, 2);
  REQUIRE(b1.size() == 2);
  CHECK(b1[0].shape() == Shape{4, 8});
  bool same = true, differ = false;
  for (int64_t i = 0; i < b1[0].numel(); ++i) {
    same = same && b1[0].get(i) == b1again[0].get(i) && b1[1].get(i) == b1again[1].get(i);
    differ = differ || b1[0].get(i) != b2[0].get(i);
    CHECK(b1[0].get(i) >= 0);
    CHECK(b1[0].get(i) < 32);
  }
  CHECK(same);
  CHECK(differ);
  CHECK_THROWS_AS(model_job_batch(j, 0), PlanError);

  // Two steps on data=2 zero=1, the state moved to model=2 with remat for a third step: the loss
  // of step 3 equals that of one trainer running all three on one device.
  ThreadRuntime rt2(2), rt1(1);
  ModelJobStep a = build_model_step(j, Layout::parse("data=2,model=1 zero=1 remat=none"));
  ModelJobStep b = build_model_step(j, Layout::parse("data=1,model=2 zero=0 remat=all"));
  ModelJobStep one = build_model_step(j, Layout::parse("data=1,model=1 zero=0 remat=none"));
  CHECK(a.mesh.num_devices() == 2);
  CHECK(a.options.train.zero == 1);
  CHECK(b.options.train.remat == RematPolicy::all);
  CHECK(b.options.train.checkpoints.size() == b.model.checkpoints.size());
  CHECK(a.options.lr.at(1) == 0.003);
  Trainer ta(a.model.graph, a.model.loss, a.model.weights, a.mesh, rt2, a.options);
  Trainer t1(one.model.graph, one.model.loss, one.model.weights, one.mesh, rt1, one.options);
  ta.init(initial_params(j, a.model));
  t1.init(initial_params(j, one.model));
  double first = 0;
  for (int64_t k = 1; k <= 2; ++k) {
    const double la = ta.step(model_job_batch(j, k)).loss, l1 = t1.step(model_job_batch(j, k)).loss;
    CHECK(la == Approx(l1).epsilon(1e-4));
    if (k == 1) first = l1;
  }
  const TrainState st = ta.state();
  Trainer tb(b.model.graph, b.model.loss, b.model.weights, b.mesh, rt2, b.options);
  tb.set_state(st);
  CHECK(tb.steps_done() == 2);
  const double lb = tb.step(model_job_batch(j, 3)).loss, l1 = t1.step(model_job_batch(j, 3)).loss;
  CHECK(lb == Approx(l1).epsilon(1e-4));
  CHECK(std::isfinite(first));
}
