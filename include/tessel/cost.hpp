// tessel/cost.hpp — the cost model: flops and bytes per op, α + bytes·factor/bandwidth per
// collective with per-mesh-axis link figures. Used by the reshard planner to pick a plan,
// and reported per program.
//
// Ring factors as in nccl-tests: all-reduce 2(n−1)/n, all-gather, reduce-scatter and
// all-to-all (n−1)/n, collective-permute 1. `bytes` is the buffer size as nccl-tests counts
// it: all-gather the output, reduce-scatter the input, the others the (equal) in/out size.
// A group over several axes runs at the slowest of their links, with the largest α.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/mesh.hpp"

namespace tessel {

enum class CollectiveKind { AllGather, AllReduce, ReduceScatter, AllToAll, CollectivePermute };
const char* collective_name(CollectiveKind k);  // "all-gather", ...

struct LinkSpec {
  double alpha_s = 10e-6;       // latency per collective step
  double bandwidth = 100e9;     // bytes/s per device (bus bandwidth)
};

struct CostModel {
  double flops_per_s = 100e12;     // per device
  double memory_bandwidth = 2e12;  // bytes/s per device, for memory-bound ops
  LinkSpec default_link;
  std::map<std::string, LinkSpec> links;  // per mesh axis; default_link otherwise

  LinkSpec link(const std::vector<std::string>& axes) const;
  static double ring_factor(CollectiveKind k, int64_t n);
  double collective_seconds(CollectiveKind k, const Mesh& mesh,
                            const std::vector<std::string>& axes, int64_t bytes) const;
  // Roofline: max(flops / rate, bytes / memory bandwidth).
  double op_seconds(double flops, double bytes) const;

  // Parses "model=bw:50e9,alpha:5e-6;data=bw:12.5e9" (per-axis overrides); throws Error.
  void parse_links(std::string_view spec);
};

}  // namespace tessel
