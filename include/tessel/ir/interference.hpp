// tessel/ir/interference.hpp — the bytes a value may not use, from the values placed so far,
// found without looking at each placed value: the memory-plan pass asks it where a new value
// may go, and the verifier whether a placed value overlaps one it may not share bytes with.
// A scan of the placed values with Liveness::may_share costs O(n) per value, O(n²) per program,
// and even listing the values that interfere costs the number of interfering pairs (15 million
// in the 96-layer GPT-3 training step at ZeRO-3, where saved activations live across the whole
// program); this index answers from unions of byte ranges, which stay short because placed
// values that do not interfere reuse each other's bytes.
//
// The relation is Liveness::may_share's, exactly, restated as intervals. Take x defined
// before y (first[x] < first[y]). y may reuse x's bytes iff every access of x is ordered
// before y's definition on y's stream: an access on that stream by coming earlier, an access
// on another stream T by a `wait T @<y's stream>` after it and before y's definition. Let
//
//   release(x, S) = the latest of: x's last access (last[x]), and for each stream T it is
//                   accessed on, its last access there if T == S, else the first `wait T @S`
//                   after that access (the program's end when there is none).
//
// Then x and y interfere (may not share) iff first[x] == first[y], or first[y] lies in
// [first[x], release(x, stream of y's definition)]. So a value is a point in time (its
// definition, on its stream) and, for each stream S, an interval [first, release(·, S)]. The
// values interfering with y are those defined on a stream T within [first[y], release(y, T)]
// (a range of T's points), and those whose interval for y's stream holds first[y] (a stabbing
// query). Both are segment trees over instruction indices whose nodes keep the union of the
// byte ranges of the values below (points) or assigned to them (intervals): a question visits
// O(streams · log n) nodes, an addition updates as many.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tessel/ir/program_verify.hpp"

namespace tessel {

class Interference {
 public:
  // `L` = compute_liveness(p), `num_instrs` = p.instrs.size(). Only values defined by an
  // instruction (first >= 0) may be asked about or added; a view counts as its source.
  Interference(const Liveness& L, int num_instrs);

  // a and b may not share bytes: !L.may_share(a, b).
  bool interfere(int a, int b) const;

  // Records that v (not added before) holds the bytes [begin, end), begin < end.
  void add(int v, int64_t begin, int64_t end);

  // Calls f(begin, end) for byte ranges whose union is the bytes of the added values that
  // interfere with v (v not added); they may overlap and come in no set order.
  template <class F>
  void for_each_busy(int v, F&& f) const {
    visit(v, [&](const Union& u) {
      for (const auto& [b, e] : u) f(b, e);
      return false;
    });
  }

  // Whether an added value that interferes with v (v not added) holds a byte of [begin, end).
  bool overlaps(int v, int64_t begin, int64_t end) const;

 private:
  using Union = std::vector<std::pair<int64_t, int64_t>>;  // disjoint [begin, end), ascending, none touching
  using Tree = std::vector<Union>;                         // segment tree over instruction indices

  int root(int v) const { return root_[static_cast<std::size_t>(v)]; }
  int release(int x, std::size_t s) const { return release_[static_cast<std::size_t>(x) * streams_ + s]; }
  static void insert(Union& u, int64_t begin, int64_t end);

  // Calls g(node union) for each node the questions about v visit, until g returns true.
  template <class G>
  bool visit(int v, G&& g) const {
    const int x = root(v), d = def_[static_cast<std::size_t>(x)];
    for (std::size_t s = 0; s < streams_; ++s) {
      // Values defined on stream s at or after v, before v's release as s sees it: the
      // canonical nodes of the range (bottom-up).
      const Tree& t = points_[s];
      std::size_t lo = static_cast<std::size_t>(d) + leaves_, hi = static_cast<std::size_t>(release(x, s)) + leaves_ + 1;
      for (; lo < hi; lo >>= 1, hi >>= 1) {
        if ((lo & 1) && g(t[lo++])) return true;
        if ((hi & 1) && g(t[--hi])) return true;
      }
    }
    // Values whose interval for v's stream holds v's definition: the leaf's ancestors.
    const Tree& t = intervals_[stream_[static_cast<std::size_t>(x)]];
    for (std::size_t node = static_cast<std::size_t>(d) + leaves_; node >= 1; node >>= 1)
      if (g(t[node])) return true;
    return false;
  }

  std::vector<int> root_, def_;
  std::vector<std::size_t> stream_;  // per root: its definition's stream
  std::size_t streams_ = 0, leaves_ = 1;
  std::vector<int> release_;   // per root and stream, clamped to the last instruction
  std::vector<Tree> points_;     // per stream: a value at the leaf of its definition and above
  std::vector<Tree> intervals_;  // per stream S: a value on the canonical nodes of [first, release(·, S)]
};

}  // namespace tessel
