// A tiny GPT model job for the pool runtime's tests (tests/unit/test_planner_pool.cpp, and its
// process form in tests/mpi/test_mpi_pool.cpp): batch 4, seq 8, one layer, vocab 32, on 1 or 2
// devices.
#pragma once

#include <cstdint>
#include <string>

#include "tessel/planner/model_job.hpp"

namespace tessel_test {

inline tessel::planner::ModelJob tiny_model_job(const std::string& name, int64_t steps, int64_t d_model,
                                                uint64_t seed) {
  const std::string text = "{\"name\": \"" + name + "\", \"steps\": " + std::to_string(steps) +
                           ", \"gpt\": {\"batch\": 4, \"seq\": 8, \"d_model\": " + std::to_string(d_model) +
                           ", \"heads\": 2, \"layers\": 1, \"vocab\": 32}, \"device_counts\": [1, 2], \"seed\": " +
                           std::to_string(seed) + ", \"lr\": 0.003}";
  return tessel::planner::parse_model_job(text, "jobs.json");
}

}  // namespace tessel_test
