// Training (train.hpp): AdamW against a hand-computed update, ZeRO layouts, every ZeRO stage
// equal to stage 0 and to one device over several donated steps, and the errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <set>

#include "tessel/ops/builders.hpp"
#include "tessel/runtime/cpu/thread_runtime.hpp"
#include "tessel/executable.hpp"
#include "tessel/models/gpt.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_verify.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "tessel/runtime/reference.hpp"
#include "tessel/train/train_step.hpp"
#include "test_util.hpp"

using namespace tessel;

namespace {

// Parameters after an Adam step: an element whose gradient is a sum that nearly cancels has
// a gradient known only to a few digits, and Adam divides it by its own magnitude, so its
// update can differ by a small fraction of the learning rate (1e-2 here) between summation
// orders. Everything else agrees to 1e-5 of the inputs' scale.
double tolerance(const std::string& output) {
  return output.rfind("next.", 0) == 0 && output.rfind("next.adam.", 0) != 0 ? 2e-4 : 1e-5;
}

// A small GptConfig: batch, sequence, width, heads, layers and vocabulary.
GptConfig gpt_config(int64_t batch, int64_t seq, int64_t d_model, int64_t heads, int64_t layers, int64_t vocab) {
  GptConfig c;
  c.batch = batch, c.seq = seq, c.d_model = d_model, c.heads = heads, c.layers = layers, c.vocab = vocab;
  return c;
}

HostTensor scalar(double v) {
  HostTensor h(DType::f32, {});
  h.set(0, v);
  return h;
}

}  // namespace

TEST_CASE("train: AdamW with clipping and decoupled decay equals the formula", "[train]") {
  // loss = sum(w * x): dloss/dw = x, a known gradient.
  Graph g;
  Tensor w = input(g, "w", DType::f32, {2, 3});
  Tensor x = input(g, "x", DType::f32, {2, 3});
  Tensor loss = reduce_sum(mul(w, x), {0, 1});
  g.mark_output(loss);
  TrainOptions o;
  o.adamw.clip_norm = 0.5;
  o.adamw.weight_decay = 0.1;
  TrainStep s = add_train_step(g, loss, {w}, Mesh::parse("data=1"), o);
  auto in = random_inputs(g, 3);
  std::map<std::string, std::size_t> at;
  for (std::size_t i = 0; i < g.inputs.size(); ++i) at[g.values[static_cast<std::size_t>(g.inputs[i])].name] = i;
  const int t = 3;
  const double lr = 0.01, b1 = o.adamw.beta1, b2 = o.adamw.beta2, eps = o.adamw.eps;
  in[at["adam.lr"]] = scalar(lr);
  in[at["adam.bc1"]] = scalar(1 / (1 - std::pow(b1, t)));
  in[at["adam.bc2"]] = scalar(1 / (1 - std::pow(b2, t)));
  for (int64_t j = 0; j < 6; ++j) in[at["adam.v.w"]].set(j, std::abs(in[at["adam.v.w"]].get(j)));  // v >= 0
  auto out = run_reference(g, in);
  double norm = 0;
  for (int64_t j = 0; j < 6; ++j) norm += in[at["x"]].get(j) * in[at["x"]].get(j);
  norm = std::sqrt(norm);
  CHECK(out[1].get(0) == Approx(norm).epsilon(1e-6));  // grad_norm
  const double scale = norm > 0.5 ? 0.5 / (norm + 1e-6) : 1.0;
  for (int64_t j = 0; j < 6; ++j) {
    const double gr = in[at["x"]].get(j) * scale, p = in[at["w"]].get(j);
    const double m = b1 * in[at["adam.m.w"]].get(j) + (1 - b1) * gr;
    const double v = b2 * in[at["adam.v.w"]].get(j) + (1 - b2) * gr * gr;
    const double u = (m / (1 - std::pow(b1, t))) / (std::sqrt(v / (1 - std::pow(b2, t))) + eps) + 0.1 * p;
    INFO("element " << j);
    CHECK(out[2].get(j) == Approx(p - lr * u).epsilon(1e-5));  // next.w
    CHECK(out[3].get(j) == Approx(m).epsilon(1e-5));          // next.adam.m.w
    CHECK(out[4].get(j) == Approx(v).epsilon(1e-5));          // next.adam.v.w
  }
  CHECK(s.next_params[0].name() == "next.w");
  REQUIRE(s.donations().size() == 3);
  CHECK(s.donations()[0] == std::make_pair(std::string("w"), std::string("next.w")));
}

TEST_CASE("train: zero_layout adds the data axis to the first dim that divides", "[train]") {
  const Mesh mesh = Mesh::parse("data=2,model=2");
  CHECK(zero_layout(Sharding::parse("[{}, {}]"), {6, 4}, mesh, "data").same_layout(Sharding::parse("[{data}, {}]")));
  CHECK(zero_layout(Sharding::parse("[{}, {}]"), {5, 4}, mesh, "data").same_layout(Sharding::parse("[{}, {data}]")));
  CHECK(zero_layout(Sharding::parse("[{model}, {}]"), {4, 6}, mesh, "data").same_layout(Sharding::parse("[{model}, {data}]")));
  CHECK(zero_layout(Sharding::parse("[{model}, {}]"), {4, 5}, mesh, "data").same_layout(Sharding::parse("[{model, data}, {}]")));
  CHECK(zero_layout(Sharding::parse("[{}]"), {3}, mesh, "data").same_layout(Sharding::parse("[{}]")));  // none divides
  CHECK(zero_layout(Sharding::parse("[{data}]"), {4}, mesh, "data").same_layout(Sharding::parse("[{data}]")));
  CHECK(zero_layout(Sharding::parse("[]"), {}, mesh, "data").same_layout(Sharding::parse("[]")));
}

TEST_CASE("train: every ZeRO stage equals stage 0 and one device over donated steps", "[train]") {
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce("train: every ZeRO stage equals stage 0 and one device over donated steps", seed, 1);
  const Mesh mesh = Mesh::parse("data=2,model=2");
  GptConfig cfg;
  cfg.batch = 4;
  cfg.seq = 8;
  cfg.d_model = 16;
  cfg.heads = 2;
  cfg.layers = 1;
  cfg.vocab = 32;
  std::vector<std::vector<HostTensor>> finals;
  std::vector<std::string> output_names;
  for (int zero = 0; zero <= 3; ++zero) {
    INFO("zero " << zero);
    GptGraph m = build_gpt(cfg);
    TrainOptions o;
    o.zero = zero;
    // Adam divides a gradient by its own magnitude plus eps: a gradient element near zero
    // (seed 1795431374179053296 has one at -1e-8, next to gradients of 1e-3) turns summation-
    // order noise of 1e-10 into an update that differs by a few percent of the learning rate
    // with eps = 1e-8. eps = 1e-6 bounds that sensitivity (lr / eps per unit of gradient) so
    // the tolerance below measures the partitioning, not the conditioning of one element.
    o.adamw.eps = 1e-6;
    TrainStep s = add_train_step(m.graph, m.loss, m.weights, mesh, o);
    Graph& g = m.graph;
    Executable exe = compile(g, mesh);
    ThreadRuntime rt(mesh.num_devices());
    LoadOptions lo;
    lo.donate = s.donations();
    LoadedExecutable prog = load(exe, rt, lo);
    std::vector<HostTensor> host = random_inputs(g, seed);
    std::map<std::string, std::size_t> at;
    for (std::size_t i = 0; i < g.inputs.size(); ++i) at[g.values[static_cast<std::size_t>(g.inputs[i])].name] = i;
    for (const auto& [name, i] : at)
      if (name.rfind("adam.", 0) == 0 || name.find("_g") != std::string::npos) {
        for (int64_t j = 0; j < host[i].numel(); ++j) host[i].set(j, name.rfind("adam.", 0) == 0 ? 0.0 : 1.0);
      } else if (host[i].dtype() == DType::f32) {
        for (int64_t j = 0; j < host[i].numel(); ++j) host[i].set(j, host[i].get(j) * 0.05);
      }
    std::vector<ShardedArray> args;
    for (std::size_t i = 0; i < host.size(); ++i) args.push_back(prog.to_device(i, host[i]));
    std::vector<int> feeds(g.outputs.size(), -1);
    for (std::size_t o2 = 0; o2 < g.outputs.size(); ++o2) {
      const std::string& name = g.values[static_cast<std::size_t>(g.outputs[o2])].name;
      if (name.rfind("next.", 0) == 0) feeds[o2] = static_cast<int>(at.at(name.substr(5)));
    }
    std::vector<HostTensor> last;
    for (int t = 1; t <= 3; ++t) {
      host[at["adam.lr"]] = scalar(1e-2);
      host[at["adam.bc1"]] = scalar(1 / (1 - std::pow(0.9, t)));
      host[at["adam.bc2"]] = scalar(1 / (1 - std::pow(0.999, t)));
      for (const char* name : {"adam.lr", "adam.bc1", "adam.bc2"}) args[at[name]] = prog.to_device(at[name], host[at[name]]);
      RunResult r = prog.run(args);
      std::vector<HostTensor> ref = run_reference(g, host);
      last.clear();
      for (std::size_t o2 = 0; o2 < r.outputs.size(); ++o2) {
        HostTensor got = prog.to_host(r.outputs[o2], /*check_replicas=*/true);
        CompareResult cmp = compare(got, ref[o2], 1.0);
        const std::string& name = g.values[static_cast<std::size_t>(g.outputs[o2])].name;
        INFO("step " << t << " output %" << name << ": " << cmp.to_string());
        CHECK(cmp.max_rel_err <= tolerance(name));
        last.push_back(got);
      }
      // Both continue from the partitioned run's state (donated on the devices, copied for the
      // reference): each step checks that step's error. Two trajectories would drift apart
      // (parameters agree to 2e-4 after a step, so the next step's grad_norm would differ by
      // more than 1e-5: seed 1795432367451081679 in the Eigen build).
      for (std::size_t o2 = 0; o2 < feeds.size(); ++o2)
        if (feeds[o2] >= 0) {
          args[static_cast<std::size_t>(feeds[o2])] = r.outputs[o2];
          host[static_cast<std::size_t>(feeds[o2])] = last[o2];
        }
    }
    finals.push_back(std::move(last));
    output_names.clear();
    for (int v : g.outputs) output_names.push_back(g.values[static_cast<std::size_t>(v)].name);
  }
  for (std::size_t z = 1; z < finals.size(); ++z)
    for (std::size_t o = 0; o < finals[0].size(); ++o) {
      CompareResult cmp = compare(finals[z][o], finals[0][o], 1.0);
      INFO("zero " << z << " output " << o << " against zero 0: " << cmp.to_string());
      CHECK(cmp.max_rel_err <= tolerance(output_names[o]));
    }
}

TEST_CASE("train: ZeRO splits the optimizer state and the parameters as its stage says", "[train]") {
  const Mesh mesh = Mesh::parse("data=4");
  auto bytes_per_device = [&](int zero) {
    Graph g;
    Tensor x = input(g, "x", DType::f32, {8, 16});
    Tensor w = input(g, "w", DType::f32, {16, 32});
    g.annotate(x, Sharding::parse("[{data}, {}]"));
    Tensor loss = reduce_mean(tanh(einsum("bd,df->bf", x, w)), {0, 1});
    g.mark_output(loss);
    TrainOptions o;
    o.zero = zero;
    add_train_step(g, loss, {w}, mesh, o);
    Executable exe = compile(g, mesh);
    std::map<std::string, int64_t> b;
    for (std::size_t i = 0; i < g.inputs.size(); ++i)
      b[g.values[static_cast<std::size_t>(g.inputs[i])].name] = exe.program().values[static_cast<std::size_t>(exe.program().inputs[i])].bytes();
    return b;
  };
  const int64_t full = 16 * 32 * 4;
  auto z0 = bytes_per_device(0), z1 = bytes_per_device(1), z3 = bytes_per_device(3);
  CHECK(z0["w"] == full);
  CHECK(z0["adam.m.w"] == full);
  CHECK(z1["w"] == full);
  CHECK(z1["adam.m.w"] == full / 4);
  CHECK(z1["adam.v.w"] == full / 4);
  CHECK(z3["w"] == full / 4);
  CHECK(z3["adam.m.w"] == full / 4);
}

TEST_CASE("train: errors name the stage or the parameter", "[train]") {
  Graph g;
  Tensor w = input(g, "w", DType::f32, {4});
  Tensor loss = reduce_sum(mul(w, w), {0});
  TrainOptions o;
  o.zero = 4;
  CHECK_THROWS_WITH(add_train_step(g, loss, {w}, Mesh::parse("data=2"), o), Catch::Contains("zero=4 is not a ZeRO stage"));
  o.zero = 2;
  CHECK_THROWS_WITH(add_train_step(g, loss, {w}, Mesh::parse("model=2"), o), Catch::Contains("'data', which mesh"));
  o.zero = 0;
  Tensor w2 = relu(w);
  CHECK_THROWS_WITH(add_train_step(g, loss, {w2}, Mesh::parse("data=2"), o),
                    Catch::Contains("%" + w2.name() + " must be a float input"));
  o.adamw.beta1 = 1.0;
  CHECK_THROWS_WITH(add_train_step(g, loss, {w}, Mesh::parse("data=2"), o), Catch::Contains("beta1=1"));
}

namespace {

// The longest live range of a copy of a weight (a gathered or re-laid-out block, not the stored
// input) in a lowered program, as a fraction of its instructions.
double longest_weight_copy(const Program& low, const std::set<int>& weights) {
  const std::set<int> inputs(low.inputs.begin(), low.inputs.end());
  const Liveness L = compute_liveness(low);
  double longest = 0;
  for (std::size_t v = 0; v < low.values.size(); ++v)
    if (weights.count(low.values[v].graph_value) && !inputs.count(static_cast<int>(v)) && L.first[v] >= 0)
      longest = std::max(longest, (L.last[v] - L.first[v]) / static_cast<double>(low.instrs.size()));
  return longest;
}

}  // namespace

TEST_CASE("train: ZeRO-3 without rematerialisation regathers a weight whose last use is far back", "[train][zero3]") {
  // No rematerialisation: grad() records no regions, and the partitioner's fallback applies (a
  // gathered copy is reused while its last use is at most regather_distance instructions back).
  // Parameters dominate: a small batch and sequence, wide layers.
  const GptConfig cfg = gpt_config(4, 8, 64, 2, 3, 64);
  const Mesh mesh = Mesh::parse("data=4,model=1");
  struct Result {
    int64_t peak = 0;
    double longest = 0;  // longest live range of a gathered weight, as a fraction of the program
    int gathers = 0;     // all-gathers of weights
  };
  auto run = [&](int zero, int regather_distance) {
    GptGraph m = build_gpt(cfg);
    TrainOptions o;
    o.zero = zero;
    o.checkpoints = m.checkpoints;  // without remat they divide nothing
    add_train_step(m.graph, m.loss, m.weights, mesh, o);
    CHECK(m.graph.regions.empty());
    CompileOptions co;
    co.partition.regather_distance = regather_distance;
    Executable exe = compile(m.graph, mesh, co);
    const Program low = lower_program(exe.program());
    std::set<int> weights;
    for (const Tensor& w : m.weights) weights.insert(w.id);
    Result r;
    r.peak = low.memory_plan().peak_bytes();
    r.longest = longest_weight_copy(low, weights);
    for (const Instr& in : low.instrs)
      if (in.kind == InstrKind::CollectiveStart && in.collective == CollectiveKind::AllGather &&
          weights.count(low.values[static_cast<std::size_t>(in.out)].graph_value))
        ++r.gathers;
    return r;
  };
  const Result z2 = run(2, 32), z3 = run(3, 32), z3_reuse = run(3, 0);
  INFO("peak bytes: zero 2 " << z2.peak << ", zero 3 " << z3.peak << " (reusing the forward gathers: " << z3_reuse.peak
                             << "); longest gathered-weight live range " << z3.longest << " of the program (reusing: "
                             << z3_reuse.longest << "); weight gathers " << z3.gathers << " (reusing: " << z3_reuse.gathers
                             << ")");
  CHECK(z3.peak < z2.peak);
  // Reusing the forward's gathered copies in the backward keeps them alive across most of the
  // step; gathering again keeps every gathered copy short-lived.
  CHECK(z3_reuse.longest > 0.5);
  CHECK(z3.longest < 0.25);
  CHECK(z3.gathers > z3_reuse.gathers);
  CHECK(z3.peak < z3_reuse.peak);
}

namespace {

// A ZeRO-3 GPT training step with rematerialisation on the GPT's checkpoints, compiled.
struct RematStep {
  GptGraph m;
  Executable exe;
};
RematStep zero3_remat_step(const GptConfig& cfg, const Mesh& mesh, RematPolicy remat, const PartitionOptions& po = {}) {
  GptGraph m = build_gpt(cfg);
  TrainOptions o;
  o.zero = 3;
  o.remat = remat;
  o.checkpoints = m.checkpoints;
  o.adamw.eps = 1e-6;  // see "every ZeRO stage equals stage 0": bounds Adam's sensitivity to tiny gradients
  add_train_step(m.graph, m.loss, m.weights, mesh, o);
  CompileOptions co;
  co.partition = po;
  Executable exe = compile(m.graph, mesh, co);
  return RematStep{std::move(m), std::move(exe)};
}

// The region name of an instruction of a program compiled from g ("" when it has none).
std::string region_of(const Graph& g, const Instr& in) {
  if (in.graph_op < 0) return "";
  const int r = g.ops[static_cast<std::size_t>(in.graph_op)].region;
  return r < 0 ? "" : g.regions[static_cast<std::size_t>(r)];
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

TEST_CASE("train: ZeRO-3 with rematerialisation gathers each weight once in its segment's forward and once in its backward",
          "[train][zero3]") {
  // On data=4 activations outweigh the weights, so the partitioner gathers a weight wherever an
  // op reads it; two sizes, a layer's backward well over regather_distance instructions long in
  // both: the rule follows the segments, not the distance. On gpt_train's model (--layers 4) and
  // default mesh it computes some products on a weight's shard (or re-lays the shard out by an
  // all-to-all) instead of gathering it. With mixed precision the gathered value is the weight's
  // bf16 cast (made where it is used, and recomputed in the backward): it follows the same rule.
  struct Setup {
    GptConfig cfg;
    Mesh mesh;
    bool every_read_gathers;
  };
  const Setup setups[] = {{gpt_config(8, 32, 32, 2, 3, 64), Mesh::parse("data=4,model=1"), true},
                          {gpt_config(16, 64, 64, 2, 3, 64), Mesh::parse("data=4,model=1"), true},
                          {gpt_config(8, 32, 64, 4, 4, 256), Mesh::parse("data=2,model=2"), false}};
  for (const Setup& setup : setups)
    for (const DType compute : {DType::f32, DType::bf16})
      for (const RematPolicy remat : {RematPolicy::einsums, RematPolicy::all}) {
        GptConfig cfg = setup.cfg;
        cfg.compute = compute;
        // The long-form attention: with one attention op a layer's backward under remat=einsums
        // is about 61 instructions, under the 2 x regather_distance this test needs to tell the
        // segment rule from the distance rule.
        cfg.fused_attention = false;
        INFO("d_model " << cfg.d_model << ", batch " << cfg.batch << ", seq " << cfg.seq << ", mesh "
                        << setup.mesh.to_string() << ", compute " << dtype_name(compute) << ", remat "
                        << remat_policy_name(remat));
        const Mesh& mesh = setup.mesh;
        RematStep s = zero3_remat_step(cfg, mesh, remat);
        const Graph& g = s.exe.graph();
        const Program& prog = s.exe.program();
        REQUIRE(!g.regions.empty());
        std::map<int, std::string> weight;  // value id in g (a weight or a cast of one) -> weight name
        for (const Tensor& w : s.m.weights) weight[g.find(w.name())] = w.name();
        for (const Op& op : g.ops)
          if (op.kind == OpKind::Cast && weight.count(op.inputs[0])) weight[op.output] = weight.at(op.inputs[0]);
        // The regions whose ops read each weight (the update reads the stored shard), from the graph.
        std::map<std::string, std::set<std::string>> reads;
        for (const Op& op : g.ops)
          for (int v : op.inputs)
            if (weight.count(v) && op.region >= 0 && g.regions[static_cast<std::size_t>(op.region)] != "update")
              reads[weight.at(v)].insert(g.regions[static_cast<std::size_t>(op.region)]);
        // The regions of each weight's all-gathers, from the partitioned program.
        std::map<std::string, std::multiset<std::string>> gathers;
        std::map<std::string, int> length;  // instructions per region
        for (const Instr& in : prog.instrs) {
          ++length[region_of(g, in)];
          if (in.kind == InstrKind::Collective && in.collective == CollectiveKind::AllGather) {
            const int gv = prog.values[static_cast<std::size_t>(in.out)].graph_value;
            if (weight.count(gv)) gathers[weight.at(gv)].insert(region_of(g, in));
          }
        }
        CHECK(length.at("backward 1") > 2 * PartitionOptions{}.regather_distance);
        int exactly_twice = 0;
        for (const Tensor& w : s.m.weights) {
          const std::set<std::string>& r = reads[w.name()];
          const std::multiset<std::string>& got = gathers[w.name()];
          INFO("weight %" << w.name() << " gathered " << got.size() << " times");
          // At most once a region, and only in a region that reads it.
          for (const std::string& x : got) {
            CHECK(got.count(x) == 1);
            CHECK(r.count(x) == 1);
          }
          if (remat != RematPolicy::all || !setup.every_read_gathers) continue;
          // Recomputing whole segments, every read gathers: each weight of one segment k is
          // gathered in "forward k" and, when its backward reads it, in "backward k" — all but
          // the blocks' b2 (the vjp of a bias add reads no operand, and nothing recomputes the
          // sum). wpe is added to the embedding on its shard (never gathered); the tied wte is
          // read in three regions (the lookup's forward, the LM head's forward and backward).
          if (w.name() == "wpe") {
            CHECK(got.empty());
            continue;
          }
          CHECK(got == std::multiset<std::string>(r.begin(), r.end()));
          if (got.size() == 2 && starts_with(*got.begin(), "backward ") &&
              *got.rbegin() == "forward " + got.begin()->substr(9))
            ++exactly_twice;
        }
        // 3 blocks x 11 weights and the final layer norm's two.
        if (remat == RematPolicy::all && setup.every_read_gathers) CHECK(exactly_twice == 3 * 11 + 2);
        // No copy of a weight (gathered, or re-laid out by an all-to-all) lives from one region
        // into another: each is made and last read by the ops of one region, in the partitioned
        // program and after lowering (asynchronous collectives started early, buffer planning;
        // lowering keeps the values' ids).
        std::set<int> copies;
        for (const Instr& in : prog.instrs)
          if (in.kind == InstrKind::Collective &&
              weight.count(prog.values[static_cast<std::size_t>(in.out)].graph_value))
            copies.insert(in.out);
        auto one_region = [&](const Program& p) {
          const Liveness L = compute_liveness(p);
          for (int v : copies) {
            const auto u = static_cast<std::size_t>(v);
            REQUIRE(p.values[u].name == prog.values[u].name);
            const Instr& def = p.instrs[static_cast<std::size_t>(L.first[u])];
            const Instr& last = p.instrs[static_cast<std::size_t>(L.last[u])];
            auto op = [&](const Instr& in) {
              return in.graph_op < 0 ? std::string("no op") : g.describe_op(in.graph_op);
            };
            INFO("%" << p.values[u].name << ": made for " << op(def) << ", last read by " << op(last));
            CHECK(region_of(g, def) == region_of(g, last));
          }
        };
        one_region(prog);
        one_region(lower_program(prog));
      }
}

TEST_CASE("train: ZeRO-3 regathering by region plans a lower peak than reusing every gather and keeps the numerics",
          "[train][zero3]") {
  const std::string name =
      "train: ZeRO-3 regathering by region plans a lower peak than reusing every gather and keeps the numerics";
  const uint64_t seed = tessel_test::seed();
  tessel_test::announce(name, seed, 1);
  // The narrow model of the test above, and gpt_train's model (--layers 4) on its default mesh.
  const std::pair<GptConfig, Mesh> setups[] = {{gpt_config(8, 32, 32, 2, 3, 64), Mesh::parse("data=4,model=1")},
                                               {gpt_config(8, 32, 64, 4, 4, 256), Mesh::parse("data=2,model=2")}};
  for (const auto& [cfg, mesh] : setups)
    for (const RematPolicy remat : {RematPolicy::einsums, RematPolicy::all}) {
      INFO("d_model " << cfg.d_model << ", " << cfg.layers << " layers, mesh " << mesh.to_string() << ", remat "
                      << remat_policy_name(remat));
      PartitionOptions reuse, distance;
      reuse.regather_by_region = distance.regather_by_region = false;
      reuse.regather_distance = 0;
      RematStep s = zero3_remat_step(cfg, mesh, remat);
      const RematStep r = zero3_remat_step(cfg, mesh, remat, reuse), d = zero3_remat_step(cfg, mesh, remat, distance);
      std::set<int> weights;
      for (const Tensor& w : s.m.weights) weights.insert(w.id);
      auto peak = [](const Executable& e) { return e.memory_estimate().peak_bytes(); };
      auto gathers = [](const Executable& e) { return e.program().summary().all_gather; };
      auto longest = [&](const Executable& e) { return longest_weight_copy(lower_program(e.program()), weights); };
      INFO("by region / by distance / reusing every gather: planned peak bytes per device "
           << peak(s.exe) << " / " << peak(d.exe) << " / " << peak(r.exe) << "; all-gathers " << gathers(s.exe)
           << " / " << gathers(d.exe) << " / " << gathers(r.exe) << "; longest live range of a weight copy "
           << longest(s.exe) << " / " << longest(d.exe) << " / " << longest(r.exe) << " of the program");
      CHECK(peak(s.exe) < peak(r.exe));
      CHECK(gathers(s.exe) > gathers(r.exe));
      // The step by region equals the unpartitioned step on fresh inputs (a valid state).
      const Graph& g = s.m.graph;
      std::vector<HostTensor> inputs = random_inputs(g, seed);
      gpt_init(g, inputs);
      make_train_inputs_valid(g, inputs);
      RunOptions ro;
      ro.poison = true;
      ro.check_replicas = true;
      const std::vector<HostTensor> got = s.exe.run(inputs, ro);
      const std::vector<HostTensor> want = run_reference(g, inputs);
      REQUIRE(got.size() == want.size());
      for (std::size_t o = 0; o < got.size(); ++o) {
        const std::string& out = g.values[static_cast<std::size_t>(g.outputs[o])].name;
        const CompareResult cmp = compare(got[o], want[o], 1.0);
        INFO("output %" << out << ": " << cmp.to_string());
        CHECK(cmp.max_rel_err <= tolerance(out));
      }
    }
}

TEST_CASE("train: the all-gathers ZeRO does by design are not warnings and the others still are", "[train]") {
  const GptConfig cfg = gpt_config(4, 8, 32, 2, 1, 64);
  const Mesh mesh = Mesh::parse("data=2,model=1");
  for (int zero : {1, 2, 3}) {
    INFO("zero " << zero);
    GptGraph m = build_gpt(cfg);
    TrainOptions o;
    o.zero = zero;
    add_train_step(m.graph, m.loss, m.weights, mesh, o);
    const Executable exe = compile(m.graph, mesh);
    for (const std::string& w : exe.program().warnings) {
      INFO(w);
      // Neither the gathered update of a ZeRO shard (next.<param>) nor, at stage 3, the
      // gathered parameter itself is reported.
      for (const Tensor& p : m.weights) {
        CHECK(w.find("%next." + p.name() + " is all-gathered") == std::string::npos);
        if (zero == 3) CHECK(w.find("%" + p.name() + " is all-gathered") == std::string::npos);
      }
    }
  }
  // A gather nobody asked for is still a warning: x sharded over data, needed whole.
  Graph g2;
  Tensor x2 = input(g2, "x", DType::f32, {8, 4});
  g2.annotate(x2, Sharding::parse("[{data}, {}]"));
  Tensor y2 = neg(x2);
  g2.annotate(y2, Sharding::parse("[{}, {}]"));
  g2.mark_output(y2);
  const Executable plain = compile(g2, mesh);
  bool gather_warned = false;
  for (const std::string& wr : plain.program().warnings)
    gather_warned = gather_warned || wr.find("is all-gathered") != std::string::npos;
  CHECK(gather_warned);
  CHECK_THROWS_WITH(g2.expect_gathers(input(g2, "z", DType::f32, {2})), Catch::Contains("%z has no annotation"));
}

// Golden collectives of the GPT-block training step (1 layer, clipping on, data=2 x model=2):
// each gradient is reduced once at every stage — stages 1 and 2 reduce-scatter each of the 16
// parameters' gradients once (the global norm comes from the blocks plus a scalar all-reduce,
// never from an all-reduced whole gradient), and the tied embedding's two contributions (the
// lookup's and the LM head's) are summed before their one reduction. At stage 0 the gradients
// are closed replicated, so they are all-reduced where they are made, and the squares of the
// global norm are then partial over `model` only: 7 scalar all-reduces over {model} (there were
// 13, over {data} and {data, model}, when closed results were reduced at their first use). A
// change in these counts is a change of plan: look at it before updating the numbers. (ZeRO-3
// was {27, 19, 15, 9, 1594676} with the long-form attention; the fused attention op, whose rule
// keeps the sequences whole, moves 7% fewer bytes: 2 fewer all-to-alls, reduce-scatters and
// all-reduces, 2 more all-gathers.)
TEST_CASE("train: the GPT-block step's collectives at every ZeRO stage", "[train][golden]") {
  const GptConfig cfg = gpt_config(8, 32, 64, 4, 1, 256);
  struct Want {
    int64_t ag, ar, rs, a2a, bytes;
  };
  const Want want[] = {{0, 28, 0, 0, 305440},
                       {16, 18, 16, 0, 479800},
                       {16, 18, 16, 0, 479800},
                       {29, 17, 13, 7, 1488180}};
  for (int zero = 0; zero <= 3; ++zero) {
    INFO("zero " << zero);
    GptGraph m = build_gpt(cfg);
    TrainOptions o;
    o.zero = zero;
    o.checkpoints = m.checkpoints;
    add_train_step(m.graph, m.loss, m.weights, Mesh::parse("data=2,model=2"), o);
    const CollectiveSummary s = compile(m.graph, Mesh::parse("data=2,model=2")).program().summary();
    INFO(s.line());
    CHECK(s.all_gather == want[zero].ag);
    CHECK(s.all_reduce == want[zero].ar);
    CHECK(s.reduce_scatter == want[zero].rs);
    CHECK(s.all_to_all == want[zero].a2a);
    CHECK(s.bytes == want[zero].bytes);
    if (zero == 1 || zero == 2) CHECK(s.reduce_scatter == static_cast<int64_t>(m.weights.size()));
  }
}
