// tessel/cost.hpp — the cost model: flops and bytes per op, α + bytes·factor/bandwidth per
// collective with per-mesh-axis link figures. Used by the reshard planner to pick a plan,
// and reported per program.
//
// Ring factors as in nccl-tests: all-reduce 2(n−1)/n, all-gather, reduce-scatter and
// all-to-all (n−1)/n, collective-permute 1. `bytes` is the buffer size as nccl-tests counts
// it: all-gather the output, reduce-scatter the input, the others the (equal) in/out size.
// A group over several axes runs at the slowest of their links, with the largest α.
//
// The default figures model one NVLink-4 node of H100 GPUs (sources in docs/links.md):
// 450 GB/s bus bandwidth and 3 µs per collective, 989 TFLOP/s dense bf16, 3.35 TB/s HBM3.
// Measure the machine at hand with `tessel-bench --calibrate-links` and pass the file it
// writes (the --links format, docs/links.md) to parse_links / tessel-explain --links @FILE.
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
  double alpha_s = 3e-6;        // seconds per collective (latency: the time of a tiny one)
  double bandwidth = 450e9;     // bytes/s per device (bus bandwidth, as nccl-tests' busbw)
};

struct CostModel {
  double flops_per_s = 989e12;      // per device (H100 SXM dense bf16)
  double memory_bandwidth = 3.35e12;  // bytes/s per device, for memory-bound ops (H100 HBM3)
  LinkSpec default_link;
  std::map<std::string, LinkSpec> links;  // per mesh axis; default_link otherwise

  LinkSpec link(const std::vector<std::string>& axes) const;
  static double ring_factor(CollectiveKind k, int64_t n);
  double collective_seconds(CollectiveKind k, const Mesh& mesh,
                            const std::vector<std::string>& axes, int64_t bytes) const;
  // Roofline: max(flops / rate, bytes / memory bandwidth).
  double op_seconds(double flops, double bytes) const;

  // Parses "model=bw:50e9,alpha:5e-6;data=bw:12.5e9" (per-axis overrides; a key left out
  // keeps default_link's figure). Entries are separated by ';' or newlines, '#' starts a
  // comment to the end of the line, blanks around an entry are ignored (docs/links.md).
  // Throws Error naming the entry.
  void parse_links(std::string_view spec);
};

// The whole text of a link figures file (for parse_links); throws Error naming the file.
std::string read_links_file(const std::string& path);
// One line `axis=bw:<bytes/s>,alpha:<seconds>` per entry (6 significant digits), which
// parse_links reads back.
std::string format_links(const std::map<std::string, LinkSpec>& links);

}  // namespace tessel
