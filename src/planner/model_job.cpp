// Model jobs of the multi-job planner (tessel/planner/model_job.hpp): the job-file entry, the
// layouts of a training step on g devices and what builds and feeds one. The pricing and the
// trials are in model_job_profile.cpp.
#include "tessel/planner/model_job.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../core/known_fields.hpp"
#include "tessel/core/common.hpp"
#include "tessel/runtime/reference.hpp"

namespace tessel::planner {

using json = nlohmann::json;

namespace {

// The GPT sizes "gpt" may set, each with where it goes and its least value.
struct GptField {
  const char* key;
  int64_t GptConfig::*field;
  int64_t least;
};
const GptField kGptFields[] = {
    {"batch", &GptConfig::batch, 1},   {"seq", &GptConfig::seq, 1},     {"d_model", &GptConfig::d_model, 1},
    {"heads", &GptConfig::heads, 1},   {"layers", &GptConfig::layers, 0}, {"vocab", &GptConfig::vocab, 1},
    {"ffn_mult", &GptConfig::ffn_mult, 1}};

const std::vector<std::string> kJobKeys = {"name", "steps", "gpt", "device_counts", "seed", "lr", "may_span_nodes",
                                           "requested_devices"};

std::vector<std::string> gpt_keys() {
  std::vector<std::string> out;
  for (const GptField& f : kGptFields) out.push_back(f.key);
  out.push_back("mixed");
  return out;
}

GptConfig parse_gpt(const json& j, const std::string& where) {
  if (!j.is_object())
    throw PlanError(fmt::format("{}: \"gpt\" must be an object of sizes, e.g. {{\"batch\": 8, \"seq\": 64, "
                                "\"d_model\": 128, \"heads\": 4, \"layers\": 2, \"vocab\": 512}}",
                                where));
  if (const std::string bad = unknown_field(j, gpt_keys(), "\"gpt\" field"); !bad.empty())
    throw PlanError(fmt::format("{}: {}", where, bad));
  GptConfig cfg;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "mixed") {
      if (!it.value().is_boolean())
        throw PlanError(fmt::format("{}: \"gpt\".\"mixed\" = {} must be true or false", where, it.value().dump()));
      if (it.value().get<bool>()) cfg.compute = DType::bf16;  // bf16 activations, f32 master weights
      continue;
    }
    const GptField* f = nullptr;  // found: unknown_field above refused every other key
    for (const GptField& g : kGptFields)
      if (key == g.key) f = &g;
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < f->least || it.value().get<int64_t>() > (1 << 24))
      throw PlanError(fmt::format("{}: \"gpt\".\"{}\" = {} must be an integer >= {}", where, key, it.value().dump(),
                                  f->least));
    cfg.*(f->field) = it.value().get<int64_t>();
  }
  if (cfg.d_model % cfg.heads != 0)
    throw PlanError(fmt::format("{}: \"gpt\".\"d_model\" = {} is not divisible by \"heads\" = {}: pick a d_model that "
                                "is a multiple of heads",
                                where, cfg.d_model, cfg.heads));
  return cfg;
}

std::vector<int32_t> parse_counts(const json& j, const std::string& where) {
  if (!j.is_array() || j.empty())
    throw PlanError(fmt::format("{}: \"device_counts\" must be a non-empty array of device counts, e.g. [1, 2, 4]",
                                where));
  std::vector<int32_t> out;
  for (const json& c : j) {
    if (!c.is_number_integer() || c.get<int64_t>() <= 0 || c.get<int64_t>() > (1 << 20))
      throw PlanError(fmt::format("{}: \"device_counts\" holds {}, which is not a positive device count", where,
                                  c.dump()));
    out.push_back(c.get<int32_t>());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool divides(int64_t n, int64_t d) { return d > 0 && n % d == 0; }

// Errors name the job "job 'gpt-a'", or with the index of its job-file entry (from 0)
// "job 3 'gpt-a'" (counted from 1).
ModelJob parse_model_job_at(const std::string& json_text, const std::string& origin, std::optional<std::size_t> index) {
  const std::string number = index ? fmt::format(" {}", *index + 1) : std::string();
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw PlanError(fmt::format("{}: a model job is not valid JSON ({})", origin, e.what()));
  }
  if (!j.is_object()) throw PlanError(fmt::format("{}: a model job is a JSON object", origin));
  ModelJob job;
  if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty())
    throw PlanError(fmt::format("{}: {} needs a \"name\" (a non-empty string)", origin,
                                index ? "job" + number : std::string("a model job")));
  job.name = j["name"].get<std::string>();
  const std::string where = fmt::format("{}: job{} '{}'", origin, number, job.name);
  if (j.contains("train_step"))
    throw PlanError(fmt::format("{}: \"train_step\" jobs (a training-step text file) are not supported yet: describe "
                                "the model with \"gpt\"",
                                where));
  if (const std::string bad = unknown_field(j, kJobKeys); !bad.empty())
    throw PlanError(fmt::format("{}: {}", where, bad));
  if (!j.contains("steps") || !j["steps"].is_number_integer() || j["steps"].get<int64_t>() <= 0)
    throw PlanError(fmt::format("{} needs \"steps\", a positive integer (got {})", where,
                                j.contains("steps") ? j["steps"].dump() : std::string("nothing")));
  job.steps = j["steps"].get<int64_t>();
  if (!j.contains("gpt")) throw PlanError(fmt::format("{} needs \"gpt\": the model's sizes", where));
  job.gpt = parse_gpt(j["gpt"], where);
  if (j.contains("device_counts")) job.device_counts = parse_counts(j["device_counts"], where);
  if (j.contains("seed")) {
    if (!j["seed"].is_number_unsigned())
      throw PlanError(fmt::format("{}: \"seed\" = {} must be an integer >= 0", where, j["seed"].dump()));
    job.seed = j["seed"].get<uint64_t>();
  }
  if (j.contains("lr")) {
    if (!j["lr"].is_number() || !(j["lr"].get<double>() > 0) || !std::isfinite(j["lr"].get<double>()))
      throw PlanError(fmt::format("{}: \"lr\" = {} must be a positive number", where, j["lr"].dump()));
    job.lr = j["lr"].get<double>();
  }
  if (j.contains("may_span_nodes")) {
    if (!j["may_span_nodes"].is_boolean())
      throw PlanError(fmt::format("{}: \"may_span_nodes\" = {} must be true or false", where,
                                  j["may_span_nodes"].dump()));
    job.may_span_nodes = j["may_span_nodes"].get<bool>();
  }
  if (j.contains("requested_devices")) {
    if (!j["requested_devices"].is_number_integer() || j["requested_devices"].get<int64_t>() < 0 ||
        j["requested_devices"].get<int64_t>() > (1 << 20))
      throw PlanError(fmt::format("{}: \"requested_devices\" = {} must be an integer >= 0", where,
                                  j["requested_devices"].dump()));
    job.requested_devices = j["requested_devices"].get<int32_t>();
  }
  return job;
}

}  // namespace

ModelJob parse_model_job(const std::string& json_text, const std::string& origin) {
  return parse_model_job_at(json_text, origin, std::nullopt);
}

ModelJob parse_model_job(const std::string& json_text, const std::string& origin, std::size_t index) {
  return parse_model_job_at(json_text, origin, index);
}

std::string Layout::mesh_spec() const { return fmt::format("data={},model={}", data, model); }

std::string Layout::to_string() const {
  return fmt::format("{}{} zero={} remat={}{}", pipe > 1 ? fmt::format("pipe={} micro={} ", pipe, micro) : "",
                     mesh_spec(), zero, remat_policy_name(remat), offload ? " offload" : "");
}

bool Layout::operator==(const Layout& o) const {
  return data == o.data && model == o.model && zero == o.zero && remat == o.remat && offload == o.offload &&
         pipe == o.pipe && micro == o.micro;
}

Layout Layout::parse(const std::string& text) {
  const auto bad = [&](const std::string& part, const char* want) {
    return PlanError(fmt::format("layout '{}': cannot read '{}' ({}; the form is 'data=2,model=2 zero=1 remat=none' "
                                 "with ' offload' optional, a pipeline's after 'pipe=P micro=M ')",
                                 text, part, want));
  };
  std::istringstream in(text);
  std::vector<std::string> parts;
  for (std::string p; in >> p;) parts.push_back(p);
  Layout l;
  const bool piped = !parts.empty() && parts[0].rfind("pipe=", 0) == 0;
  std::string pipe_part, micro_part;
  if (piped) {
    if (parts.size() < 2 || parts[1].rfind("micro=", 0) != 0) throw bad(parts[0], "want 'pipe=P micro=M' first");
    pipe_part = parts[0];
    micro_part = parts[1];
    parts.erase(parts.begin(), parts.begin() + 2);
  }
  if (parts.size() < 3 || parts.size() > 4) throw bad(text, "three or four parts");
  const auto number = [&](const std::string& part, const std::string& digits, int64_t least, int64_t most) {
    std::size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(digits, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (digits.empty() || used != digits.size() || v < least || v > most) throw bad(part, "a number out of range");
    return v;
  };
  const std::string& mesh = parts[0];
  const auto comma = mesh.find(",model=");
  if (mesh.rfind("data=", 0) != 0 || comma == std::string::npos) throw bad(mesh, "want data=A,model=B");
  l.data = static_cast<int32_t>(number(mesh, mesh.substr(5, comma - 5), 1, 1 << 20));
  l.model = static_cast<int32_t>(number(mesh, mesh.substr(comma + 7), 1, 1 << 20));
  if (parts[1].rfind("zero=", 0) != 0) throw bad(parts[1], "want zero=0..3");
  l.zero = static_cast<int>(number(parts[1], parts[1].substr(5), 0, 3));
  if (parts[2].rfind("remat=", 0) != 0) throw bad(parts[2], "want remat=none|einsums|all");
  try {
    l.remat = parse_remat_policy(parts[2].substr(6));
  } catch (const Error&) {
    throw bad(parts[2], "want remat=none|einsums|all");
  }
  if (parts.size() == 4) {
    if (parts[3] != "offload") throw bad(parts[3], "want offload");
    l.offload = true;
  }
  if (piped) {
    l.pipe = static_cast<int32_t>(number(pipe_part, pipe_part.substr(5), 2, 4096));
    l.micro = static_cast<int32_t>(number(micro_part, micro_part.substr(6), 1, 1 << 20));
    if (l.zero > 2) throw bad(text, "a pipeline takes ZeRO 0 to 2");
    if (l.remat == RematPolicy::einsums || l.offload)
      throw bad(text, "a pipeline takes remat=none (each stage keeps its activations) or remat=all (each stage's "
                      "backward recomputes its forward), without offload");
  }
  return l;
}

std::vector<Layout> enumerate_layouts(const GptConfig& gpt, int32_t devices, const std::vector<RematPolicy>& remat,
                                      bool pipeline) {
  std::vector<Layout> out;
  if (devices < 1) return out;
  if (pipeline)
    for (int32_t pipe = 2; pipe <= devices && pipe <= gpt.layers; ++pipe) {
      if (devices % pipe != 0) continue;
      const int32_t stage = devices / pipe;
      int32_t micro = 0;
      for (int32_t m : {2 * pipe, pipe})
        if (micro == 0 && divides(gpt.batch, m)) micro = m;
      if (micro == 0) continue;
      GptConfig one = gpt;
      one.batch = gpt.batch / micro;
      // Each stage keeping its activations or recomputing its forward (remat einsums: not within
      // a stage), as listed.
      std::vector<RematPolicy> stage_remat;
      for (RematPolicy r : remat)
        if (r != RematPolicy::einsums) stage_remat.push_back(r);
      for (Layout l : enumerate_layouts(one, stage, stage_remat)) {
        if (l.zero > 2) continue;
        l.pipe = pipe;
        l.micro = micro;
        out.push_back(l);
      }
    }
  // data = devices first (no tensor parallelism: the usual best on fast compute), down to data = 1.
  for (int32_t data = devices; data >= 1; --data) {
    if (devices % data != 0) continue;
    const int32_t model = devices / data;
    // The batch splits over data; heads, the MLP width (and so every weight annotated with model)
    // over model. An uneven split would be padded (uneven.hpp): wasted work a plan should not pick.
    if (!divides(gpt.batch, data) || !divides(gpt.heads, model) || !divides(gpt.d_model * gpt.ffn_mult, model))
      continue;
    // ZeRO shards over data: with one data replica every stage is stage 0.
    const int max_zero = data > 1 ? 3 : 0;
    for (int zero = 0; zero <= max_zero; ++zero)
      for (RematPolicy r : remat) {
        Layout l;
        l.data = data;
        l.model = model;
        l.zero = zero;
        l.remat = r;
        out.push_back(l);
      }
  }
  return out;
}

std::vector<int32_t> candidate_counts(const ModelJob& job, const Pool& pool) {
  const bool span = job.may_span_nodes || pool.allow_spanning;
  const auto placeable = [&](int32_t g) {
    return g >= 1 && (g <= pool.devices_per_node ||
                      (span && g % pool.devices_per_node == 0 && g <= pool.num_devices()));
  };
  std::vector<int32_t> out;
  if (!job.device_counts.empty()) {
    for (int32_t g : job.device_counts)
      if (placeable(g)) out.push_back(g);
    return out;
  }
  for (int32_t g = 1; g <= pool.devices_per_node; g *= 2) out.push_back(g);
  if (out.back() != pool.devices_per_node) out.push_back(pool.devices_per_node);  // a whole node
  if (span)
    for (int64_t g = 2 * static_cast<int64_t>(pool.devices_per_node); g <= pool.num_devices(); g *= 2)
      out.push_back(static_cast<int32_t>(g));
  return out;
}

ModelJobStep build_model_step(const ModelJob& job, const Layout& layout) {
  ModelJobStep s;
  GptConfig cfg = job.gpt;
  cfg.annotate = true;
  if (layout.pipe > 1) {
    if (layout.micro < 1 || cfg.batch % layout.micro != 0)
      throw PlanError(fmt::format("job '{}': layout {}: the batch of {} rows does not split into {} micro-batches",
                                  job.name, layout.to_string(), cfg.batch, layout.micro));
    if (layout.pipe > cfg.layers)
      throw PlanError(fmt::format("job '{}': layout {}: {} stages for {} layers", job.name, layout.to_string(),
                                  layout.pipe, cfg.layers));
    cfg.batch /= layout.micro;  // a stage sees one micro-batch
  }
  s.model = build_gpt(cfg);
  s.mesh = Mesh::parse(layout.mesh_spec());
  s.options.train.zero = layout.zero;
  s.options.train.data_axis = cfg.data_axis;
  s.options.train.remat = layout.remat;
  if (layout.remat != RematPolicy::none) s.options.train.checkpoints = s.model.checkpoints;
  // gpt_train --offload's threshold: activations of 16 KiB or more per device may move to the host.
  if (layout.offload) s.options.load.lowering.offload_min_bytes = 16 << 10;
  s.options.lr = LrSchedule::constant(job.lr);
  s.options.tokens_per_batch = cfg.batch * cfg.seq;
  return s;
}

std::map<std::string, HostTensor> initial_params(const ModelJob& job, const GptGraph& model) {
  std::vector<HostTensor> host = random_inputs(model.graph, job.seed);
  gpt_init(model.graph, host);
  std::map<std::string, HostTensor> out;
  for (const Tensor& w : model.weights) {
    const auto pos = std::find(model.graph.inputs.begin(), model.graph.inputs.end(), w.id);
    out[w.name()] = host[static_cast<std::size_t>(pos - model.graph.inputs.begin())];
  }
  return out;
}

std::vector<HostTensor> model_job_batch(const ModelJob& job, int64_t k) {
  if (k < 1) throw PlanError(fmt::format("job '{}': batch {} (batches count from 1)", job.name, k));
  const int64_t rows = job.gpt.batch, seq = job.gpt.seq, vocab = job.gpt.vocab;
  // The token after x is (5x + 3) mod vocab: a full-period sequence when vocab is a power of two
  // (Hull-Dobell), and a rule the model can learn, so the loss falls as it would on text.
  const auto next = [vocab](int64_t x) { return (5 * x + 3) % vocab; };
  std::seed_seq seq_seed{static_cast<uint32_t>(job.seed), static_cast<uint32_t>(job.seed >> 32),
                         static_cast<uint32_t>(k), static_cast<uint32_t>(static_cast<uint64_t>(k) >> 32)};
  std::mt19937_64 rng(seq_seed);
  HostTensor tokens(DType::i32, {rows, seq}), labels(DType::i32, {rows, seq});
  for (int64_t b = 0; b < rows; ++b) {
    int64_t x = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
    for (int64_t s = 0; s < seq; ++s) {
      tokens.set(b * seq + s, static_cast<double>(x));
      x = next(x);
      labels.set(b * seq + s, static_cast<double>(x));
    }
  }
  return {tokens, labels};
}

}  // namespace tessel::planner
