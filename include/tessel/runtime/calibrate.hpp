// tessel/runtime/calibrate.hpp — measure the link figures of the cost model (α and bus
// bandwidth per mesh axis) on the runtime at hand, and write them in the --links format.
//
// The cost model prices a collective over an axis group of n devices as
//   seconds = α + bytes · factor(n) / bandwidth      (factor: 2(n−1)/n for all-reduce, ...)
// (cost.hpp, docs/links.md). calibrate_links fits exactly that line, per axis, with an
// all-reduce of f32 on every group of the axis at once (all devices busy, as in a program):
//   α          = the median time of a tiny all-reduce (`small_bytes`),
//   bandwidth  = large_bytes · 2(n−1)/n / (t_large − α), t_large the median time of an
//                all-reduce of `large_bytes` (nccl-tests' busbw with the latency taken out).
// Each sample is the slowest local device's time for one collective enqueued on its
// communication stream and synchronised (what the executor pays), after warm-up calls; on a
// multi-process runtime the slowest device of every process (allgather_shards).
//
// Works on any Runtime: a ThreadRuntime (the in-process communicator) or an MpiRuntime
// (collective over the processes: every process calls it with the same arguments).
// tessel-bench --calibrate-links and tessel-bench-mpi --calibrate-links drive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessel/core/cost.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel {

struct CalibrationOptions {
  std::size_t small_bytes = 8;          // latency probe (2 floats)
  std::size_t large_bytes = 16u << 20;  // bandwidth probe; a multiple of 4 bytes
  int warmup = 3;                       // untimed calls per size
  int iterations = 20;                  // timed calls per size (the median is kept)
  double timeout_s = 120;               // a member waiting longer for its peers fails
};

struct AxisCalibration {
  std::string axis;
  int64_t group_size = 0;
  double small_seconds = 0;  // median time of the small all-reduce
  double large_seconds = 0;  // median time of the large all-reduce
  double busbw = 0;          // nccl-tests' busbw of the large one: large_bytes*2(n-1)/n / large_seconds
  LinkSpec link;             // the fitted α and bandwidth
};

struct LinkCalibration {
  std::string runtime;  // Runtime::name(): "threads", "mpi"
  Mesh mesh;
  CalibrationOptions options;
  std::vector<AxisCalibration> axes;  // the axes of size > 1, in mesh order

  // axis -> fitted link, for CostModel::links.
  std::map<std::string, LinkSpec> links() const;
  // The file tessel-explain --links @FILE reads: '#' comment lines saying how and where it
  // was measured (with the raw medians), then one `axis=bw:...,alpha:...` line per axis.
  std::string to_links_file(const std::string& machine = {}) const;
};

// Throws RuntimeError when the runtime cannot run the mesh, a collective fails, or the
// options are unusable (sizes not multiples of 4 bytes, small >= large, iterations < 1).
LinkCalibration calibrate_links(Runtime& runtime, const Mesh& mesh, const CalibrationOptions& options = {});

// The compute figures of the cost model (CostModel::flops_per_s, memory_bandwidth) measured on
// this host's CPU kernels, as one device thread runs them (one kernel thread): an f32 einsum
// `mk,kn->mn` of gemm_size^3 (its flops over its median time) and an f32 add over stream_bytes
// per operand (3 x stream_bytes moved over its median time). For CPU virtual devices; a GPU
// has its own figures (docs/links.md).
struct ComputeCalibration {
  int64_t gemm_size = 512;
  int64_t stream_bytes = 16 << 20;
  double gemm_seconds = 0, stream_seconds = 0;  // medians
  double flops_per_s = 0, memory_bandwidth = 0;
};
ComputeCalibration calibrate_compute(const CalibrationOptions& options = {});

// A cost model of `mesh` on `runtime` as measured here: calibrate_links for the links,
// calibrate_compute for the compute (on CPU runtimes), and compute_sharing for the mesh's
// local devices on this host's hardware threads. What automatic sharding should plan with on
// CPU devices, where the default (H100) figures price compute and collectives in other ratios
// (docs/auto-sharding.md).
CostModel measured_cost_model(Runtime& runtime, const Mesh& mesh, const CalibrationOptions& options = {});

}  // namespace tessel
