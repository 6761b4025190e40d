// tessel/core/mesh.hpp — an N-d grid of devices with named axes, e.g. {data=2, model=4}.
//
// A device is addressed by its *position* p in [0, num_devices) (row-major over the axes,
// the last axis fastest) and by its coordinates. device_ids() maps a position to a physical
// device id (identity by default). An *axis group* of a device for a set of axes is the set
// of devices that differ from it only along those axes: the members of one collective. It
// maps 1:1 onto ncclCommSplit / MPI_Comm_split with color = the coordinates on the other axes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/common.hpp"

namespace tessel {

struct MeshAxis {
  std::string name;
  int64_t size = 1;
};

class Mesh {
 public:
  // The largest mesh tessel builds: 2^20 devices (beyond any cluster today; a mesh keeps
  // per-device tables, so an absurd size is refused before anything is allocated).
  static constexpr int64_t kMaxDevices = int64_t{1} << 20;

  // A mesh with no axes: one device.
  Mesh() = default;
  // Throws MeshError for empty or duplicate names, sizes < 1 or a device list of the wrong
  // length or with repeated ids. An empty device_ids means 0..N-1.
  explicit Mesh(std::vector<MeshAxis> axes, std::vector<int> device_ids = {});
  // Parses "data=2,model=4" (also "{data=2, model=4}", Mesh::to_string's form, and blanks
  // around each token). Axes are separated by exactly one ','. Throws MeshError naming the
  // column for an empty spec (no axis), "data:2" (write '='), "data=2 model=4" (a blank where
  // the ',' belongs) and an empty or doubled separator.
  static Mesh parse(std::string_view spec);

  int rank() const { return static_cast<int>(axes_.size()); }
  const std::vector<MeshAxis>& axes() const { return axes_; }
  int64_t num_devices() const { return num_devices_; }
  const std::vector<int>& device_ids() const { return device_ids_; }

  // Index of the axis in axes(), -1 when there is no such axis.
  int axis_index(std::string_view name) const;
  bool has_axis(std::string_view name) const { return axis_index(name) >= 0; }
  // Size of the named axis; throws MeshError naming the axis and the mesh when unknown.
  int64_t axis_size(std::string_view name) const;
  // Product of the sizes of the given axes (1 for none).
  int64_t axes_size(const std::vector<std::string>& names) const;

  std::vector<int64_t> coords(int64_t position) const;
  int64_t position(const std::vector<int64_t>& coords) const;
  int64_t coord(int64_t position, std::string_view axis) const;

  // The devices that differ from `position` only along `axes`, ordered by their index in
  // the group: the listed axes taken major→minor in the order given.
  std::vector<int64_t> group(int64_t position, const std::vector<std::string>& axes) const;
  // Index of `position` inside its group for `axes` (major→minor in the order given).
  int64_t index_in_group(int64_t position, const std::vector<std::string>& axes) const;
  // All groups for `axes`: a partition of the devices, ordered by their smallest member.
  std::vector<std::vector<int64_t>> groups(const std::vector<std::string>& axes) const;

  // "{data=2, model=4}"
  std::string to_string() const;
  bool operator==(const Mesh& o) const;
  bool operator!=(const Mesh& o) const { return !(*this == o); }

 private:
  std::vector<MeshAxis> axes_;
  std::vector<int> device_ids_{0};
  int64_t num_devices_ = 1;
};

}  // namespace tessel
