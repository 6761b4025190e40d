// tessel/planner/show.hpp — the joint schedule shown: a table, the plan as JSON, a Perfetto
// trace with a track per device, and a Gantt chart as SVG (one row per device).
#pragma once

#include <string>
#include <vector>

#include "tessel/planner/jobs.hpp"
#include "tessel/planner/schedule.hpp"

namespace tessel::planner {

// One line per job (name, device count, device ids, start, end, runtime, step time), then the
// makespan, the bound and the method. Times in seconds, or h:mm:ss past an hour.
std::string schedule_table(const Schedule& s, const std::vector<JobProfile>& jobs, const Pool& pool);

// {"makespan_s": ..., "sum_completion_s": ..., "lower_bound_s": ..., "method": ..., "optimal": ...,
//  "jobs": [{"name": ..., "devices": [global ids], "start_s": ..., "end_s": ...,
//            "num_devices": ..., "step_time_s": ..., "plan": ...}, ...]}
std::string schedule_json(const Schedule& s, const std::vector<JobProfile>& jobs);

// Chrome/Perfetto trace-event JSON (ui.perfetto.dev opens it): a process per node, a track
// (thread) per device, one slice per job on each of its devices; 1 s of plan = 1 s of trace.
std::string schedule_perfetto(const Schedule& s, const Pool& pool);

// A Gantt chart: time across, one row per device, a coloured bar per job with its name where it
// fits (and as a tooltip), node boundaries marked.
std::string schedule_svg(const Schedule& s, const Pool& pool, const std::string& title);

// "1:02:03" past an hour, "12.3 s" below.
std::string format_duration(double seconds);
// Device ids as runs: {0, 1, 2, 3, 8} -> "0-3,8".
std::string format_devices(const std::vector<int32_t>& ids);

}  // namespace tessel::planner
