// Running a planned batch of model jobs side by side on one pool, with re-planning and moves
// through checkpoints (tessel/planner/pool_runtime.hpp).
#include "tessel/runtime/make_runtime.hpp"
#include "tessel/planner/pool_runtime.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "job_runner.hpp"

#include "pool_protocol.hpp"
#include "tessel/checkpoint/checkpoint.hpp"
#include "tessel/core/common.hpp"
#include "tessel/planner/show.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"

namespace tessel::planner {

namespace {

using Clock = std::chrono::steady_clock;

enum class Phase { waiting, running, done };

struct JobState {
  Phase phase = Phase::waiting;
  std::vector<int32_t> devices;     // where it runs now, or next
  double key = 0;                   // its place in the order of its devices' jobs
  int64_t steps_done = 0;
  int64_t checkpoint_step = 0;      // the step of its last checkpoint (0: none)
  bool move_requested = false;      // checkpoint at the next step boundary, then go to next_devices
  std::vector<int32_t> next_devices;
  double next_key = 0;
  std::set<std::size_t> forced_done;  // PoolRunOptions::moves applied
  double segment_start = 0;
  int64_t segment_first_step = 0;
  double segment_seconds = 0;       // step time summed over this segment's steps
  int64_t segment_steps = 0;
  double last_loss = 0;
  bool finished_thread = false;     // the thread has returned (join it)
  std::thread thread;
  std::exception_ptr error;
};

std::string ids(const std::vector<int32_t>& d) { return format_devices(d); }

class PoolRun {
 public:
  PoolRun(const std::vector<ModelJob>& jobs, const std::vector<JobProfile>& profiles, const Schedule& plan,
          const Pool& pool, const PoolRunOptions& options)
      : jobs_(jobs), profiles_(profiles), pool_(pool), o_(options), state_(jobs.size()) {
    if (profiles.size() != jobs.size() || plan.jobs.size() != jobs.size())
      throw PlanError(fmt::format("run_pool: {} jobs, {} profiles and a plan of {} jobs: give one of each per job",
                                  jobs.size(), profiles.size(), plan.jobs.size()));
    if ((o_.replan_interval_s > 0 || !o_.moves.empty()) && o_.checkpoint_dir.empty())
      throw PlanError("run_pool: re-planning and moves checkpoint the moved jobs: set PoolRunOptions::checkpoint_dir");
    report_.predicted_makespan_s = plan.makespan_s;
    report_.jobs.resize(jobs.size());
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      const Placement& p = plan.jobs[j];
      layout_for(j, p.num_devices);  // fails early for a count without a layout
      state_[j].devices = p.devices;
      state_[j].key = p.start_s;
      report_.jobs[j].name = jobs[j].name;
      report_.jobs[j].predicted_start_s = p.start_s;
      report_.jobs[j].predicted_end_s = p.end_s;
      report_.jobs[j].losses.reserve(static_cast<std::size_t>(jobs[j].steps));
    }
    for (const PoolRunOptions::Move& m : o_.moves) {
      bool known = false;
      for (std::size_t j = 0; j < jobs.size(); ++j)
        if (jobs[j].name == m.job) {
          known = true;
          layout_for(j, static_cast<int32_t>(m.devices.size()));
        }
      if (!known) throw PlanError(fmt::format("run_pool: a move names job '{}', which is not in the batch", m.job));
    }
  }

  PoolRunReport run() {
    t0_ = Clock::now();
    double next_progress = o_.progress_interval_s, next_replan = o_.replan_interval_s;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      reap();
      if (failed_) break;
      bool all_done = true;
      for (const JobState& s : state_) all_done = all_done && s.phase == Phase::done;
      if (all_done) break;
      dispatch();
      // Wake at the next progress line or re-plan when that comes sooner than 50 ms.
      double wait_s = 0.05;
      const double now_s = now();
      if (o_.progress_interval_s > 0) wait_s = std::min(wait_s, next_progress - now_s);
      if (o_.replan_interval_s > 0) wait_s = std::min(wait_s, next_replan - now_s);
      cv_.wait_for(lock, std::chrono::microseconds(static_cast<int64_t>(std::max(wait_s, 0.001) * 1e6)));
      const double t = now();
      if (o_.progress_interval_s > 0 && t >= next_progress) {
        progress(t);
        next_progress = t + o_.progress_interval_s;
      }
      if (o_.replan_interval_s > 0 && t >= next_replan) {
        replan(t);
        next_replan = t + o_.replan_interval_s;
      }
    }
    // A failure: every other job stops at its next step boundary; then the first error, named.
    stop_ = true;
    lock.unlock();
    for (JobState& s : state_)
      if (s.thread.joinable()) s.thread.join();
    for (std::size_t j = 0; j < state_.size(); ++j)
      if (state_[j].error) {
        try {
          std::rethrow_exception(state_[j].error);
        } catch (const std::exception& e) {
          throw PlanError(fmt::format("pool run: job '{}' failed: {}", jobs_[j].name, e.what()));
        }
      }
    report_.makespan_s = 0;
    for (const JobRunRecord& r : report_.jobs) report_.makespan_s = std::max(report_.makespan_s, r.end_s);
    return report_;
  }

 private:
  double now() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  void print(const std::string& line) const {
    if (o_.print) o_.print(line);
    else std::fputs(line.c_str(), stdout), std::fflush(stdout);
  }

  std::string layout_for(std::size_t j, int32_t g) const {
    auto it = profiles_[j].plan.find(g);
    if (it == profiles_[j].plan.end())
      throw PlanError(fmt::format("run_pool: job '{}' has no layout for {} devices in its profile (plan[{}]); "
                                  "profile it with profile_model_job for that count",
                                  jobs_[j].name, g, g));
    return it->second;
  }

  // Joins the threads that returned (under the lock; the join itself does not block long: the
  // thread has set finished_thread as its last act under the lock).
  void reap() {
    for (JobState& s : state_)
      if (s.finished_thread && s.thread.joinable()) {
        mu_.unlock();
        s.thread.join();
        mu_.lock();
        s.finished_thread = false;
      }
  }

  // Starts every waiting job whose devices are free and whose turn it is on each of them: no
  // unfinished job with an earlier key shares a device with it.
  void dispatch() {
    for (std::size_t j = 0; j < state_.size(); ++j) {
      JobState& s = state_[j];
      if (s.phase != Phase::waiting || s.thread.joinable()) continue;
      bool ready = true;
      for (std::size_t i = 0; i < state_.size() && ready; ++i) {
        if (i == j || state_[i].phase == Phase::done) continue;
        const bool shares = std::any_of(state_[i].devices.begin(), state_[i].devices.end(), [&](int32_t d) {
          return std::find(s.devices.begin(), s.devices.end(), d) != s.devices.end();
        });
        if (!shares) continue;
        if (state_[i].phase == Phase::running || state_[i].key < s.key || (state_[i].key == s.key && i < j))
          ready = false;
      }
      if (!ready) continue;
      s.phase = Phase::running;
      s.segment_start = now();
      s.segment_first_step = s.steps_done + 1;
      s.segment_seconds = 0;
      s.segment_steps = 0;
      if (report_.jobs[j].segments.empty()) report_.jobs[j].start_s = s.segment_start;
      s.thread = std::thread([this, j] {
        if (o_.processes) remote_job(j);
        else job_thread(j);
      });
    }
  }

  void job_thread(std::size_t j) {
    const ModelJob& job = jobs_[j];
    std::vector<int32_t> devices;
    int64_t resume_step = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      devices = state_[j].devices;
      resume_step = state_[j].checkpoint_step;
    }
    const int32_t count = static_cast<int32_t>(devices.size());
    const std::string layout = layout_for(j, count);
    std::exception_ptr error;
    bool moved = false;
    try {
      // The Trainer, over one program or a pipeline (job_runner.hpp).
      detail::JobRunner tr(job, Layout::parse(layout), o_.kernel_threads);
      std::unique_ptr<CheckpointDir> ck;
      if (!o_.checkpoint_dir.empty()) ck = std::make_unique<CheckpointDir>(o_.checkpoint_dir + "/" + job.name);
      if (resume_step > 0) {
        tr.restore(*ck, resume_step);
      } else {
        tr.init();
      }
      for (int64_t k = tr.steps_done() + 1; k <= job.steps; ++k) {
        bool move = false;
        {
          std::lock_guard<std::mutex> g(mu_);
          if (stop_) break;
          JobState& st = state_[j];
          for (std::size_t m = 0; m < o_.moves.size(); ++m)
            if (o_.moves[m].job == job.name && o_.moves[m].after_step == k - 1 && !st.forced_done.count(m)) {
              st.forced_done.insert(m);
              st.move_requested = true;
              st.next_devices = o_.moves[m].devices;
              std::sort(st.next_devices.begin(), st.next_devices.end());
              st.next_key = st.key;
              report_.events.push_back(fmt::format("{:.2f} s: job '{}' moves after step {} from devices {} to {} "
                                                   "(asked for)",
                                                   now(), job.name, k - 1, ids(st.devices), ids(st.next_devices)));
            }
          move = st.move_requested;
        }
        if (move) {
          // Checkpoint from the devices; the next segment restores it onto its own layout.
          const int64_t at = tr.steps_done();
          tr.save(*ck);
          std::lock_guard<std::mutex> g(mu_);
          state_[j].checkpoint_step = at;
          moved = true;
          break;
        }
        const StepRecord r = tr.step(k);
        std::lock_guard<std::mutex> g(mu_);
        JobState& st = state_[j];
        st.steps_done = k;
        st.last_loss = r.loss;
        st.segment_seconds += r.seconds;
        st.segment_steps += 1;
        report_.jobs[j].losses.push_back(r.loss);
      }
    } catch (...) {
      error = std::current_exception();
    }
    end_segment(j, layout, error, moved);
  }

  // The segment of job j that just ended (under no lock): its record, and what comes next.
  void end_segment(std::size_t j, const std::string& layout, std::exception_ptr error, bool moved) {
    std::lock_guard<std::mutex> g(mu_);
    JobState& st = state_[j];
    JobRunRecord& rec = report_.jobs[j];
    const double t = now();
    if (st.steps_done >= st.segment_first_step) {
      RunSegment seg;
      seg.devices = st.devices;
      seg.layout = layout;
      seg.first_step = st.segment_first_step;
      seg.last_step = st.steps_done;
      seg.start_s = st.segment_start;
      seg.end_s = t;
      rec.segments.push_back(seg);
    }
    if (st.segment_steps > 0) rec.step_time_s = st.segment_seconds / static_cast<double>(st.segment_steps);
    if (error) {
      st.error = error;
      failed_ = true;
      st.phase = Phase::done;
    } else if (moved) {
      st.phase = Phase::waiting;
      st.move_requested = false;
      st.devices = st.next_devices;
      st.key = st.next_key;
    } else {
      st.phase = Phase::done;
      rec.end_s = t;
    }
    st.finished_thread = true;
    cv_.notify_all();
  }

  // The process form: job j's segment runs on the processes of its devices (pool_worker.cpp);
  // this thread sends the order, follows the leader's reports and relays moves and stops.
  void remote_job(std::size_t j) {
    const ModelJob& job = jobs_[j];
    detail::SegmentOrder order;
    std::ptrdiff_t forced = -1;  // the PoolRunOptions::moves entry this segment ends with
    {
      std::lock_guard<std::mutex> g(mu_);
      JobState& st = state_[j];
      order.seg = ++next_segment;
      order.job = j;
      order.resume_step = st.checkpoint_step;
      order.devices = st.devices;
      for (std::size_t m = 0; m < o_.moves.size(); ++m)
        if (o_.moves[m].job == job.name && !st.forced_done.count(m) && o_.moves[m].after_step >= st.steps_done &&
            (forced < 0 || o_.moves[m].after_step < o_.moves[static_cast<std::size_t>(forced)].after_step))
          forced = static_cast<std::ptrdiff_t>(m);
      if (forced >= 0) order.stop_after = o_.moves[static_cast<std::size_t>(forced)].after_step;
    }
    std::sort(order.devices.begin(), order.devices.end());
    std::exception_ptr error;
    bool moved = false;
    std::string layout;
    try {
      layout = layout_for(j, static_cast<int32_t>(order.devices.size()));
      order.layout = layout;
      if (order.seg >= detail::kMaxSegments)
        throw PlanError(fmt::format("run_pool: more than {} job segments in this process's pool runs (the tags of "
                                    "their messages would overflow)",
                                    detail::kMaxSegments));
      const std::string text = detail::format_order(order);
      for (int32_t d : order.devices) o_.processes->send(d, detail::kStartTag, text);
      const int leader = order.devices[0];
      bool sent_move = false, sent_stop = false;
      auto last_report = Clock::now();
      detail::QuietBackoff backoff;
      while (true) {
        std::optional<ProcessGroup::Message> m = o_.processes->try_recv(detail::progress_tag(order.seg));
        if (!m) {
          const double quiet = std::chrono::duration<double>(Clock::now() - last_report).count();
          if (o_.report_timeout_s > 0 && quiet > o_.report_timeout_s)
            throw PlanError(fmt::format(
                "process {} (the first of devices {}) has reported nothing for {:.0f} s (PoolRunOptions::"
                "report_timeout_s): did it die or hang? (with mpirun's defaults a dead process ends the job)",
                leader, ids(order.devices), quiet));
          bool stop = false, move = false;
          {
            std::lock_guard<std::mutex> g(mu_);
            stop = stop_;
            move = state_[j].move_requested;
          }
          if (stop && !sent_stop) {
            o_.processes->send(leader, detail::control_tag(order.seg), "X");
            sent_stop = true;
          } else if (move && !sent_move && !sent_stop) {
            o_.processes->send(leader, detail::control_tag(order.seg), "M");
            sent_move = true;
          }
          backoff.wait();
          continue;
        }
        backoff.reset();
        last_report = Clock::now();
        const std::string& b = m->bytes;
        if (b.rfind("P ", 0) == 0) {
          std::istringstream lines(b);
          std::string line;
          std::lock_guard<std::mutex> g(mu_);
          JobState& st = state_[j];
          while (std::getline(lines, line)) {
            int64_t k = 0;
            double loss = 0, seconds = 0;
            std::istringstream in(line.substr(std::min<std::size_t>(2, line.size())));
            if (line.rfind("P ", 0) != 0 || !(in >> k >> loss >> seconds))
              throw PlanError(fmt::format("run_pool: a malformed step report '{}' from process {}",
                                          line.substr(0, 60), m->rank));
            st.steps_done = k;
            st.last_loss = loss;
            st.segment_seconds += seconds;
            st.segment_steps += 1;
            report_.jobs[j].losses.push_back(loss);
          }
        } else if (b == "D" || b == "X") {
          break;
        } else if (b.rfind("M ", 0) == 0) {
          const int64_t at = std::stoll(b.substr(2));
          std::lock_guard<std::mutex> g(mu_);
          JobState& st = state_[j];
          st.checkpoint_step = at;
          moved = true;
          if (forced >= 0 && at == order.stop_after) {
            const PoolRunOptions::Move& mv = o_.moves[static_cast<std::size_t>(forced)];
            st.forced_done.insert(static_cast<std::size_t>(forced));
            st.next_devices = mv.devices;
            std::sort(st.next_devices.begin(), st.next_devices.end());
            st.next_key = st.key;
            report_.events.push_back(fmt::format("{:.2f} s: job '{}' moves after step {} from devices {} to {} (asked "
                                                 "for)",
                                                 now(), job.name, at, ids(st.devices), ids(st.next_devices)));
          }
          break;
        } else if (b.rfind("E ", 0) == 0) {
          throw PlanError(b.substr(2));
        } else {
          throw PlanError(fmt::format("run_pool: an unknown report '{}' from process {}", b.substr(0, 60), m->rank));
        }
      }
    } catch (...) {
      error = std::current_exception();
    }
    end_segment(j, layout, error, moved);
  }

  void progress(double t) {
    for (std::size_t j = 0; j < state_.size(); ++j) {
      const JobState& s = state_[j];
      if (s.phase != Phase::running || s.segment_steps == 0) continue;
      const double step_s = s.segment_seconds / static_cast<double>(s.segment_steps);
      const double tokens = static_cast<double>(jobs_[j].gpt.batch * jobs_[j].gpt.seq);
      print(fmt::format("[{:8.1f} s] {:<16} step {:>6}/{:<6} loss {:.4f}  {:>9.0f} tok/s  finish in {}  devices {}\n", t,
                        jobs_[j].name, s.steps_done, jobs_[j].steps, s.last_loss, tokens / step_s,
                        format_duration(step_s * static_cast<double>(jobs_[j].steps - s.steps_done)), ids(s.devices)));
    }
  }

  // The remaining work priced with measured rates: keep the order, re-plan the waiting jobs, or
  // move one running job (pool_runtime.hpp); adopts the best when it wins by the margin.
  void replan(double t) {
    std::vector<double> ratios;
    std::vector<double> free_at(static_cast<std::size_t>(pool_.num_devices()), 0.0);  // from now
    std::vector<std::size_t> running, waiting;
    for (std::size_t j = 0; j < state_.size(); ++j) {
      const JobState& s = state_[j];
      if (s.phase == Phase::running) {
        running.push_back(j);
        if (s.segment_steps < 2 || s.move_requested) return;  // not measured yet, or already moving
        const double step_s = s.segment_seconds / static_cast<double>(s.segment_steps);
        ratios.push_back(step_s / profiles_[j].step_time_s.at(static_cast<int32_t>(s.devices.size())));
        for (int32_t d : s.devices)
          free_at[d] = step_s * static_cast<double>(jobs_[j].steps - s.steps_done);
      } else if (s.phase == Phase::waiting) {
        waiting.push_back(j);
      }
    }
    // With nothing waiting only a move can help, and moving to more devices helps only when the
    // devices compute on their own (a pool sharing cores gains nothing from more threads).
    if (ratios.empty() || (waiting.empty() && pool_.cores > 0)) return;
    const double f = median(ratios);
    auto remaining_profile = [&](std::size_t j) {
      JobProfile p;
      p.name = jobs_[j].name;
      p.steps = jobs_[j].steps - state_[j].steps_done;
      for (const auto& [g, ts] : profiles_[j].step_time_s)
        if (profiles_[j].plan.count(g)) p.step_time_s[g] = ts * f;
      p.peak_bytes = profiles_[j].peak_bytes;
      p.may_span_nodes = profiles_[j].may_span_nodes;
      return p;
    };
    // Keeping the order: the waiting jobs in key order, each after its devices free up.
    std::vector<std::size_t> by_key = waiting;
    std::sort(by_key.begin(), by_key.end(), [&](std::size_t a, std::size_t b) { return state_[a].key < state_[b].key; });
    std::vector<double> keep_free = free_at;
    double keep_end = *std::max_element(free_at.begin(), free_at.end());
    const double running_end = keep_end;
    for (std::size_t j : by_key) {
      double start = 0;
      for (int32_t d : state_[j].devices) start = std::max(start, keep_free[d]);
      const double end = start + remaining_profile(j).runtime_s(static_cast<int32_t>(state_[j].devices.size()));
      for (int32_t d : state_[j].devices) keep_free[d] = end;
      keep_end = std::max(keep_end, end);
    }
    PlanOptions po;
    po.time_limit_s = 0;
    po.max_iterations = 4000;
    struct Option {
      double end = 0;
      Schedule plan;
      std::vector<std::size_t> jobs;
      std::ptrdiff_t moved = -1;
    };
    std::vector<Option> options;
    if (!waiting.empty()) {
      Option a;
      std::vector<JobProfile> ps;
      for (std::size_t j : waiting) ps.push_back(remaining_profile(j));
      po.device_free_at = free_at;
      a.plan = plan_fast(ps, pool_, po);
      a.end = std::max(a.plan.makespan_s, running_end);
      a.jobs = waiting;
      options.push_back(std::move(a));
    }
    for (std::size_t r : running) {
      const int32_t now_count = static_cast<int32_t>(state_[r].devices.size());
      for (const auto& [g, ts] : remaining_profile(r).step_time_s) {
        (void)ts;
        if (g == now_count) continue;
        Option b;
        std::vector<JobProfile> ps;
        for (std::size_t j : waiting) ps.push_back(remaining_profile(j));
        JobProfile mp = remaining_profile(r);
        const double step_g = mp.step_time_s.at(g) + o_.move_cost_s / static_cast<double>(std::max<int64_t>(mp.steps, 1));
        mp.step_time_s = {{g, step_g}};
        ps.push_back(mp);
        po.device_free_at = free_at;
        for (int32_t d : state_[r].devices) po.device_free_at[d] = 0;
        try {
          b.plan = plan_fast(ps, pool_, po);
        } catch (const PlanError&) {
          continue;  // that count does not fit the pool
        }
        b.end = std::max(b.plan.makespan_s, *std::max_element(po.device_free_at.begin(), po.device_free_at.end()));
        b.jobs = waiting;
        b.jobs.push_back(r);
        b.moved = static_cast<std::ptrdiff_t>(r);
        options.push_back(std::move(b));
      }
    }
    if (options.empty()) return;
    const Option* best = &options[0];
    for (const Option& op : options)
      if (op.end < best->end) best = &op;
    const bool adopt = best->end < keep_end * (1 - o_.replan_margin);
    report_.events.push_back(fmt::format(
        "{:.2f} s: re-plan (measured/profiled step time {:.2f}): keeping the order ends in {}, the best new plan in "
        "{}{}{}",
        t, f, format_duration(keep_end), format_duration(best->end),
        best->moved >= 0 ? fmt::format(" (moving '{}')", jobs_[static_cast<std::size_t>(best->moved)].name) : "",
        adopt ? ": adopted" : ": kept the order"));
    if (!adopt) return;
    for (std::size_t i = 0; i < best->jobs.size(); ++i) {
      const std::size_t j = best->jobs[i];
      const Placement& p = best->plan.jobs[i];
      if (static_cast<std::ptrdiff_t>(j) == best->moved) {
        state_[j].move_requested = true;
        state_[j].next_devices = p.devices;
        state_[j].next_key = t + p.start_s;
        report_.events.push_back(fmt::format("{:.2f} s: job '{}' moves from devices {} to {}", t, jobs_[j].name,
                                             ids(state_[j].devices), ids(p.devices)));
      } else {
        state_[j].devices = p.devices;
        state_[j].key = t + p.start_s;
      }
    }
  }

  const std::vector<ModelJob>& jobs_;
  const std::vector<JobProfile>& profiles_;
  const Pool pool_;
  const PoolRunOptions o_;
  std::vector<JobState> state_;
  PoolRunReport report_;
  Clock::time_point t0_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool failed_ = false;
  // Segment ids (the process form) are unique over every pool run of this process: a report
  // of an earlier run's segment that nobody read (a run that failed) can never be taken for one
  // of this run's.
  static std::atomic<int64_t> next_segment;
};

std::atomic<int64_t> PoolRun::next_segment{0};

}  // namespace

std::string PoolRunReport::table() const {
  std::size_t width = 3;
  for (const JobRunRecord& r : jobs) width = std::max(width, r.name.size());
  std::string out = fmt::format("{:<{}}  {:>10} {:>10}  {:>10} {:>10}  {:>8}  {:>6}  {}\n", "job", width, "plan start",
                                "plan end", "start", "end", "end/plan", "loss", "segments");
  for (const JobRunRecord& r : jobs) {
    std::string segs;
    for (const RunSegment& s : r.segments)
      segs += fmt::format("{}[{}] steps {}-{}", segs.empty() ? "" : "; ", ids(s.devices), s.first_step, s.last_step);
    out += fmt::format("{:<{}}  {:>10} {:>10}  {:>10} {:>10}  {:>7.2f}x  {:>6.3f}  {}\n", r.name, width,
                       format_duration(r.predicted_start_s), format_duration(r.predicted_end_s),
                       format_duration(r.start_s), format_duration(r.end_s),
                       r.predicted_end_s > 0 ? r.end_s / r.predicted_end_s : 0.0,
                       r.losses.empty() ? 0.0 : r.losses.back(), segs);
  }
  out += fmt::format("makespan: planned {}, measured {} ({:.2f}x)\n", format_duration(predicted_makespan_s),
                     format_duration(makespan_s), predicted_makespan_s > 0 ? makespan_s / predicted_makespan_s : 0.0);
  for (const std::string& e : events) out += e + "\n";
  return out;
}

PoolRunReport run_pool(const std::vector<ModelJob>& jobs, const std::vector<JobProfile>& profiles,
                       const Schedule& plan, const Pool& pool, const PoolRunOptions& options) {
  if (options.make_runtime && !options.processes)
    throw PlanError("run_pool: PoolRunOptions::make_runtime is for the process form: set processes too");
  if (!options.processes) {
    PoolRun run(jobs, profiles, plan, pool, options);
    return run.run();
  }
  ProcessGroup& pg = *options.processes;
  if (pg.name() != "mpi")
    throw PlanError(fmt::format("run_pool: the process form runs jobs on MpiRuntimes: give mpi_process_group(), not a "
                                "'{}' group",
                                pg.name()));
  if (pg.size() != pool.num_devices())
    throw PlanError(fmt::format("run_pool: one process per device: the pool has {} devices but {} processes were "
                                "launched (mpirun -np {})",
                                pool.num_devices(), pg.size(), pool.num_devices()));
  if (pg.rank() != 0) {
    detail::serve_pool(jobs, pg, options);
    return {};
  }
  // Rank 0: the coordinator, and the worker of device 0 beside it.
  std::exception_ptr worker_error;
  std::thread worker([&] {
    try {
      detail::serve_pool(jobs, pg, options);
    } catch (...) {
      worker_error = std::current_exception();
    }
  });
  auto quit = [&](const std::string& message) {
    for (int r = 0; r < pg.size(); ++r) pg.send(r, detail::kStartTag, message);
    worker.join();
  };
  PoolRunReport report;
  try {
    PoolRun run(jobs, profiles, plan, pool, options);
    report = run.run();
  } catch (const std::exception& e) {
    quit(std::string("Q failed\n") + e.what());
    throw;
  }
  quit("Q ok");
  return report;
}

}  // namespace tessel::planner
