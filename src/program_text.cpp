// src/program_text.cpp — the text form of a Program (docs/program-ir.md): printer and a
// line-oriented recursive-descent parser in the style of the graph's (src/text.cpp): one
// statement per line, a small lazy lexer, errors "file:line:col" with the line and a caret.
// Kernel attributes are printed and parsed through the op registry's schema (ops.hpp).
#include "tessel/program_text.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include "tessel/ops.hpp"
#include "tessel/program_verify.hpp"

namespace tessel {
namespace {

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypes[] = {
    {DType::f32, "f32"}, {DType::bf16, "bf16"}, {DType::f16, "f16"}, {DType::i32, "i32"}};

const char* dtype_text(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  return "?";
}

std::string ints_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + "]";
}

std::string type_text(DType t, const Shape& s) { return dtype_text(t) + ints_text(s); }

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_start(char c) { return is_alpha(c) || c == '_'; }
bool is_ident_char(char c) { return is_alpha(c) || is_digit(c) || c == '_'; }
bool is_name_char(char c) { return is_ident_char(c) || c == '.' || c == '-'; }

std::string value_ref(std::string_view name) {
  bool bare = !name.empty();
  for (char c : name) bare = bare && is_name_char(c);
  return "%" + (bare ? std::string(name) : quote_text(name));
}

std::string axes_text(const std::vector<std::string>& axes) { return "{" + join(axes, ", ") + "}"; }

std::string index_text(const IndexExpr& e) {
  if (e.axes.empty() || e.stride == 0) return std::to_string(e.base);
  std::string s = e.base != 0 ? std::to_string(e.base) + "+" : std::string();
  return s + std::to_string(e.stride) + "*{" + join(e.axes, ",") + "}";
}

std::string index_list_text(const std::vector<IndexExpr>& v) {
  std::vector<std::string> parts;
  for (const auto& e : v) parts.push_back(index_text(e));
  return "[" + join(parts, ",") + "]";
}

const char* collective_text(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllToAll: return "all_to_all";
    case CollectiveKind::CollectivePermute: return "collective_permute";
  }
  return "?";
}

constexpr CollectiveKind kCollectives[] = {CollectiveKind::AllGather, CollectiveKind::AllReduce,
                                           CollectiveKind::ReduceScatter, CollectiveKind::AllToAll,
                                           CollectiveKind::CollectivePermute};

std::string echo_line(std::string_view line) {
  std::string out(line);
  for (char& c : out)
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) c = '?';
  return out;
}

// ---- printer --------------------------------------------------------------------------------

std::string instr_text(const Program& p, const Instr& in) {
  auto vname = [&](int v) { return value_ref(p.values[static_cast<std::size_t>(v)].name); };
  if (in.kind == InstrKind::Wait) return fmt::format("wait {} @{}", in.wait_for, in.stream);
  if (in.kind == InstrKind::CollectiveDone) return fmt::format("done {} @{}", vname(in.in.at(0)), in.stream);
  std::vector<std::string> args;
  for (int v : in.in) args.push_back(vname(v));
  const std::string call = "(" + join(args, ", ") + ")";
  std::vector<std::string> names;
  for (int v : in.defs()) names.push_back(vname(v));
  std::string s = join(names, ", ") + " = ";
  switch (in.kind) {
    case InstrKind::Kernel: s += op_name(in.op) + call + attrs_text(in.op, in.attrs); break;
    case InstrKind::ShardSlice: s += fmt::format("shard_slice{} axes={} dim={}", call, axes_text(in.axes), in.dim); break;
    case InstrKind::Copy: {
      std::vector<std::string> cs;
      for (const auto& c : in.copies) cs.push_back(index_list_text(c.src) + "->" + index_list_text(c.dst));
      s += fmt::format("copy{} block={} copies=[{}]", call, ints_text(in.block), join(cs, ", "));
      break;
    }
    case InstrKind::View: s += fmt::format("view{} offset={}", call, in.view_offset); break;
    case InstrKind::Collective:
    case InstrKind::CollectiveStart: {
      s += collective_text(in.collective);
      if (in.kind == InstrKind::CollectiveStart) s += "_start";
      s += call;
      if (in.collective == CollectiveKind::CollectivePermute) {
        std::vector<std::string> ps;
        for (const auto& pr : in.pairs) ps.push_back(fmt::format("{}->{}", pr.first, pr.second));
        s += " pairs=[" + join(ps, ", ") + "]";
      } else {
        s += " axes=" + axes_text(in.axes);
      }
      if (in.collective == CollectiveKind::AllGather || in.collective == CollectiveKind::ReduceScatter)
        s += fmt::format(" dim={}", in.dim);
      if (in.collective == CollectiveKind::AllToAll)
        s += fmt::format(" split_dim={} concat_dim={}", in.dim, in.dim2);
      if (in.reduce == ReduceOp::Max) s += " op=max";
      s += fmt::format(" bytes={}", in.bytes);
      break;
    }
    default: break;
  }
  // Each result's type, layout and arena offset; the stream after the first result's.
  const std::vector<int> defs = in.defs();
  for (std::size_t r = 0; r < defs.size(); ++r) {
    const std::size_t v = static_cast<std::size_t>(defs[r]);
    const LocalValue& o = p.values[v];
    s += fmt::format("{} : {} global={} sharding={}", r ? "," : "", type_text(o.dtype, o.shape),
                     type_text(o.dtype, o.global_shape), o.sharding.to_string());
    if (r == 0) s += " @" + in.stream;
    if (p.memory.planned && v < p.memory.offset.size() && p.memory.offset[v] >= 0)
      s += fmt::format(" at={}", p.memory.offset[v]);
  }
  return s;
}

}  // namespace

std::string print_program(const Program& p) {
  std::string out = "mesh";
  if (p.mesh.rank() == 0) out += " {}";
  for (int i = 0; i < p.mesh.rank(); ++i)
    out += fmt::format("{} {}={}", i ? "," : "", p.mesh.axes()[i].name, p.mesh.axes()[i].size);
  bool identity = true;
  for (std::size_t i = 0; i < p.mesh.device_ids().size(); ++i) identity = identity && p.mesh.device_ids()[i] == static_cast<int>(i);
  if (!identity) {
    std::vector<int64_t> ids(p.mesh.device_ids().begin(), p.mesh.device_ids().end());
    out += " devices=" + ints_text(ids);
  }
  out += "\n";
  for (int v : p.inputs) {
    const LocalValue& lv = p.values[static_cast<std::size_t>(v)];
    out += fmt::format("{} = input {} global={} sharding={}\n", value_ref(lv.name), type_text(lv.dtype, lv.shape),
                       type_text(lv.dtype, lv.global_shape), lv.sharding.to_string());
  }
  for (const Instr& in : p.instrs) out += instr_text(p, in) + "\n";
  std::vector<std::string> outs;
  for (int v : p.outputs) outs.push_back(value_ref(p.values[static_cast<std::size_t>(v)].name));
  out += outs.empty() ? "output\n" : "output " + join(outs, ", ") + "\n";
  if (p.memory.planned)
    out += fmt::format("memory arena={}  # peak {} bytes per device: arena + inputs {} + outputs {}\n",
                       p.memory.arena_bytes, p.memory.peak_bytes(), p.memory.input_bytes, p.memory.output_bytes);
  return out;
}

namespace {

// ---- lexer + parser -------------------------------------------------------------------------

enum class TK { End, Ident, Value, Number, String, Punct };

struct Token {
  TK kind = TK::End;
  std::string text;
  int col = 1;
};

std::string describe(const Token& t) {
  std::string s = t.text.size() > 40 ? t.text.substr(0, 37) + "..." : t.text;
  switch (t.kind) {
    case TK::End: return "end of line";
    case TK::String: return "string " + quote_text(s);
    case TK::Value: return "'" + value_ref(s) + "'";
    default: return "'" + echo_line(s) + "'";
  }
}

class Parser {
 public:
  Parser(std::string_view text, std::string_view file) : text_(text), file_(file) {}

  Program run(const ProgramParseOptions& opts) {
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
    if (!seen_mesh_) fail_at(1, 1, "expected a 'mesh' line (e.g. 'mesh data=2, model=4') before the program");
    if (!seen_output_) fail_at(lineno_, 1, "the program has no 'output' line");
    p_.memory.offset.resize(p_.values.size(), -1);
    if (p_.memory.planned) {
      // Inputs and outputs per device, as the memory-plan pass computes them.
      std::vector<bool> counted(p_.values.size(), false);
      for (int v : p_.inputs) {
        if (!counted[static_cast<std::size_t>(v)]) p_.memory.input_bytes += p_.values[static_cast<std::size_t>(v)].bytes();
        counted[static_cast<std::size_t>(v)] = true;
      }
      for (int v : p_.outputs) {
        if (!counted[static_cast<std::size_t>(v)]) p_.memory.output_bytes += p_.values[static_cast<std::size_t>(v)].bytes();
        counted[static_cast<std::size_t>(v)] = true;
      }
    } else if (any_at_) {
      fail_at(any_at_, 1, "'at=' offsets need a 'memory arena=N' line");
    }
    if (opts.verify) {
      try {
        verify_program(p_);
      } catch (const ProgramError& e) {
        const int i = e.instruction();
        const int line = i >= 0 && static_cast<std::size_t>(i) < instr_line_.size() ? instr_line_[static_cast<std::size_t>(i)]
                                                                                   : lineno_;
        throw ParseError(fmt::format("{}:{}:1: {}", file_, line, e.what()));
      }
    }
    return std::move(p_);
  }

 private:
  std::string_view text_, file_, line_;
  int lineno_ = 0;
  std::size_t pos_ = 0;
  std::vector<Token> ahead_;
  Program p_;
  std::unordered_map<std::string, int> defined_;
  std::vector<int> instr_line_;
  bool seen_mesh_ = false, seen_output_ = false, seen_memory_ = false;
  int any_at_ = 0;

  [[noreturn]] void fail(int col, const std::string& msg) const { fail_at(lineno_, col, msg); }
  [[noreturn]] void fail_at(int line, int col, const std::string& msg) const {
    if (line != lineno_) throw ParseError(fmt::format("{}:{}:{}: {}", file_, line, col, msg));
    std::string caret;
    for (int i = 0; i + 1 < col; ++i)
      caret += (static_cast<std::size_t>(i) < line_.size() && line_[static_cast<std::size_t>(i)] == '\t') ? '\t' : ' ';
    throw ParseError(fmt::format("{}:{}:{}: {}\n  {}\n  {}^", file_, lineno_, col, msg, echo_line(line_), caret));
  }

  int col_of(std::size_t p) const {
    return p >= static_cast<std::size_t>(std::numeric_limits<int>::max()) ? std::numeric_limits<int>::max()
                                                                           : static_cast<int>(p) + 1;
  }
  char at(std::size_t p) const { return p < line_.size() ? line_[p] : '\0'; }

  std::string lex_string() {
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

  Token lex() {
    while (pos_ < line_.size() && (line_[pos_] == ' ' || line_[pos_] == '\t' || line_[pos_] == '\r')) ++pos_;
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
    if (c == '%') {
      ++pos_;
      t.kind = TK::Value;
      if (at(pos_) == '"') {
        t.text = lex_string();
        if (t.text.empty()) fail(t.col, "a value name must not be empty");
        return t;
      }
      std::size_t s = pos_;
      // A bare name stops before "->" so that "%a->" is not read as a name.
      while (pos_ < line_.size() && is_name_char(line_[pos_]) && !(line_[pos_] == '-' && at(pos_ + 1) == '>')) ++pos_;
      if (pos_ == s) fail(t.col, "expected a value name after '%'");
      t.text = std::string(line_.substr(s, pos_ - s));
      return t;
    }
    if (c == '"') {
      t.kind = TK::String;
      t.text = lex_string();
      return t;
    }
    const char n = at(pos_ + 1);
    if (c == '-' && n == '>') {
      pos_ += 2;
      t.kind = TK::Punct;
      t.text = "->";
      return t;
    }
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
    if (std::strchr("=,[]{}():?@*+", c) != nullptr) {
      ++pos_;
      t.kind = TK::Punct;
      t.text = std::string(1, c);
      return t;
    }
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      fail(t.col, fmt::format("unexpected byte 0x{:02x}", static_cast<unsigned>(static_cast<unsigned char>(c))));
    fail(t.col, fmt::format("unexpected character '{}'", c));
  }

  const Token& peek(std::size_t k = 0) {
    while (ahead_.size() <= k) ahead_.push_back(lex());
    return ahead_[k];
  }
  Token next() {
    peek();
    Token t = std::move(ahead_.front());
    ahead_.erase(ahead_.begin());
    return t;
  }
  static bool is_punct(const Token& t, std::string_view c) { return t.kind == TK::Punct && t.text == c; }
  bool accept(std::string_view c) {
    if (!is_punct(peek(), c)) return false;
    next();
    return true;
  }
  Token expect(std::string_view c, std::string_view context) {
    Token t = next();
    if (!is_punct(t, c)) fail(t.col, fmt::format("expected '{}' {}, got {}", c, context, describe(t)));
    return t;
  }
  Token expect_ident(std::string_view what) {
    Token t = next();
    if (t.kind != TK::Ident) fail(t.col, fmt::format("expected {}, got {}", what, describe(t)));
    return t;
  }
  void expect_end(std::string_view what) {
    const Token& t = peek();
    if (t.kind != TK::End) fail(t.col, fmt::format("expected end of line after {}, got {}", what, describe(t)));
  }

  int64_t to_int(const Token& t, std::string_view what) {
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
  int64_t parse_int(std::string_view what) { return to_int(next(), what); }
  int parse_int32(std::string_view what) {
    Token t = next();
    int64_t v = to_int(t, what);
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      fail(t.col, fmt::format("integer {} is out of range ({})", t.text, what));
    return static_cast<int>(v);
  }
  double parse_double(std::string_view what) {
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
    if (errno == ERANGE && std::abs(v) > 1.0) fail(t.col, fmt::format("number {} is out of range ({})", t.text, what));
    return v;
  }
  bool parse_bool(std::string_view what) {
    Token t = next();
    if (t.kind == TK::Ident && t.text == "true") return true;
    if (t.kind == TK::Ident && t.text == "false") return false;
    fail(t.col, fmt::format("expected true or false ({}), got {}", what, describe(t)));
  }
  std::vector<int64_t> parse_int_list(std::string_view what, bool dims) {
    expect("[", fmt::format("to start the {} list", what));
    std::vector<int64_t> out;
    if (accept("]")) return out;
    while (true) {
      Token t = next();
      int64_t v = to_int(t, what);
      if (dims && v < 1) fail(t.col, fmt::format("expected a dimension >= 1 in {}, got {}", what, v));
      out.push_back(v);
      Token c = next();
      if (is_punct(c, ",")) continue;
      if (is_punct(c, "]")) break;
      fail(c.col, fmt::format("expected ',' or ']' in the {} list, got {}", what, describe(c)));
    }
    return out;
  }
  DType parse_dtype(const Token& t, std::string_view context) {
    if (t.kind == TK::Ident)
      for (const auto& d : kDTypes)
        if (t.text == d.name) return d.dtype;
    fail(t.col, fmt::format("expected a type like f32[8,128] {} (dtypes: f32, bf16, f16, i32), got {}", context,
                            describe(t)));
  }
  void parse_type(DType& dtype, Shape& shape, std::string_view context) {
    dtype = parse_dtype(next(), context);
    shape = parse_int_list("shape", true);
  }
  std::vector<std::string> parse_axes(std::string_view what) {
    expect("{", fmt::format("to start the axes of {} (like {{data, model}})", what));
    std::vector<std::string> axes;
    if (accept("}")) return axes;
    while (true) {
      Token a = expect_ident(fmt::format("a mesh axis in {}", what));
      if (!p_.mesh.has_axis(a.text))
        fail(a.col, fmt::format("unknown mesh axis '{}' in {} (mesh {})", a.text, what, p_.mesh.to_string()));
      for (const auto& b : axes)
        if (b == a.text) fail(a.col, fmt::format("mesh axis '{}' is listed twice in {}", a.text, what));
      axes.push_back(a.text);
      Token c = next();
      if (is_punct(c, ",")) continue;
      if (is_punct(c, "}")) break;
      fail(c.col, fmt::format("expected ',' or '}}' in {}, got {}", what, describe(c)));
    }
    return axes;
  }
  Sharding parse_sharding() {
    expect("[", "to start a sharding like [{data}, {}]");
    Sharding s;
    if (!accept("]")) {
      while (true) {
        DimSharding d;
        d.axes = parse_axes("a dim sharding");
        s.dims.push_back(std::move(d));
        Token c = next();
        if (is_punct(c, ",")) continue;
        if (is_punct(c, "]")) break;
        fail(c.col, fmt::format("expected ',' or ']' in the sharding, got {}", describe(c)));
      }
    }
    if (peek().kind == TK::Ident && peek().text == "partial") {
      next();
      s.partial = parse_axes("the partial axes");
    }
    return s;
  }
  IndexExpr parse_index() {
    IndexExpr e;
    Token t = next();
    int64_t v = to_int(t, "a block offset");
    if (peek().kind == TK::Number && !peek().text.empty() && peek().text[0] == '+') {
      // "8+64*{model}": the lexer reads "+64" as a signed number.
      e.base = v;
      v = parse_int("a block offset stride");
      expect("*", "after the stride of a block offset (like 16*{model})");
      e.stride = v;
      e.axes = parse_axes("a block offset");
    } else if (accept("*")) {
      e.stride = v;
      e.axes = parse_axes("a block offset");
    } else {
      e.base = v;
    }
    return e;
  }
  std::vector<IndexExpr> parse_index_list() {
    expect("[", "to start a block offset like [0,16*{model}]");
    std::vector<IndexExpr> out;
    if (accept("]")) return out;
    while (true) {
      out.push_back(parse_index());
      Token c = next();
      if (is_punct(c, ",")) continue;
      if (is_punct(c, "]")) break;
      fail(c.col, fmt::format("expected ',' or ']' in the block offset, got {}", describe(c)));
    }
    return out;
  }

  int use(const Token& t) {
    if (t.kind != TK::Value) fail(t.col, fmt::format("expected a value like %x, got {}", describe(t)));
    auto it = defined_.find(t.text);
    if (it == defined_.end()) fail(t.col, fmt::format("value {} is not defined (values are defined before use)", value_ref(t.text)));
    return it->second;
  }
  int define(const Token& t) {
    if (defined_.count(t.text)) fail(t.col, fmt::format("value {} is defined twice", value_ref(t.text)));
    LocalValue lv;
    lv.name = t.text;
    p_.values.push_back(std::move(lv));
    const int id = static_cast<int>(p_.values.size()) - 1;
    defined_[t.text] = id;
    return id;
  }

  std::string parse_stream() {
    Token s = expect_ident("a stream name after '@' (like @compute)");
    return s.text;
  }

  void statement() {
    const Token& first = peek();
    if (first.kind == TK::End) return;
    if (first.kind == TK::Ident) {
      if (first.text == "mesh") return mesh_line();
      if (!seen_mesh_) fail(first.col, "expected a 'mesh' line first");
      if (first.text == "output") return output_line();
      if (first.text == "memory") return memory_line();
      if (seen_output_) fail(first.col, "nothing but 'memory' may follow the 'output' line");
      if (first.text == "done") return done_line();
      if (first.text == "wait") return wait_line();
      fail(first.col, fmt::format("expected a statement (a definition '%x = ...', done, wait, output or memory), got {}",
                                  describe(first)));
    }
    if (first.kind != TK::Value) fail(first.col, fmt::format("expected a statement, got {}", describe(first)));
    if (!seen_mesh_) fail(first.col, "expected a 'mesh' line first");
    if (seen_output_) fail(first.col, "nothing but 'memory' may follow the 'output' line");
    definition();
  }

  void mesh_line() {
    Token m = next();
    if (seen_mesh_) fail(m.col, "the mesh is declared twice");
    seen_mesh_ = true;
    std::vector<MeshAxis> axes;
    std::vector<int> ids;
    if (accept("{")) {
      expect("}", "(a mesh with no axes is written 'mesh {}')");
    } else {
      while (peek().kind == TK::Ident && peek().text != "devices") {
        MeshAxis a;
        a.name = next().text;
        expect("=", "after the axis name");
        a.size = parse_int("the axis size");
        axes.push_back(std::move(a));
        if (!accept(",")) break;
      }
    }
    if (peek().kind == TK::Ident && peek().text == "devices") {
      next();
      expect("=", "after devices");
      for (int64_t d : parse_int_list("devices", false)) ids.push_back(static_cast<int>(d));
    }
    expect_end("the mesh");
    try {
      p_.mesh = Mesh(std::move(axes), std::move(ids));
    } catch (const Error& e) {
      fail(m.col, e.what());
    }
  }

  void output_line() {
    next();
    seen_output_ = true;
    if (peek().kind == TK::End) return;
    while (true) {
      p_.outputs.push_back(use(next()));
      if (!accept(",")) break;
    }
    expect_end("the outputs");
  }

  void memory_line() {
    Token m = next();
    if (!seen_output_) fail(m.col, "the 'memory' line comes after the 'output' line");
    if (seen_memory_) fail(m.col, "the memory plan is given twice");
    seen_memory_ = true;
    Token k = expect_ident("'arena=' after memory");
    if (k.text != "arena") fail(k.col, fmt::format("expected 'arena=' after memory, got {}", describe(k)));
    expect("=", "after arena");
    Token n = next();
    p_.memory.arena_bytes = to_int(n, "the arena size in bytes");
    if (p_.memory.arena_bytes < 0) fail(n.col, "the arena size must be >= 0");
    p_.memory.planned = true;
    expect_end("the memory plan");
  }

  void done_line() {
    next();
    Instr in;
    in.kind = InstrKind::CollectiveDone;
    in.in = {use(next())};
    in.out = -1;
    expect("@", "before the stream of the done (like @comm)");
    in.stream = parse_stream();
    expect_end("the done");
    push(std::move(in));
  }

  void wait_line() {
    next();
    Instr in;
    in.kind = InstrKind::Wait;
    in.out = -1;
    in.wait_for = expect_ident("the stream waited for (like 'wait compute @comm')").text;
    expect("@", "before the waiting stream (like 'wait compute @comm')");
    in.stream = parse_stream();
    expect_end("the wait");
    push(std::move(in));
  }

  void push(Instr in) {
    p_.instrs.push_back(std::move(in));
    instr_line_.push_back(lineno_);
  }

  void definition() {
    Token name = next();
    std::vector<Token> more_names;  // a kernel of an op with several results: %a, %b, %c = ...
    while (accept(",")) {
      Token t = next();
      if (t.kind != TK::Value) fail(t.col, fmt::format("expected a value name after ',', got {}", describe(t)));
      more_names.push_back(std::move(t));
    }
    expect("=", "after the value name");
    Token op = expect_ident("an instruction (input, an op, a collective, copy, view or shard_slice)");
    if (op.text == "input" && !more_names.empty()) fail(op.col, "an input defines one value");
    if (op.text == "input") {
      const int v = define(name);
      LocalValue& lv = p_.values[static_cast<std::size_t>(v)];
      parse_type(lv.dtype, lv.shape, "after input");
      bool global = false, sharding = false;
      while (peek().kind != TK::End) {
        Token k = expect_ident("global= or sharding=");
        expect("=", fmt::format("after {}", k.text));
        if (k.text == "global" && !global) {
          DType dt;
          parse_type(dt, lv.global_shape, "after global=");
          if (dt != lv.dtype) fail(k.col, "the global type must have the local type's dtype");
          global = true;
        } else if (k.text == "sharding" && !sharding) {
          lv.sharding = parse_sharding();
          sharding = true;
        } else {
          fail(k.col, fmt::format("unexpected or repeated attribute '{}' of an input (it takes global= and sharding=)", k.text));
        }
      }
      if (!global || !sharding) fail(op.col, "an input needs global= and sharding=");
      p_.inputs.push_back(v);
      return;
    }
    Instr in;
    std::string base = op.text;
    bool start = false;
    if (base.size() > 6 && base.compare(base.size() - 6, 6, "_start") == 0) {
      start = true;
      base.resize(base.size() - 6);
    }
    std::optional<CollectiveKind> coll;
    for (CollectiveKind k : kCollectives)
      if (base == collective_text(k)) coll = k;
    if (coll) {
      in.kind = start ? InstrKind::CollectiveStart : InstrKind::Collective;
      in.collective = *coll;
    } else if (start) {
      fail(op.col, fmt::format("'{}' is not a collective start (all_gather_start, all_reduce_start, "
                               "reduce_scatter_start, all_to_all_start, collective_permute_start)", op.text));
    } else if (op.text == "copy") {
      in.kind = InstrKind::Copy;
    } else if (op.text == "view") {
      in.kind = InstrKind::View;
    } else if (op.text == "shard_slice") {
      in.kind = InstrKind::ShardSlice;
    } else {
      auto k = op_kind_from_name(op.text);
      if (!k || *k == OpKind::Input || *k == OpKind::ShardingConstraint)
        fail(op.col, fmt::format("unknown instruction '{}' (an op of the registry, a collective, copy, view or "
                                 "shard_slice)", op.text));
      in.kind = InstrKind::Kernel;
      in.op = *k;
    }
    const int results = in.kind == InstrKind::Kernel ? op_def(in.op).num_results : 1;
    if (static_cast<int>(more_names.size()) + 1 != results)
      fail(name.col, results == 1 ? fmt::format("{} defines one value, not {}", op.text, more_names.size() + 1)
                                  : fmt::format("{} has {} results; name each ('%a, %b, ... = {}(...)'), not {}",
                                                op.text, results, op.text, more_names.size() + 1));
    expect("(", "to start the operands");
    if (!accept(")")) {
      while (true) {
        in.in.push_back(use(next()));
        Token c = next();
        if (is_punct(c, ",")) continue;
        if (is_punct(c, ")")) break;
        fail(c.col, fmt::format("expected ',' or ')' in the operands, got {}", describe(c)));
      }
    }
    const int v = define(name);
    in.out = v;
    for (const Token& t : more_names) in.extra_out.push_back(define(t));
    // Result r's attributes (type, global=, sharding=, at=); results after the first follow
    // a ',' each: `: T0 global=.. sharding=.. @compute, : T1 global=.. sharding=..`.
    int cur = 0;
    std::vector<int> defs = in.defs();
    auto value_of = [&](int r) -> LocalValue& { return p_.values[static_cast<std::size_t>(defs[static_cast<std::size_t>(r)])]; };
    std::vector<std::map<std::string, int>> result_seen(defs.size());
    std::vector<bool> result_typed(defs.size(), false);
    std::vector<int64_t> result_at(defs.size(), -1);
    std::map<std::string, int>& seen = result_seen[0];
    bool streamed = false;
    const std::vector<AttrSpec>* schema = in.kind == InstrKind::Kernel ? &op_def(in.op).attrs : nullptr;
    while (peek().kind != TK::End) {
      Token t = next();
      LocalValue& lv = value_of(cur);
      if (is_punct(t, ",")) {
        if (cur + 1 >= static_cast<int>(defs.size()))
          fail(t.col, fmt::format("{} defines {} value(s): no attributes for another", op.text, defs.size()));
        ++cur;
        if (!is_punct(peek(), ":"))
          fail(peek().col, fmt::format("expected ': type' for {} after ',', got {}",
                                       value_ref(value_of(cur).name), describe(peek())));
        continue;
      }
      if (is_punct(t, ":")) {
        if (result_typed[static_cast<std::size_t>(cur)]) fail(t.col, "the type is given twice");
        parse_type(lv.dtype, lv.shape, "after ':'");
        result_typed[static_cast<std::size_t>(cur)] = true;
        continue;
      }
      const bool per_value = t.kind == TK::Ident && (t.text == "global" || t.text == "sharding" || t.text == "at");
      if (cur > 0 && !per_value)
        fail(t.col, fmt::format("only global=, sharding= and at= follow the type of {} (the op's attributes "
                                "and its @stream come before the first ',')", value_ref(lv.name)));
      auto& rseen = result_seen[static_cast<std::size_t>(cur)];
      if (per_value) {
        if (rseen.count(t.text)) fail(t.col, fmt::format("attribute '{}' is given twice", t.text));
        rseen[t.text] = t.col;
        expect("=", fmt::format("after '{}'", t.text));
        if (t.text == "global") {
          DType dt;
          parse_type(dt, lv.global_shape, "after global=");
          if (result_typed[static_cast<std::size_t>(cur)] && dt != lv.dtype)
            fail(t.col, "the global type must have the local type's dtype");
        } else if (t.text == "sharding") {
          lv.sharding = parse_sharding();
        } else {
          Token n = next();
          result_at[static_cast<std::size_t>(cur)] = to_int(n, "the arena offset");
          if (result_at[static_cast<std::size_t>(cur)] < 0) fail(n.col, "an arena offset must be >= 0");
          any_at_ = any_at_ ? any_at_ : lineno_;
        }
        continue;
      }
      if (is_punct(t, "@")) {
        if (streamed) fail(t.col, "the stream is given twice");
        in.stream = parse_stream();
        streamed = true;
        continue;
      }
      if (t.kind != TK::Ident) fail(t.col, fmt::format("expected an attribute like key=value, ': type' or '@stream', got {}", describe(t)));
      if (seen.count(t.text)) fail(t.col, fmt::format("attribute '{}' is given twice", t.text));
      seen[t.text] = t.col;
      expect("=", fmt::format("after '{}'", t.text));
      const std::string& k = t.text;
      if (schema) {
        const AttrSpec* spec = nullptr;
        for (const auto& s : *schema)
          if (k == s.key) spec = &s;
        if (!spec) {
          std::vector<std::string> keys;
          for (const auto& s : *schema) keys.push_back(s.key);
          fail(t.col, fmt::format("{} has no attribute '{}' (its attributes: {})", op.text, k,
                                  keys.empty() ? std::string("none") : join(keys, ", ")));
        }
        parse_attr(*spec, in.attrs);
      } else if (in.kind == InstrKind::Collective || in.kind == InstrKind::CollectiveStart) {
        const bool permute = in.collective == CollectiveKind::CollectivePermute;
        if (k == "axes" && !permute) {
          in.axes = parse_axes("the collective's axis group");
        } else if (k == "pairs" && permute) {
          expect("[", "to start the pairs like [0->1, 1->0]");
          if (!accept("]")) {
            while (true) {
              int64_t a = parse_int("a source position");
              expect("->", "between source and target positions");
              int64_t b = parse_int("a target position");
              in.pairs.emplace_back(a, b);
              Token c = next();
              if (is_punct(c, ",")) continue;
              if (is_punct(c, "]")) break;
              fail(c.col, fmt::format("expected ',' or ']' in the pairs, got {}", describe(c)));
            }
          }
        } else if (k == "dim" && (in.collective == CollectiveKind::AllGather || in.collective == CollectiveKind::ReduceScatter)) {
          in.dim = parse_int32("the collective's dim");
        } else if (k == "split_dim" && in.collective == CollectiveKind::AllToAll) {
          in.dim = parse_int32("the split dim");
        } else if (k == "concat_dim" && in.collective == CollectiveKind::AllToAll) {
          in.dim2 = parse_int32("the concat dim");
        } else if (k == "op" && (in.collective == CollectiveKind::AllReduce ||
                                 in.collective == CollectiveKind::ReduceScatter)) {
          Token o = next();
          if (o.kind == TK::Ident && o.text == "sum") in.reduce = ReduceOp::Sum;
          else if (o.kind == TK::Ident && o.text == "max") in.reduce = ReduceOp::Max;
          else fail(o.col, fmt::format("expected op=sum or op=max, got {}", describe(o)));
        } else if (k == "bytes") {
          in.bytes = parse_int("the collective's bytes");
        } else {
          fail(t.col, fmt::format("{} has no attribute '{}'", op.text, k));
        }
      } else if (in.kind == InstrKind::ShardSlice && k == "axes") {
        in.axes = parse_axes("the slice's axis group");
      } else if (in.kind == InstrKind::ShardSlice && k == "dim") {
        in.dim = parse_int32("the slice's dim");
      } else if (in.kind == InstrKind::View && k == "offset") {
        Token n = next();
        in.view_offset = to_int(n, "the view's byte offset");
        if (in.view_offset < 0) fail(n.col, "a view offset must be >= 0");
      } else if (in.kind == InstrKind::Copy && k == "block") {
        in.block = parse_int_list("block", true);
      } else if (in.kind == InstrKind::Copy && k == "copies") {
        expect("[", "to start the copies like [[0,0]->[0,0]]");
        if (!accept("]")) {
          while (true) {
            CopyBlock c;
            c.src = parse_index_list();
            expect("->", "between the source and destination offsets of a block");
            c.dst = parse_index_list();
            in.copies.push_back(std::move(c));
            Token s = next();
            if (is_punct(s, ",")) continue;
            if (is_punct(s, "]")) break;
            fail(s.col, fmt::format("expected ',' or ']' in the copies, got {}", describe(s)));
          }
        }
      } else {
        fail(t.col, fmt::format("{} has no attribute '{}'", op.text, k));
      }
    }
    // Required attributes.
    auto need = [&](const char* key) {
      if (!seen.count(key)) fail(op.col, fmt::format("{} needs {}=", op.text, key));
    };
    if (cur + 1 != static_cast<int>(defs.size()))
      fail(op.col, fmt::format("{} needs the attributes of each of its {} results (': type global=.. sharding=..', "
                               "separated by ',')", op.text, defs.size()));
    for (std::size_t r = 0; r < defs.size(); ++r) {
      const std::string who = r == 0 ? op.text : value_ref(value_of(static_cast<int>(r)).name);
      if (!result_typed[r]) fail(op.col, fmt::format("{} needs its local type (': f32[...]')", who));
      for (const char* key : {"global", "sharding"})
        if (!result_seen[r].count(key)) fail(op.col, fmt::format("{} needs {}=", who, key));
    }
    if (!streamed) fail(op.col, fmt::format("{} needs its stream ('@compute')", op.text));
    LocalValue& lv = value_of(0);
    if (schema) {
      for (const auto& s : *schema)
        if (s.required && !seen.count(s.key)) fail(op.col, fmt::format("{} needs {}=", op.text, s.key));
      if (in.op == OpKind::Constant) {
        in.attrs.shape = lv.shape;
        in.attrs.dtype = lv.dtype;
      }
      std::vector<Shape> shapes;
      for (int x : in.in) shapes.push_back(p_.values[static_cast<std::size_t>(x)].shape);
      if (op_def(in.op).flops) in.flops = op_def(in.op).flops(in.attrs, shapes, lv.shape);
    }
    if (in.kind == InstrKind::Collective || in.kind == InstrKind::CollectiveStart) {
      need(in.collective == CollectiveKind::CollectivePermute ? "pairs" : "axes");
      if (in.collective == CollectiveKind::AllGather || in.collective == CollectiveKind::ReduceScatter) need("dim");
      if (in.collective == CollectiveKind::AllToAll) {
        need("split_dim");
        need("concat_dim");
      }
      need("bytes");
    }
    if (in.kind == InstrKind::ShardSlice) {
      need("axes");
      need("dim");
    }
    if (in.kind == InstrKind::Copy) {
      need("block");
      need("copies");
    }
    if (in.kind == InstrKind::View) need("offset");
    for (std::size_t r = 0; r < defs.size(); ++r)
      if (result_at[r] >= 0) {
        p_.memory.offset.resize(p_.values.size(), -1);
        p_.memory.offset[static_cast<std::size_t>(defs[r])] = result_at[r];
      }
    push(std::move(in));
  }

  void parse_attr(const AttrSpec& spec, OpAttrs& a) {
    switch (spec.field) {
      case AttrField::Equation: {
        Token s = next();
        if (s.kind != TK::String)
          fail(s.col, fmt::format("expected an einsum equation string like \"bsd,df->bsf\", got {}", describe(s)));
        a.equation = s.text;
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
      case AttrField::DType: a.dtype = parse_dtype(next(), fmt::format("for '{}'", spec.key)); return;
    }
  }
};

}  // namespace

Program parse_program(std::string_view text, std::string_view filename, const ProgramParseOptions& options) {
  return Parser(text, filename).run(options);
}

Program parse_program_file(const std::string& path, const ProgramParseOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ParseError(fmt::format("{}: cannot open file: {}", path, std::strerror(errno)));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ParseError(fmt::format("{}: cannot read file", path));
  return parse_program(text, path, options);
}

}  // namespace tessel
