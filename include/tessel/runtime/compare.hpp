// tessel/runtime/compare.hpp — element-by-element comparison of a partitioned run against
// the reference.
//
// max_rel_err is the relative error in the max norm: max_i |got_i − want_i| / max_i |want_i|.
// Per-element relative error is not used on purpose: a partitioned reduction sums in a
// different order than the reference, so an element that is ~0 through cancellation differs
// by a few ulps of its partial sums, which is a huge relative error of a tiny number and no
// bug. A NaN on either side, or an infinity on one side only (or of the other sign), counts
// as an infinite error: NaN never passes. Equal infinities (e.g. masked logits) match.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/runtime/tensor.hpp"

namespace tessel {

struct CompareResult {
  double max_rel_err = 0;
  int64_t worst = -1;  // element index of the largest error
  double got = 0, want = 0;
  bool shape_mismatch = false;
  std::string to_string() const;
};

// `scale_floor` raises the denominator: max(max_i |want_i|, scale_floor). Property tests
// pass the largest input magnitude: a result that cancels to far below the magnitude of
// its inputs (a sum of signed terms that nearly vanishes) carries the absolute rounding
// error of those inputs' scale, and is judged against that scale.
CompareResult compare(const HostTensor& got, const HostTensor& want, double scale_floor = 0);

// Largest finite |element| over the floating-point tensors (i32 tensors are skipped).
double max_abs(const std::vector<HostTensor>& tensors);

}  // namespace tessel
