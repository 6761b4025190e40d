// JobRunner (job_runner.hpp): the Trainer, over one program or (pipeline_trainer) a pipeline.
#include "job_runner.hpp"

#include <fmt/format.h>

#include <chrono>
#include <optional>

#include "tessel/pipeline/runner.hpp"
#include "tessel/pipeline/trainer.hpp"
#include "tessel/pipeline/stages.hpp"
#include "tessel/runtime/make_runtime.hpp"

namespace tessel::planner::detail {

struct JobRunner::Impl {
  Impl(const ModelJob& j, const Layout& l) : job(j), layout(l), s(build_model_step(j, l)) {}
  const ModelJob& job;
  Layout layout;
  ModelJobStep s;
  // The runtimes (one, or one per pipeline stage) first: they outlive the Trainer that runs on
  // them.
  std::vector<std::unique_ptr<Runtime>> runtimes;
  std::optional<Trainer> trainer;
};

JobRunner::JobRunner(const ModelJob& job, const Layout& layout, int kernel_threads)
    : p_(std::make_unique<Impl>(job, layout)) {
  Impl& I = *p_;
  if (layout.pipe <= 1) {
    I.runtimes.push_back(make_cpu_runtime({"threads", I.s.mesh, kernel_threads}));
    I.trainer.emplace(I.s.model.graph, I.s.model.loss, I.s.model.weights, I.s.mesh, *I.runtimes[0], I.s.options);
    return;
  }
  // A Trainer over the pipeline (pipeline_trainer): equal layers per stage, cut at the residual
  // stream (gpt_train's pipeline), 1F1B, each stage keeping or recomputing its activations as
  // the layout says (TrainerOptions::train.remat, as priced).
  const int64_t P = layout.pipe;
  const std::vector<Tensor> cuts = equal_layer_cuts(I.s.model.checkpoints, job.gpt.layers, P);
  std::vector<Runtime*> rp;
  for (int64_t st = 0; st < P; ++st) {
    I.runtimes.push_back(make_cpu_runtime({"threads", I.s.mesh, kernel_threads}));
    rp.push_back(I.runtimes.back().get());
  }
  PipelineOptions po;
  po.schedule = ScheduleKind::OneFOneB;
  po.micro = layout.micro;
  TrainerOptions to = I.s.options;
  to.train.checkpoints.clear();                 // a stage recomputes its whole forward, or keeps it
  to.tokens_per_batch *= layout.micro;          // the model is one micro-batch's
  const Mesh mesh = Mesh::parse(fmt::format("pipe={},{}", P, layout.mesh_spec()));
  I.trainer.emplace(pipeline_trainer(I.s.model.graph, I.s.model.loss, I.s.model.weights, cuts, mesh, rp, to, po));
}

JobRunner::~JobRunner() = default;

void JobRunner::init() { p_->trainer->init(initial_params(p_->job, p_->s.model)); }

void JobRunner::restore(const CheckpointDir& dir, int64_t step) { p_->trainer->restore_checkpoint(dir, step); }

void JobRunner::save(CheckpointDir& dir) { p_->trainer->save_checkpoint(dir); }

int64_t JobRunner::steps_done() const { return p_->trainer->steps_done(); }

StepRecord JobRunner::step(int64_t k) {
  Impl& I = *p_;
  const std::vector<HostTensor> batch = model_job_batch(I.job, k);
  if (I.layout.pipe <= 1) return I.trainer->step(batch);
  // The batch's rows in micro-batches, in order (each in batch_inputs' order: tokens, labels).
  const int64_t M = I.layout.micro, rows = batch[0].shape()[0] / M, S = batch[0].shape()[1];
  std::vector<std::vector<HostTensor>> micro;
  for (int64_t m = 0; m < M; ++m) {
    std::vector<HostTensor> mb;
    for (std::size_t i = 0; i < 2; ++i) {
      HostTensor t(batch[i].dtype(), {rows, S});
      for (int64_t e = 0; e < rows * S; ++e) t.set(e, batch[i].get(m * rows * S + e));
      mb.push_back(std::move(t));
    }
    micro.push_back(std::move(mb));
  }
  return I.trainer->step(micro);
}

}  // namespace tessel::planner::detail
