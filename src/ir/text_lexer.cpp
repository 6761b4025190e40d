// text_lexer.cpp — the line lexer and spellings shared by the graph and program text parsers
// (text_lexer.hpp says why they share one).
#include "text_lexer.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <system_error>

namespace tessel {
namespace detail {

std::optional<DType> dtype_from_text(std::string_view name) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32})
    if (name == dtype_name(d)) return d;
  return std::nullopt;
}

std::string sharding_text(const Sharding& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.dims.size(); ++i) {
    if (i) out += ", ";
    out += '{';
    const DimSharding& d = s.dims[i];
    for (std::size_t j = 0; j < d.axes.size(); ++j) {
      if (j) out += ", ";
      out += d.axes[j];
    }
    if (!d.closed) out += d.axes.empty() ? "?" : ", ?";
    out += '}';
  }
  out += ']';
  if (!s.partial.empty()) {
    out += " partial{";
    for (std::size_t j = 0; j < s.partial.size(); ++j) {
      if (j) out += ", ";
      out += s.partial[j];
    }
    out += '}';
  }
  return out;
}

std::string value_ref(std::string_view name) {
  bool bare = !name.empty();
  for (char c : name) bare = bare && is_name_char(c);
  return "%" + (bare ? std::string(name) : quote_text(name));
}

std::string echo_line(std::string_view line) {
  std::string out(line);
  for (char& c : out)
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) c = '?';
  return out;
}

std::string read_text_file(const std::string& path) {
  check_not_directory(path, "the graph or program text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ParseError(fmt::format("{}: cannot open file: {}", path, std::strerror(errno)));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ParseError(fmt::format("{}: cannot read file", path));
  return text;
}

std::string describe(const Token& t) {
  std::string s = t.text.size() > 40 ? t.text.substr(0, 37) + "..." : t.text;
  switch (t.kind) {
    case TK::End: return "end of line";
    case TK::String: return "string " + quote_text(s);
    case TK::Value: return "'" + value_ref(s) + "'";
    default: return "'" + echo_line(s) + "'";
  }
}

// ---- LineLexer -----------------------------------------------------------------------------

void LineLexer::for_each_line(const std::function<void()>& statement) {
  std::size_t start = 0;
  while (start <= text_.size()) {
    std::size_t nl = text_.find('\n', start);
    std::size_t end = nl == std::string_view::npos ? text_.size() : nl;
    line_ = text_.substr(start, end - start);
    if (!line_.empty() && line_.back() == '\r') line_.remove_suffix(1);
    ++lineno_;
    pos_ = 0;
    ahead_.clear();
    statement();
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
}

void LineLexer::fail(int col, const std::string& msg) const { fail_at(lineno_, col, msg); }

void LineLexer::fail_at(int line, int col, const std::string& msg) const {
  if (line != lineno_) throw ParseError(fmt::format("{}:{}:{}: {}", file_, line, col, msg));
  std::string caret;
  for (int i = 0; i + 1 < col; ++i)
    caret += (static_cast<std::size_t>(i) < line_.size() && line_[static_cast<std::size_t>(i)] == '\t') ? '\t' : ' ';
  throw ParseError(fmt::format("{}:{}:{}: {}\n  {}\n  {}^", file_, lineno_, col, msg, echo_line(line_), caret));
}

int LineLexer::col_of(std::size_t p) const {
  return p >= static_cast<std::size_t>(std::numeric_limits<int>::max()) ? std::numeric_limits<int>::max()
                                                                         : static_cast<int>(p) + 1;
}

// Reads a "..." literal starting at pos_ (the opening quote); returns the decoded text.
std::string LineLexer::lex_string() {
  const int col = col_of(pos_);
  std::string out;
  ++pos_;
  while (true) {
    if (pos_ >= line_.size()) fail(col, "unterminated string (missing closing '\"')");
    char c = line_[pos_++];
    if (c == '"') return out;
    if (c != '\\') {
      out += c;
      continue;
    }
    if (pos_ >= line_.size()) fail(col, "unterminated string (missing closing '\"')");
    char e = line_[pos_++];
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'x': {
        auto hex = [](char h) -> int {
          if (is_digit(h)) return h - '0';
          if (h >= 'a' && h <= 'f') return h - 'a' + 10;
          if (h >= 'A' && h <= 'F') return h - 'A' + 10;
          return -1;
        };
        int hi = hex(at(pos_)), lo = hex(at(pos_ + 1));
        if (hi < 0 || lo < 0) fail(col_of(pos_ - 2), "expected two hex digits after \\x");
        out += static_cast<char>(hi * 16 + lo);
        pos_ += 2;
        break;
      }
      default: fail(col_of(pos_ - 2), fmt::format("unknown escape '\\{}' in string", echo_line(std::string(1, e))));
    }
  }
}

Token LineLexer::lex() {
  while (pos_ < line_.size() && syntax_.blanks.find(line_[pos_]) != std::string_view::npos) ++pos_;
  Token t;
  t.col = col_of(pos_);
  if (pos_ >= line_.size() || line_[pos_] == '#') return t;
  const std::size_t start = pos_;
  const char c = line_[pos_];
  if (is_ident_start(c)) {
    while (pos_ < line_.size() && is_ident_char(line_[pos_])) ++pos_;
    t.kind = TK::Ident;
    t.text = std::string(line_.substr(start, pos_ - start));
    return t;
  }
  const auto arrow_at = [&](std::size_t p) { return syntax_.arrow && at(p) == '-' && at(p + 1) == '>'; };
  if (c == '%') {
    ++pos_;
    t.kind = TK::Value;
    if (at(pos_) == '"') {
      t.text = lex_string();
      if (t.text.empty()) fail(t.col, "a value name must not be empty");
      return t;
    }
    std::size_t s = pos_;
    // Where "->" is a token, a bare name stops before it so that "%a->" is not read as a name.
    while (pos_ < line_.size() && is_name_char(line_[pos_]) && !arrow_at(pos_)) ++pos_;
    if (pos_ == s) fail(t.col, "expected a value name after '%'");
    t.text = std::string(line_.substr(s, pos_ - s));
    return t;
  }
  if (c == '"') {
    t.kind = TK::String;
    t.text = lex_string();
    return t;
  }
  if (arrow_at(pos_)) {
    pos_ += 2;
    t.kind = TK::Punct;
    t.text = "->";
    return t;
  }
  const char n = at(pos_ + 1);
  if (is_digit(c) || ((c == '-' || c == '+' || c == '.') && (is_digit(n) || n == '.' || is_alpha(n)))) {
    ++pos_;
    while (pos_ < line_.size()) {
      char d = line_[pos_];
      char prev = line_[pos_ - 1];
      if (is_ident_char(d) || d == '.' || ((d == '+' || d == '-') && (prev == 'e' || prev == 'E')))
        ++pos_;
      else
        break;
    }
    t.kind = TK::Number;
    t.text = std::string(line_.substr(start, pos_ - start));
    return t;
  }
  // std::strchr also finds the terminating '\0': a NUL byte lexes as a punctuation token,
  // which no statement accepts (its message echoes it as '?').
  if (std::strchr(syntax_.punct, c) != nullptr) {
    ++pos_;
    t.kind = TK::Punct;
    t.text = std::string(1, c);
    return t;
  }
  if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
    fail(t.col, fmt::format("unexpected byte 0x{:02x}", static_cast<unsigned>(static_cast<unsigned char>(c))));
  fail(t.col, fmt::format("unexpected character '{}'", c));
}

const Token& LineLexer::peek(std::size_t k) {
  while (ahead_.size() <= k) ahead_.push_back(lex());
  return ahead_[k];
}

Token LineLexer::next() {
  peek();
  Token t = std::move(ahead_.front());
  ahead_.erase(ahead_.begin());
  return t;
}

bool LineLexer::accept(std::string_view p) {
  if (!is_punct(peek(), p)) return false;
  next();
  return true;
}

Token LineLexer::expect(std::string_view p, std::string_view context) {
  Token t = next();
  if (!is_punct(t, p)) fail(t.col, fmt::format("expected '{}' {}, got {}", p, context, describe(t)));
  return t;
}

Token LineLexer::expect_ident(std::string_view what) {
  Token t = next();
  if (t.kind != TK::Ident) fail(t.col, fmt::format("expected {}, got {}", what, describe(t)));
  return t;
}

void LineLexer::expect_end(std::string_view what) {
  const Token& t = peek();
  if (t.kind != TK::End) fail(t.col, fmt::format("expected end of line after {}, got {}", what, describe(t)));
}

int64_t LineLexer::to_int(const Token& t, std::string_view what) {
  if (t.kind != TK::Number) fail(t.col, fmt::format("expected an integer ({}), got {}", what, describe(t)));
  std::string_view s = t.text;
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range) fail(t.col, fmt::format("integer {} is out of range ({})", t.text, what));
  if (ec != std::errc() || p != s.data() + s.size())
    fail(t.col, fmt::format("expected an integer ({}), got {}", what, describe(t)));
  return v;
}

int LineLexer::parse_int32(std::string_view what) {
  Token t = next();
  int64_t v = to_int(t, what);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    fail(t.col, fmt::format("integer {} is out of range ({})", t.text, what));
  return static_cast<int>(v);
}

bool LineLexer::parse_bool(std::string_view what) {
  Token t = next();
  if (is_ident(t, "true")) return true;
  if (is_ident(t, "false")) return false;
  fail(t.col, fmt::format("expected true or false ({}), got {}", what, describe(t)));
}

double LineLexer::parse_double(std::string_view what) {
  Token t = next();
  if (t.kind != TK::Number && t.kind != TK::Ident)
    fail(t.col, fmt::format("expected a number ({}), got {}", what, describe(t)));
  std::string z = t.text;
  if (!z.empty() && z[0] == '+') z.erase(0, 1);
  char* endp = nullptr;
  errno = 0;
  double v = std::strtod(z.c_str(), &endp);
  if (z.empty() || endp != z.c_str() + z.size())
    fail(t.col, fmt::format("expected a number ({}), got {}", what, describe(t)));
  // Underflow to a subnormal or zero still has a well-defined nearest double.
  if (errno == ERANGE && std::abs(v) > 1.0) fail(t.col, fmt::format("number {} is out of range ({})", t.text, what));
  return v;
}

std::vector<int64_t> LineLexer::parse_int_list(std::string_view what, bool dims, int64_t min_dim) {
  expect("[", fmt::format("to start the {} list", what));
  std::vector<int64_t> out;
  if (accept("]")) return out;
  int64_t product = 1;
  while (true) {
    Token t = next();
    int64_t v = to_int(t, what);
    if (dims && v < min_dim)
      fail(t.col, min_dim == 0 ? fmt::format("expected a non-negative dimension, got {}", v)
                               : fmt::format("expected a dimension >= {} in {}, got {}", min_dim, what, v));
    if (dims) {
      if (v != 0 && product > std::numeric_limits<int64_t>::max() / v)
        fail(t.col, "shape is too large: its element count overflows int64");
      if (v != 0) product *= v;
    }
    out.push_back(v);
    Token c = next();
    if (is_punct(c, ",")) continue;
    if (is_punct(c, "]")) break;
    fail(c.col, fmt::format("expected ',' or ']' in the {} list, got {}", what, describe(c)));
  }
  return out;
}

DType LineLexer::parse_dtype(const Token& t, std::string_view context) {
  if (t.kind == TK::Ident)
    if (auto d = dtype_from_text(t.text)) return *d;
  fail(t.col, fmt::format("expected a type like f32[8,128] {} (dtypes: f32, bf16, f16, i32), got {}", context,
                          describe(t)));
}

void LineLexer::parse_attr(const AttrSpec& spec, OpAttrs& a) {
  switch (spec.field) {
    case AttrField::Equation:
    case AttrField::Epilogue: {
      Token s = next();
      const bool eq = spec.field == AttrField::Equation;
      if (s.kind != TK::String)
        fail(s.col, fmt::format("expected {} string like {}, got {}", eq ? "an einsum equation" : "an epilogue expression",
                                eq ? "\"bsd,df->bsf\"" : "\"gelu(add($0,$1))\"", describe(s)));
      (eq ? a.equation : a.epilogue) = s.text;
      return;
    }
    case AttrField::Dims: a.dims = parse_int_list(spec.key, false); return;
    case AttrField::Shape: a.shape = parse_int_list(spec.key, true); return;
    case AttrField::Starts: a.starts = parse_int_list(spec.key, false); return;
    case AttrField::Limits: a.limits = parse_int_list(spec.key, false); return;
    case AttrField::Axis: a.axis = parse_int(spec.key); return;
    case AttrField::Depth: a.depth = parse_int(spec.key); return;
    case AttrField::Scalar: a.scalar = parse_double(spec.key); return;
    case AttrField::Eps: a.eps = parse_double(spec.key); return;
    case AttrField::Beta1: a.beta1 = parse_double(spec.key); return;
    case AttrField::Beta2: a.beta2 = parse_double(spec.key); return;
    case AttrField::WeightDecay: a.weight_decay = parse_double(spec.key); return;
    case AttrField::Keepdims: a.keepdims = parse_bool(spec.key); return;
    case AttrField::Causal: a.causal = parse_bool(spec.key); return;
    case AttrField::DType: a.dtype = parse_dtype(next(), fmt::format("for '{}'", spec.key)); return;
  }
}
}  // namespace detail
}  // namespace tessel
