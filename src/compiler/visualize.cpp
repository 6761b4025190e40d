// show_sharding (tessel/compiler/visualize.hpp): the mesh as a text grid of per-device blocks.
#include "tessel/compiler/visualize.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace tessel {

namespace {

// "[0:4, :, 128:256]" for the block of `position`.
std::string block_of(const Mesh& mesh, const Shape& global, const Sharding& s, int64_t position) {
  const Shape local = s.local_shape(mesh, global);
  const std::vector<int64_t> off = s.local_offset(mesh, global, position);
  std::vector<std::string> dims;
  for (std::size_t d = 0; d < global.size(); ++d) {
    const bool split = d < s.dims.size() && !s.dims[d].axes.empty() && mesh.axes_size(s.dims[d].axes) > 1;
    if (!split) {
      dims.push_back(":");
      continue;
    }
    const int64_t lo = std::min(off[d], global[d]);
    const int64_t hi = std::min(off[d] + local[d], global[d]);
    dims.push_back(fmt::format("{}:{}", lo, hi));
  }
  return "[" + join(dims, ", ") + "]";
}

std::string coord_label(const Mesh& mesh, const std::vector<int64_t>& coords, std::size_t from) {
  std::vector<std::string> parts;
  for (std::size_t a = from; a < coords.size(); ++a)
    parts.push_back(fmt::format("{}={}", mesh.axes()[a].name, coords[a]));
  return join(parts, ",");
}

}  // namespace

std::string show_sharding(const Mesh& mesh, const Shape& global, const Sharding& sharding, std::string_view name,
                          DType dtype) {
  sharding.validate(mesh, global, name.empty() ? std::string_view("the value") : name);
  std::string out;
  if (!name.empty()) out += std::string(name) + " ";
  out += fmt::format("{} sharding {} on mesh {} ({} devices)\n", type_str(dtype, global), sharding.to_string(),
                     mesh.to_string(), mesh.num_devices());
  const bool partial = !sharding.partial.empty();
  if (partial)
    out += fmt::format("partial over {{{}}}: each cell marked + holds an unreduced addend; the value is the "
                       "sum of the cells of each {{{}}} group\n",
                       join(sharding.partial, ", "), join(sharding.partial, ", "));

  // Rows: the first axis (none for a 1-D mesh); columns: the remaining axes, flattened.
  const int rank = mesh.rank();
  const bool has_rows = rank >= 2;
  const int64_t rows = has_rows ? mesh.axes()[0].size : 1;
  const int64_t cols = rank == 0 ? 1 : mesh.num_devices() / rows;
  const std::size_t col_from = has_rows ? 1 : 0;
  std::vector<std::string> col_label(static_cast<std::size_t>(cols)), row_label(static_cast<std::size_t>(rows));
  std::vector<std::vector<std::string>> cell(static_cast<std::size_t>(rows),
                                             std::vector<std::string>(static_cast<std::size_t>(cols)));
  for (int64_t p = 0; p < mesh.num_devices(); ++p) {
    const int64_t r = p / cols, c = p % cols;  // positions are row-major over the axes
    const std::vector<int64_t> coords = mesh.coords(p);
    if (r == 0) col_label[static_cast<std::size_t>(c)] = coord_label(mesh, coords, col_from);
    if (c == 0 && has_rows) row_label[static_cast<std::size_t>(r)] = fmt::format("{}={}", mesh.axes()[0].name, coords[0]);
    cell[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)] =
        fmt::format("#{} {}{}", mesh.device_ids()[static_cast<std::size_t>(p)], block_of(mesh, global, sharding, p),
                    partial ? " +" : "");
  }
  // Column widths: the widest of the label and the cells.
  std::size_t row_w = 0;
  for (const auto& l : row_label) row_w = std::max(row_w, l.size());
  std::vector<std::size_t> w(static_cast<std::size_t>(cols), 0);
  for (int64_t c = 0; c < cols; ++c) {
    w[static_cast<std::size_t>(c)] = col_label[static_cast<std::size_t>(c)].size();
    for (int64_t r = 0; r < rows; ++r)
      w[static_cast<std::size_t>(c)] =
          std::max(w[static_cast<std::size_t>(c)], cell[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)].size());
  }
  auto line = [&](const std::string& head, const std::vector<std::string>& items) {
    std::string l = has_rows ? fmt::format("{:<{}}  ", head, row_w) : std::string();
    for (std::size_t c = 0; c < items.size(); ++c) {
      l += c + 1 < items.size() ? fmt::format("{:<{}}  ", items[c], w[c]) : items[c];
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    out += l + "\n";
  };
  if (rank > 0) line("", col_label);
  for (int64_t r = 0; r < rows; ++r) line(row_label[static_cast<std::size_t>(r)], cell[static_cast<std::size_t>(r)]);
  return out;
}

}  // namespace tessel
