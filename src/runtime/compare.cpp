// Element-by-element comparison; relative error in the max norm (see compare.hpp).
#include "tessel/runtime/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace tessel {

double max_abs(const std::vector<HostTensor>& tensors) {
  double m = 0;
  for (const HostTensor& t : tensors) {
    if (t.dtype() == DType::i32) continue;
    for (int64_t i = 0; i < t.numel(); ++i) {
      double v = t.get(i);
      if (std::isfinite(v)) m = std::max(m, std::fabs(v));
    }
  }
  return m;
}

CompareResult compare(const HostTensor& got, const HostTensor& want, double scale_floor) {
  CompareResult r;
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    r.shape_mismatch = true;
    r.max_rel_err = std::numeric_limits<double>::infinity();
    return r;
  }
  const int64_t n = want.numel();
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    double w = want.get(i);
    if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
  }
  const double denom = std::max({scale, scale_floor, std::numeric_limits<double>::min()});
  for (int64_t i = 0; i < n; ++i) {
    double g = got.get(i), w = want.get(i);
    double err;
    if (std::isnan(g) || std::isnan(w)) err = std::numeric_limits<double>::infinity();
    else if (std::isinf(g) || std::isinf(w)) err = (g == w) ? 0 : std::numeric_limits<double>::infinity();
    else err = std::fabs(g - w) / denom;
    if (err > r.max_rel_err || r.worst < 0) {
      if (err > r.max_rel_err || r.worst < 0) {
        r.max_rel_err = std::max(r.max_rel_err, err);
        r.worst = i;
        r.got = g;
        r.want = w;
      }
    }
  }
  return r;
}

std::string CompareResult::to_string() const {
  if (shape_mismatch) return "shape or dtype mismatch";
  return fmt::format("max_rel_err={:.3g} at element {} (got {}, want {})", max_rel_err, worst, got, want);
}

}  // namespace tessel
