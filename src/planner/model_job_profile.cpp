// A plan per device count for a model job (tessel/planner/model_job.hpp): every layout priced by
// the cost model, the best one or two timed on CPU virtual devices, the profile and the report.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "tessel/runtime/make_runtime.hpp"
#include "tessel/core/common.hpp"
#include "tessel/executable.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/planner/model_job.hpp"
#include "tessel/pipeline/auto_stages.hpp"
#include "tessel/pipeline/stages.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "job_runner.hpp"

namespace tessel::planner {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The cost model of g devices of `pool` (ProfileOptions::cost): the pool's links when given, CPU
// threads' shared compute.
CostModel cost_for(const ProfileOptions& o, const Pool& pool, int32_t g) {
  CostModel c = o.cost;
  if (pool.intra_node_gbps > 0) c.default_link.bandwidth = pool.intra_node_gbps * 1e9;
  // Row-major meshes put model (the minor axis) inside a node: only data crosses nodes.
  if (g > pool.devices_per_node && pool.inter_node_gbps > 0) {
    LinkSpec l = c.default_link;
    l.bandwidth = pool.inter_node_gbps * 1e9;
    c.links["data"] = l;
  }
  if (o.shared_cores > 0) c.compute_sharing = compute_sharing(g, o.shared_cores);
  return c;
}

// The training step of `s` compiled exactly as the Trainer compiles its update program (a copy of
// the model with the loss as its only output, add_train_step with the non-finite guard, compile
// with default options), with the donations the Trainer loads it with.
struct CompiledStep {
  Executable exe;
  std::vector<std::pair<std::string, std::string>> donations;
};

CompiledStep compile_step(const ModelJobStep& s) {
  Graph g = s.model.graph.clone();
  g.outputs = {s.model.loss.id};
  Tensor loss = g.tensor(s.model.loss.id);
  std::vector<Tensor> params;
  for (const Tensor& w : s.model.weights) params.push_back(g.tensor(w.id));
  TrainOptions to = s.options.train;
  to.guard_non_finite = true;
  for (Tensor& c : to.checkpoints) c = g.tensor(c.id);
  TrainStep step = add_train_step(g, loss, params, s.mesh, to);
  return CompiledStep{compile(g, s.mesh), step.donations()};
}

// Prices `layout` (model_job.hpp, step 2) into `c`; returns the bytes an offload moves to and from
// the host (0 without offload).
double price(const ModelJob& job, const Pool& pool, const ProfileOptions& o, Candidate& c) {
  const int32_t g = c.layout.devices();
  const CostModel cost = cost_for(o, pool, g);
  const ModelJobStep s = build_model_step(job, c.layout);
  if (c.layout.pipe > 1) {
    // A pipeline: its stages (equal layers, as JobRunner cuts them) priced as the automatic
    // stage cut prices them: each stage's forward and backward per micro-batch on the stage
    // mesh, the step sum(t) + (M - 1) max(t) under 1F1B, the peak the largest stage's bytes
    // (parameters, accumulators, moments, the micro-batches' kept inputs and activations in
    // flight, the backward's working memory). The update after the schedule is not priced.
    const int64_t P = c.layout.pipe;
    const std::vector<Tensor> cuts = equal_layer_cuts(s.model.checkpoints, job.gpt.layers, P);
    StageCutOptions so;
    so.meshes = {s.mesh};
    so.schedule = ScheduleKind::OneFOneB;
    so.remat = c.layout.remat;  // as JobRunner runs them: remat=none keeps each stage's activations
    const StageCut sc = choose_stage_cuts(s.model.graph, s.model.loss, s.model.weights, cuts, P, c.layout.micro, so,
                                          cost_for(o, pool, s.mesh.num_devices()));
    c.predicted_compute_s = sc.step_s;
    c.predicted_comm_s = 0;
    c.predicted_dispatch_s = 0;
    c.predicted_step_s = sc.step_s;
    c.peak_bytes = static_cast<double>(*std::max_element(sc.stage_bytes.begin(), sc.stage_bytes.end()));
    c.fits = !(pool.memory_bytes > 0) || c.peak_bytes <= pool.memory_bytes;
    c.note = fmt::format("pipeline: stages of {:.4g} s per micro-batch{}", fmt::join(sc.stage_s, ", "),
                         c.fits ? "" : fmt::format("; peak {:.4g} bytes > the pool's memory {:.4g} bytes per device",
                                                   c.peak_bytes, pool.memory_bytes));
    return 0;
  }
  std::optional<CompiledStep> compiled;
  try {
    compiled = compile_step(s);
  } catch (const Error& e) {  // a layout the compiler refuses is a bug to report, with its job and layout
    throw PlanError(fmt::format("job '{}': the training step on {} did not compile: {}", job.name,
                                c.layout.to_string(), e.what()));
  }
  const CompiledStep& cs = *compiled;
  // The program load() runs (fused kernels, combined all-reduces, the collective-matmul rings
  // where the gate takes them), lowered as the Trainer's load lowers it.
  ProgramPassOptions lowering = s.options.load.lowering;
  lowering.collective_matmul.cost.compute_sharing = cost.compute_sharing;
  Program low = lower_program(cs.exe.program(), false, lowering);
  // The compiler's estimates (tessel-explain's "compute_s + comm_s") of that program: the
  // kernels' roofline time and every collective at the options' link figures.
  c.predicted_compute_s = low.compute_seconds(cost);
  c.predicted_comm_s = low.comm_seconds(cost);
  // What a step of many small instructions pays beyond their roofline (a launch, a hand-off):
  // ZeRO's per-parameter gathers and slices, a tiny model's many kernels.
  c.predicted_dispatch_s = low.dispatch_seconds(cost);
  // Memory: its plan with each output written into its donor (the parameters and moments
  // updated in place) counted once, as the Trainer loads it.
  plan_donations(low, cs.exe.graph(), cs.donations);
  c.peak_bytes = static_cast<double>(low.memory_plan().peak_bytes());
  // An offload's copies to the host and back: on their own stream, but priced in full (the PCIe
  // link is the bottleneck where offloading is needed at all).
  double host_bytes = 0;
  for (const Instr& in : low.instrs) {
    if (in.kind != InstrKind::Copy || in.out < 0 || in.in.empty()) continue;
    const LocalValue& src = low.values[static_cast<std::size_t>(in.in[0])];
    const LocalValue& dst = low.values[static_cast<std::size_t>(in.out)];
    if (src.host != dst.host) host_bytes += static_cast<double>(dst.bytes());
  }
  c.predicted_step_s = c.predicted_compute_s + c.predicted_comm_s + c.predicted_dispatch_s + host_bytes / o.host_bandwidth;
  c.fits = !(pool.memory_bytes > 0) || c.peak_bytes <= pool.memory_bytes;
  if (!c.fits)
    c.note = fmt::format("peak {:.4g} bytes > the pool's memory {:.4g} bytes per device", c.peak_bytes,
                         pool.memory_bytes);
  return host_bytes;
}

// Times `c` on g CPU virtual devices (model_job.hpp, step 3).
void trial(const ModelJob& job, const ProfileOptions& o, Candidate& c) {
  const auto t0 = Clock::now();
  try {
    detail::JobRunner tr(job, c.layout, o.kernel_threads);
    tr.init();
    std::vector<double> times;
    double peak = 0;
    for (int k = 1; k <= o.warmup_steps + o.timed_steps; ++k) {
      const StepRecord r = tr.step(k);
      peak = std::max(peak, static_cast<double>(r.measured_peak_bytes));
      if (k > o.warmup_steps) times.push_back(r.seconds);
    }
    // The median: one step slowed by a neighbour on shared cores should not move a 3-step estimate.
    std::sort(times.begin(), times.end());
    const std::size_t n = times.size();
    c.measured_step_s = n % 2 == 1 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    c.measured_peak_bytes = peak;
  } catch (const Error& e) {
    throw PlanError(fmt::format("job '{}': the trial of {} on {} CPU virtual devices failed: {}", job.name,
                                c.layout.to_string(), c.layout.devices(), e.what()));
  }
  c.trial_seconds = seconds_since(t0);
}

// The candidates to time, from the fitting ones in order of prediction: the best, and up to
// trials_per_count - 1 more predicted within second_trial_margin of the best that are not
//  - a variant (remat, offload) of a picked layout that fits without either: such a variant only
//    trades time for memory the pool has (remat and offload against each other, where the plain
//    layout does not fit, are real alternatives);
//  - the same program as a picked one (ZeRO stages 1 and 2 often compile alike): the same
//    predicted time and peak.
std::vector<std::size_t> pick_trials(const std::vector<Candidate>& cands, const std::vector<std::size_t>& order,
                                     const ProfileOptions& o) {
  std::vector<std::size_t> out;
  for (std::size_t i : order) {
    if (static_cast<int>(out.size()) == o.trials_per_count) break;
    const Candidate& c = cands[i];
    if (!out.empty() && c.predicted_step_s > (1 + o.second_trial_margin) * cands[out.front()].predicted_step_s) break;
    const bool same = std::any_of(out.begin(), out.end(), [&](std::size_t k) {
      const Layout& t = cands[k].layout;
      const bool plain = t.remat == RematPolicy::none && !t.offload;
      return (plain && t.data == c.layout.data && t.zero == c.layout.zero && t.pipe == c.layout.pipe) ||
             (cands[k].predicted_step_s == c.predicted_step_s && cands[k].peak_bytes == c.peak_bytes);
    });
    if (!same) out.push_back(i);
  }
  return out;
}

void check_options(const ModelJob& job, const ProfileOptions& o) {
  const auto bad = [&](const std::string& what) {
    return PlanError(fmt::format("profile_model_job (job '{}'): {}", job.name, what));
  };
  if (o.trials_per_count < 1 || o.trials_per_count > 2)
    throw bad(fmt::format("trials_per_count = {} must be 1 or 2 (issue 25: at most 2 trials per job and device "
                          "count)",
                          o.trials_per_count));
  if (!(o.second_trial_margin >= 0))
    throw bad(fmt::format("second_trial_margin = {} must be >= 0 (a fraction of the best prediction)",
                          o.second_trial_margin));
  if (o.timed_steps < 1) throw bad(fmt::format("timed_steps = {} must be >= 1", o.timed_steps));
  if (o.warmup_steps < 0) throw bad(fmt::format("warmup_steps = {} must be >= 0", o.warmup_steps));
  if (o.kernel_threads < 1) throw bad(fmt::format("kernel_threads = {} must be >= 1", o.kernel_threads));
  if (o.shared_cores < 0) throw bad(fmt::format("shared_cores = {} must be >= 0", o.shared_cores));
  if (!(o.host_bandwidth > 0) || !std::isfinite(o.host_bandwidth))
    throw bad(fmt::format("host_bandwidth = {} must be a positive number of bytes/s", o.host_bandwidth));
  if (o.remat.empty()) throw bad("remat lists no policy: give at least RematPolicy::none");
  o.cost.validate();
  if (job.steps <= 0) throw bad(fmt::format("steps = {} must be positive", job.steps));
}

}  // namespace

std::string ModelJobReport::table() const {
  std::string out = fmt::format("job '{}': {} candidates priced in {:.2f} s, {} trials in {:.2f} s\n", job,
                                candidates.size(), predict_seconds, trials, trial_seconds);
  out += fmt::format("{:>7}  {:<50} {:>11} {:>11} {:>11} {:>11} {:>12}  {:<4} {:>11}\n", "devices", "layout",
                     "predicted", "compute", "comm", "dispatch", "peak bytes", "fits", "measured");
  for (const Candidate& c : candidates) {
    out += fmt::format("{:>7}  {:<50} {:>9.4g} s {:>9.4g} s {:>9.4g} s {:>9.4g} s {:>12.4g}  {:<4} {:>11}{}{}\n",
                       c.layout.devices(), c.layout.to_string(), c.predicted_step_s, c.predicted_compute_s,
                       c.predicted_comm_s, c.predicted_dispatch_s, c.peak_bytes, c.fits ? "yes" : "no",
                       c.measured_step_s >= 0 ? fmt::format("{:.4g} s", c.measured_step_s) : std::string("-"),
                       c.chosen ? "  <- chosen" : "", c.note.empty() ? "" : "  (" + c.note + ")");
  }
  for (const auto& [g, why] : notes) out += fmt::format("{} devices: {}\n", g, why);
  return out;
}

namespace {

// The PlanError of a job with no plan on any device count: why each count is out, and the least
// peak of any layout against the memory.
PlanError no_plan(const ModelJob& job, const Pool& pool, const std::map<int32_t, std::string>& notes,
                  bool none_placeable, double least_peak) {
  std::string why;
  for (const auto& [g, note] : notes) why += fmt::format("; {} devices: {}", g, note);
  if (none_placeable) why = "; no device count of the job is placeable in the pool" + why;
  return PlanError(fmt::format("job '{}' has no plan on any device count{}{}", job.name, why,
                               std::isfinite(least_peak) && pool.memory_bytes > 0
                                   ? fmt::format(" (the least peak of any layout is {:.4g} bytes per device, the "
                                                 "pool's memory {:.4g}: a smaller model or batch, or more devices)",
                                                 least_peak, pool.memory_bytes)
                                   : std::string()));
}

// The device counts of the job that are placeable in the pool and have a layout, in ascending
// order; a note for each of the job's counts left out. Throws no_plan when none is left: what
// is known without compiling anything.
std::vector<int32_t> layable_counts(const ModelJob& job, const Pool& pool, const std::vector<RematPolicy>& remat,
                                    std::map<int32_t, std::string>& notes) {
  const std::vector<int32_t> counts = candidate_counts(job, pool);
  for (int32_t g : job.device_counts)
    if (std::find(counts.begin(), counts.end(), g) == counts.end())
      notes[g] = fmt::format("not placeable in the pool ({} nodes x {} devices{})", pool.nodes, pool.devices_per_node,
                             job.may_span_nodes || pool.allow_spanning ? "; spanning takes whole nodes"
                                                                       : "; the job may not span nodes");
  std::vector<int32_t> out;
  for (int32_t g : counts) {
    if (enumerate_layouts(job.gpt, g, remat).empty())
      notes[g] = fmt::format("no layout: batch {} does not split over any data axis with heads {} and MLP width {} "
                             "over the model axis",
                             job.gpt.batch, job.gpt.heads, job.gpt.d_model * job.gpt.ffn_mult);
    else
      out.push_back(g);
  }
  if (out.empty()) throw no_plan(job, pool, notes, counts.empty(), std::numeric_limits<double>::infinity());
  return out;
}

}  // namespace

void check_model_job(const ModelJob& job, const Pool& pool) {
  std::map<int32_t, std::string> notes;
  // Whether a count has a layout depends on its meshes only, not on the remat policies tried.
  layable_counts(job, pool, {RematPolicy::none}, notes);
}

void price_model_job(const ModelJob& job, const Pool& pool, const ProfileOptions& options, ModelJobReport& r) {
  check_options(job, options);
  r = ModelJobReport{};
  r.job = job.name;
  double least_peak = std::numeric_limits<double>::infinity();
  bool any_fits = false;
  for (int32_t g : layable_counts(job, pool, options.remat, r.notes)) {
    const std::size_t first = r.candidates.size();
    const auto t0 = Clock::now();
    for (const Layout& l : enumerate_layouts(job.gpt, g, options.remat, options.pipeline)) {
      Candidate c;
      c.layout = l;
      price(job, pool, options, c);
      const bool try_offload = !c.fits && options.try_offload;
      r.candidates.push_back(c);
      if (!try_offload) continue;
      Candidate off;
      off.layout = l;
      off.layout.offload = true;
      // A variant whose offload moves nothing is the same program: not a candidate.
      if (price(job, pool, options, off) > 0) r.candidates.push_back(off);
    }
    r.predict_seconds += seconds_since(t0);
    double least = std::numeric_limits<double>::infinity();
    bool fits = false;
    for (std::size_t i = first; i < r.candidates.size(); ++i) {
      least = std::min(least, r.candidates[i].peak_bytes);
      fits = fits || r.candidates[i].fits;
    }
    least_peak = std::min(least_peak, least);
    any_fits = any_fits || fits;
    if (!fits)
      r.notes[g] = fmt::format("no layout fits: the least peak is {:.4g} bytes per device, the pool has {:.4g}", least,
                               pool.memory_bytes);
  }
  if (!any_fits) throw no_plan(job, pool, r.notes, false, least_peak);
}

JobProfile time_model_job(const ModelJob& job, const Pool& pool, const ProfileOptions& options, ModelJobReport& r) {
  check_options(job, options);
  JobProfile prof;
  prof.name = job.name;
  prof.steps = job.steps;
  prof.may_span_nodes = job.may_span_nodes;
  prof.requested_devices = job.requested_devices;
  double least_peak = std::numeric_limits<double>::infinity();
  // The candidates of a count are contiguous in the report (price_model_job's order).
  for (std::size_t first = 0; first < r.candidates.size();) {
    const int32_t g = r.candidates[first].layout.devices();
    std::size_t end = first;
    while (end < r.candidates.size() && r.candidates[end].layout.devices() == g) ++end;
    // Fitting candidates by prediction; ties (equal programs) by peak, then enumeration order.
    std::vector<std::size_t> order;
    for (std::size_t i = first; i < end; ++i) {
      least_peak = std::min(least_peak, r.candidates[i].peak_bytes);
      if (r.candidates[i].fits) order.push_back(i);
    }
    first = end;
    if (order.empty()) continue;  // price_model_job's note says why
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const Candidate &x = r.candidates[a], &y = r.candidates[b];
      if (x.predicted_step_s != y.predicted_step_s) return x.predicted_step_s < y.predicted_step_s;
      return x.peak_bytes < y.peak_bytes;
    });
    std::size_t chosen = order.front();
    if (options.measure) {
      const std::vector<std::size_t> tried = pick_trials(r.candidates, order, options);
      for (std::size_t i : tried) {
        Candidate& c = r.candidates[i];
        trial(job, options, c);
        r.trial_seconds += c.trial_seconds;
        ++r.trials;
        // The allocators saw more than the pool has: the estimate was wrong; never choose it.
        if (pool.memory_bytes > 0 && c.measured_peak_bytes > pool.memory_bytes) {
          c.fits = false;
          c.note = fmt::format("measured peak {:.4g} bytes > the pool's memory {:.4g}", c.measured_peak_bytes,
                               pool.memory_bytes);
        }
      }
      // The trials decide between them: the cost model ranks, the clock confirms.
      bool any = false;
      for (std::size_t i : tried) {
        const Candidate& c = r.candidates[i];
        if (c.fits && (!any || c.measured_step_s < r.candidates[chosen].measured_step_s)) {
          chosen = i;
          any = true;
        }
      }
      if (!any) {
        r.notes[g] = "every trial's measured peak exceeded the pool's memory";
        continue;
      }
    }
    Candidate& c = r.candidates[chosen];
    c.chosen = true;
    prof.step_time_s[g] = c.measured_step_s >= 0 ? c.measured_step_s : c.predicted_step_s;
    prof.peak_bytes[g] = std::max(c.peak_bytes, c.measured_peak_bytes);
    prof.plan[g] = c.layout.to_string();
  }
  if (prof.step_time_s.empty()) throw no_plan(job, pool, r.notes, false, least_peak);
  return prof;
}

JobProfile profile_model_job(const ModelJob& job, const Pool& pool, const ProfileOptions& options,
                             ModelJobReport* report) {
  ModelJobReport local;
  ModelJobReport& r = report ? *report : local;
  price_model_job(job, pool, options, r);
  return time_model_job(job, pool, options, r);
}

}  // namespace tessel::planner
