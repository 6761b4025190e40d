// tessel/passes/fuse_attention.hpp — the fuse-attention graph pass: attention written the long
// way becomes one `attention` op (docs/attention.md), so a user's graph gets the tiled kernels
// that never write the [Sq, Sk] scores. It matches
//   s = einsum(q, k)  [-> mul/div by a scalar constant] [-> causal_mask]  -> softmax(last dim)
//   -> einsum(s, v)
// (scale and mask in either order) when q, k, v and the result are in one of attention's
// layouts ("bhsd" or "bshd": q [b,h,q,d] or [b,q,h,d], k and v likewise, the result like q),
// the scores are [b,h,q,s] in any order of b and h with the keys last, the mask is causal on
// Sq == Sk, and nothing but the chain reads its intermediates (no output, no annotation). A
// chain whose intermediates something else reads (a training graph's backward reads the
// probabilities) is left as it is: build the model with attention() or run this pass before
// grad() to get the flash backward.
#pragma once

#include <string>
#include <vector>

#include "tessel/ir/graph.hpp"

namespace tessel {

struct FusedAttentionGraph {
  Graph graph;  // a copy of the input with every matched chain replaced; value names kept
  int fused = 0;
  // One line per rewritten chain, e.g. "%l0_ctx = attention(%l0_q, %l0_k, %l0_v) layout=bshd
  // causal=true scale=0.125 (from einsum %l0_scores_raw -> mul -> causal_mask -> softmax
  // %l0_probs -> einsum)".
  std::vector<std::string> report;
};

FusedAttentionGraph fuse_attention(const Graph& g);

}  // namespace tessel
