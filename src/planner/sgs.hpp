// The planner's scheduling core, shared by the fast, exact, brute-force methods and the
// baselines (tessel/planner/schedule.hpp): a job's modes (device count, node choice, runtime),
// the serial schedule-generation scheme over per-node usage profiles, and the step from its
// start times to a Schedule with device ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/planner/schedule.hpp"

namespace tessel::planner::detail {

// One way to run a job: g devices for p seconds on the given nodes (one node, or whole nodes
// when it spans), or on whichever node(s) free up first when `nodes` is empty.
struct Mode {
  int32_t g = 0;
  double p = 0;
  std::vector<int32_t> nodes;
  int32_t span() const;  // nodes it occupies: 1, or g / devices_per_node
  int32_t devices_per_node = 0;
};

struct Instance {
  int32_t nodes = 1;
  int32_t devices_per_node = 1;
  std::vector<std::vector<Mode>> modes;  // per job: its usable modes, fewest devices first
  std::vector<double> device_free_at;    // per global device: busy until then (empty: all free)
};

// Which modes a job gets per usable count: one whose node(s) are chosen at placement (the
// earliest free), one per node (set), or both (the greedy one first).
enum class NodeModes { greedy, explicit_nodes, both };
// Throws PlanError naming a job that no count fits.
Instance make_instance(const std::vector<JobProfile>& jobs, const Pool& pool, NodeModes node_modes);

struct Timeline {
  std::vector<double> start;
  std::vector<std::vector<int32_t>> nodes;
  double makespan = 0;
  double sum_completion = 0;
};

// Places the jobs in `order`, job j in mode mode_of[j], each at the earliest moment its devices
// are free for its whole runtime (holes left by earlier placements are filled).
Timeline serial_sgs(const Instance& inst, const std::vector<int32_t>& order, const std::vector<int32_t>& mode_of);

// Device ids by a sweep over the start times (any free devices of the node will do; the lowest
// are taken), and the Schedule's totals.
Schedule make_schedule(const Instance& inst, const Timeline& t, const std::vector<int32_t>& mode_of,
                       const std::vector<JobProfile>& jobs, const Pool& pool, const std::string& method);

// The jobs' order by start time in a schedule (ties by index): serial_sgs with it and the same
// modes gives every job a start no later (the left-shift argument in docs/planner.md).
std::vector<int32_t> order_by_start(const std::vector<double>& start);

double objective_value(const Timeline& t, Objective o);

}  // namespace tessel::planner::detail
