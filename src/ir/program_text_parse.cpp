// src/ir/program_text_parse.cpp — the parser of a Program's text form (docs/program-ir.md): a
// line-oriented recursive-descent parser in the style of the graph's (graph_text_parse.cpp): one
// statement per line, the lazy lexer the two share (text_lexer.hpp), errors "file:line:col"
// with the line and a caret. Kernel attributes are parsed through the op registry's schema
// (ops/registry.hpp); program_text_print.cpp is the printer.
#include "tessel/ir/program_text.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include "tessel/ops/registry.hpp"
#include "tessel/ir/program_verify.hpp"
#include "text_lexer.hpp"

namespace tessel {

using namespace detail;

namespace {

// ---- lexer + parser -------------------------------------------------------------------------

// The program's syntax: "->" in copies and pairs, '@' before a stream, '*' and '+' in block
// offsets like 8+16*{model}.
constexpr LexSyntax kProgramSyntax{" \t\r", "=,[]{}():?@*+", true};

class Parser : LineLexer {
 public:
  Parser(std::string_view text, std::string_view file) : LineLexer(text, file, kProgramSyntax) {}

  Program run(const ProgramParseOptions& opts) {
    for_each_line([this] { statement(); });
    if (!seen_mesh_) fail_at(1, 1, "expected a 'mesh' line (e.g. 'mesh data=2, model=4') before the program");
    if (!seen_output_) fail_at(lineno(), 1, "the program has no 'output' line");
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
                                                                                   : lineno();
        throw ParseError(fmt::format("{}:{}:1: {}", file(), line, e.what()));
      }
    }
    return std::move(p_);
  }

 private:
  Program p_;
  std::unordered_map<std::string, int> defined_;
  std::vector<int> instr_line_;
  bool seen_mesh_ = false, seen_output_ = false, seen_memory_ = false;
  int any_at_ = 0;

  void parse_type(DType& dtype, Shape& shape, std::string_view context) {
    const Token t = next();
    dtype = parse_dtype(t, context);
    shape = parse_int_list("shape", true, 1);
    try {
      (void)checked_value_bytes(shape, dtype, "a value");
    } catch (const ShapeError& e) {
      fail(t.col, e.what());
    }
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
      parse_index_term(e);
    } else if (accept("*")) {
      e.stride = v;
      parse_index_term(e);
    } else {
      e.base = v;
    }
    return e;
  }
  // After `stride*`: `{axes}`, or a ring index `({axes}+shift mod m)`.
  void parse_index_term(IndexExpr& e) {
    if (!accept("(")) {
      e.axes = parse_axes("a block offset");
      return;
    }
    e.axes = parse_axes("a ring block offset");
    Token sh = next();
    if (sh.kind != TK::Number || sh.text.empty() || (sh.text[0] != '+' && sh.text[0] != '-'))
      fail(sh.col, fmt::format("expected a signed shift like +1 in a ring block offset ({{model}}+1 mod 4), got {}",
                               describe(sh)));
    e.shift = to_int(sh, "a ring shift");
    Token m = next();
    if (m.kind != TK::Ident || m.text != "mod")
      fail(m.col, fmt::format("expected 'mod' in a ring block offset ({{model}}+1 mod 4), got {}", describe(m)));
    Token n = next();
    e.modulus = to_int(n, "a ring modulus");
    if (e.modulus < 1) fail(n.col, fmt::format("a ring modulus must be >= 1, got {}", e.modulus));
    expect(")", "to close a ring block offset like ({model}+1 mod 4)");
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
    if (peek().kind == TK::Ident && peek().text == "host") {  // the host pool (offloaded values)
      next();
      expect("=", "after host");
      Token h = next();
      p_.memory.host_bytes = to_int(h, "the host pool size in bytes");
      if (p_.memory.host_bytes < 0) fail(h.col, "the host pool size must be >= 0");
    }
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
    instr_line_.push_back(lineno());
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
    if (const CollectiveInfo* coll = find_collective(base)) {
      in.kind = start ? InstrKind::CollectiveStart : InstrKind::Collective;
      in.collective = coll->kind;
    } else if (start) {
      std::vector<std::string> starts;
      for (const CollectiveInfo& c : kCollectiveTable) starts.push_back(collective_start_name(c.kind));
      fail(op.col, fmt::format("'{}' is not a collective start ({})", op.text, join(starts, ", ")));
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
      const bool per_value = t.kind == TK::Ident && (t.text == "global" || t.text == "sharding" || t.text == "at" ||
                                                     t.text == "memory");
      if (cur > 0 && !per_value)
        fail(t.col, fmt::format("only global=, sharding= and at= follow the type of {} (and memory=; the op's attributes "
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
        } else if (t.text == "memory") {
          Token k = expect_ident("memory=host or memory=device");
          if (k.text != "host" && k.text != "device")
            fail(k.col, fmt::format("expected memory=host or memory=device, got {}", describe(k)));
          lv.host = k.text == "host";
        } else {
          Token n = next();
          result_at[static_cast<std::size_t>(cur)] = to_int(n, "the arena offset");
          if (result_at[static_cast<std::size_t>(cur)] < 0) fail(n.col, "an arena offset must be >= 0");
          any_at_ = any_at_ ? any_at_ : lineno();
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
        const CollectiveInfo& ci = collective_info(in.collective);
        const bool permute = ci.over_pairs;
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
        } else if (k == "dim" && (ci.shape == CollectiveShape::GatherDim || ci.shape == CollectiveShape::ScatterDim)) {
          in.dim = parse_int32("the collective's dim");
        } else if (k == "split_dim" && ci.shape == CollectiveShape::AllToAll) {
          in.dim = parse_int32("the split dim");
        } else if (k == "concat_dim" && ci.shape == CollectiveShape::AllToAll) {
          in.dim2 = parse_int32("the concat dim");
        } else if (k == "op" && ci.reduces) {
          Token o = next();
          if (o.kind == TK::Ident && o.text == "sum") in.reduce = ReduceOp::Sum;
          else if (o.kind == TK::Ident && o.text == "max") in.reduce = ReduceOp::Max;
          else fail(o.col, fmt::format("expected op=sum or op=max, got {}", describe(o)));
        } else if (k == "bytes") {
          const Token b = peek();
          in.bytes = parse_int("the collective's bytes");
          if (in.bytes < 0) fail(b.col, fmt::format("a collective's bytes= must be >= 0, got {}", in.bytes));
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
        in.block = parse_int_list("block", true, 1);
      } else if (in.kind == InstrKind::Copy && k == "copies") {
        expect("[", "to start the copies like [[0,0]->[0,0]]");
        if (!accept("]")) {
          while (true) {
            CopyBlock c;
            if (peek().kind == TK::Number) {  // `1:[..]->[..]`: a block of the second input
              Token k = next();
              const int64_t input = to_int(k, "a copy block's input");
              if (input < 0 || input >= static_cast<int64_t>(in.in.size()))
                fail(k.col, fmt::format("copy block input {} is not one of the copy's {} inputs", input, in.in.size()));
              c.input = static_cast<int>(input);
              expect(":", "after a copy block's input index (like 1:[0,0]->[16,0])");
            }
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
      // The op's own checks (an einsum equation that does not fit its operands) are reported
      // at the op, like every other error of the text.
      try {
        if (op_def(in.op).flops) in.flops = op_def(in.op).flops(in.attrs, shapes, lv.shape);
      } catch (const ParseError&) {
        throw;
      } catch (const Error& e) {
        fail(op.col, e.what());
      }
    }
    if (in.kind == InstrKind::Collective || in.kind == InstrKind::CollectiveStart) {
      const CollectiveInfo& ci = collective_info(in.collective);
      need(ci.over_pairs ? "pairs" : "axes");
      if (ci.shape == CollectiveShape::GatherDim || ci.shape == CollectiveShape::ScatterDim) need("dim");
      if (ci.shape == CollectiveShape::AllToAll) {
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


};

}  // namespace

Program parse_program(std::string_view text, std::string_view filename, const ProgramParseOptions& options) {
  return Parser(text, filename).run(options);
}

Program parse_program_file(const std::string& path, const ProgramParseOptions& options) {
  return parse_program(read_text_file(path), path, options);
}

}  // namespace tessel
