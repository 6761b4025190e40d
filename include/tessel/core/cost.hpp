// tessel/core/cost.hpp — the cost model: flops and bytes per op, α + bytes·factor/bandwidth per
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

#include "tessel/core/collective_kind.hpp"
#include "tessel/core/mesh.hpp"

namespace tessel {


struct LinkSpec {
  double alpha_s = 3e-6;        // seconds per collective (latency: the time of a tiny one)
  double bandwidth = 450e9;     // bytes/s per device (bus bandwidth, as nccl-tests' busbw)
};

struct CostModel {
  double flops_per_s = 989e12;      // per device (H100 SXM dense bf16)
  double memory_bandwidth = 3.35e12;  // bytes/s per device, for memory-bound ops (H100 HBM3)
  LinkSpec default_link;
  std::map<std::string, LinkSpec> links;  // per mesh axis; default_link otherwise
  // Fixed seconds per instruction a stream runs, beyond its roofline time: the launch (or the
  // hand-off to a stream worker), the event it waits on, the wake-up. Negligible next to a
  // large einsum, it is what a decomposition into many small steps pays: the collective-matmul
  // gate charges it per instruction of a ring step. Default: a CUDA kernel launch with its
  // event wait on a busy stream (~2 us). CPU device threads: docs/collective-matmul.md ("The gate").
  double dispatch_s = 2e-6;
  // Fixed seconds per step, beyond its program's instructions: sending its inputs, starting the
  // devices on the program, waiting for the last one, reading a result back. 0 (the default):
  // not priced.
  // calibrate_dispatch measures it for a runtime (runtime/calibrate.hpp).
  double run_s = 0;
  // Of run_s, what a run pays with its inputs already on the devices and nothing read back (a
  // loop of forwards over resident weights): starting the devices on the program and waiting
  // for the last one. 0: not priced.
  double launch_s = 0;
  // How many device programs share one device's worth of compute (>= 1): 1 where each device
  // has its own (a GPU per device, the default); on CPU device threads with more devices than
  // cores, devices / cores (compute_sharing() below). Compute (op_seconds) and dispatch times
  // are multiplied by it: while all devices compute, each gets 1/compute_sharing of a core.
  double compute_sharing = 1;

  LinkSpec link(const std::vector<std::string>& axes) const;
  static double ring_factor(CollectiveKind k, int64_t n);
  double collective_seconds(CollectiveKind k, const Mesh& mesh,
                            const std::vector<std::string>& axes, int64_t bytes) const;
  // Roofline: max(flops / rate, bytes / memory bandwidth), times compute_sharing.
  double op_seconds(double flops, double bytes) const;
  // dispatch_s times compute_sharing: a woken stream waits its turn for a shared core.
  double dispatch_seconds() const;
  // Throws Error naming the field when a figure is not a finite positive number (dispatch_s
  // may be 0) or compute_sharing < 1.
  void validate() const;

  // Parses "model=bw:50e9,alpha:5e-6;data=bw:12.5e9" (per-axis overrides; a key left out
  // keeps default_link's figure). Entries are separated by ';' or newlines, '#' starts a
  // comment to the end of the line, blanks around an entry are ignored (docs/links.md).
  // Throws Error naming the entry.
  void parse_links(std::string_view spec);
};

// Every figure equal (the links compared axis by axis).
bool operator==(const LinkSpec& a, const LinkSpec& b);
bool operator==(const CostModel& a, const CostModel& b);
inline bool operator!=(const CostModel& a, const CostModel& b) { return !(a == b); }

// CostModel::compute_sharing for `devices` device threads on `cores` hardware threads: 1 when
// every device has a core of its own, else devices / cores. cores <= 0 (unknown, as
// std::thread::hardware_concurrency() may say) counts as one core per device. Throws Error
// when devices < 1.
double compute_sharing(int64_t devices, int64_t cores);

// The whole text of a link figures file (for parse_links); throws Error naming the file.
std::string read_links_file(const std::string& path);
// One line `axis=bw:<bytes/s>,alpha:<seconds>` per entry (6 significant digits), which
// parse_links reads back.
std::string format_links(const std::map<std::string, LinkSpec>& links);

}  // namespace tessel
