// The worker side of the pool runtime's process form (pool_protocol.hpp): every process of the
// pool serves the segments rank 0's coordinator sends it, each on an MpiRuntime over the
// processes of the segment's devices.
#include <fmt/format.h>

#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "pool_protocol.hpp"
#include "tessel/runtime/make_runtime.hpp"
#include "tessel/checkpoint/checkpoint.hpp"
#include "tessel/runtime/mpi/mpi_runtime.hpp"
#include "tessel/train/trainer.hpp"

namespace tessel::planner::detail {

std::string format_order(const SegmentOrder& o) {
  std::string s = fmt::format("S {} {} {} {}", o.seg, o.job, o.resume_step, o.stop_after);
  for (int32_t d : o.devices) s += fmt::format(" {}", d);
  return s + "\n" + o.layout;
}

SegmentOrder parse_order(const std::string& text) {
  const std::size_t nl = text.find('\n');
  std::istringstream in(text.substr(0, nl));
  SegmentOrder o;
  std::string s;
  in >> s >> o.seg >> o.job >> o.resume_step >> o.stop_after;
  int32_t d = 0;
  while (in >> d) o.devices.push_back(d);
  if (s != "S" || o.devices.empty() || nl == std::string::npos)
    throw PlanError(fmt::format("pool worker: a malformed segment order '{}' (a coordinator of another tessel "
                                "version?)",
                                text.substr(0, 80)));
  o.layout = text.substr(nl + 1);
  return o;
}

namespace {

void run_segment(const std::vector<ModelJob>& jobs, ProcessGroup& pg, const PoolRunOptions& opt,
                 const SegmentOrder& o) {
  const bool leader = pg.rank() == o.devices[0];
  const int ptag = progress_tag(o.seg), ctag = control_tag(o.seg);
  std::string steps;  // step reports not yet sent (the leader's)
  auto last_sent = std::chrono::steady_clock::now();
  auto send_steps = [&] {
    if (!leader || steps.empty()) return;
    pg.send(0, ptag, steps);
    steps.clear();
    last_sent = std::chrono::steady_clock::now();
  };
  auto tell = [&](const std::string& m) {  // the segment's last report: the steps before it first
    send_steps();
    if (leader) pg.send(0, ptag, m);
  };
  try {
    if (o.job >= jobs.size())
      throw PlanError(fmt::format("pool worker: segment {} names job {} but this process has {} jobs (was every "
                                  "process given the same job file?)",
                                  o.seg, o.job, jobs.size()));
    const ModelJob& job = jobs[o.job];
    // The step first: a layout that does not build fails on every process of the segment alike,
    // before any MPI communicator exists (no process is left waiting, none marked failed).
    const Layout layout = Layout::parse(o.layout);
    if (layout.pipe > 1)
      throw PlanError(fmt::format("pool worker: job '{}' has the pipeline layout '{}', which the pool runs on CPU "
                                  "threads of one process only yet (plan without pipelines: ProfileOptions::pipeline)",
                                  job.name, o.layout));
    ModelJobStep s = build_model_step(job, layout);
    const std::vector<int> ranks(o.devices.begin(), o.devices.end());
    std::unique_ptr<Runtime> runtime;  // waits until every process of the segment is here; outlives the trainer
    if (opt.make_runtime) {
      runtime = opt.make_runtime(ranks, static_cast<int>(o.seg));
      if (!runtime) throw PlanError("pool worker: PoolRunOptions::make_runtime returned no runtime");
    } else {
      RuntimeRequest rq;
      rq.backend = "mpi";
      rq.mesh = s.mesh;
      rq.mpi_ranks = ranks;
      rq.mpi_group_tag = static_cast<int>(o.seg);
      rq.kernel_threads = opt.kernel_threads;
      runtime = make_cpu_runtime(rq);
    }
    Runtime& rt = *runtime;
    Trainer tr(s.model.graph, s.model.loss, s.model.weights, s.mesh, rt, s.options);
    std::unique_ptr<CheckpointDir> ck;
    if (!opt.checkpoint_dir.empty()) ck = std::make_unique<CheckpointDir>(opt.checkpoint_dir + "/" + job.name);
    if (o.resume_step > 0) {
      if (!ck) throw PlanError(fmt::format("pool worker: job '{}' resumes at step {} without a checkpoint_dir", job.name,
                                           o.resume_step));
      tr.restore_checkpoint(*ck, o.resume_step);
    } else {
      tr.init(initial_params(job, s.model));
    }
    for (int64_t k = tr.steps_done() + 1; k <= job.steps; ++k) {
      // The leader decides whether to go on (the coordinator's control messages, or the move
      // asked for after step stop_after) and every process of the segment follows it.
      char decision = 'C';
      if (leader) {
        if (o.stop_after >= 0 && k - 1 == o.stop_after) decision = 'M';
        while (auto c = pg.try_recv(ctag)) decision = c->bytes == "X" ? 'X' : (decision == 'X' ? 'X' : 'M');
      }
      if (o.devices.size() > 1) decision = rt.allgather_host(std::string(1, decision))[0].at(0);
      if (decision == 'M') {
        if (!ck) throw PlanError(fmt::format("pool worker: job '{}' moves without a checkpoint_dir", job.name));
        const int64_t at = tr.steps_done();
        tr.save_checkpoint(*ck);
        tell(fmt::format("M {}", at));
        return;
      }
      if (decision == 'X') {
        tell("X");
        return;
      }
      const StepRecord r = tr.step(model_job_batch(job, k));
      if (leader) {
        steps += fmt::format("{}P {} {:.9g} {:.9g}", steps.empty() ? "" : "\n", k, r.loss, r.seconds);
        // The first step at once (the coordinator's first rate), then every kReportEvery.
        if (k == o.resume_step + 1 || std::chrono::steady_clock::now() - last_sent >= kReportEvery) send_steps();
      }
    }
    tell("D");
  } catch (const std::exception& e) {
    // Every process of the segment says so (the leader may be the one that cannot), the
    // leader after the steps that ran.
    try {
      send_steps();
    } catch (const std::exception&) {
    }
    pg.send(0, ptag, fmt::format("E process {} of devices {}: {}", pg.rank(), fmt::join(o.devices, ","), e.what()));
  }
}

}  // namespace

void serve_pool(const std::vector<ModelJob>& jobs, ProcessGroup& pg, const PoolRunOptions& options) {
  QuietBackoff quiet;
  while (true) {
    std::optional<ProcessGroup::Message> m = pg.try_recv(kStartTag);
    if (!m) {
      quiet.wait();
      continue;
    }
    quiet.reset();
    if (m->bytes.rfind("Q ok", 0) == 0) return;
    if (m->bytes.rfind("Q failed", 0) == 0) {
      const std::size_t nl = m->bytes.find('\n');
      throw PlanError(nl == std::string::npos ? "pool run failed on rank 0" : m->bytes.substr(nl + 1));
    }
    run_segment(jobs, pg, options, parse_order(m->bytes));
  }
}

}  // namespace tessel::planner::detail
