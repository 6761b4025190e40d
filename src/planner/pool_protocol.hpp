// The messages of the pool runtime's process form (pool_runtime.hpp, PoolRunOptions::processes):
// rank 0's coordinator sends each job segment to the processes of its devices and hears from the
// segment's leader (its lowest device's process). All are text, over ProcessGroup::send/try_recv.
//
//   start tag, coordinator -> each process of the segment:
//     "S <seg> <job> <resume_step> <stop_after> <device>...\n<layout>"   run a segment
//     "Q ok" | "Q failed\n<message>"                                    the run is over
//   progress tag of the segment, leader (or any member, for E) -> coordinator:
//     "P <step> <loss> <seconds>"   a step ran (one line per step: after the segment's first
//                                   step, a report holds the steps of kReportEvery)
//     "D"        every step ran
//     "M <step>"  checkpointed at <step>, moving       "X"        stopped when asked
//     "E <message>"  the segment failed
//   control tag of the segment, coordinator -> leader:
//     "M" checkpoint at the next step boundary and end     "X" stop at the next step boundary
// <stop_after>: the step after which a move asked for in PoolRunOptions::moves happens (-1: none),
// so that the segment ends exactly there without a round trip.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/planner/model_job.hpp"
#include "tessel/planner/pool_runtime.hpp"
#include "tessel/runtime/process_group.hpp"

namespace tessel::planner::detail {

constexpr int kStartTag = 1;
constexpr int kMaxSegments = 8000;  // progress and control tags stay below ProcessGroup's 16384
inline int progress_tag(int64_t seg) { return 16 + 2 * static_cast<int>(seg); }
inline int control_tag(int64_t seg) { return 17 + 2 * static_cast<int>(seg); }

// How often a segment's leader sends its step reports (a step's line waits at most this long;
// a final, move or stop report first sends what waits). With QuietBackoff below, this cut the
// process form's context switches by a third to a half on oversubscribed cores
// (bench/results/2026-11-27T0330-2core-cpu-pool-processes).
constexpr std::chrono::milliseconds kReportEvery{25};

// A polling loop's sleep while nothing arrives: 1 ms, doubling to 8 ms; reset on a message.
// (The loops wait on MPI_Improbe, which has no blocking form that another thread can wake.)
class QuietBackoff {
 public:
  void wait() {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
    ms_ = std::min(ms_ * 2, 8);
  }
  void reset() { ms_ = 1; }

 private:
  int ms_ = 1;
};

struct SegmentOrder {
  int64_t seg = 0;
  std::size_t job = 0;
  int64_t resume_step = 0;
  int64_t stop_after = -1;
  std::vector<int32_t> devices;  // ascending; devices[0]'s process leads
  std::string layout;
};

std::string format_order(const SegmentOrder& o);
SegmentOrder parse_order(const std::string& text);

// Serves segment orders on this process until the coordinator's "Q": each segment runs on an
// MpiRuntime over its devices' processes. "Q failed" throws PlanError with the coordinator's
// message (so every process ends with the pool's error).
void serve_pool(const std::vector<ModelJob>& jobs, ProcessGroup& pg, const PoolRunOptions& options);

}  // namespace tessel::planner::detail
