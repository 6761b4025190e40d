// Mesh: named N-d device grid, coordinates and axis groups.
#include "tessel/core/mesh.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>

namespace tessel {

Mesh::Mesh(std::vector<MeshAxis> axes, std::vector<int> device_ids) : axes_(std::move(axes)) {
  std::set<std::string> seen;
  num_devices_ = 1;
  for (std::size_t i = 0; i < axes_.size(); ++i) {
    const MeshAxis& a = axes_[i];
    if (a.name.empty())
      throw MeshError(fmt::format("mesh axis #{} has an empty name: give every axis a name, "
                                  "e.g. {{data=2, model=4}}", i));
    for (char c : a.name)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_'))
        throw MeshError(fmt::format("mesh axis name '{}' has character '{}': use letters, "
                                    "digits and '_'", a.name, c));
    if (!seen.insert(a.name).second)
      throw MeshError(fmt::format("mesh axis '{}' appears twice: axis names must be unique",
                                  a.name));
    if (a.size < 1)
      throw MeshError(fmt::format("mesh axis '{}' has size {}: sizes must be >= 1", a.name,
                                  a.size));
    if (a.size > kMaxDevices / num_devices_)
      throw MeshError(fmt::format("mesh axis '{}' of size {} makes the mesh larger than {} "
                                  "devices (Mesh::kMaxDevices)", a.name, a.size, kMaxDevices));
    num_devices_ *= a.size;
  }
  if (device_ids.empty()) {
    device_ids_.resize(static_cast<std::size_t>(num_devices_));
    for (int64_t i = 0; i < num_devices_; ++i) device_ids_[i] = static_cast<int>(i);
  } else {
    if (static_cast<int64_t>(device_ids.size()) != num_devices_)
      throw MeshError(fmt::format("mesh {} has {} devices but {} device ids were given",
                                  to_string(), num_devices_, device_ids.size()));
    for (int id : device_ids)
      if (id < 0) throw MeshError(fmt::format("mesh {}: device id {} is negative", to_string(), id));
    std::set<int> ids(device_ids.begin(), device_ids.end());
    if (ids.size() != device_ids.size())
      throw MeshError(fmt::format("mesh {}: device ids must be distinct", to_string()));
    device_ids_ = std::move(device_ids);
  }
}

Mesh Mesh::parse(std::string_view spec) {
  // name=size[, name=size...], optionally inside one pair of braces (Mesh::to_string's form);
  // blanks around each token. A separator is exactly one ',': a leading, trailing or doubled
  // comma, a blank in its place or an unmatched brace is an error at its column.
  std::vector<MeshAxis> axes;
  std::size_t i = 0;
  auto blanks = [&] {
    while (i < spec.size() && std::isspace(static_cast<unsigned char>(spec[i]))) ++i;
  };
  auto example = "e.g. data=2,model=4 (a single device: x=1)";
  blanks();
  const bool braced = i < spec.size() && spec[i] == '{';
  if (braced) ++i;
  blanks();
  if (i >= spec.size() || (braced && spec[i] == '}'))
    throw MeshError(fmt::format("empty mesh '{}': expected name=size[,name=size...], {}", spec, example));
  while (true) {
    std::size_t b = i;
    while (i < spec.size() && (std::isalnum(static_cast<unsigned char>(spec[i])) || spec[i] == '_'))
      ++i;
    std::string name(spec.substr(b, i - b));
    blanks();
    if (!name.empty() && i < spec.size() && spec[i] == ':')
      throw MeshError(fmt::format("bad mesh '{}' at column {}: write {}=SIZE with '=', not ':' "
                                  "(e.g. data=2,model=4)", spec, i + 1, name));
    if (name.empty() || i >= spec.size() || spec[i] != '=')
      throw MeshError(fmt::format("bad mesh '{}' at column {}: expected name=size, {}", spec, i + 1, example));
    ++i;
    blanks();
    std::size_t nb = i;
    if (i < spec.size() && spec[i] == '-') ++i;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) ++i;
    if (nb == i || (i - nb == 1 && spec[nb] == '-'))
      throw MeshError(fmt::format("bad mesh '{}' at column {}: expected a size after '{}='",
                                  spec, nb + 1, name));
    int64_t size = 0;
    try {
      size = std::stoll(std::string(spec.substr(nb, i - nb)));
    } catch (const std::exception&) {
      throw MeshError(fmt::format("bad mesh '{}': size of '{}' is out of range", spec, name));
    }
    axes.push_back({name, size});
    blanks();
    if (i >= spec.size() || spec[i] != ',') break;
    ++i;
    blanks();
    if (i >= spec.size() || spec[i] == ',' || spec[i] == '}')
      throw MeshError(fmt::format("bad mesh '{}' at column {}: expected name=size after ',' (no empty axis), {}",
                                  spec, i + 1, example));
  }
  if (braced) {
    if (i >= spec.size() || spec[i] != '}')
      throw MeshError(fmt::format("bad mesh '{}' at column {}: expected ',' or the closing '}}'", spec, i + 1));
    ++i;
    blanks();
  }
  if (i < spec.size())
    throw MeshError(fmt::format("bad mesh '{}' at column {}: unexpected '{}'; separate axes with ',' ({})", spec,
                                i + 1, spec[i], example));
  return Mesh(std::move(axes));
}

int Mesh::axis_index(std::string_view name) const {
  for (std::size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == name) return static_cast<int>(i);
  return -1;
}

int64_t Mesh::axis_size(std::string_view name) const {
  int i = axis_index(name);
  if (i < 0)
    throw MeshError(fmt::format("mesh {} has no axis '{}'", to_string(), name));
  return axes_[i].size;
}

int64_t Mesh::axes_size(const std::vector<std::string>& names) const {
  int64_t n = 1;
  for (const auto& a : names) n *= axis_size(a);
  return n;
}

std::vector<int64_t> Mesh::coords(int64_t p) const {
  if (p < 0 || p >= num_devices_)
    throw MeshError(fmt::format("device position {} is outside mesh {} ({} devices)", p,
                                to_string(), num_devices_));
  std::vector<int64_t> c(axes_.size());
  for (int i = rank() - 1; i >= 0; --i) {
    c[i] = p % axes_[i].size;
    p /= axes_[i].size;
  }
  return c;
}

int64_t Mesh::position(const std::vector<int64_t>& c) const {
  if (static_cast<int>(c.size()) != rank())
    throw MeshError(fmt::format("{} coordinates given for mesh {} of rank {}", c.size(),
                                to_string(), rank()));
  int64_t p = 0;
  for (int i = 0; i < rank(); ++i) {
    if (c[i] < 0 || c[i] >= axes_[i].size)
      throw MeshError(fmt::format("coordinate {} is outside axis '{}' of size {}", c[i],
                                  axes_[i].name, axes_[i].size));
    p = p * axes_[i].size + c[i];
  }
  return p;
}

int64_t Mesh::coord(int64_t p, std::string_view axis) const {
  int i = axis_index(axis);
  if (i < 0) throw MeshError(fmt::format("mesh {} has no axis '{}'", to_string(), axis));
  return coords(p)[i];
}

std::vector<int64_t> Mesh::group(int64_t p, const std::vector<std::string>& axes) const {
  std::vector<int> idx;
  for (const auto& a : axes) {
    int i = axis_index(a);
    if (i < 0) throw MeshError(fmt::format("mesh {} has no axis '{}'", to_string(), a));
    if (std::find(idx.begin(), idx.end(), i) != idx.end())
      throw MeshError(fmt::format("axis '{}' listed twice in an axis group", a));
    idx.push_back(i);
  }
  std::vector<int64_t> base = coords(p);
  int64_t n = 1;
  for (int i : idx) n *= axes_[i].size;
  std::vector<int64_t> out;
  out.reserve(static_cast<std::size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    std::vector<int64_t> c = base;
    int64_t r = k;
    for (int j = static_cast<int>(idx.size()) - 1; j >= 0; --j) {
      c[idx[j]] = r % axes_[idx[j]].size;
      r /= axes_[idx[j]].size;
    }
    out.push_back(position(c));
  }
  return out;
}

int64_t Mesh::index_in_group(int64_t p, const std::vector<std::string>& axes) const {
  std::vector<int64_t> c = coords(p);
  int64_t r = 0;
  for (const auto& a : axes) {
    int i = axis_index(a);
    if (i < 0) throw MeshError(fmt::format("mesh {} has no axis '{}'", to_string(), a));
    r = r * axes_[i].size + c[i];
  }
  return r;
}

std::vector<std::vector<int64_t>> Mesh::groups(const std::vector<std::string>& axes) const {
  std::vector<std::vector<int64_t>> out;
  std::vector<bool> done(static_cast<std::size_t>(num_devices_), false);
  for (int64_t p = 0; p < num_devices_; ++p) {
    if (done[p]) continue;
    auto g = group(p, axes);
    for (int64_t q : g) done[q] = true;
    out.push_back(std::move(g));
  }
  return out;
}

std::string Mesh::to_string() const {
  std::vector<std::string> parts;
  for (const auto& a : axes_) parts.push_back(fmt::format("{}={}", a.name, a.size));
  return "{" + join(parts, ", ") + "}";
}

bool Mesh::operator==(const Mesh& o) const {
  if (axes_.size() != o.axes_.size() || device_ids_ != o.device_ids_) return false;
  for (std::size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name != o.axes_[i].name || axes_[i].size != o.axes_[i].size) return false;
  return true;
}

}  // namespace tessel
