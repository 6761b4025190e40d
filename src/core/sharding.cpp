// Sharding: per-dim axis lists, partial axes, text form, validation, local blocks.
#include "tessel/core/sharding.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>

namespace tessel {

Sharding Sharding::of(const std::vector<std::vector<std::string>>& axes,
                      std::vector<std::string> partial) {
  Sharding s;
  for (const auto& a : axes) s.dims.push_back(DimSharding{a, true});
  s.partial = std::move(partial);
  return s;
}

Sharding Sharding::replicated(int rank, bool closed) {
  Sharding s;
  s.dims.assign(static_cast<std::size_t>(rank), DimSharding{{}, closed});
  return s;
}

namespace {
struct Lexer {
  std::string_view t;
  std::size_t i = 0;
  void ws() {
    while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
  }
  [[noreturn]] void fail(const std::string& expected) const {
    std::string got = i < t.size() ? fmt::format("'{}'", t[i]) : std::string("end of text");
    throw ParseError(fmt::format("sharding '{}' column {}: expected {}, got {}", t, i + 1,
                                 expected, got));
  }
  bool eat(char c) {
    ws();
    if (i < t.size() && t[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(fmt::format("'{}'", c));
  }
  std::string ident() {
    ws();
    std::size_t b = i;
    while (i < t.size() && (std::isalnum(static_cast<unsigned char>(t[i])) || t[i] == '_')) ++i;
    if (b == i) fail("an axis name");
    return std::string(t.substr(b, i - b));
  }
};
}  // namespace

Sharding Sharding::parse(std::string_view text) {
  Lexer lx{text};
  Sharding s;
  lx.expect('[');
  if (!lx.eat(']')) {
    do {
      lx.expect('{');
      DimSharding d;
      if (!lx.eat('}')) {
        do {
          if (lx.eat('?')) {
            d.closed = false;
            break;
          }
          d.axes.push_back(lx.ident());
        } while (lx.eat(','));
        lx.expect('}');
      }
      s.dims.push_back(std::move(d));
    } while (lx.eat(','));
    lx.expect(']');
  }
  lx.ws();
  if (lx.i < text.size()) {
    std::size_t b = lx.i;
    while (lx.i < text.size() && std::isalpha(static_cast<unsigned char>(text[lx.i]))) ++lx.i;
    if (text.substr(b, lx.i - b) != "partial") {
      lx.i = b;
      lx.fail("'partial{...}' or end of sharding");
    }
    lx.expect('{');
    if (!lx.eat('}')) {
      do s.partial.push_back(lx.ident());
      while (lx.eat(','));
      lx.expect('}');
    }
    lx.ws();
    if (lx.i < text.size()) lx.fail("end of sharding");
  }
  return s;
}

std::string Sharding::to_string() const {
  std::string out = "[";
  for (std::size_t d = 0; d < dims.size(); ++d) {
    if (d) out += ", ";
    std::vector<std::string> parts = dims[d].axes;
    if (!dims[d].closed) parts.push_back("?");
    out += "{" + join(parts, ", ") + "}";
  }
  out += "]";
  if (!partial.empty()) out += " partial{" + join(partial, ", ") + "}";
  return out;
}

bool Sharding::same_layout(const Sharding& o) const {
  if (dims.size() != o.dims.size()) return false;
  for (std::size_t d = 0; d < dims.size(); ++d)
    if (dims[d].axes != o.dims[d].axes) return false;
  std::vector<std::string> a = partial, b = o.partial;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

Sharding Sharding::closed_copy() const {
  Sharding s = *this;
  for (auto& d : s.dims) d.closed = true;
  return s;
}

Sharding Sharding::without_partial() const {
  Sharding s = *this;
  s.partial.clear();
  return s;
}

bool Sharding::is_replicated() const {
  if (!partial.empty()) return false;
  for (const auto& d : dims)
    if (!d.axes.empty()) return false;
  return true;
}

bool Sharding::uses_axis(std::string_view axis) const {
  if (std::find(partial.begin(), partial.end(), axis) != partial.end()) return true;
  return dim_of_axis(axis) >= 0;
}

int Sharding::dim_of_axis(std::string_view axis) const {
  for (std::size_t d = 0; d < dims.size(); ++d)
    if (std::find(dims[d].axes.begin(), dims[d].axes.end(), axis) != dims[d].axes.end())
      return static_cast<int>(d);
  return -1;
}

std::vector<std::string> Sharding::tiled_axes() const {
  std::vector<std::string> out;
  for (const auto& d : dims) out.insert(out.end(), d.axes.begin(), d.axes.end());
  return out;
}

int64_t Sharding::shard_count(int dim, const Mesh& mesh) const {
  return mesh.axes_size(dims.at(static_cast<std::size_t>(dim)).axes);
}

int64_t Sharding::shard_index(int dim, const Mesh& mesh, int64_t position) const {
  return mesh.index_in_group(position, dims.at(static_cast<std::size_t>(dim)).axes);
}

void Sharding::validate(const Mesh& mesh, const Shape& global, std::string_view what,
                        bool allow_uneven) const {
  if (dims.size() != global.size())
    throw ShardingError(fmt::format(
        "{}: sharding {} has {} dims but the value has shape {} (rank {}): give one {{...}} "
        "per dim", what, to_string(), dims.size(), shape_str(global), global.size()));
  std::set<std::string> used;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    for (const auto& a : dims[d].axes) {
      if (!mesh.has_axis(a))
        throw ShardingError(fmt::format(
            "{}: sharding {} dim {} uses axis '{}' which mesh {} does not have", what,
            to_string(), d, a, mesh.to_string()));
      if (!used.insert(a).second)
        throw ShardingError(fmt::format(
            "{}: sharding {} uses axis '{}' twice (dim {}): a mesh axis can split only one "
            "dim once", what, to_string(), a, d));
    }
    int64_t n = mesh.axes_size(dims[d].axes);
    if (!allow_uneven && global[d] % n != 0) {
      // Suggest the axes prefix that would divide.
      std::string fix;
      int64_t lo = global[d] / n * n, hi = lo + n;
      fix = fmt::format("make dim {} a multiple of {} (e.g. {} or {}), or shard it over fewer "
                        "axes", d, n, lo > 0 ? lo : hi, hi);
      throw ShardingError(fmt::format(
          "{}: dim {} of shape {} has size {} which is not divisible by the {} shards of "
          "axes {{{}}} in sharding {}: {}", what, d, shape_str(global), global[d], n,
          join(dims[d].axes, ", "), to_string(), fix));
    }
  }
  std::set<std::string> seen_partial;
  for (const auto& a : partial) {
    if (!mesh.has_axis(a))
      throw ShardingError(fmt::format("{}: sharding {} is partial over axis '{}' which mesh {} "
                                      "does not have", what, to_string(), a, mesh.to_string()));
    if (used.count(a))
      throw ShardingError(fmt::format("{}: sharding {} uses axis '{}' both to split a dim and "
                                      "as a partial-sum axis: an axis is one or the other",
                                      what, to_string(), a));
    if (!seen_partial.insert(a).second)
      throw ShardingError(fmt::format("{}: sharding {} lists partial axis '{}' twice", what,
                                      to_string(), a));
  }
}

Shape Sharding::local_shape(const Mesh& mesh, const Shape& global) const {
  Shape out = global;
  for (std::size_t d = 0; d < dims.size() && d < out.size(); ++d)
    out[d] /= mesh.axes_size(dims[d].axes);
  return out;
}

std::vector<int64_t> Sharding::local_offset(const Mesh& mesh, const Shape& global,
                                            int64_t position) const {
  std::vector<int64_t> off(global.size(), 0);
  for (std::size_t d = 0; d < dims.size() && d < global.size(); ++d) {
    if (dims[d].axes.empty()) continue;
    int64_t n = mesh.axes_size(dims[d].axes);
    off[d] = mesh.index_in_group(position, dims[d].axes) * (global[d] / n);
  }
  return off;
}

}  // namespace tessel
