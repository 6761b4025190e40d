// Basic value types: dtype names and sizes, shape printing, the median of timings.
#include "tessel/core/common.hpp"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

namespace tessel {

double median(std::vector<double> values) {
  if (values.empty()) throw Error("median: no values");
  const std::size_t n = values.size();
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n / 2), values.end());
  const double hi = values[n / 2];
  if (n % 2) return hi;
  return 0.5 * (*std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n / 2)) + hi);
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  if (s == "i32") return DType::i32;
  throw ParseError(fmt::format("unknown dtype '{}': expected one of f32, bf16, f16, i32", s));
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
  }
  return 4;
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

int64_t num_elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n))
      throw ShapeError(fmt::format("shape {} has more elements than an int64 counts: use smaller dimensions", shape_str(s)));
  return n;
}

int64_t num_bytes(const Shape& s, DType t) {
  int64_t b = 0;
  if (__builtin_mul_overflow(num_elements(s), static_cast<int64_t>(dtype_size(t)), &b))
    throw ShapeError(fmt::format("a {} value of shape {} has more bytes than an int64 counts: use smaller dimensions",
                                 dtype_name(t), shape_str(s)));
  return b;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ",")); }

std::string type_str(DType t, const Shape& s) { return dtype_name(t) + shape_str(s); }

int64_t checked_value_bytes(const Shape& s, DType t, const std::string& what) {
  int64_t b = 0;
  try {
    b = num_bytes(s, t);
  } catch (const ShapeError& e) {
    throw ShapeError(fmt::format("{}: {}", what, e.what()));
  }
  if (b > kMaxValueBytes)
    throw ShapeError(fmt::format("{}: {} is {} bytes, more than a value may hold (2^50 bytes = 1 PiB): use smaller "
                                 "dimensions",
                                 what, type_str(t, s), b));
  return b;
}

void check_not_directory(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(fmt::format("{}: '{}' is a directory; give the path of a file", what, path));
}

uint64_t fnv1a_64(std::string_view text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string quote_text(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
          out += fmt::format("\\x{:02x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        else
          out += c;
    }
  }
  return out + "\"";
}

}  // namespace tessel
