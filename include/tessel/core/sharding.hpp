// tessel/core/sharding.hpp — how a tensor is laid out on a mesh.
//
// For each tensor dim an ordered list of mesh axes it is split over (major→minor); axes
// used by no dim are replicated; `partial` lists axes over which the value is an unreduced
// sum (each device holds a summand). A dim is *closed* (fixed, e.g. a user annotation) or
// *open* (propagation may append axes to it).
//
// Text form:  [{data}, {}, {model, ?}] partial{x}
//   {a, b}   closed dim split over a (major) then b (minor)
//   {a, ?}   open dim, currently split over a
//   {?}      open dim, currently replicated
//
// Laws (tested): the local blocks of all devices tile the global tensor exactly once per
// replica; local_shape * shard counts == global shape; parse(to_string(s)) == s.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/core/mesh.hpp"

namespace tessel {

struct DimSharding {
  std::vector<std::string> axes;  // major → minor
  bool closed = true;
  bool operator==(const DimSharding& o) const { return axes == o.axes && closed == o.closed; }
  bool operator!=(const DimSharding& o) const { return !(*this == o); }
};

class Sharding {
 public:
  std::vector<DimSharding> dims;
  std::vector<std::string> partial;  // kept sorted by mesh order when produced by the library

  Sharding() = default;
  explicit Sharding(std::vector<DimSharding> d, std::vector<std::string> p = {})
      : dims(std::move(d)), partial(std::move(p)) {}
  // Convenience: Sharding::of({{"data"}, {}, {"model"}}) — closed dims.
  static Sharding of(const std::vector<std::vector<std::string>>& axes,
                     std::vector<std::string> partial = {});
  static Sharding replicated(int rank, bool closed = true);
  // All dims open and empty: what propagation starts from.
  static Sharding open(int rank) { return replicated(rank, false); }
  // Parses the text form; throws ParseError with the column and what was expected.
  static Sharding parse(std::string_view text);

  std::string to_string() const;
  int rank() const { return static_cast<int>(dims.size()); }

  // Equality of layout and of open/closed flags.
  bool operator==(const Sharding& o) const { return dims == o.dims && partial == o.partial; }
  bool operator!=(const Sharding& o) const { return !(*this == o); }
  // Same placement of data (axes per dim and partial axes), ignoring open/closed.
  bool same_layout(const Sharding& o) const;
  // Copy with every dim closed / open, or with partial cleared.
  Sharding closed_copy() const;
  Sharding without_partial() const;

  bool is_replicated() const;  // no tiled axis and no partial axis
  bool uses_axis(std::string_view axis) const;  // tiled or partial
  // Dim that is split over `axis`, or -1.
  int dim_of_axis(std::string_view axis) const;
  std::vector<std::string> tiled_axes() const;  // in dim order, major→minor within a dim

  int64_t shard_count(int dim, const Mesh& mesh) const;
  // Index of the device's shard along `dim`: axes major→minor, mixed radix.
  int64_t shard_index(int dim, const Mesh& mesh, int64_t position) const;

  // Throws ShardingError naming `what` (e.g. "value %h of op #3 einsum"), the dim, the axis
  // and the problem: rank mismatch, unknown axis, axis used twice, axis both tiled and
  // partial, dim size not divisible by the shard count (with what would fix it).
  // With allow_uneven, a dim need not be divisible by its shard count (it is padded when
  // compiled, uneven.hpp); everything else is still checked.
  void validate(const Mesh& mesh, const Shape& global, std::string_view what,
                bool allow_uneven = false) const;

  Shape local_shape(const Mesh& mesh, const Shape& global) const;
  std::vector<int64_t> local_offset(const Mesh& mesh, const Shape& global,
                                    int64_t position) const;
};

}  // namespace tessel
