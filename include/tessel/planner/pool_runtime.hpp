// tessel/planner/pool_runtime.hpp — running a planned batch of model jobs side by side on one
// pool (issue 25 item 4): each job a Trainer on its own sub-mesh of the pool's devices.
//
// The plan (schedule.hpp) is executed as an order per device, not by the clock: a job starts
// when every job planned before it on each of its devices has finished, so a job that runs
// longer than predicted delays only what follows it. Each job runs on its own thread with its
// own runtime (CPU virtual devices here: a ThreadRuntime of g devices) and its own Trainer,
// loading the layout its profile chose for g devices (JobProfile::plan), drawing batch k as
// model_job_batch(job, k).
//
// Introspection: every replan_interval_s the runtime measures each running job's step time,
// scales the waiting jobs' profiles by the measured-to-profiled ratio, and re-plans the rest
// (plan_fast around the running jobs' devices). Two kinds of new plan are weighed against
// keeping the current order: the waiting jobs re-planned, and, for each running job and each
// other count it may use, that job moved (checkpointed at its next step, restored onto its new
// devices: the move costs move_cost_s) with the waiting jobs re-planned around it. A new plan is
// adopted only when its predicted end is at least replan_margin earlier. A moved job continues
// from its checkpoint (CheckpointDir under checkpoint_dir/<job>), so its loss curve continues:
// the same batches, the state restored onto the new layout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/planner/jobs.hpp"
#include "tessel/planner/model_job.hpp"
#include "tessel/planner/schedule.hpp"
#include "tessel/runtime/process_group.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel::planner {

struct PoolRunOptions {
  double progress_interval_s = 2.0;  // a progress line per running job this often (0: none)
  std::function<void(const std::string&)> print;  // where the lines go (default: stdout)
  double replan_interval_s = 0;      // 0: never re-plan
  double replan_margin = 0.05;       // adopt a new plan when it ends at least this fraction earlier
  double move_cost_s = 1.0;          // what a move is priced at in a re-plan (save, compile, restore)
  std::string checkpoint_dir;        // where moved jobs' states go (needed with re-planning or moves)
  int32_t kernel_threads = 1;        // ThreadRuntimeOptions::kernel_threads of every job
  // Moves made regardless of the re-planner (tests, and a user who wants one): after `after_step`
  // the job is checkpointed and continues on `devices` (global ids, free once the jobs planned
  // there before it end) in its profile's layout for that many devices.
  struct Move {
    std::string job;
    int64_t after_step = 0;
    std::vector<int32_t> devices;
  };
  std::vector<Move> moves;
  // The process form (one process per device, as on GPUs): an MPI process group (mpi_process_group())
  // of pool.num_devices() processes, device d being process d. Every process calls run_pool with
  // the same jobs and options; rank 0 runs the plan it is given (the other processes may pass empty
  // profiles and an empty plan: they only serve) and sends each job's segment to the processes of
  // its devices, where the job runs on an MpiRuntime over those processes (MpiRuntimeOptions::ranks);
  // the segment's first process reports every step to rank 0, which prints the progress lines,
  // re-plans and moves jobs as in one process. The report is rank 0's; the others return one
  // without jobs. A job that fails stops the pool on every process, each throwing PlanError with
  // rank 0's message. nullptr: every device is a thread of this process.
  std::shared_ptr<ProcessGroup> processes;
  // The runtime a job's segment runs on in the process form, made on each of the segment's
  // processes: `ranks` are their MPI_COMM_WORLD ranks (= the segment's devices, ascending),
  // `tag` is unique to the segment (for MPI_Comm_create_group). Null: an MpiRuntime over
  // `ranks` (MpiRuntimeOptions::ranks, group_tag = tag, kernel_threads). On GPUs, one GPU per
  // process with NCCL over the segment's processes (what tessel-plan --backend cuda gives; the
  // planner library does not link the CUDA backend; the runtime factory does, with one GPU per
  // process when given the ranks, runtime/make_runtime.hpp):
  //   o.make_runtime = [](const std::vector<int>& ranks, int tag) {
  //     RuntimeRequest r;
  //     r.backend = "cuda";
  //     r.mpi_ranks = ranks;  // NCCL's bootstrap over these processes only
  //     r.mpi_group_tag = tag;
  //     return make_runtime(r);  // the GPU of this process's local rank
  //   };
  std::function<std::unique_ptr<Runtime>(const std::vector<int>& ranks, int tag)> make_runtime;
  // The process form: a segment whose first process has sent rank 0 nothing (no step, no end)
  // for this long fails the pool, naming the job and its processes (a process that died or
  // hangs, where mpirun keeps the others running). Counts from the order, so it must cover a
  // segment's compile and load too. 0: wait for ever. After such a failure the processes of
  // that job may still be blocked in it: end the MPI job (abort_job_on_error, as tessel-plan
  // does) rather than go on.
  double report_timeout_s = 600;
};

// One stretch of a job on one set of devices.
struct RunSegment {
  std::vector<int32_t> devices;
  std::string layout;
  int64_t first_step = 0, last_step = 0;  // steps run in it (1-based, inclusive)
  double start_s = 0, end_s = 0;          // since the pool started
};

struct JobRunRecord {
  std::string name;
  double predicted_start_s = 0, predicted_end_s = 0;  // the first plan's
  double start_s = 0, end_s = 0;                      // measured
  std::vector<RunSegment> segments;
  std::vector<double> losses;                         // losses[k - 1]: step k's loss
  double step_time_s = 0;                             // measured, mean over the last segment
};

struct PoolRunReport {
  double predicted_makespan_s = 0;
  double makespan_s = 0;
  std::vector<JobRunRecord> jobs;     // in the order of the jobs given
  std::vector<std::string> events;    // re-plans weighed and adopted, moves
  // Predicted beside measured per job, then the makespans.
  std::string table() const;
};

// Runs `jobs` (profiles[i] is jobs[i]'s, with plan[g] for the counts the schedule uses) as
// `plan` places them, on CPU virtual devices (threads of this process, or with
// PoolRunOptions::processes one process per device). Throws PlanError when a job's count has no layout
// in its profile, when the plan does not place every job, or when moves are asked for without
// a checkpoint_dir; a job that fails stops the pool and its error is rethrown naming the job.
PoolRunReport run_pool(const std::vector<ModelJob>& jobs, const std::vector<JobProfile>& profiles,
                       const Schedule& plan, const Pool& pool, const PoolRunOptions& options = {});

}  // namespace tessel::planner
