// tessel/compiler/uneven.hpp — uneven shardings by padding, as GSPMD does.
//
// A dim of size n split k ways is padded to the next multiple of k: every device holds a
// block of ceil(n/k) (the last ones partly padding), so the SPMD program stays uniform.
// pad_uneven rewrites the global graph once, before propagation:
//  * every dim that shares a factor with an unevenly annotated dim (through the ops' factor
//    rules) is padded alike; inputs are padded with zeros by the runtime's host transfers;
//  * reductions and contractions over a padded dim first mask the padding with their
//    neutral element (mask_padding: 0 for sums, -inf for max, softmax and cross-entropy);
//    reduce_mean is rescaled by padded/valid; layer_norm over a padded feature dim is
//    decomposed into masked sums;
//  * an op that cannot see padding (a reshape, concat or slice across a padded dim) gets the
//    real extent sliced out first, and its result is padded again where needed;
//  * outputs stay padded, in the layout they were computed in (so an updated parameter can be
//    donated back to its padded input); PaddedGraph::output_shapes holds their real shapes,
//    and the runtime trims them on the way to the host (to_host, Executable::run).
// A graph with no uneven annotation is returned unchanged. With `strict`, an uneven
// annotation is today's clear divisibility error instead.
#pragma once

#include <vector>

#include "tessel/ir/graph.hpp"
#include "tessel/core/mesh.hpp"

namespace tessel {

struct PaddedGraph {
  Graph graph;                       // the graph to propagate and partition
  bool padded = false;               // false: `graph` is a clone of the input
  std::vector<Shape> input_shapes;   // the user's (unpadded) shape of each input
  std::vector<Shape> output_shapes;  // the user's (unpadded) shape of each output
  std::vector<std::string> notes;    // one line per padded class, e.g. for tessel-explain
};

PaddedGraph pad_uneven(const Graph& g, const Mesh& mesh);

}  // namespace tessel
