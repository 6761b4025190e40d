// Tests of the text form (tessel/ir/graph_text.hpp, docs/ir.md): round trips for every op kind and
// for builder-made graphs, exact error positions, and a seeded random-mutation test that
// the parser only ever succeeds or throws tessel::Error.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "tessel/ops/builders.hpp"
#include "tessel/ir/graph.hpp"
#include "tessel/ops/registry.hpp"
#include "tessel/ir/graph_text.hpp"
#include "test_util.hpp"

using namespace tessel;

namespace {

bool same_bits(double a, double b) {
  uint64_t x = 0, y = 0;
  std::memcpy(&x, &a, sizeof x);
  std::memcpy(&y, &b, sizeof y);
  return x == y;
}

// First difference between two graphs, or "" when they are the same graph.
std::string graph_diff(const Graph& a, const Graph& b) {
  std::ostringstream d;
  if (a.values.size() != b.values.size()) {
    d << "value count " << a.values.size() << " vs " << b.values.size();
    return d.str();
  }
  for (std::size_t i = 0; i < a.values.size(); ++i) {
    const Value &x = a.values[i], &y = b.values[i];
    if (x.name != y.name || x.shape != y.shape || x.dtype != y.dtype || x.producer != y.producer)
      d << "value " << i << " (%" << x.name << " vs %" << y.name << ") differs";
    if (!d.str().empty()) return d.str();
  }
  if (a.ops.size() != b.ops.size()) return "op count differs";
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    const Op &x = a.ops[i], &y = b.ops[i];
    const OpAttrs &p = x.attrs, &q = y.attrs;
    std::string what = "op #" + std::to_string(i) + " " + op_name(x.kind) + ": ";
    if (x.kind != y.kind) return what + "kind";
    if (x.inputs != y.inputs) return what + "inputs";
    if (x.output != y.output || x.extra_outputs != y.extra_outputs) return what + "output";
    if (p.equation != q.equation) return what + "equation";
    if (p.dims != q.dims) return what + "dims";
    if (p.shape != q.shape) return what + "shape";
    if (p.starts != q.starts || p.limits != q.limits) return what + "starts/limits";
    if (p.axis != q.axis) return what + "axis";
    if (!same_bits(p.scalar, q.scalar)) return what + "scalar";
    if (!same_bits(p.eps, q.eps)) return what + "eps";
    if (p.keepdims != q.keepdims) return what + "keepdims";
    if (p.sharding != q.sharding) return what + "sharding";
    if (p.priority != q.priority) return what + "priority";
    if (p.dtype != q.dtype) return what + "dtype";
  }
  if (a.inputs != b.inputs) return "inputs differ";
  if (a.outputs != b.outputs) return "outputs differ";
  if (a.annotations.size() != b.annotations.size()) return "annotation count differs";
  for (const auto& [v, ann] : a.annotations) {
    auto it = b.annotations.find(v);
    if (it == b.annotations.end()) return "annotation of value " + std::to_string(v) + " missing";
    if (ann.sharding != it->second.sharding || ann.priority != it->second.priority)
      return "annotation of value " + std::to_string(v) + " differs";
  }
  if (a.mesh.has_value() != b.mesh.has_value()) return "mesh presence differs";
  if (a.mesh && *a.mesh != *b.mesh) return "mesh differs";
  return "";
}

// Prints, parses, compares, and checks that printing is a fixed point.
void check_round_trip(const Graph& g, const PrintOptions& opts = {}) {
  const std::string text = print_graph(g, opts);
  INFO("printed:\n" << text);
  Graph back = parse_graph(text);
  CHECK(graph_diff(g, back) == "");
  CHECK(print_graph(back, opts) == text);
  CHECK(print_graph(back) == print_graph(g));
}

// The message of the ParseError `text` throws ("" when it parses).
std::string parse_error(const std::string& text) {
  try {
    parse_graph(text);
  } catch (const ParseError& e) {
    return e.what();
  }
  return "";
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Every op kind, annotations, priorities, a mesh, several output lines.
const char* const kAllOps = R"tsl(# every op kind of the IR
mesh data=2, model=4
%x = input f32[8,16,32] sharding=[{data}, {}, {}]
%w = input f32[32,64] sharding=[{}, {model}] priority=1
%ids = input i32[8,16]
%table = input f32[100,32]
%c = constant f32[] value=0.5
%c2 = constant bf16[2,3] value=-1.25e-07
%h = einsum(%x, %w) eq="bsd,df->bsf" : f32[8,16,64]
%e1 = einsum(%h) eq="bsf->fsb"
%n = neg(%h)
%ex = exp(%n)
%lg = log(%ex)
%th = tanh(%lg)   # a comment after a statement
%ge = gelu(%th)
%re = relu(%ge)

%sq = sqrt(%re)
%rs = rsqrt(%sq)
%a = add(%rs, %c)
%s = sub(%a, %h)
%m = mul(%s, %h)
%d = div(%m, %h)
%mx = max(%d, %h)
%r1 = reduce_sum(%mx) dims=[1] keepdims=true
%r2 = reduce_max(%mx) dims=[2,0]
%r3 = reduce_mean(%mx) dims=[-1]
%t = transpose(%mx) perm=[0,2,1]
%rsh = reshape(%mx) shape=[8,16,8,8]
%bc = broadcast(%r1) shape=[8,16,64]
%sl = slice(%mx) starts=[0,0,0] limits=[8,8,64]
%cc = concat(%sl, %sl) axis=1
%sm = softmax(%cc) axis=-1
%gamma = input f32[64]
%beta = input f32[64]
%ln = layer_norm(%sm, %gamma, %beta) eps=1e-05
%emb = embedding(%table, %ids)
%lbl = input i32[8,16]
%logits = einsum(%emb, %w) eq="bsd,dv->bsv"
%ce = cross_entropy(%logits, %lbl)
%scores = einsum(%x, %x) eq="bqd,bkd->bqk"
%cm = causal_mask(%scores) sharding=[{data}, {?}, {}]
%sc = sharding_constraint(%ln) sharding=[{data}, {?}, {model, ?}] priority=2
%g2 = gelu(%sc) sharding=[{data}, {}, {model}] priority=3
%sg = sigmoid(%h)
%si = silu(%sg)
%cs = cast(%si) dtype=bf16
%ci = cast(%ids) dtype=f32
%q1 = eq(%ids, %lbl)
%q2 = ne(%h, %h)
%q3 = lt(%h, %c)
%q4 = le(%ids, %lbl)
%q5 = gt(%ids, %lbl)
%q6 = ge(%h, %h)
%wh = where(%q3, %h, %si)
%oh = one_hot(%ids) depth=100 dtype=bf16
%ga = gather(%table, %ids) axis=0
%sa = scatter_add(%emb, %ids) depth=100 axis=0
%pos = input i32[8]
%wrow = input f32[8,32]
%wa = write_at(%emb, %pos, %wrow) axis=1
%temp = input f32[8,16]
%tok = sample_tokens(%logits, %ids, %temp, %lbl, %temp)
%mp = mask_padding(%h) axis=2 depth=60 value=-inf
%dx, %dgamma, %dbeta = layer_norm_grad(%sm, %gamma, %h) eps=1e-05 sharding=([{data}, {?}, {}], _, [{}]) priority=(0, 0, 1)
%lr = constant f32[] value=0.001
%gg = gelu_grad(%h, %h)
%sgr = softmax_grad(%sm, %sm) axis=-1
%ceg = cross_entropy_grad(%logits, %lbl, %ce)
%fe = fused_elementwise(%h, %c) expr="exp($0);where(gt(#0,$1),#0,mul($1,0.5:f32[]))"
%fs = fused_softmax(%h) expr="causal_mask(mul($0,0.125:f32[]))" axis=-1
%fei = fused_einsum(%x, %w, %gamma, %h) eq="bsd,df->bsf" epilogue="add(gelu(add($0,$1)),$2)"
%aq = input f32[8,16,4,8]
%ao, %alse = attention(%aq, %aq, %aq) layout="bshd" causal=true scale=0.25
%adq, %adk, %adv = attention_grad(%aq, %aq, %aq, %ao, %alse, %ao) layout="bshd" causal=true scale=0.25
%pn, %mn, %vn = adamw(%h, %h, %h, %h, %lr, %c, %c, %c) beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0.01
output %ce, %cm
output %g2
)tsl";

}  // namespace

TEST_CASE("text: every op kind parses and round-trips", "[text]") {
  Graph g = parse_graph(kAllOps, "all.tsl");
  std::set<int> kinds;
  for (const Op& op : g.ops) kinds.insert(static_cast<int>(op.kind));
  for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k) {
    INFO("op kind " << op_name(static_cast<OpKind>(k)));
    CHECK(kinds.count(k) == 1);
  }

  REQUIRE(g.mesh.has_value());
  CHECK(*g.mesh == Mesh({{"data", 2}, {"model", 4}}));
  CHECK(g.inputs.size() == 11);
  CHECK(g.outputs == std::vector<int>{g.find("ce"), g.find("cm"), g.find("g2")});

  const Op& sm = g.ops[g.values[g.find("sm")].producer];
  CHECK(sm.attrs.axis == 2);  // stored normalized
  const Op& r2 = g.ops[g.values[g.find("r2")].producer];
  CHECK(r2.attrs.dims == std::vector<int64_t>{0, 2});
  const Op& r1 = g.ops[g.values[g.find("r1")].producer];
  CHECK(r1.attrs.keepdims);
  CHECK(g.values[g.find("r1")].shape == Shape{8, 1, 64});
  const Op& c2 = g.ops[g.values[g.find("c2")].producer];
  CHECK(c2.attrs.scalar == -1.25e-07);
  CHECK(c2.attrs.dtype == DType::bf16);
  CHECK(g.values[g.find("c2")].shape == Shape{2, 3});
  const Op& ln = g.ops[g.values[g.find("ln")].producer];
  CHECK(ln.attrs.eps == 1e-05);

  // sharding_constraint: sharding/priority are op attributes, not an annotation.
  const int sc = g.find("sc");
  const Op& sco = g.ops[g.values[sc].producer];
  REQUIRE(sco.attrs.sharding.has_value());
  CHECK(*sco.attrs.sharding == Sharding({DimSharding{{"data"}, true}, DimSharding{{}, false},
                                         DimSharding{{"model"}, false}}));
  CHECK(sco.attrs.priority == 2);
  CHECK(g.annotations.count(sc) == 0);

  // Annotations on inputs and on intermediate values.
  CHECK(g.annotations.at(g.find("x")).sharding == Sharding::of({{"data"}, {}, {}}));
  CHECK(g.annotations.at(g.find("x")).priority == 0);
  CHECK(g.annotations.at(g.find("w")).priority == 1);
  CHECK(g.annotations.at(g.find("g2")).sharding == Sharding::of({{"data"}, {}, {"model"}}));
  CHECK(g.annotations.at(g.find("g2")).priority == 3);
  CHECK(g.annotations.at(g.find("cm")).sharding.dims[1].closed == false);

  check_round_trip(g);
  PrintOptions no_types;
  no_types.types = false;
  check_round_trip(g, no_types);
}

TEST_CASE("text: printed form is canonical", "[text]") {
  const std::string text = R"(mesh {data=2, model=4}
%x = input f32[8,6] sharding=[{data},{}]   # spaces are free
%y = softmax(%x)
%z = reduce_sum(%y) dims=[-1] keepdims=false
%k = layer_norm(%x, %g, %b)
)";
  // %g and %b are undefined: the last line is an error; drop it for the canonical check.
  CHECK(parse_error(text).find("undefined value %g") != std::string::npos);
  const std::string ok = text.substr(0, text.find("%k ="));
  Graph g = parse_graph(ok);
  CHECK(print_graph(g) ==
        "mesh data=2, model=4\n"
        "%x = input f32[8,6] sharding=[{data}, {}]\n"
        "%y = softmax(%x) axis=1 : f32[8,6]\n"
        "%z = reduce_sum(%y) dims=[1] : f32[8]\n");
  PrintOptions o;
  o.types = false;
  o.comment = [](int v) { return v == 1 ? std::string("the\nsoftmax") : std::string(); };
  CHECK(print_graph(g, o) ==
        "mesh data=2, model=4\n"
        "%x = input f32[8,6] sharding=[{data}, {}]\n"
        "%y = softmax(%x) axis=1  # the softmax\n"
        "%z = reduce_sum(%y) dims=[1]\n");
  check_round_trip(g, o);
}

TEST_CASE("text: a builder-made Megatron MLP round-trips", "[text]") {
  Graph g;
  g.mesh = Mesh({{"data", 2}, {"model", 4}});
  Tensor x = input(g, "x", DType::f32, {8, 128, 512});
  Tensor w1 = input(g, "w1", DType::f32, {512, 2048});
  Tensor w2 = input(g, "w2", DType::f32, {2048, 512});
  Tensor gamma = input(g, "ln.gamma", DType::f32, {512});
  Tensor beta = input(g, "ln.beta", DType::f32, {512});
  g.annotate(x, Sharding::of({{"data"}, {}, {}}));
  g.annotate(w1, Sharding::of({{}, {"model"}}));
  g.annotate(w2, Sharding::of({{"model"}, {}}), 1);
  Tensor n = layer_norm(x, gamma, beta, 1e-6);
  Tensor h = gelu(einsum("bsd,df->bsf", n, w1)).named("hidden");
  Tensor y = einsum("bsf,fd->bsd", h, w2) * 0.1;  // a fresh-named constant and mul
  Tensor z = shard(y + x, Sharding({DimSharding{{"data"}, true}, DimSharding{{}, false},
                                    DimSharding{{}, true}}),
                   4);
  Tensor s = softmax(reduce_mean(z, {-1}, true), 1);
  Tensor odd = constant(g, 0.1 + 0.2, DType::f32, {});  // 0.30000000000000004
  Tensor r = reduce_max(transpose(reshape(z, {8, 128, 8, 64}), {0, 2, 1, 3}), {3});
  Tensor q = slice(concat({r, r}, 2), {0, 0, 0}, {8, 8, 64});
  g.annotate(q, Sharding::of({{"data"}, {}, {}}), 2);
  g.mark_output(z);
  g.mark_output(s);
  g.mark_output(odd);
  g.mark_output(broadcast_to(q, {2, 8, 8, 64}));
  g.mark_output(z);  // an output listed twice stays listed twice

  check_round_trip(g);
  PrintOptions o;
  o.types = false;
  o.comment = [&g](int v) { return g.describe(v); };
  check_round_trip(g, o);

  const std::string text = print_graph(g);
  CHECK(text.find("%hidden = gelu(") != std::string::npos);
  CHECK(text.find("%ln.gamma = input f32[512]\n") != std::string::npos);
  CHECK(text.find("value=0.30000000000000004") != std::string::npos);
  CHECK(text.find("eps=1e-06") != std::string::npos);
  CHECK(text.find("sharding=[{model}, {}] priority=1") != std::string::npos);
  CHECK(text.find("sharding_constraint(") != std::string::npos);
  CHECK(text.find("sharding=[{data}, {?}, {}] priority=4") != std::string::npos);
}

TEST_CASE("text: unusual names / scalars and meshes round-trip", "[text]") {
  Graph g;
  g.mesh = Mesh({{"x", 2}, {"y", 2}}, {3, 1, 2, 0});
  Tensor a = input(g, "weird name \"q\"\t#1", DType::f16, {4});
  g.annotate(a, Sharding::of({{"y", "x"}}));
  for (double v : {0.0, -0.0, 1e300, -2.5e-308, 5e-324, 1.0 / 3.0, 123456789.125})
    g.mark_output(add(a, constant(g, v, DType::f16, {})));
  g.mark_output(constant(g, -2147483648.0, DType::i32, {2}));
  g.mark_output(constant(g, std::numeric_limits<double>::infinity(), DType::f32, {2}));
  g.mark_output(constant(g, -std::numeric_limits<double>::infinity(), DType::f32, {}));
  g.mark_output(constant(g, std::numeric_limits<double>::quiet_NaN(), DType::f32, {}));
  check_round_trip(g);
  CHECK(print_graph(g).find("devices=[3,1,2,0]") != std::string::npos);

  Graph empty;
  CHECK(print_graph(empty).empty());
  check_round_trip(empty);
  Graph one;
  one.mesh = Mesh();
  CHECK(print_graph(one) == "mesh {}\n");
  check_round_trip(one);
}

TEST_CASE("text: an i32 constant must hold an i32", "[text]") {
  for (const char* v : {"nan", "inf", "-inf", "0.5", "2147483648", "-2147483649"}) {
    INFO("value=" << v);
    try {
      parse_graph(std::string("%c = constant i32[2] value=") + v + "\noutput %c\n", "c.tsl");
      FAIL("accepted");
    } catch (const ParseError& e) {
      CHECK(std::string(e.what()).find("is not an i32") != std::string::npos);
    }
  }
  CHECK_NOTHROW(parse_graph("%c = constant i32[2] value=-2147483648\noutput %c\n"));
  Graph g;
  CHECK_THROWS_AS(constant(g, std::numeric_limits<double>::quiet_NaN(), DType::i32), ShapeError);
}

TEST_CASE("text: sharding text agrees with Sharding::to_string", "[text]") {
  for (const char* s : {"[]", "[{data}, {}, {model, ?}]", "[{?}, {data, model}] partial{x, y}"}) {
    Sharding sh = Sharding::parse(s);
    CHECK(sh.to_string() == s);
  }
  // A sharding_constraint may carry a partial sharding; its text is the library's text.
  Graph g = parse_graph(
      "%x = input f32[8,8]\n%y = sharding_constraint(%x) sharding=[{a, ?}, {}] partial{b, c}\n");
  const Sharding& s = *g.ops[1].attrs.sharding;
  CHECK(s == Sharding::parse("[{a, ?}, {}] partial{b, c}"));
  CHECK(print_graph(g).find("sharding=" + s.to_string() + " : f32[8,8]") != std::string::npos);
}

TEST_CASE("text: errors name file / line and column", "[text]") {
  SECTION("unknown op") {
    std::string e = parse_error("%x = input f32[2]\n%y = frob(%x)\n");
    CHECK(starts_with(e, "<input>:2:6: unknown op 'frob'"));
    // The offending line is echoed with a caret under the column.
    CHECK(e.find("\n  %y = frob(%x)\n       ^") != std::string::npos);
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = gleu(%x)\n"),
                      "<input>:2:6: unknown op 'gleu' (did you mean 'gelu'?)"));
  }
  SECTION("undefined value") {
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = gelu(%foo)\n"),
                      "<input>:2:11: undefined value %foo"));
    CHECK(starts_with(parse_error("%x = input f32[2]\noutput %x, %nope"),
                      "<input>:2:12: undefined value %nope"));
    // A value is defined by its line, not before.
    CHECK(starts_with(parse_error("%y = gelu(%y)"), "<input>:1:11: undefined value %y"));
  }
  SECTION("bad shape") {
    CHECK(starts_with(parse_error("%x = input f32[2,-3]"),
                      "<input>:1:18: expected a non-negative dimension, got -3"));
    CHECK(starts_with(parse_error("%x = input f32[2,3\n"),
                      "<input>:1:19: expected ',' or ']' in the shape list, got end of line"));
    CHECK(starts_with(parse_error("%x = input f33[2]"), "<input>:1:12: expected a type like"));
    CHECK(starts_with(parse_error("%x = input f32[99999999999,99999999999]"),
                      "<input>:1:28: shape is too large"));
    // Shape errors of the builder are reported at the op with the builder's message.
    std::string e = parse_error("%x = input f32[2,3]\n%y = reshape(%x) shape=[4,2]\n");
    CHECK(starts_with(e, "<input>:2:6: reshape(%x: f32[2,3]): cannot reshape"));
    CHECK(starts_with(parse_error("%x = input f32[2,0]"), "<input>:1:6: input %x: shape [2,0]"));
  }
  SECTION("type mismatch") {
    std::string e = parse_error("%x = input f32[2,3]\n%y = gelu(%x) : f32[3,2]\n");
    CHECK(starts_with(e, "<input>:2:17: type mismatch for %y: the text says f32[3,2] but gelu "
                         "infers f32[2,3]"));
    CHECK(starts_with(parse_error("%x = input f32[2,3]\n%y = gelu(%x) : bf16[2,3]\n"),
                      "<input>:2:17: type mismatch for %y"));
  }
  SECTION("einsum shape mismatch") {
    std::string e = parse_error(
        "%a = input f32[2,3]\n%b = input f32[4,5]\n%c = einsum(%a, %b) eq=\"ij,jk->ik\"\n");
    CHECK(starts_with(e, "<input>:3:6: einsum("));
    CHECK(e.find("f32[2,3]") != std::string::npos);
    CHECK(e.find("f32[4,5]") != std::string::npos);
  }
  SECTION("unterminated string") {
    CHECK(starts_with(parse_error("%a = input f32[2,3]\n%b = input f32[3,5]\n"
                                  "%c = einsum(%a, %b) eq=\"ij,jk->ik\n"),
                      "<input>:3:24: unterminated string"));
    CHECK(starts_with(parse_error("%\"abc = input f32[2]"), "<input>:1:2: unterminated string"));
  }
  SECTION("bad sharding text") {
    CHECK(starts_with(parse_error("%x = input f32[8,4] sharding=[{data}, {model]"),
                      "<input>:1:45: expected ',' or '}' in the dim sharding, got ']'"));
    CHECK(starts_with(parse_error("%x = input f32[8,4] sharding=[{?, data}, {}]"),
                      "<input>:1:33: expected '}' after '?'"));
    CHECK(starts_with(parse_error("%x = input f32[8,4] sharding={data}"),
                      "<input>:1:30: expected a sharding like [{data}, {}]"));
    CHECK(starts_with(parse_error("%x = input f32[8,4] sharding=[{data}, {data}]"),
                      "<input>:1:40: mesh axis 'data' is used twice"));
    CHECK(starts_with(parse_error("%x = input f32[8,4] sharding=[{data}]"),
                      "<input>:1:30: sharding [{data}] has 1 dims but %x has rank 2"));
    CHECK(starts_with(parse_error("%x = input f32[8,4] sharding=[{}, {}] partial{a}"),
                      "<input>:1:30: annotate %x"));  // annotations cannot be partial
    // Against the declared mesh: unknown axis, not divisible.
    CHECK(starts_with(parse_error("mesh data=2\n%x = input f32[8,4] sharding=[{model}, {}]"),
                      "<input>:2:30: %x: sharding [{model}, {}]"));
    // An uneven split parses (it is padded when compiled, uneven.hpp).
    CHECK_NOTHROW(parse_graph("mesh data=3\n%x = input f32[8,4] sharding=[{data}, {}]"));
    CHECK(starts_with(parse_error("mesh data=2\n%x = input f32[8,4]\n"
                                  "%y = sharding_constraint(%x) sharding=[{}, {data}, {}]"),
                      "<input>:3:39: sharding [{}, {data}, {}] has 3 dims"));
  }
  SECTION("definitions and attributes") {
    CHECK(starts_with(parse_error("%x = input f32[2]\n\n%x = gelu(%x)"),
                      "<input>:3:1: duplicate definition of %x (first defined at <input>:1:1)"));
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = reduce_sum(%x)"),
                      "<input>:2:6: reduce_sum requires attribute 'dims'"));
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = gelu(%x) axis=0"),
                      "<input>:2:15: gelu has no attribute 'axis' (it takes: sharding, priority)"));
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = softmax(%x) axis=0 axis=0"),
                      "<input>:2:25: attribute 'axis' is given twice"));
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = softmax(%x) axis=x"),
                      "<input>:2:23: expected an integer (axis), got 'x'"));
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = reduce_sum(%x) dims=[0] keepdims=1"),
                      "<input>:2:39: expected true or false (keepdims), got '1'"));
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = softmax(%x) axis=5"),
                      "<input>:2:6: softmax: axis 5 is out of range for rank 1"));
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = gelu(%x, %x)"),
                      "<input>:2:6: gelu takes 1 operand, got 2"));
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = gelu(%x) priority=1"),
                      "<input>:2:15: 'priority' needs a 'sharding'"));
    CHECK(starts_with(parse_error("%x = input(%y)"), "<input>:1:11: input takes no operands"));
    CHECK(starts_with(parse_error("%c = constant f32[]"),
                      "<input>:1:6: constant requires attribute 'value'"));
    CHECK(starts_with(parse_error("%c = constant f32[] value=1e999"),
                      "<input>:1:27: number 1e999 is out of range"));
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = einsum(%x) eq=i->i"),
                      "<input>:2:20: expected an einsum equation string"));
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = einsum(%x) eq=\"i->j\""),
                      "<input>:2:6: einsum("));
    CHECK(starts_with(parse_error("%x = input f32[2]\n%y = softmax(%x) axis=99999999999999999999"),
                      "<input>:2:23: integer 99999999999999999999 is out of range"));
  }
  SECTION("statements and lexing") {
    CHECK(starts_with(parse_error("x = input f32[2]"), "<input>:1:1: expected a statement"));
    CHECK(starts_with(parse_error("%x input f32[2]"), "<input>:1:4: expected '=' after %x"));
    CHECK(starts_with(parse_error("%x = input f32[2] @"), "<input>:1:19: unexpected character '@'"));
    CHECK(starts_with(parse_error("%x = input f32[2]\x01"), "<input>:1:18: unexpected byte 0x01"));
    CHECK(starts_with(parse_error("% = input f32[2]"), "<input>:1:1: expected a value name"));
    CHECK(starts_with(parse_error("%x = input f32[2]\noutput"),
                      "<input>:2:7: expected a value '%name', got end of line"));
    CHECK(starts_with(parse_error("%x = input f32[2]\nmesh data=2"),
                      "<input>:2:1: the mesh must be declared before the first value"));
    CHECK(starts_with(parse_error("mesh data=2\nmesh data=2"),
                      "<input>:2:1: mesh declared twice (first on line 1)"));
    CHECK(starts_with(parse_error("mesh data=0"), "<input>:1:1: mesh axis 'data' has size 0"));
    CHECK(starts_with(parse_error("mesh {data=2"), "<input>:1:13: expected '}' to close the mesh"));
    CHECK(starts_with(parse_error("mesh a=65536, b=65536"), "<input>:1:1: mesh has more than"));
    // \r\n line ends are fine; tabs keep the caret aligned.
    CHECK(parse_graph("%x = input f32[2]\r\n%y = gelu(%x)\r\n").ops.size() == 2);
    std::string e = parse_error("\t%x = frob()");
    CHECK(starts_with(e, "<input>:1:7: unknown op 'frob'"));
    CHECK(e.find("\n  \t%x = frob()\n  \t     ^") != std::string::npos);
  }
  SECTION("filename") {
    try {
      parse_graph("%x = gelu(%y)", "model.tsl");
      FAIL("no error");
    } catch (const ParseError& err) {
      CHECK(starts_with(err.what(), "model.tsl:1:11: undefined value %y"));
    }
  }
}

TEST_CASE("text: parse_graph_file", "[text]") {
  CHECK_THROWS_AS(parse_graph_file("/nonexistent/dir/graph.tsl"), ParseError);
  const std::string path = "/tmp/tessel_test_text_" + std::to_string(::getpid()) + ".tsl";
  {
    std::ofstream f(path);
    f << kAllOps << "%bad = gelu(%undefined)\n";
  }
  try {
    parse_graph_file(path);
    FAIL("no error");
  } catch (const ParseError& e) {
    CHECK(starts_with(e.what(), path + ":"));
    CHECK(std::string(e.what()).find("undefined value %undefined") != std::string::npos);
  }
  {
    std::ofstream f(path);
    f << kAllOps;
  }
  CHECK(print_graph(parse_graph_file(path)) == print_graph(parse_graph(kAllOps)));
  std::remove(path.c_str());
}

TEST_CASE("text: random mutations either parse or throw tessel::Error", "[text][fuzz]") {
  const uint64_t seed = tessel_test::seed();
  const int cases = tessel_test::cases(2000);
  tessel_test::announce("text: random mutations either parse or throw tessel::Error", seed, cases);
  INFO("seed " << seed << " (TESSEL_SEED=" << seed << " reproduces)");
  std::mt19937_64 rng(seed);
  auto pick = [&rng](std::size_t n) {
    return n == 0 ? std::size_t{0} : std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };
  const std::string alphabet = "%=,[]{}():?#\"\\-+.0123456789eE_ \tabcdfijkxyz\n";
  // Two bases: every op kind, and quoted names / escapes / odd scalars / device ids.
  const std::vector<std::string> bases = {
      kAllOps,
      "mesh {x=2, y=2} devices=[3,1,2,0]\n"
      "%\"a b\\\"c\\x01\" = input f16[4,2] sharding=[{y, x}, {?}] priority=7\n"
      "%k.1 = constant f16[] value=-inf\n%k-2 = constant i32[2] value=-7\n"
      "%s = add(%\"a b\\\"c\\x01\", %k.1) : f16[4,2]\n"
      "%t = sharding_constraint(%s) sharding=[{x}, {}] partial{y} priority=1\n"
      "%u = einsum(%t) eq=\"ij->j\" sharding=[{?}]\n"
      "output %u, %k-2\n"};
  for (const std::string& b : bases) check_round_trip(parse_graph(b));

  auto split_lines = [](const std::string& s) {
    std::vector<std::string> lines;
    std::size_t b = 0;
    while (b <= s.size()) {
      std::size_t e = s.find('\n', b);
      if (e == std::string::npos) e = s.size();
      lines.push_back(s.substr(b, e - b));
      b = e + 1;
    }
    return lines;
  };
  auto join_lines = [](const std::vector<std::string>& lines) {
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  };

  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < cases; ++iter) {
    std::string t = bases[pick(bases.size())];
    const int mutations = 1 + static_cast<int>(pick(4));
    for (int m = 0; m < mutations; ++m) {
      const std::size_t kind = pick(8);
      if (kind <= 4 && t.empty()) continue;
      const std::size_t at = pick(t.size());
      switch (kind) {
        case 0: t[at] = alphabet[pick(alphabet.size())]; break;
        case 1: t[at] = static_cast<char>(pick(256)); break;
        case 2: t.erase(at, 1 + pick(3)); break;
        case 3: t.insert(at, 1, alphabet[pick(alphabet.size())]); break;
        case 4: t.insert(at, t.substr(pick(t.size()), 1 + pick(12))); break;
        default: {
          std::vector<std::string> lines = split_lines(t);
          const std::size_t i = pick(lines.size()), j = pick(lines.size());
          if (kind == 5) lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(i));
          else if (kind == 6) lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), lines[j]);
          else std::swap(lines[i], lines[j]);
          t = join_lines(lines);
        }
      }
    }
    INFO("iteration " << iter << ", text:\n" << t);
    try {
      Graph g = parse_graph(t, "fuzz.tsl");
      ++parsed;
      // Whatever parses must print and parse back to the same graph.
      const std::string p = print_graph(g);
      Graph back = parse_graph(p);
      REQUIRE(graph_diff(g, back) == "");
      REQUIRE(print_graph(back) == p);
    } catch (const tessel::Error& e) {
      ++rejected;
      // Every rejection names a position: "fuzz.tsl:line:col: ..." (or the round trip's).
      const std::string msg = e.what();
      if (!starts_with(msg, "fuzz.tsl:")) FAIL("message without a position: " << msg);
    } catch (const std::exception& e) {
      FAIL("threw a non-tessel exception: " << e.what());
    }
  }
  WARN("fuzz: parsed " << parsed << ", rejected " << rejected << " (seed " << seed << ")");
  if (cases >= 200) {  // with a handful of cases either outcome may not occur
    CHECK(rejected > 0);
    CHECK(parsed > 0);
  }
}
