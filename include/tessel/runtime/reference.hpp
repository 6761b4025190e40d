// tessel/runtime/reference.hpp — the unpartitioned reference executor: the correctness
// oracle of every partitioned run. It runs the graph on global shapes, one op after the
// other, with the same CPU kernels the partitioned executor uses.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/ir/graph.hpp"
#include "tessel/runtime/tensor.hpp"

namespace tessel {

// Runs every op of `g` in order on global shapes and returns the values of g.outputs, in
// order. `inputs` are given in g.inputs order; a wrong count, dtype or shape throws
// RuntimeError naming the input value, the expected and the given type. Intermediates are
// freed after their last use. `num_threads` is passed to the kernels (large GEMMs).
std::vector<HostTensor> run_reference(const Graph& g, const std::vector<HostTensor>& inputs,
                                      int num_threads = 1);

// Fresh, seeded (deterministic per seed) inputs for every graph input, in g.inputs order:
// floats uniform in [-1, 1); i32 values used as Embedding ids uniform in [0, table rows),
// as CrossEntropy labels in [0, V), any other i32 in [0, 8). Identity-like ops (reshape,
// transpose, slice, broadcast, concat, sharding constraint) between the input and its
// Embedding / CrossEntropy use are looked through. Each input draws from its own stream
// (seed mixed with its index), so adding an input does not change the others.
std::vector<HostTensor> random_inputs(const Graph& g, uint64_t seed);

}  // namespace tessel
