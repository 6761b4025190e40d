// Internal to the planner: a model job's layout run on CPU virtual devices (threads of this
// process), the one place the trials and the pool runtime build what runs a layout: the Trainer
// for a data x model layout, the Trainer over a pipeline for a pipeline layout
// (pipeline/trainer.hpp pipeline_trainer: pipe runtimes of a stage's devices each, the model cut
// into equal layers, 1F1B, the layout's remat). Both save and restore the same checkpoint arrays
// (the parameters and AdamW moments by name), so a job moves between them.
#pragma once

#include <cstdint>
#include <memory>

#include "tessel/checkpoint/checkpoint.hpp"
#include "tessel/planner/model_job.hpp"
#include "tessel/train/trainer.hpp"

namespace tessel::planner::detail {

class JobRunner {
 public:
  JobRunner(const ModelJob& job, const Layout& layout, int kernel_threads);
  ~JobRunner();
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  void init();                                              // the job's initial parameters
  void restore(const CheckpointDir& dir, int64_t step);     // a checkpoint of any layout of the job
  void save(CheckpointDir& dir);                            // at steps_done()
  int64_t steps_done() const;
  StepRecord step(int64_t k);                               // batch k of the job (model_job_batch)

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

}  // namespace tessel::planner::detail
