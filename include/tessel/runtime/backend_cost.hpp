// tessel/runtime/backend_cost.hpp — the cost model of the machine a program will run on, for the
// tools that plan with one (automatic sharding, the Trainer's auto_shard, gpt_train --auto).
// The cost model's default figures are an H100's (cost.hpp): planning CPU threads with them prices
// compute against collectives in the wrong ratio (on a 2-core CPU the plan that keeps every
// weight whole and repeats the step on every device looked best: 2.4x slower than the hand
// layouts). So a planner asks for the backend's figures:
//   - CPU devices (runtime "threads" or "mpi"): this machine's figures, measured
//     (measured_cost_model, calibrate.hpp: the links of the mesh, an f32 product and an add on
//     one kernel thread, the sharing of cores) once per machine, runtime and mesh, and cached in
//     a file, so later runs read them (about 1 s saved per run, and the same plan each time);
//   - CUDA devices: the GPU figures of CostModel's defaults (an H100 SXM; docs/links.md).
// Under a multi-process runtime rank 0 reads (or, on a miss, every rank measures and rank 0
// writes) the figures, and every process plans with rank 0's: the processes agree.
//
// The cache: a directory (BackendCostOptions::cache_dir, else $TESSEL_CACHE_DIR, else
// $XDG_CACHE_HOME/tessel, else $HOME/.cache/tessel) holding one text file per key, named
// cost-<runtime>-<mesh>-<hash>.txt, where the hash covers the CPU model, the hardware threads,
// the host name, the runtime, the mesh and the process count. A file is written whole (a
// temporary renamed over it); one that cannot be read or parsed is measured again and replaced.
// Delete the directory (or a file) to measure again, e.g. after a change to the machine's load.
//
// Thread safety: as the runtime's collectives (one call per process at a time).
#pragma once

#include <string>

#include "tessel/core/cost.hpp"
#include "tessel/core/mesh.hpp"
#include "tessel/runtime/calibrate.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel {

struct BackendCostOptions {
  std::string cache_dir;     // "": default_cost_cache_dir()
  bool use_cache = true;     // false: measure now, read and write no file
  CalibrationOptions calibration;
};

struct BackendCost {
  CostModel cost;
  // One sentence for a tool's output: which figures and where they come from, e.g.
  // "this machine's measured figures (2-core Intel(R) Xeon(R) ..., read from
  // /root/.cache/tessel/cost-threads-data=2,model=2-....txt)".
  std::string source;
  std::string cache_file;  // the file read or written; "" when none
  bool measured_now = false;
};

// The cache directory by the rule above; "" when none of the variables is set.
std::string default_cost_cache_dir();

// "Intel(R) Xeon(R) CPU @ 2.20GHz, 2 hardware threads, host vm": what the cache key covers.
std::string machine_description();

// The figures for `mesh` on `runtime` (collective over the runtime's processes on a cache miss:
// every process calls it). Throws RuntimeError when measuring fails; a cache that cannot be
// written is not an error (the figures are used, `source` says they were not saved and why).
BackendCost backend_cost_model(Runtime& runtime, const Mesh& mesh, const BackendCostOptions& options = {});

}  // namespace tessel
