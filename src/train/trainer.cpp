// The training loop as an object (trainer.hpp): the update program (add_train_step), and on
// first use the micro-batch program of gradient accumulation, the update that ends an
// accumulation, and the forward for evaluation; the parameters and moments stay on the devices.
#include "tessel/train/trainer.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include "tessel/ops/builders.hpp"
#include "tessel/runtime/backend_cost.hpp"
#include "tessel/runtime/reference.hpp"

namespace tessel {

namespace {

// A rate of inf turned every parameter non-finite in one step while its loss and norm looked
// fine (issue 37 D4); NaN or a negative rate is as wrong.
void check_rate(const char* who, const char* what, double v) {
  if (!std::isfinite(v) || v < 0)
    throw Error(fmt::format("{}: the learning rate{}{} is {}: it must be a finite number >= 0 (e.g. 3e-4)", who,
                            *what ? " " : "", what, v));
}

}  // namespace

LrSchedule LrSchedule::constant(double lr) {
  check_rate("LrSchedule::constant", "", lr);
  LrSchedule s;
  s.peak = lr;
  return s;
}

LrSchedule LrSchedule::warmup_cosine(double peak, int64_t warmup_steps, int64_t total_steps, double final_lr) {
  check_rate("LrSchedule::warmup_cosine", "peak", peak);
  check_rate("LrSchedule::warmup_cosine", "final_lr", final_lr);
  if (warmup_steps < 0 || total_steps < warmup_steps)
    throw Error(fmt::format("LrSchedule::warmup_cosine: needs peak >= 0, final_lr >= 0 and 0 <= warmup_steps <= "
                            "total_steps (got peak={} warmup_steps={} total_steps={} final_lr={})",
                            peak, warmup_steps, total_steps, final_lr));
  LrSchedule s;
  s.kind = Kind::WarmupCosine;
  s.peak = peak;
  s.warmup_steps = warmup_steps;
  s.total_steps = total_steps;
  s.final_lr = final_lr;
  return s;
}

double LrSchedule::at(int64_t t) const {
  if (t < 1) throw Error(fmt::format("LrSchedule::at: step {} (steps count from 1)", t));
  check_rate("LrSchedule", "peak", peak);  // the fields are public: checked where they are used
  if (kind == Kind::Constant) return peak;
  check_rate("LrSchedule", "final_lr", final_lr);
  if (t <= warmup_steps) return peak * static_cast<double>(t) / static_cast<double>(warmup_steps);
  if (t >= total_steps) return final_lr;
  const double progress = static_cast<double>(t - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return final_lr + 0.5 * (peak - final_lr) * (1.0 + std::cos(M_PI * progress));
}

std::string LrSchedule::to_string() const {
  if (kind == Kind::Constant) return fmt::format("constant {}", peak);
  return fmt::format("warmup {} + cosine to {} (peak {}, final {})", warmup_steps, total_steps, peak, final_lr);
}

namespace {

HostTensor scalar(double v) {
  HostTensor h(DType::f32, {});
  h.set(0, v);
  return h;
}

// A compiled and loaded program of the trainer.
struct Loaded {
  Executable exe;
  LoadedExecutable le;
};

}  // namespace

struct Trainer::Impl {
  Runtime* rt = nullptr;
  Mesh mesh;
  TrainerOptions o;
  Graph model;  // the caller's graph, copied
  int loss_id = -1;
  std::vector<int> param_ids;
  std::vector<std::string> params, batch;
  std::string loss_name;
  std::optional<Loaded> update, micro, update_acc, eval;
  std::map<std::string, ShardedArray> state;  // parameters and moments, by input name
  int64_t t = 0;
  bool initialised = false;
  std::vector<StepRecord> history;
  std::optional<AutoShardResult> auto_result;  // TrainerOptions::auto_shard's plan of the update
  std::string cost_source;                     // which figures auto_shard plans with, in words
  std::unique_ptr<TrainerEngine> engine;       // set: the steps and the state are the engine's

  // Throws Error for what only the Trainer's own single program has.
  void single(const char* what) const {
    if (engine)
      throw Error(fmt::format("Trainer::{}: this trainer runs on {}, not one program of its own (use state(), "
                              "set_state() and the checkpoints)",
                              what, engine->describe()));
  }
  // A batch by input name.
  std::map<std::string, HostTensor> named(const std::vector<HostTensor>& b) const {
    std::map<std::string, HostTensor> out;
    for (std::size_t i = 0; i < batch.size(); ++i) out[batch[i]] = b[i];
    return out;
  }

  // A copy of the model with only the loss as output, and handles of the loss and parameters.
  Graph copy(Tensor& loss, std::vector<Tensor>& ps) const {
    Graph g = model.clone();
    g.outputs = {loss_id};
    loss = g.tensor(loss_id);
    ps.clear();
    for (int id : param_ids) ps.push_back(g.tensor(id));
    return g;
  }
  TrainOptions train_options(Graph& g, bool accumulated) const {
    TrainOptions to = o.train;
    if (engine) to.zero = 0;  // (the engine's own layouts; the graph serves the reference step)
    to.guard_non_finite = true;
    to.accumulated = accumulated;
    for (Tensor& c : to.checkpoints) c = g.tensor(c.id);  // the caller's handles are on `model`
    return to;
  }
  Loaded build(Graph& g, std::vector<std::pair<std::string, std::string>> donate) const {
    Executable exe = compile(g, mesh);
    LoadOptions lo = o.load;
    lo.donate.insert(lo.donate.end(), donate.begin(), donate.end());
    LoadedExecutable le = load(exe, *rt, lo);
    return Loaded{std::move(exe), std::move(le)};
  }
  Loaded build_update(bool accumulated) {
    Tensor loss;
    std::vector<Tensor> ps;
    Graph g = copy(loss, ps);
    const std::map<int, Annotation> user = g.annotations;  // the model's own (e.g. the batch on data)
    TrainStep s = add_train_step(g, loss, ps, mesh, train_options(g, accumulated));
    if (!o.auto_shard) return build(g, s.donations());
    // The step's own layouts (parameters, moments, gradients) are left to auto_shard, each
    // update tied to its parameter so the donated state keeps one layout. The update that
    // ends an accumulation takes the state in the layouts the plain update keeps it in.
    g.annotations = user;
    if (accumulated) pin_inputs(g, *update, state_names());
    return build_auto(g, s.donations(), accumulated ? nullptr : &auto_result);
  }
  // auto_shard of `g` (its annotations kept, the donations tied), compiled and loaded.
  Loaded build_auto(Graph& g, const std::vector<std::pair<std::string, std::string>>& donations,
                    std::optional<AutoShardResult>* result) {
    AutoShardOptions ao = *o.auto_shard;
    ao.tied.insert(ao.tied.end(), donations.begin(), donations.end());
    // Under a multi-process runtime all adopt rank 0's plan.
    AutoShardResult r = agree_on_plan(rt, auto_shard(g, mesh, ao), g);
    check_fits(r, ao, mesh, "Trainer (TrainerOptions::auto_shard)");  // a budget is never dropped
    r.cost_source = cost_source;
    r.cost = ao.cost;
    Graph chosen = r.annotated(g);
    // Every gather of the program is the plan's own, priced by it (FSDP-like parameters,
    // updates computed sharded and gathered into the parameter's layout, the batch gathered
    // for an op the plan computes whole): not warnings.
    for (auto& [v, a] : chosen.annotations) a.gather_expected = true;
    if (result) *result = std::move(r);
    return build(chosen, donations);
  }
  // The parameters and their moments, by input name.
  std::vector<std::string> state_names() const {
    std::vector<std::string> n = params;
    for (const std::string& p : params) {
      n.push_back("adam.m." + p);
      n.push_back("adam.v." + p);
    }
    return n;
  }
  // Annotates the inputs of `g` named in `names` with the layouts program `from` takes them in,
  // so that its arrays fit (their gathers by design).
  void pin_inputs(Graph& g, const Loaded& from, const std::vector<std::string>& names) const {
    const Program& p = from.exe.program();
    const Graph& fg = from.exe.graph();
    for (const std::string& n : names) {
      const int v = g.find(n);
      for (std::size_t i = 0; v >= 0 && i < fg.inputs.size(); ++i)
        if (fg.values[static_cast<std::size_t>(fg.inputs[i])].name == n) {
          g.annotate(v, p.values[static_cast<std::size_t>(p.inputs[i])].sharding.closed_copy());
          g.expect_gathers(g.tensor(v));
        }
    }
  }
  Loaded& micro_program() {
    if (!micro) {
      if (o.auto_shard) update_acc_program();  // the layouts it takes the accumulated gradients in
      Tensor loss;
      std::vector<Tensor> ps;
      Graph g = copy(loss, ps);
      const std::map<int, Annotation> user = g.annotations;
      GradAccumulation a = add_grad_accumulation(g, loss, ps, mesh, train_options(g, true));
      if (!o.auto_shard) {
        micro = build(g, a.donations());
      } else {
        // The parameters as the update keeps them, the accumulated gradients as the update
        // that ends the accumulation takes them; the rest chosen by auto_shard.
        g.annotations = user;
        pin_inputs(g, *update, params);
        std::vector<std::string> acc;
        for (const Tensor& t : a.acc) acc.push_back(t.name());
        pin_inputs(g, *update_acc, acc);
        micro = build_auto(g, a.donations(), nullptr);
      }
    }
    return *micro;
  }
  Loaded& update_acc_program() {
    if (!update_acc) update_acc = build_update(true);
    return *update_acc;
  }
  Loaded& eval_program() {
    if (!eval) {
      Tensor loss;
      std::vector<Tensor> ps;
      Graph g = copy(loss, ps);
      // The parameters in the layouts the update program keeps them in, so its arrays fit.
      const Program& up = update->exe.program();
      for (std::size_t i = 0; i < ps.size(); ++i) {
        const std::size_t in = update->le.input_index(params[i]);
        g.annotate(ps[i], up.values[static_cast<std::size_t>(up.inputs[in])].sharding.closed_copy());
        if (o.train.zero >= 3 || o.auto_shard) g.expect_gathers(ps[i]);  // (auto: FSDP-like layouts are by design)
      }
      eval = build(g, {});
    }
    return *eval;
  }

  int64_t tokens_of(const std::vector<HostTensor>& b) const {
    if (o.tokens_per_batch > 0) return o.tokens_per_batch;
    for (const HostTensor& h : b)
      if (h.dtype() == DType::i32) return h.numel();
    return b.empty() ? 0 : b[0].numel();
  }
  void check_batch(const std::vector<HostTensor>& b, const char* what) const {
    if (b.size() != batch.size()) {
      std::string names;
      for (const std::string& n : batch) names += (names.empty() ? "" : ", ") + n;
      throw Error(fmt::format("Trainer::{}: a batch holds {} tensors ({}), got {}", what, batch.size(), names,
                              b.size()));
    }
  }
  void check_ready(const char* what) const {
    if (!initialised)
      throw Error(fmt::format("Trainer::{}: the parameters are not set; call init() with every parameter first",
                              what));
  }
  // The arrays of one run of `p`: the state and `extra` by name, the batch sent to the devices.
  // `host`: more inputs to send with the batch (a step's scalars), all in one transfer.
  std::map<std::string, ShardedArray> inputs(Loaded& p, const std::vector<HostTensor>& b,
                                             std::map<std::string, ShardedArray> extra, bool with_moments,
                                             std::map<std::string, HostTensor> host = {}) const {
    for (std::size_t i = 0; i < batch.size(); ++i) host[batch[i]] = b[i];
    for (auto& [name, arr] : p.le.to_device(host)) extra[name] = std::move(arr);
    for (const std::string& name : params) {
      extra[name] = state.at(name);
      if (with_moments) {
        extra["adam.m." + name] = state.at("adam.m." + name);
        extra["adam.v." + name] = state.at("adam.v." + name);
      }
    }
    return extra;
  }
  double host_scalar(Loaded& p, const RunResult& r, const std::string& name) const {
    return p.le.to_host(p.le.output(r, name)).get(0);
  }
  // The model copied, its loss, parameters and batch inputs (the rest of its inputs) by name.
  void adopt(const Graph& g, Tensor loss, const std::vector<Tensor>& ps) {
    if (loss.graph() != &g) throw Error("Trainer: the loss must be a value of the model graph");
    loss.value();
    model = g.clone();
    loss_id = loss.id;
    loss_name = loss.name();
    for (const Tensor& p : ps) {
      if (p.graph() != &g) throw Error(fmt::format("Trainer: parameter %{} is not a value of the model graph", p.name()));
      param_ids.push_back(p.id);
      params.push_back(p.name());
    }
    for (int in : g.inputs)
      if (std::find(param_ids.begin(), param_ids.end(), in) == param_ids.end())
        batch.push_back(g.values[static_cast<std::size_t>(in)].name);
  }
  // The engine's step, and the record's end (timing, tokens, the non-finite policy, history).
  StepRecord engine_step(const std::vector<std::vector<HostTensor>>& micro_batches, StepRecord rec,
                         std::chrono::steady_clock::time_point start);
  StepRecord finish(const std::vector<std::vector<HostTensor>>& micro_batches, StepRecord rec,
                    std::chrono::steady_clock::time_point start, bool finite);
};

Trainer::Trainer(const Graph& model, Tensor loss, const std::vector<Tensor>& params, const Mesh& mesh,
                 Runtime& runtime, TrainerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  im.rt = &runtime;
  im.mesh = mesh;
  im.o = std::move(options);
  im.adopt(model, loss, params);
  im.o.lr.at(1);  // a bad schedule fails here
  if (im.o.auto_shard) {  // the figures of the machine the step runs on, unless given
    AutoShardOptions& ao = *im.o.auto_shard;
    if (ao.cost_figures == AutoShardOptions::CostFigures::Backend && ao.cost == CostModel{}) {
      BackendCost bc = backend_cost_model(runtime, mesh);
      ao.cost = bc.cost;
      im.cost_source = std::move(bc.source);
    } else {
      im.cost_source = ao.cost == CostModel{} ? "the cost model's default figures (an H100's), as given"
                                               : "the figures given in AutoShardOptions::cost";
    }
  }
  im.update = im.build_update(false);
}

Trainer::Trainer(const Graph& model, Tensor loss, const std::vector<Tensor>& params,
                 std::unique_ptr<TrainerEngine> engine, TrainerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  if (!engine) throw Error("Trainer: the engine is null");
  if (options.auto_shard)
    throw Error(fmt::format("Trainer: TrainerOptions::auto_shard plans one program; {} takes its layouts from its "
                            "stages (for a pipeline: StageCutOptions::auto_shard and stages_with_layouts)",
                            engine->describe()));
  im.engine = std::move(engine);
  im.mesh = Mesh::parse("data=1");  // the reference step's graphs (no layouts used)
  im.o = std::move(options);
  im.adopt(model, loss, params);
  im.o.lr.at(1);
}

Trainer::~Trainer() = default;
Trainer::Trainer(Trainer&&) noexcept = default;
Trainer& Trainer::operator=(Trainer&&) noexcept = default;

const std::vector<std::string>& Trainer::batch_inputs() const { return impl_->batch; }
const std::vector<std::string>& Trainer::param_names() const { return impl_->params; }
int64_t Trainer::steps_done() const { return impl_->t; }
const std::vector<StepRecord>& Trainer::history() const { return impl_->history; }
const LrSchedule& Trainer::schedule() const { return impl_->o.lr; }
void Trainer::set_schedule(const LrSchedule& lr) {
  lr.at(1);
  impl_->o.lr = lr;
}
namespace {
// A run's memory into the step's record: the largest over the step's runs and devices.
void add_memory(StepRecord& rec, const RunStats& st) {
  for (int64_t b : st.measured_peak_bytes) rec.measured_peak_bytes = std::max(rec.measured_peak_bytes, b);
  rec.planned_peak_bytes = std::max(rec.planned_peak_bytes, st.planned_peak_bytes);
  for (int64_t b : st.measured_host_peak_bytes) rec.measured_host_peak_bytes = std::max(rec.measured_host_peak_bytes, b);
}
}  // namespace

int64_t Trainer::planned_peak_bytes() const {
  int64_t peak = 0;
  for (const std::optional<Loaded>* p : {&impl_->update, &impl_->micro, &impl_->update_acc, &impl_->eval})
    if (*p) peak = std::max(peak, (*p)->le.program().memory_plan().peak_bytes());
  return peak;
}

const Executable& Trainer::executable() const {
  impl_->single("executable");
  return impl_->update->exe;
}
const AutoShardResult* Trainer::auto_shard_result() const {
  return impl_->auto_result ? &*impl_->auto_result : nullptr;
}
TrainerEngine* Trainer::engine() const { return impl_->engine.get(); }

LoadedExecutable& Trainer::program() {
  impl_->single("program");
  return impl_->update->le;
}

void Trainer::init(const std::map<std::string, HostTensor>& values) {
  Impl& im = *impl_;
  for (const auto& [name, v] : values)
    if (std::find(im.params.begin(), im.params.end(), name) == im.params.end())
      throw Error(fmt::format("Trainer::init: '{}' is not a parameter of the training step", name));
  if (im.engine) {  // the parameters and zero moments, as a state
    std::map<std::string, HostTensor> st;
    for (std::size_t i = 0; i < im.params.size(); ++i) {
      const std::string& name = im.params[i];
      auto it = values.find(name);
      if (it == values.end()) throw Error(fmt::format("Trainer::init: no value for parameter '{}'", name));
      const Value& pv = im.model.values[static_cast<std::size_t>(im.param_ids[i])];
      if (it->second.dtype() != pv.dtype || it->second.shape() != pv.shape)
        throw Error(fmt::format("Trainer::init: parameter '{}' is {}; the model's is {}", name,
                                type_str(it->second.dtype(), it->second.shape()), type_str(pv.dtype, pv.shape)));
      st[name] = it->second;
      st["adam.m." + name] = HostTensor(DType::f32, pv.shape);
      st["adam.v." + name] = HostTensor(DType::f32, pv.shape);
    }
    im.engine->set_state(st);
    im.t = 0;
    im.history.clear();
    im.initialised = true;
    return;
  }
  LoadedExecutable& le = im.update->le;
  std::map<std::string, ShardedArray> s;
  for (std::size_t i = 0; i < im.params.size(); ++i) {
    const std::string& name = im.params[i];
    auto it = values.find(name);
    if (it == values.end()) throw Error(fmt::format("Trainer::init: no value for parameter '{}'", name));
    s[name] = le.to_device(name, it->second);
    const Value& pv = im.model.values[static_cast<std::size_t>(im.param_ids[i])];
    const HostTensor zeros(DType::f32, pv.shape);
    s["adam.m." + name] = le.to_device("adam.m." + name, zeros);
    s["adam.v." + name] = le.to_device("adam.v." + name, zeros);
  }
  im.state = std::move(s);
  im.t = 0;
  im.history.clear();
  im.initialised = true;
}

TrainState Trainer::state() const {
  impl_->check_ready("state");
  TrainState st;
  st.step = impl_->t;
  if (impl_->engine) {
    st.values = impl_->engine->state();
    return st;
  }
  for (const auto& [name, a] : impl_->state) st.values[name] = impl_->update->le.to_host(a);
  return st;
}

void Trainer::set_state(const TrainState& st) {
  Impl& im = *impl_;
  if (st.step < 0) throw Error(fmt::format("Trainer::set_state: step {} is negative", st.step));
  if (im.engine) {
    im.engine->set_state(st.values);
    im.t = st.step;
    im.initialised = true;
    return;
  }
  std::map<std::string, ShardedArray> s;
  for (const std::string& p : im.params)
    for (const std::string& name : {p, "adam.m." + p, "adam.v." + p}) {
      auto it = st.values.find(name);
      if (it == st.values.end()) throw Error(fmt::format("Trainer::set_state: the state has no '{}'", name));
      s[name] = im.update->le.to_device(name, it->second);
    }
  for (const auto& [name, v] : st.values)
    if (!s.count(name)) throw Error(fmt::format("Trainer::set_state: '{}' is not part of the training state", name));
  im.state = std::move(s);
  im.t = st.step;
  im.initialised = true;
}

const std::map<std::string, ShardedArray>& Trainer::device_state() const {
  impl_->single("device_state");
  impl_->check_ready("device_state");
  return impl_->state;
}

void Trainer::set_device_state(int64_t step, std::map<std::string, ShardedArray> values) {
  Impl& im = *impl_;
  im.single("set_device_state");
  if (step < 0) throw Error(fmt::format("Trainer::set_device_state: step {} is negative", step));
  const std::map<std::string, Sharding> want = state_shardings();
  const Program& up = im.update->exe.program();
  for (const auto& [name, sh] : want) {
    auto it = values.find(name);
    if (it == values.end()) throw Error(fmt::format("Trainer::set_device_state: the state has no '{}'", name));
    const ShardedArray& a = it->second;
    const LocalValue& lv = up.values[static_cast<std::size_t>(up.inputs[im.update->le.input_index(name)])];
    if (!a.valid() || a.dtype() != lv.dtype || a.shape() != lv.global_shape || !(a.sharding() == sh) ||
        a.devices() != im.update->le.local_devices())
      throw Error(fmt::format("Trainer::set_device_state: '{}' is {}, the update step takes {}{} {} on the devices {} "
                              "(restore it onto program()'s input '{}')",
                              name, a.valid() ? a.to_string() : std::string("an empty or donated array"),
                              dtype_name(lv.dtype), shape_str(lv.global_shape), sh.to_string(),
                              shape_str(im.update->le.local_devices()), name));
  }
  for (const auto& [name, v] : values)
    if (!want.count(name))
      throw Error(fmt::format("Trainer::set_device_state: '{}' is not part of the training state", name));
  im.state = std::move(values);
  im.t = step;
  im.initialised = true;
}

std::map<std::string, Sharding> Trainer::state_shardings() const {
  const Impl& im = *impl_;
  if (im.engine) return im.engine->state_shardings();
  const Program& up = im.update->exe.program();
  std::map<std::string, Sharding> out;
  for (const std::string& p : im.params)
    for (const std::string& name : {p, "adam.m." + p, "adam.v." + p}) {
      const std::size_t in = im.update->le.input_index(name);
      out[name] = up.values[static_cast<std::size_t>(up.inputs[in])].sharding;
    }
  return out;
}

namespace {

// "{data, model}" for the axes a layout splits over (any dim), "" when it splits over none.
std::string split_axes(const Sharding& s) {
  std::vector<std::string> axes;
  for (const DimSharding& d : s.dims)
    for (const std::string& a : d.axes)
      if (std::find(axes.begin(), axes.end(), a) == axes.end()) axes.push_back(a);
  return axes.empty() ? "" : "{" + join(axes, ", ") + "}";
}

// "96% split over {model}, 4% whole": the shares of the bytes by the axes they are split over.
std::string shares(const std::vector<std::pair<int64_t, std::string>>& bytes_and_axes) {
  std::map<std::string, int64_t> by;
  int64_t total = 0;
  for (const auto& [b, axes] : bytes_and_axes) {
    by[axes] += b;
    total += b;
  }
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [axes, b] : by) order.emplace_back(b, axes);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> parts;
  for (const auto& [b, axes] : order) {
    const double pct = total > 0 ? 100.0 * static_cast<double>(b) / static_cast<double>(total) : 0;
    const std::string what = axes.empty() ? "whole" : "split over " + axes;
    parts.push_back(order.size() == 1 ? "all " + what
                    : pct < 0.5       ? "<1% " + what
                                      : fmt::format("{:.0f}% {}", pct, what));
  }
  return join(parts, ", ");
}

}  // namespace

std::string Trainer::strategy_in_words() const {
  const Impl& im = *impl_;
  if (im.engine) return im.engine->describe();
  const Program& up = im.update->exe.program();
  auto layout_of = [&](const std::string& name) {
    return up.values[static_cast<std::size_t>(up.inputs[im.update->le.input_index(name)])].sharding;
  };
  std::vector<std::string> batch_axes;
  for (const std::string& b : im.batch) {
    const Sharding s = layout_of(b);
    const std::string a = s.rank() > 0 ? split_axes(Sharding({s.dims[0]})) : "";
    if (std::find(batch_axes.begin(), batch_axes.end(), a) == batch_axes.end()) batch_axes.push_back(a);
  }
  std::vector<std::pair<int64_t, std::string>> weights, moments;
  bool moments_as_weights = true, all_whole = true;
  for (std::size_t i = 0; i < im.params.size(); ++i) {
    const Value& v = im.model.values[static_cast<std::size_t>(im.param_ids[i])];
    const int64_t bytes = num_bytes(v.shape, v.dtype);
    const Sharding w = layout_of(im.params[i]);
    weights.emplace_back(bytes, split_axes(w));
    all_whole = all_whole && split_axes(w).empty();
    for (const std::string& m : {"adam.m." + im.params[i], "adam.v." + im.params[i]}) {
      const Sharding ms = layout_of(m);
      moments.emplace_back(bytes, split_axes(ms));
      moments_as_weights = moments_as_weights && ms.same_layout(w);
      all_whole = all_whole && split_axes(ms).empty();
    }
  }
  // The activations: every value the step computes (not its inputs), by its global bytes.
  std::vector<bool> is_input(up.values.size(), false);
  for (int in : up.inputs) is_input[static_cast<std::size_t>(in)] = true;
  std::vector<std::pair<int64_t, std::string>> acts;
  bool acts_whole = true;
  for (std::size_t v = 0; v < up.values.size(); ++v) {
    const LocalValue& lv = up.values[v];
    if (is_input[v] || lv.global_shape.empty()) continue;
    acts.emplace_back(num_bytes(lv.global_shape, lv.dtype), split_axes(lv.sharding));
    acts_whole = acts_whole && acts.back().second.empty();
  }
  if (acts_whole && all_whole)
    return "every device repeats the whole step (its activations, weights and AdamW moments whole)";
  std::vector<std::string> b;
  for (const std::string& a : batch_axes) b.push_back(a.empty() ? "whole" : "over " + a);
  return fmt::format("the batch comes in {}; activations: {} (of their bytes); weights: {}; AdamW moments: {}",
                     join(b, " / "), shares(acts), shares(weights), moments_as_weights ? "as their weights" : shares(moments));
}

StepRecord Trainer::step(const std::vector<HostTensor>& batch) {
  return step(std::vector<std::vector<HostTensor>>{batch});
}

StepRecord Trainer::step(const std::vector<std::vector<HostTensor>>& micro_batches) {
  Impl& im = *impl_;
  im.check_ready("step");
  if (micro_batches.empty()) throw Error("Trainer::step: no batch given (one, or K micro-batches)");
  for (const auto& b : micro_batches) im.check_batch(b, "step");
  const auto start = std::chrono::steady_clock::now();
  const int k = static_cast<int>(micro_batches.size());
  StepRecord rec;
  rec.step = im.t + 1;
  rec.lr = im.o.lr.at(rec.step);
  rec.micro_batches = k;
  if (im.engine) return im.engine_step(micro_batches, rec, start);
  const AdamWConfig& a = im.o.train.adamw;
  double loss_sum = 0;
  bool finite = true;
  std::map<std::string, ShardedArray> acc;  // accumulated gradients by input name
  if (k > 1) {
    Loaded& mp = im.micro_program();
    std::map<std::string, HostTensor> zeros;  // the accumulators, sent in one transfer
    for (const std::string& name : im.params) {
      const Value& pv = im.model.values[static_cast<std::size_t>(im.model.find(name))];
      zeros["grad.acc." + name] = HostTensor(DType::f32, pv.shape);
    }
    acc = mp.le.to_device(zeros);
    for (int i = 0; i + 1 < k; ++i) {
      RunResult r = mp.le.run_named(im.inputs(mp, micro_batches[static_cast<std::size_t>(i)], acc, false), im.o.run);
      add_memory(rec, r.stats);
      const double l = im.host_scalar(mp, r, im.loss_name);
      loss_sum += l;
      finite = finite && std::isfinite(l);
      for (const std::string& name : im.params)
        acc["grad.acc." + name] = mp.le.output(r, "next.grad.acc." + name);
    }
  }
  Loaded& up = k > 1 ? im.update_acc_program() : *im.update;
  double norm = std::nan("");
  if (finite) {  // a non-finite micro-batch loss: the update is not run at all
    std::map<std::string, HostTensor> scalars;  // sent with the batch, one transfer for all
    scalars["adam.lr"] = scalar(rec.lr);
    scalars["adam.bc1"] = scalar(1.0 / (1.0 - std::pow(a.beta1, rec.step)));
    scalars["adam.bc2"] = scalar(1.0 / (1.0 - std::pow(a.beta2, rec.step)));
    if (k > 1) scalars["grad.scale"] = scalar(1.0 / k);
    RunResult r = up.le.run_named(im.inputs(up, micro_batches.back(), acc, true, std::move(scalars)), im.o.run);
    add_memory(rec, r.stats);
    // The parameters and moments were donated: their next values are the state (unchanged
    // values when the step was not finite, TrainOptions::guard_non_finite).
    for (const std::string& name : im.params)
      for (const std::string& s : {name, "adam.m." + name, "adam.v." + name})
        im.state[s] = up.le.output(r, "next." + s);
    const double l = im.host_scalar(up, r, im.loss_name);
    loss_sum += l;
    norm = im.host_scalar(up, r, "grad_norm");
    finite = std::isfinite(l) && std::isfinite(norm);
  }
  rec.loss = loss_sum / k;
  rec.grad_norm = norm;
  return im.finish(micro_batches, rec, start, finite);
}

StepRecord Trainer::Impl::engine_step(const std::vector<std::vector<HostTensor>>& micro_batches, StepRecord rec,
                                      std::chrono::steady_clock::time_point start) {
  const int64_t want = engine->micro_batches();
  if (want > 0 && static_cast<int64_t>(micro_batches.size()) != want)
    throw Error(fmt::format("Trainer::step: {} micro-batch{} given; {} runs {} a step (split the batch into {} of "
                            "the model's rows each)",
                            micro_batches.size(), micro_batches.size() == 1 ? "" : "es", engine->describe(), want,
                            want));
  std::vector<std::map<std::string, HostTensor>> by_name;
  for (const auto& b : micro_batches) by_name.push_back(named(b));
  const TrainerEngine::Step r = engine->step(by_name, rec.lr, rec.step);
  rec.loss = r.loss;
  rec.grad_norm = r.grad_norm;
  rec.bubble = r.bubble;
  rec.peak_in_flight = r.peak_in_flight;
  return finish(micro_batches, rec, start, r.applied && std::isfinite(r.loss) && std::isfinite(r.grad_norm));
}

StepRecord Trainer::Impl::finish(const std::vector<std::vector<HostTensor>>& micro_batches, StepRecord rec,
                                 std::chrono::steady_clock::time_point start, bool finite) {
  Impl& im = *this;
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t tokens = 0;
  for (const auto& b : micro_batches) tokens += im.tokens_of(b);
  rec.tokens_per_s = rec.seconds > 0 ? static_cast<double>(tokens) / rec.seconds : 0;
  const double norm = rec.grad_norm;
  if (!finite) {
    rec.skipped = true;
    im.history.push_back(rec);
    if (im.o.non_finite == NonFinite::Stop)
      throw Error(fmt::format("Trainer::step: step {} is not finite (loss {}, gradient norm {}); the parameters and "
                              "moments keep their values from before the step. Lower the learning rate ({}), check "
                              "the batch, or set TrainerOptions::non_finite = NonFinite::Skip to skip such steps",
                              rec.step, rec.loss, norm, rec.lr));
    return rec;
  }
  im.t = rec.step;
  im.history.push_back(rec);
  return rec;
}

StepRecord Trainer::reference_step(const std::vector<std::vector<HostTensor>>& micro_batches, int threads) {
  impl_->check_ready("reference_step");
  return reference_step(state(), micro_batches, threads);
}

StepRecord Trainer::reference_step(const TrainState& from, const std::vector<std::vector<HostTensor>>& micro_batches,
                                   int threads) const {
  const Impl& im = *impl_;
  if (micro_batches.empty()) throw Error("Trainer::reference_step: no batch given (one, or K micro-batches)");
  for (const auto& b : micro_batches) im.check_batch(b, "reference_step");
  const int k = static_cast<int>(micro_batches.size());
  StepRecord rec;
  rec.step = from.step + 1;
  rec.lr = im.o.lr.at(rec.step);
  rec.micro_batches = k;
  // Every value by input name: the state, the accumulated gradients, the batch, the scalars.
  std::map<std::string, HostTensor> host = from.values;
  const AdamWConfig& a = im.o.train.adamw;
  host["adam.lr"] = scalar(rec.lr);
  host["adam.bc1"] = scalar(1.0 / (1.0 - std::pow(a.beta1, rec.step)));
  host["adam.bc2"] = scalar(1.0 / (1.0 - std::pow(a.beta2, rec.step)));
  host["grad.scale"] = scalar(1.0 / k);
  for (const std::string& name : im.params)
    host["grad.acc." + name] = HostTensor(DType::f32, im.model.values[static_cast<std::size_t>(im.model.find(name))].shape);
  auto run = [&](const Graph& g, const std::vector<HostTensor>& b) {
    for (std::size_t i = 0; i < im.batch.size(); ++i) host[im.batch[i]] = b[i];
    std::vector<HostTensor> in;
    for (int v : g.inputs) {
      const std::string& name = g.values[static_cast<std::size_t>(v)].name;
      auto it = host.find(name);
      if (it == host.end()) throw Error(fmt::format("Trainer::reference_step: the state has no '{}'", name));
      in.push_back(it->second);
    }
    std::vector<HostTensor> out = run_reference(g, in, threads);
    std::map<std::string, HostTensor> named;
    for (std::size_t o = 0; o < g.outputs.size(); ++o) named[g.values[static_cast<std::size_t>(g.outputs[o])].name] = out[o];
    return named;
  };
  // The graphs the programs were compiled from, built again (no load: nothing collective).
  double loss_sum = 0;
  Tensor loss;
  std::vector<Tensor> ps;
  if (k > 1) {
    Graph g = im.copy(loss, ps);
    add_grad_accumulation(g, loss, ps, im.mesh, im.train_options(g, true));
    for (int i = 0; i + 1 < k; ++i) {
      auto out = run(g, micro_batches[static_cast<std::size_t>(i)]);
      loss_sum += out.at(im.loss_name).get(0);
      for (const std::string& name : im.params) host["grad.acc." + name] = out.at("next.grad.acc." + name);
    }
  }
  Graph g = im.copy(loss, ps);
  add_train_step(g, loss, ps, im.mesh, im.train_options(g, k > 1));
  auto out = run(g, micro_batches.back());
  rec.loss = (loss_sum + out.at(im.loss_name).get(0)) / k;
  rec.grad_norm = out.at("grad_norm").get(0);
  return rec;
}

double Trainer::evaluate(const std::vector<HostTensor>& batch) {
  Impl& im = *impl_;
  im.check_ready("evaluate");
  im.check_batch(batch, "evaluate");
  if (im.engine) return im.engine->evaluate(im.named(batch));
  Loaded& ev = im.eval_program();
  RunResult r = ev.le.run_named(im.inputs(ev, batch, {}, false), im.o.run);
  return im.host_scalar(ev, r, im.loss_name);
}

HostTensor Trainer::param(const std::string& name) const {
  if (impl_->engine) {
    impl_->check_ready("param");
    if (std::find(impl_->params.begin(), impl_->params.end(), name) == impl_->params.end())
      throw Error(fmt::format("Trainer::param: '{}' is not a parameter", name));
    return impl_->engine->param(name);
  }
  auto it = impl_->state.find(name);
  if (it == impl_->state.end() || std::find(impl_->params.begin(), impl_->params.end(), name) == impl_->params.end())
    throw Error(fmt::format("Trainer::param: '{}' is not a parameter{}", name,
                            impl_->initialised ? "" : " (or init() was not called)"));
  return impl_->update->le.to_host(it->second);
}

void Trainer::write_history_csv(const std::string& path) const {
  // Written beside the file and renamed over it: a reader (or a run killed while writing, when
  // this is called after every step) sees the old file or the new one, never a torn one.
  // A temporary of this process's own: two runs writing into one folder (ctest -j, a sweep) must
  // not rename each other's half-written files.
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream f(tmp);
    if (!f) throw Error(fmt::format("Trainer::write_history_csv: cannot write '{}'", tmp));
    f << "step,loss,grad_norm,lr,seconds,tokens_per_s,micro_batches,skipped\n";
    for (const StepRecord& r : impl_->history)
      f << fmt::format("{},{:.9g},{:.9g},{:.9g},{:.6f},{:.1f},{},{}\n", r.step, r.loss, r.grad_norm, r.lr, r.seconds,
                       r.tokens_per_s, r.micro_batches, r.skipped ? 1 : 0);
    f.flush();
    if (!f) throw Error(fmt::format("Trainer::write_history_csv: writing '{}' failed", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error(fmt::format("Trainer::write_history_csv: cannot rename '{}' to '{}': {}", tmp, path,
                            std::strerror(errno)));
}

void Trainer::write_loss_svg(const std::string& path, const std::string& title) const {
  std::vector<std::pair<double, double>> pts;
  for (const StepRecord& r : impl_->history)
    if (!r.skipped && std::isfinite(r.loss)) pts.emplace_back(static_cast<double>(r.step), r.loss);
  if (pts.empty()) throw Error("Trainer::write_loss_svg: no finite step recorded yet");
  double x0 = pts.front().first, x1 = pts.back().first, y0 = pts[0].second, y1 = pts[0].second;
  for (const auto& [x, y] : pts) y0 = std::min(y0, y), y1 = std::max(y1, y);
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double w = 640, h = 360, left = 60, right = 20, top = 40, bottom = 40;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * (w - left - right); };
  auto py = [&](double y) { return top + (y1 - y) / (y1 - y0) * (h - top - bottom); };
  std::string line;
  for (const auto& [x, y] : pts) line += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
  std::string escaped;
  for (char c : title) escaped += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  std::ofstream f(path);
  if (!f) throw Error(fmt::format("Trainer::write_loss_svg: cannot write '{}'", path));
  f << fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" font-size=\"14\">{3}</text>\n"
      "<line x1=\"{2}\" y1=\"{4}\" x2=\"{2}\" y2=\"{5}\" stroke=\"black\"/>\n"
      "<line x1=\"{2}\" y1=\"{5}\" x2=\"{6}\" y2=\"{5}\" stroke=\"black\"/>\n"
      "<text x=\"{7}\" y=\"{8}\" text-anchor=\"end\">{9:.4g}</text>\n"
      "<text x=\"{7}\" y=\"{5}\" text-anchor=\"end\">{10:.4g}</text>\n"
      "<text x=\"{2}\" y=\"{11}\">step {12}</text>\n"
      "<text x=\"{6}\" y=\"{11}\" text-anchor=\"end\">step {13}</text>\n"
      "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{14}\"/>\n</svg>\n",
      w, h, left, escaped, top, h - bottom, w - right, left - 4, top + 4, y1, y0, h - bottom + 16, x0,
      pts.back().first, line);
  if (!f) throw Error(fmt::format("Trainer::write_loss_svg: writing '{}' failed", path));
}

}  // namespace tessel
