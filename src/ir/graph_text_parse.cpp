// src/ir/graph_text_parse.cpp — the parser of the Graph's text form (docs/ir.md): line-oriented
// recursive descent; graph_text_print.cpp is its printer.
//
// The parser reads one statement per line with a lazy lexer (text_lexer.hpp, shared with the
// program text), so the first mistake on a line is the one reported, at its exact column.
// Graph construction goes through the builder (Graph::add_input / add_op / annotate), which
// owns every shape rule: the parser only checks the syntax, names and attribute sets, and
// re-reports builder errors at the op's position.
#include "tessel/ir/graph_text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "tessel/ops/registry.hpp"
#include "../core/known_fields.hpp"
#include "text_lexer.hpp"

namespace tessel {
namespace {

using namespace detail;

// " (did you mean 'gelu'?)" for a near miss of an op name, else "".
std::string suggest_op(std::string_view name) {
  if (name.size() > 64) return "";
  std::vector<std::string> names;
  for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k) names.emplace_back(op_def(static_cast<OpKind>(k)).name);
  const std::string best = closest_name(name, names);
  return best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best);
}

// ---- lexer + parser -----------------------------------------------------------------------

// The graph's syntax: '->' is not a token (an einsum equation is a "string").
constexpr LexSyntax kGraphSyntax{" \t\v\f\r", "=,[]{}():?", false};

class Parser : LineLexer {
 public:
  Parser(std::string_view text, std::string_view filename) : LineLexer(text, filename, kGraphSyntax) {}

  Graph run() {
    for_each_line([this] { statement(); });
    return std::move(g_);
  }

 private:
  Graph g_;
  struct Definition {
    int id, line, col;
  };
  std::unordered_map<std::string, Definition> defined_;  // value name -> where defined
  int mesh_line_ = 0;
  bool seen_value_ = false;



  // f32[8,128]
  void parse_type(DType& dtype, Shape& shape, std::string_view context) {
    Token t = next();
    std::optional<DType> d = t.kind == TK::Ident ? dtype_from_text(t.text) : std::nullopt;
    if (!d)
      fail(t.col, fmt::format("expected a type like f32[8,128] {} (dtypes: f32, bf16, f16, "
                              "i32), got {}",
                              context, describe(t)));
    dtype = *d;
    shape = parse_int_list("shape", /*dims=*/true);
  }

  // [{data}, {}, {model, ?}] partial{x}
  Sharding parse_sharding() {
    Token open = next();
    if (!is_punct(open, "["))
      fail(open.col,
           fmt::format("expected a sharding like [{{data}}, {{}}], got {}", describe(open)));
    std::vector<DimSharding> dims;
    std::map<std::string, int> used;  // axis -> column of first use
    auto use = [&](const Token& a) {
      auto [it, fresh] = used.emplace(a.text, a.col);
      if (!fresh)
        fail(a.col, fmt::format("mesh axis '{}' is used twice in the sharding", a.text));
    };
    if (!accept("]")) {
      while (true) {
        Token lb = next();
        if (!is_punct(lb, "{"))
          fail(lb.col, fmt::format("expected '{{' to start a dim sharding like {{data}} or "
                                   "{{}}, got {}",
                                   describe(lb)));
        DimSharding d;
        if (!accept("}")) {
          while (true) {
            Token a = next();
            if (is_punct(a, "?")) {
              d.closed = false;
              Token c = next();
              if (!is_punct(c, "}"))
                fail(c.col, fmt::format("expected '}}' after '?' (the open marker comes "
                                        "last in a dim), got {}",
                                        describe(c)));
              break;
            }
            if (a.kind != TK::Ident)
              fail(a.col, fmt::format("expected a mesh axis name or '?' in the dim "
                                      "sharding, got {}",
                                      describe(a)));
            use(a);
            d.axes.push_back(a.text);
            Token c = next();
            if (is_punct(c, ",")) continue;
            if (is_punct(c, "}")) break;
            fail(c.col, fmt::format("expected ',' or '}}' in the dim sharding, got {}",
                                    describe(c)));
          }
        }
        dims.push_back(std::move(d));
        Token c = next();
        if (is_punct(c, ",")) continue;
        if (is_punct(c, "]")) break;
        fail(c.col, fmt::format("expected ',' or ']' in the sharding, got {}", describe(c)));
      }
    }
    Sharding s(std::move(dims));
    if (is_ident(peek(), "partial")) {
      next();
      expect("{", "after 'partial'");
      if (!accept("}")) {
        while (true) {
          Token a = next();
          if (a.kind != TK::Ident)
            fail(a.col, fmt::format("expected a mesh axis name in partial{{...}}, got {}",
                                    describe(a)));
          use(a);
          s.partial.push_back(a.text);
          Token c = next();
          if (is_punct(c, ",")) continue;
          if (is_punct(c, "}")) break;
          fail(c.col, fmt::format("expected ',' or '}}' in partial{{...}}, got {}",
                                  describe(c)));
        }
      }
    }
    return s;
  }

  int lookup(const Token& t) {
    if (t.kind != TK::Value)
      fail(t.col, fmt::format("expected a value '%name', got {}", describe(t)));
    auto it = defined_.find(t.text);
    if (it == defined_.end()) fail(t.col, fmt::format("undefined value {}", value_ref(t.text)));
    return it->second.id;
  }

  // Checks a sharding against the value's type and, when declared, the mesh.
  void check_sharding(const Sharding& s, int col, const Shape& shape, std::string_view what) {
    if (static_cast<std::size_t>(s.rank()) != shape.size())
      fail(col, fmt::format("sharding {} has {} dims but {} has rank {} ({})", sharding_text(s),
                            s.rank(), what, shape.size(), shape_str(shape)));
    if (g_.mesh) {
      try {
        s.validate(*g_.mesh, shape, what, /*allow_uneven=*/true);  // padded when compiled
      } catch (const Error& e) {
        fail(col, e.what());
      }
    }
  }

  // -- statements --
  void statement() {
    const Token t = peek();
    if (t.kind == TK::End) return;
    if (is_ident(t, "mesh")) return mesh_statement();
    if (is_ident(t, "output")) return output_statement();
    if (t.kind == TK::Value) return definition();
    fail(t.col, fmt::format("expected a statement ('%name = op(...)', 'output %name' or "
                            "'mesh axis=size, ...'), got {}",
                            describe(t)));
  }

  void mesh_statement() {
    Token kw = next();
    if (mesh_line_) fail(kw.col, fmt::format("mesh declared twice (first on line {})", mesh_line_));
    if (seen_value_) fail(kw.col, "the mesh must be declared before the first value");
    const bool brace = accept("{");
    std::vector<MeshAxis> axes;
    while (true) {
      const Token t = peek();  // a copy: peek(1) below may reallocate the lookahead
      if (t.kind == TK::End || (brace && is_punct(t, "}"))) break;
      if (is_ident(t, "devices") && is_punct(peek(1), "=") && is_punct(peek(2), "[")) break;
      if (!axes.empty() && is_punct(t, ",")) next();
      Token name = next();
      if (name.kind != TK::Ident)
        fail(name.col, fmt::format("expected a mesh axis 'name=size', got {}", describe(name)));
      expect("=", fmt::format("after mesh axis name '{}'", name.text));
      MeshAxis axis;
      axis.name = name.text;
      axis.size = parse_int(fmt::format("size of mesh axis '{}'", name.text));
      axes.push_back(std::move(axis));
    }
    if (brace) expect("}", "to close the mesh");
    std::vector<int> devices;
    bool has_devices = false;
    if (is_ident(peek(), "devices")) {
      next();
      expect("=", "after 'devices'");
      for (int64_t d : parse_int_list("device id", false)) {
        if (d < 0 || d > std::numeric_limits<int>::max())
          fail(kw.col, fmt::format("device id {} is out of range", d));
        devices.push_back(static_cast<int>(d));
      }
      has_devices = true;
    }
    expect_end("the mesh");
    // Mesh allocates one entry per device: refuse absurd sizes before it multiplies them.
    constexpr int64_t kMaxDevices = Mesh::kMaxDevices;
    int64_t total = 1;
    for (const MeshAxis& a : axes) {
      if (a.size >= 1 && total > kMaxDevices / a.size)
        fail(kw.col, fmt::format("mesh has more than {} devices", kMaxDevices));
      if (a.size >= 1) total *= a.size;
    }
    try {
      if (axes.empty() && !has_devices)
        g_.mesh = Mesh();
      else
        g_.mesh = Mesh(std::move(axes), std::move(devices));
    } catch (const Error& e) {
      fail(kw.col, e.what());
    }
    mesh_line_ = lineno();
  }

  void output_statement() {
    next();
    do {
      int id = lookup(next());
      g_.mark_output(g_.tensor(id));
    } while (accept(","));
    expect_end("the outputs");
  }

  void definition() {
    Token nt = next();
    const std::string name = nt.text;
    // An op with several results names each: `%dx, %dg, %db = layer_norm_grad(...)`.
    std::vector<Token> name_tokens{nt};
    while (accept(",")) {
      Token t = next();
      if (t.kind != TK::Value) fail(t.col, fmt::format("expected a value name after ',', got {}", describe(t)));
      name_tokens.push_back(std::move(t));
    }
    for (std::size_t i = 0; i < name_tokens.size(); ++i) {
      const Token& t = name_tokens[i];
      if (auto it = defined_.find(t.text); it != defined_.end())
        fail(t.col, fmt::format("duplicate definition of {} (first defined at {}:{}:{})",
                                value_ref(t.text), file(), it->second.line, it->second.col));
      for (std::size_t j = 0; j < i; ++j)
        if (name_tokens[j].text == t.text) fail(t.col, fmt::format("{} is named twice", value_ref(t.text)));
    }
    expect("=", fmt::format("after {}", value_ref(name_tokens.back().text)));
    Token ot = next();
    if (ot.kind != TK::Ident)
      fail(ot.col, fmt::format("expected an op name after '=', got {}", describe(ot)));
    std::optional<OpKind> kind_opt = op_kind_from_name(ot.text);
    if (!kind_opt || *kind_opt == OpKind::kCount)
      fail(ot.col, fmt::format("unknown op '{}'{}", ot.text, suggest_op(ot.text)));
    const OpKind kind = *kind_opt;
    const std::string opname = ot.text;
    seen_value_ = true;
    const std::size_t nres = static_cast<std::size_t>(op_def(kind).num_results);
    if (name_tokens.size() != nres)
      fail(name_tokens.size() > 1 ? name_tokens[1].col : nt.col,
           nres == 1 ? fmt::format("{} has one result; name one value", opname)
                     : fmt::format("{} has {} results; name each: '%a, %b{} = {}(...)'", opname, nres,
                                   nres > 2 ? ", ..." : "", opname));

    OpAttrs attrs;
    std::vector<int> operands;
    DType dtype = DType::f32;
    Shape shape;
    const bool leaf = kind == OpKind::Input || kind == OpKind::Constant;
    if (leaf) {
      if (is_punct(peek(), "("))
        fail(peek().col, fmt::format("{} takes no operands; write '{} = {} f32[8,16]{}'",
                                     opname, value_ref(name), opname,
                                     kind == OpKind::Constant ? " value=1" : ""));
      parse_type(dtype, shape, fmt::format("after '{}'", opname));
    } else {
      expect("(", fmt::format("after op name '{}'", opname));
      if (!accept(")")) {
        while (true) {
          operands.push_back(lookup(next()));
          Token c = next();
          if (is_punct(c, ",")) continue;
          if (is_punct(c, ")")) break;
          fail(c.col, fmt::format("expected ',' or ')' in the operands of {}, got {}", opname,
                                  describe(c)));
        }
      }
      const OpDef& def = op_def(kind);
      const int n = static_cast<int>(operands.size());
      if (n < def.min_inputs || (def.max_inputs >= 0 && n > def.max_inputs)) {
        std::string want =
            def.max_inputs < 0 ? fmt::format("at least {}", def.min_inputs)
            : def.min_inputs == def.max_inputs
                ? fmt::format("{}", def.min_inputs)
                : fmt::format("{} to {}", def.min_inputs, def.max_inputs);
        fail(ot.col, fmt::format("{} takes {} operand{}, got {}", opname, want,
                                 def.max_inputs == 1 ? "" : "s", n));
      }
    }

    // Attributes and the optional ": type" check, in any order.
    const std::vector<AttrSpec>& specs = op_def(kind).attrs;
    std::map<std::string, int> seen;  // key -> column
    bool has_declared = false;
    int declared_col = 0;
    DType declared_dtype = DType::f32;
    Shape declared_shape;
    std::vector<ResultType> declared_more;  // results 1.. of an op with several
    std::optional<Sharding> annotation;
    int annotation_col = 0, priority = 0;
    // An op with several results: `sharding=(S0, _, S2)` and `priority=P` or `(P0, P1, P2)`.
    std::vector<std::optional<Sharding>> result_annotations(nres);
    std::vector<int> result_priorities(nres, 0);
    const bool constraint = kind == OpKind::ShardingConstraint;
    while (true) {
      const Token t = peek();
      if (t.kind == TK::End) break;
      if (is_punct(t, ":")) {
        if (leaf)
          fail(t.col, fmt::format("the type of {} goes right after '{}', not after ':'",
                                  opname, opname));
        if (has_declared) fail(t.col, "the result type is given twice");
        next();
        declared_col = peek().col;
        parse_type(declared_dtype, declared_shape, "after ':'");
        for (std::size_t r = 1; r < nres; ++r) {
          expect(",", fmt::format("between the types of the {} results of {}", nres, opname));
          ResultType t;
          parse_type(t.dtype, t.shape, "after ','");
          declared_more.push_back(std::move(t));
        }
        has_declared = true;
        continue;
      }
      if (t.kind != TK::Ident)
        fail(t.col, fmt::format("expected an attribute 'name=value'{} or end of line, got {}",
                                leaf ? "" : ", ': type'", describe(t)));
      Token key = next();
      bool allowed = key.text == "sharding" || key.text == "priority";
      for (const auto& s : specs) allowed = allowed || key.text == s.key;
      if (!allowed) {
        std::vector<std::string> names;
        for (const auto& s : specs) names.push_back(s.key);
        if (!constraint) {
          names.push_back("sharding");
          names.push_back("priority");
        }
        std::string list;
        for (std::size_t i = 0; i < names.size(); ++i) list += (i ? ", " : "") + names[i];
        fail(key.col, fmt::format("{} has no attribute '{}' (it takes: {})", opname, key.text,
                                  list));
      }
      if (!seen.emplace(key.text, key.col).second)
        fail(key.col, fmt::format("attribute '{}' is given twice", key.text));
      expect("=", fmt::format("after attribute name '{}'", key.text));
      const std::string& k = key.text;
      if (k == "sharding" && nres > 1) {
        annotation_col = peek().col;
        expect("(", fmt::format("to start the shardings of the {} results of {} (like sharding=([{{data}}], _, _); "
                                "'_' for none)", nres, opname));
        for (std::size_t r = 0; r < nres; ++r) {
          if (r) expect(",", "between the results' shardings");
          if (peek().kind == TK::Ident && peek().text == "_") next();
          else result_annotations[r] = parse_sharding();
        }
        expect(")", fmt::format("after the {} shardings of {}", nres, opname));
        annotation = Sharding();  // marks "given" for the priority check
      } else if (k == "priority" && nres > 1 && is_punct(peek(), "(")) {
        next();
        for (std::size_t r = 0; r < nres; ++r) {
          if (r) expect(",", "between the results' priorities");
          result_priorities[r] = parse_int32("priority");
        }
        expect(")", fmt::format("after the {} priorities of {}", nres, opname));
      } else if (k == "sharding") {
        annotation_col = peek().col;
        annotation = parse_sharding();
      } else if (k == "priority") {
        priority = parse_int32("priority");
        result_priorities.assign(nres, priority);
      } else {
        const AttrSpec* spec = nullptr;
        for (const auto& s : specs)
          if (k == s.key) spec = &s;
        parse_attr(*spec, attrs);
      }
    }
    for (const auto& s : specs)
      if (s.required && !seen.count(s.key))
        fail(ot.col, fmt::format("{} requires attribute '{}'", opname, s.key));
    if (seen.count("priority") && !annotation)
      fail(seen["priority"], "'priority' needs a 'sharding' on the same line");

    if (constraint) {
      // sharding= / priority= are the op's own attributes here.
      const std::string what = fmt::format("sharding_constraint {}", value_ref(name));
      check_sharding(*annotation, annotation_col, g_.values[operands[0]].shape, what);
      attrs.sharding = std::move(annotation);
      attrs.priority = priority;
      annotation.reset();
    }

    if (nres > 1) {
      std::vector<std::string> names;
      for (const Token& t : name_tokens) names.push_back(t.text);
      std::vector<Tensor> rs;
      try {
        rs = g_.add_op_results(kind, operands, attrs, names);
      } catch (const Error& e) {
        fail(ot.col, e.what());
      }
      for (std::size_t r = 0; r < nres; ++r) {
        const Value& v = g_.values[static_cast<std::size_t>(rs[r].id)];
        const ResultType want = !has_declared ? ResultType{v.shape, v.dtype}
                                : r == 0      ? ResultType{declared_shape, declared_dtype}
                                              : declared_more[r - 1];
        if (v.dtype != want.dtype || v.shape != want.shape)
          fail(declared_col, fmt::format("type mismatch for {}: the text says {} but {} infers {}",
                                         value_ref(v.name), type_str(want.dtype, want.shape), opname,
                                         type_str(v.dtype, v.shape)));
        if (result_annotations[r]) {
          check_sharding(*result_annotations[r], annotation_col, v.shape, value_ref(v.name));
          try {
            g_.annotate(rs[r].id, std::move(*result_annotations[r]), result_priorities[r]);
          } catch (const Error& e) {
            fail(annotation_col, e.what());
          }
        }
        defined_.emplace(v.name, Definition{rs[r].id, lineno(), name_tokens[r].col});
      }
      return;
    }
    int id = -1;
    try {
      if (kind == OpKind::Input) {
        id = g_.add_input(name, dtype, shape).id;
      } else {
        if (kind == OpKind::Constant) {
          attrs.dtype = dtype;
          attrs.shape = shape;
        }
        id = g_.add_op(kind, operands, attrs, name).id;
      }
    } catch (const Error& e) {
      fail(ot.col, e.what());
    }
    if (id < 0 || static_cast<std::size_t>(id) >= g_.values.size())
      fail(ot.col, fmt::format("internal error: the builder returned no value for {}",
                               value_ref(name)));
    const Value& v = g_.values[id];
    if (has_declared && (v.dtype != declared_dtype || v.shape != declared_shape))
      fail(declared_col,
           fmt::format("type mismatch for {}: the text says {} but {} infers {}",
                       value_ref(name), type_str(declared_dtype, declared_shape), opname,
                       type_str(v.dtype, v.shape)));
    if (annotation) {
      check_sharding(*annotation, annotation_col, v.shape, value_ref(name));
      try {
        g_.annotate(id, std::move(*annotation), priority);
      } catch (const Error& e) {
        fail(annotation_col, e.what());
      }
    }
    defined_.emplace(name, Definition{id, lineno(), nt.col});
  }
};

}  // namespace

Graph parse_graph(std::string_view text, std::string_view filename) {
  return Parser(text, filename).run();
}

Graph parse_graph_file(const std::string& path) {
  return parse_graph(read_text_file(path), path);
}

}  // namespace tessel
