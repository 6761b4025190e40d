// text_lexer.hpp (private) — the line lexer shared by the two text parsers: the graph's
// (src/ir/graph_text_parse.cpp, docs/ir.md) and the program's (src/ir/program_text_parse.cpp, docs/program-ir.md),
// with the spelling of value names both printers use.
//
// Why one lexer: both text forms read one statement per line with the same tokens (idents,
// %values, numbers, "strings" with escapes) and report "file:line:col: message" with the
// line and a caret under the column; as two copies, every fix had to be made twice. What differs
// between the two syntaxes is data (LexSyntax): the blanks skipped between tokens, the
// one-character punctuation, and whether "->" is a token. A parser derives from LineLexer and
// reads tokens with peek/next/accept/expect; every error message is part of the text
// forms' contract (tests and fuzz corpora pin them), so they live here exactly once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/common.hpp"
#include "tessel/core/collective_kind.hpp"
#include "tessel/core/sharding.hpp"
#include "tessel/ops/registry.hpp"

namespace tessel {
namespace detail {

// ---- characters, names --------------------------------------------------------------------

inline bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_ident_start(char c) { return is_alpha(c) || c == '_'; }
inline bool is_ident_char(char c) { return is_alpha(c) || is_digit(c) || c == '_'; }
// Characters of a bare value name after '%' (anything else is written %"quoted").
inline bool is_name_char(char c) { return is_ident_char(c) || c == '.' || c == '-'; }

// The DType named "f32", "bf16", "f16" or "i32" (common.hpp: dtype_name), if any.
std::optional<DType> dtype_from_text(std::string_view name);
// %name when every character is a name character, else %"quoted".
std::string value_ref(std::string_view name);
// A sharding as the graph text writes it: `[{data}, {?}, {model, ?}] partial{x}` (open dims
// end in `?`); the parser (graph_text_parse.cpp) quotes it in errors, the printer writes it.
std::string sharding_text(const Sharding& s);
// Printable form of a source line for error messages: control bytes become '?', so the
// message stays one readable line and the caret stays aligned.
std::string echo_line(std::string_view line);
// The whole file, for parse_*_file; a ParseError "path: cannot open file: ..." otherwise.
std::string read_text_file(const std::string& path);

// ---- tokens --------------------------------------------------------------------------------

enum class TK { End, Ident, Value, Number, String, Punct };

struct Token {
  TK kind = TK::End;
  std::string text;  // decoded text for String and quoted Value names
  int col = 1;       // 1-based byte column
};

// "end of line", "string \"...\"", "'%x'", "'token'" (long texts clipped), for messages.
std::string describe(const Token& t);

// What differs between the two text syntaxes.
struct LexSyntax {
  std::string_view blanks;  // skipped between tokens
  const char* punct;        // one-character punctuation tokens
  bool arrow = false;       // "->" is one punctuation token and ends a bare %name
};

// A lexer over the lines of one text; parsers derive from it. Errors throw ParseError.
class LineLexer {
 public:
  LineLexer(std::string_view text, std::string_view file, LexSyntax syntax)
      : text_(text), file_(file), syntax_(syntax) {}

 protected:
  // Calls statement() once per line ('\n'-separated, a trailing '\r' dropped), with the
  // lexer at the line's start.
  void for_each_line(const std::function<void()>& statement);

  std::string_view file() const { return file_; }
  int lineno() const { return lineno_; }  // 1-based line being read

  // "file:line:col: msg" with the line and a caret under col.
  [[noreturn]] void fail(int col, const std::string& msg) const;
  // The same for another line than the current one: without the line and caret.
  [[noreturn]] void fail_at(int line, int col, const std::string& msg) const;

  const Token& peek(std::size_t k = 0);
  Token next();
  static bool is_punct(const Token& t, std::string_view p) { return t.kind == TK::Punct && t.text == p; }
  static bool is_ident(const Token& t, std::string_view s) { return t.kind == TK::Ident && t.text == s; }
  bool accept(std::string_view p);
  Token expect(std::string_view p, std::string_view context);
  Token expect_ident(std::string_view what);
  void expect_end(std::string_view what);

  // Integer literals ("+8" reads as 8); `what` names the number in the message.
  int64_t to_int(const Token& t, std::string_view what);
  int64_t parse_int(std::string_view what) { return to_int(next(), what); }
  int parse_int32(std::string_view what);
  bool parse_bool(std::string_view what);
  // A number in std::strtod's syntax, "+" allowed; `what` names it.
  double parse_double(std::string_view what);
  // [1, 2, 3]; with `dims` the entries are tensor dimensions: at least min_dim, their product
  // within int64.
  std::vector<int64_t> parse_int_list(std::string_view what, bool dims, int64_t min_dim = 0);
  // f32, bf16, f16 or i32; `context` follows "expected a type like f32[8,128]" in the message.
  DType parse_dtype(const Token& t, std::string_view context);
  // One op attribute's value, in the syntax of its field (ops/registry.hpp: attr_value_text
  // prints it); both text forms read op attributes with it.
  void parse_attr(const AttrSpec& spec, OpAttrs& a);

 private:
  int col_of(std::size_t p) const;
  char at(std::size_t p) const { return p < line_.size() ? line_[p] : '\0'; }
  std::string lex_string();
  Token lex();

  std::string_view text_, file_, line_;
  LexSyntax syntax_;
  int lineno_ = 0;
  std::size_t pos_ = 0;
  std::vector<Token> ahead_;
};

}  // namespace detail
}  // namespace tessel
