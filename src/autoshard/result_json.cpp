// AutoShardResult as JSON and back (tessel/autoshard/auto_shard.hpp), and agree_on_plan: one
// plan agreed by every process of a multi-process run (rank 0's, sent as JSON).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "tessel/autoshard/auto_shard.hpp"
#include "tessel/runtime/runtime.hpp"

namespace tessel {

namespace {

using json = nlohmann::json;

json sharding_json(const Sharding& s) { return s.to_string(); }

Sharding sharding_of(const json& j, const std::string& what) {
  if (!j.is_string()) throw Error(fmt::format("AutoShardResult::from_json: {} is not a layout string", what));
  try {
    return Sharding::parse(j.get<std::string>());
  } catch (const Error& e) {
    throw Error(fmt::format("AutoShardResult::from_json: {}: {}", what, e.what()));
  }
}

}  // namespace

std::string AutoShardResult::to_json() const {
  json j;
  j["format"] = "tessel auto_shard plan 1";
  json sh = json::array(), user = json::array(), ops = json::array(), tied = json::array(), alts = json::array();
  for (const Sharding& s : shardings) sh.push_back(sharding_json(s));
  for (bool u : from_user) user.push_back(u);
  for (const auto& fs : op_factors) ops.push_back(fs);
  for (const auto& [v, s] : tied_layouts) tied.push_back({{"value", v}, {"layout", sharding_json(s)}});
  for (const RejectedAlternative& a : alternatives)
    alts.push_back({{"op", a.op},
                    {"chosen", sharding_json(a.chosen)},
                    {"alternative", sharding_json(a.alternative)},
                    {"chosen_s", a.chosen_s},
                    {"alternative_s", a.alternative_s}});
  j["shardings"] = sh;
  j["from_user"] = user;
  j["op_factors"] = ops;
  j["tied_layouts"] = tied;
  j["alternatives"] = alts;
  j["compute_s"] = compute_s;
  j["dispatch_s"] = dispatch_s;
  j["comm_s"] = comm_s;
  j["peak_bytes"] = peak_bytes;
  j["program_peak_bytes"] = program_peak_bytes;
  j["solver"] = solver;
  j["solve_s"] = solve_s;
  j["formulate_s"] = formulate_s;
  j["nodes"] = nodes;
  j["edges"] = edges;
  j["strategies"] = strategies;
  j["fits"] = fits;
  return j.dump();
}

AutoShardResult AutoShardResult::from_json(const std::string& text, const Graph& g) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("AutoShardResult::from_json: not JSON ({})", e.what()));
  }
  if (!j.is_object() || j.value("format", std::string()) != "tessel auto_shard plan 1")
    throw Error("AutoShardResult::from_json: not a plan written by AutoShardResult::to_json (no \"format\": "
                "\"tessel auto_shard plan 1\")");
  AutoShardResult r;
  try {
    const json& sh = j.at("shardings");
    const json& user = j.at("from_user");
    const json& ops = j.at("op_factors");
    if (!sh.is_array() || sh.size() != g.values.size() || !user.is_array() || user.size() != g.values.size())
      throw Error(fmt::format("AutoShardResult::from_json: the plan lays out {} values, the graph has {}: it was "
                              "made for another graph",
                              sh.is_array() ? sh.size() : 0, g.values.size()));
    if (!ops.is_array() || ops.size() != g.ops.size())
      throw Error(fmt::format("AutoShardResult::from_json: the plan has strategies for {} ops, the graph has {}: it "
                              "was made for another graph",
                              ops.is_array() ? ops.size() : 0, g.ops.size()));
    for (std::size_t v = 0; v < sh.size(); ++v) {
      Sharding s = sharding_of(sh[v], fmt::format("the layout of %{}", g.values[v].name));
      if (s.rank() != 0 && s.rank() != static_cast<int>(g.values[v].shape.size()))
        throw Error(fmt::format("AutoShardResult::from_json: the layout {} of %{} has rank {}, the value {}: the plan "
                                "was made for another graph",
                                s.to_string(), g.values[v].name, s.rank(), g.values[v].shape.size()));
      r.shardings.push_back(std::move(s));
      r.from_user.push_back(user[v].get<bool>());
    }
    for (const json& fs : ops) r.op_factors.push_back(fs.get<std::vector<std::vector<std::string>>>());
    for (const json& t : j.at("tied_layouts")) {
      const int v = t.at("value").get<int>();
      if (v < 0 || static_cast<std::size_t>(v) >= g.values.size())
        throw Error(fmt::format("AutoShardResult::from_json: tied value {} is not a value of the graph", v));
      r.tied_layouts.push_back({v, sharding_of(t.at("layout"), fmt::format("the tied layout of %{}", g.values[static_cast<std::size_t>(v)].name))});
    }
    for (const json& a : j.at("alternatives")) {
      RejectedAlternative ra;
      ra.op = a.at("op").get<int>();
      ra.chosen = sharding_of(a.at("chosen"), "an alternative's chosen layout");
      ra.alternative = sharding_of(a.at("alternative"), "an alternative's layout");
      ra.chosen_s = a.at("chosen_s").get<double>();
      ra.alternative_s = a.at("alternative_s").get<double>();
      r.alternatives.push_back(std::move(ra));
    }
    r.compute_s = j.at("compute_s").get<double>();
    r.dispatch_s = j.at("dispatch_s").get<double>();
    r.comm_s = j.at("comm_s").get<double>();
    r.peak_bytes = j.at("peak_bytes").get<int64_t>();
    r.program_peak_bytes = j.at("program_peak_bytes").get<int64_t>();
    r.solver = j.at("solver").get<std::string>();
    r.solve_s = j.at("solve_s").get<double>();
    r.formulate_s = j.at("formulate_s").get<double>();
    r.nodes = j.at("nodes").get<int64_t>();
    r.edges = j.at("edges").get<int64_t>();
    r.strategies = j.at("strategies").get<int64_t>();
    r.fits = j.at("fits").get<bool>();
  } catch (const json::exception& e) {
    throw Error(fmt::format("AutoShardResult::from_json: a field is missing or of the wrong kind ({})", e.what()));
  }
  return r;
}

void check_fits(const AutoShardResult& r, const AutoShardOptions& o, const Mesh& mesh, const std::string& who) {
  if (r.fits || o.memory_budget_bytes <= 0) return;
  const int64_t least = r.program_peak_bytes > 0 ? r.program_peak_bytes : r.peak_bytes;
  throw Error(fmt::format("{}: no plan within the memory budget of {} bytes per device on mesh {}: the least found "
                          "needs {} bytes per device ({}); give a larger budget, more devices, or recompute "
                          "activations (remat)",
                          who, o.memory_budget_bytes, mesh.to_string(), least,
                          r.program_peak_bytes > 0 ? "its program's peak" : "the solver's estimate"));
}

AutoShardResult agree_on_plan(Runtime* runtime, const AutoShardResult& mine, const Graph& g) {
  if (!runtime || runtime->process_count() <= 1) return mine;
  return AutoShardResult::from_json(runtime->allgather_host(mine.to_json()).at(0), g);
}

}  // namespace tessel
