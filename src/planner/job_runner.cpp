// JobRunner (job_runner.hpp): the Trainer, or a PipelineTrainer for a pipeline layout.
#include "job_runner.hpp"

#include <fmt/format.h>

#include <chrono>
#include <optional>

#include "tessel/pipeline/runner.hpp"
#include "tessel/pipeline/stages.hpp"
#include "tessel/runtime/make_runtime.hpp"

namespace tessel::planner::detail {

struct JobRunner::Impl {
  Impl(const ModelJob& j, const Layout& l) : job(j), layout(l), s(build_model_step(j, l)) {}
  const ModelJob& job;
  Layout layout;
  ModelJobStep s;
  // The Trainer's runtime and trainer, or the pipeline's runtimes and trainer (runtimes first:
  // they outlive what runs on them).
  std::vector<std::unique_ptr<Runtime>> runtimes;
  std::optional<Trainer> trainer;
  std::optional<PipelineTrainer> pipeline;
  int64_t steps = 0;  // the pipeline's steps done
};

JobRunner::JobRunner(const ModelJob& job, const Layout& layout, int kernel_threads)
    : p_(std::make_unique<Impl>(job, layout)) {
  Impl& I = *p_;
  if (layout.pipe <= 1) {
    I.runtimes.push_back(make_cpu_runtime({"threads", I.s.mesh, kernel_threads}));
    I.trainer.emplace(I.s.model.graph, I.s.model.loss, I.s.model.weights, I.s.mesh, *I.runtimes[0], I.s.options);
    return;
  }
  // Equal layers per stage, cut at the residual stream (gpt_train's pipeline).
  const int64_t P = layout.pipe;
  const std::vector<Tensor> cuts = equal_layer_cuts(I.s.model.checkpoints, job.gpt.layers, P);
  std::vector<Runtime*> rp;
  for (int64_t st = 0; st < P; ++st) {
    I.runtimes.push_back(make_cpu_runtime({"threads", I.s.mesh, kernel_threads}));
    rp.push_back(I.runtimes.back().get());
  }
  PipelineOptions o;
  o.schedule = ScheduleKind::OneFOneB;
  o.micro = layout.micro;
  o.adamw = I.s.options.train.adamw;
  o.zero = layout.zero;
  o.remat = layout.remat;  // as priced (model_job_profile.cpp): none keeps each stage's activations, all recomputes
  o.data_axis = I.s.options.train.data_axis;
  I.pipeline.emplace(split_stages(I.s.model.graph, I.s.model.loss, I.s.model.weights, cuts), I.s.mesh, rp,
                     initial_params(job, I.s.model), o);
}

JobRunner::~JobRunner() = default;

void JobRunner::init() {
  Impl& I = *p_;
  if (I.trainer) I.trainer->init(initial_params(I.job, I.s.model));
  // The pipeline started from them (its constructor takes the initial values).
}

void JobRunner::restore(const CheckpointDir& dir, int64_t step) {
  Impl& I = *p_;
  if (I.trainer) {
    I.trainer->restore_checkpoint(dir, step);
    return;
  }
  I.pipeline->set_state(dir.read_all(step));
  I.steps = step;
}

void JobRunner::save(CheckpointDir& dir) {
  Impl& I = *p_;
  if (I.trainer) {
    I.trainer->save_checkpoint(dir);
    return;
  }
  dir.save(I.steps, I.pipeline->state(), I.s.mesh);
}

int64_t JobRunner::steps_done() const { return p_->trainer ? p_->trainer->steps_done() : p_->steps; }

StepRecord JobRunner::step(int64_t k) {
  Impl& I = *p_;
  const std::vector<HostTensor> batch = model_job_batch(I.job, k);
  if (I.trainer) return I.trainer->step(batch);
  // The batch's rows in micro-batches, in order.
  const int64_t M = I.layout.micro, rows = batch[0].shape()[0] / M, S = batch[0].shape()[1];
  std::vector<std::map<std::string, HostTensor>> micro;
  for (int64_t m = 0; m < M; ++m) {
    std::map<std::string, HostTensor> mb;
    const char* names[] = {"tokens", "labels"};
    for (std::size_t i = 0; i < 2; ++i) {
      HostTensor t(batch[i].dtype(), {rows, S});
      for (int64_t e = 0; e < rows * S; ++e) t.set(e, batch[i].get(m * rows * S + e));
      mb.emplace(names[i], std::move(t));
    }
    micro.push_back(std::move(mb));
  }
  const int64_t t = I.steps + 1;
  const auto t0 = std::chrono::steady_clock::now();
  const PipelineStepReport r = I.pipeline->step(micro, I.s.options.lr.at(t), t);
  I.steps = t;
  StepRecord rec;
  rec.step = t;
  rec.loss = r.loss;
  rec.grad_norm = r.grad_norm;
  rec.lr = I.s.options.lr.at(t);
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rec;
}

}  // namespace tessel::planner::detail
