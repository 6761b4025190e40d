// PipelineTrainer (pipeline/runner.hpp): the virtual stages' programs loaded on their stage's
// runtime, one host thread per stage running its schedule, mailboxes between the threads, then
// the update (norm, clipping, AdamW) per virtual stage.
#include "tessel/pipeline/runner.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "tessel/executable.hpp"
#include "tessel/ops/builders.hpp"
#include "tessel/runtime/loaded_executable.hpp"
#include "stage_links.hpp"

namespace tessel {

namespace {

using Arrays = std::map<std::string, ShardedArray>;
using detail::Hosts;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct StageProgram {
  Executable exe;
  LoadedExecutable loaded;
};

StageProgram load_program(const Graph& g, const Mesh& mesh, Runtime& rt, const LoadOptions& lo = {}) {
  Executable exe = compile(g, mesh);
  LoadedExecutable l = load(exe, rt, lo);
  return StageProgram{std::move(exe), std::move(l)};
}

// `a`, an array of `from`, as input `name` of `to` (the same runtime and mesh): the array itself
// when `to` lays the input out alike, else through the host.
ShardedArray carry(const LoadedExecutable& from, const ShardedArray& a, const LoadedExecutable& to,
                   const std::string& name) {
  return a.sharding() == to.input_sharding(name) ? a : to.to_device(name, from.to_host(a));
}

// Whether `p` takes an input named `name`.
bool takes(const LoadedExecutable& p, const std::string& name) {
  const std::vector<std::string>& in = p.input_names();
  return std::find(in.begin(), in.end(), name) != in.end();
}

// acc += h, element by element (the sum of a tied parameter's gradient accumulators, which are
// f32: a plain loop over the floats; another type goes through HostTensor::get/set).
void add_into(HostTensor& acc, const HostTensor& h) {
  if (acc.dtype() == DType::f32 && h.dtype() == DType::f32 && acc.numel() == h.numel()) {
    float* a = acc.as<float>();
    const float* b = h.as<float>();
    for (int64_t i = 0; i < h.numel(); ++i) a[i] += b[i];
    return;
  }
  for (int64_t i = 0; i < h.numel(); ++i) acc.set(i, acc.get(i) + h.get(i));
}

}  // namespace

struct PipelineTrainer::Impl {
  std::vector<PipelineStage> stages;
  std::vector<Runtime*> runtimes;
  PipelineOptions o;
  Schedule schedule;
  int64_t P = 1, V = 1;  // stages, virtual stages
  // bwd: the backward; with a split schedule (zb-h1) its W half, and bwd_b its B half (none
  // where B is empty: a stage receiving no float value).
  std::vector<std::optional<StageProgram>> fwd, bwd, bwd_b, sumsq, update;
  std::vector<std::vector<std::string>> stash_names;  // per virtual stage: B's outputs W reads (split_backward)
  std::vector<std::vector<std::string>> owned;  // per virtual stage: the parameters it updates
  // The master values, by name. A parameter of this process's stages that only its owner uses
  // lives on the owner's devices (param_dev, the update's layout) between steps; its host value
  // here is then `stale` and read back only when asked for (host_param). A tied parameter (used
  // by several virtual stages) is read back after every update: the other holders take it from here.
  mutable Hosts params;
  mutable std::set<std::string> stale;
  std::set<std::string> tied;
  std::vector<Arrays> param_dev;                // per virtual stage: its owned parameters on its devices
  std::vector<Arrays> state_of;                 // per virtual stage: its adam.m/v arrays (the update's layout)
  detail::StagePlacement where;                 // which stages run in this process
  std::unique_ptr<detail::StageLinks> links;
  int64_t steps_run = 0;
  bool local(int64_t vs) const { return where.local(vs % P); }
  // The values of the parameters this process's stages own (with `moments`, their AdamW
  // moments too), gathered from every process: each stage's once.
  Hosts gather_owned(bool moments) const;
  // Virtual stage vs's parameters on its forward's devices: an owned one carried from the last
  // update's result, the others (a tied parameter another stage owns, or the first step's
  // values) sent from the host in one transfer.
  Arrays forward_params(int64_t vs) const {
    const auto u = static_cast<std::size_t>(vs);
    Arrays out;
    std::map<std::string, HostTensor> send;
    for (const std::string& n : stages[u].params) {
      auto it = param_dev[u].find(n);
      if (it != param_dev[u].end()) out.emplace(n, carry(update[u]->loaded, it->second, fwd[u]->loaded, n));
      else send.emplace(n, host_param(n));
    }
    for (auto& [n, arr] : fwd[u]->loaded.to_device(send)) out.emplace(n, std::move(arr));
    return out;
  }
  // Parameter `n`'s host value, read back from its owner's devices when stale.
  const HostTensor& host_param(const std::string& n) const {
    if (stale.count(n)) {
      for (int64_t vs = 0; vs < V; ++vs) {
        const auto u = static_cast<std::size_t>(vs);
        auto it = param_dev[u].find(n);
        if (local(vs) && it != param_dev[u].end()) {
          params.at(n) = update[u]->loaded.to_host(it->second);
          break;
        }
      }
      stale.erase(n);
    }
    return params.at(n);
  }
};

std::vector<int> pipeline_stage_ranks(int processes, int64_t stages, int64_t stage) {
  if (stages < 1 || processes < 1 || processes % stages != 0)
    throw Error(fmt::format("pipeline: {} processes for {} stages: every stage needs as many processes (run a "
                            "multiple of {} processes)",
                            processes, stages, stages));
  if (stage < 0 || stage >= stages) throw Error(fmt::format("pipeline: no stage {} of {}", stage, stages));
  const int k = processes / static_cast<int>(stages);
  std::vector<int> r;
  for (int i = 0; i < k; ++i) r.push_back(static_cast<int>(stage) * k + i);
  return r;
}

Hosts PipelineTrainer::Impl::gather_owned(bool moments) const {
  Hosts mine;
  for (int64_t vs = 0; vs < V; ++vs) {
    if (!local(vs)) continue;
    const auto u = static_cast<std::size_t>(vs);
    for (const std::string& n : owned[u]) mine[n] = host_param(n);
    if (moments)
      for (const auto& [n, arr] : state_of[u]) mine[n] = update[u]->loaded.to_host(arr);
  }
  if (!where.processes) return mine;
  Hosts all;
  for (const std::string& b : where.gather(where.leader() ? detail::pack_hosts(mine) : std::string()))
    for (auto& [n, t] : detail::unpack_hosts(b, "pipeline: the gathered state")) all[n] = std::move(t);
  return all;
}

PipelineTrainer::PipelineTrainer(std::vector<PipelineStage> stages, const Mesh& stage_mesh,
                                 std::vector<Runtime*> runtimes, const std::map<std::string, HostTensor>& params,
                                 PipelineOptions options)
    : PipelineTrainer(std::move(stages), std::vector<Mesh>(runtimes.size(), stage_mesh), runtimes, params,
                      std::move(options)) {}

PipelineTrainer::PipelineTrainer(std::vector<PipelineStage> stages, const std::vector<Mesh>& stage_meshes,
                                 std::vector<Runtime*> runtimes, const std::map<std::string, HostTensor>& params,
                                 PipelineOptions options)
    : p_(std::make_unique<Impl>()) {
  Impl& I = *p_;
  I.stages = std::move(stages);
  I.runtimes = std::move(runtimes);
  I.o = options;
  I.P = static_cast<int64_t>(I.runtimes.size());
  I.V = static_cast<int64_t>(I.stages.size());
  if (I.P < 1 || I.o.chunks < 1 || I.V != I.P * I.o.chunks)
    throw Error(fmt::format("PipelineTrainer: {} virtual stages for {} runtimes of {} chunks each (give stages x "
                            "chunks of them)",
                            I.V, I.P, I.o.chunks));
  if (static_cast<int64_t>(stage_meshes.size()) != I.P)
    throw Error(fmt::format("PipelineTrainer: {} stage meshes for {} stages (give one per stage)", stage_meshes.size(),
                            I.P));
  I.where.stages = I.P;
  if (I.o.processes) {
    const int N = I.o.processes->size();
    const std::vector<int> mine = pipeline_stage_ranks(N, I.P, 0);
    I.where.processes = I.o.processes;
    I.where.per_stage = static_cast<int>(mine.size());
    I.where.my_stage = I.o.processes->rank() / I.where.per_stage;
    I.where.index = I.o.processes->rank() % I.where.per_stage;
  }
  for (int64_t s = 0; s < I.P; ++s) {
    Runtime* rt = I.runtimes[static_cast<std::size_t>(s)];
    if (I.where.local(s) && !rt)
      throw Error(I.o.processes ? fmt::format("PipelineTrainer: process {} runs stage {}, whose runtime is null",
                                              I.o.processes->rank(), s)
                                : fmt::format("PipelineTrainer: stage {}'s runtime is null", s));
    if (!I.where.local(s) && rt)
      throw Error(fmt::format("PipelineTrainer: process {} runs stage {} only; give null for stage {}'s runtime (its "
                              "processes give theirs)",
                              I.o.processes->rank(), I.where.my_stage, s));
    if (rt && rt->process_count() != I.where.per_stage)
      throw Error(I.o.processes
                      ? fmt::format("PipelineTrainer: stage {}'s runtime spans {} processes; the stage has {} ({} "
                                    "processes for {} stages)",
                                    s, rt->process_count(), I.where.per_stage, I.o.processes->size(), I.P)
                      : fmt::format("PipelineTrainer: stage {}'s runtime spans {} processes: give "
                                    "PipelineOptions::processes (the pipeline's processes) and each process its "
                                    "stage's runtime",
                                    s, rt->process_count()));
  }
  I.links = std::make_unique<detail::StageLinks>(I.where, I.o.timeout_s);
  I.schedule = make_schedule(I.o.schedule, I.P, I.o.micro, I.o.chunks);
  if (I.o.zero < 0 || I.o.zero > 3)
    throw Error(fmt::format("PipelineTrainer: zero={} is not a ZeRO stage (0 to 3 within each pipeline stage)",
                            I.o.zero));
  const AdamWConfig& a = I.o.adamw;
  if (I.o.remat == RematPolicy::einsums)
    throw Error("PipelineTrainer: remat=einsums is not supported within pipeline stages (all: recompute the stage's "
                "forward, the default; none: keep its activations)");
  if (I.o.remat == RematPolicy::none)
    for (PipelineStage& st : I.stages) st = keep_activations(std::move(st));

  // Every parameter given, of the graphs' type; each updated by the first virtual stage using it.
  std::set<std::string> seen;
  I.owned.resize(static_cast<std::size_t>(I.V));
  for (int64_t vs = 0; vs < I.V; ++vs) {
    const PipelineStage& st = I.stages[static_cast<std::size_t>(vs)];
    for (const std::string& n : st.params) {
      const Value& v = st.forward.values[static_cast<std::size_t>(st.forward.find(n))];
      auto it = params.find(n);
      if (it == params.end()) throw Error(fmt::format("PipelineTrainer: no value given for parameter '{}'", n));
      if (it->second.dtype() != v.dtype || it->second.shape() != v.shape)
        throw Error(fmt::format("PipelineTrainer: parameter '{}' is {}; stage {} uses it as {}", n,
                                type_str(it->second.dtype(), it->second.shape()), vs, type_str(v.dtype, v.shape)));
      I.params[n] = it->second;
      if (seen.insert(n).second) I.owned[static_cast<std::size_t>(vs)].push_back(n);
      else I.tied.insert(n);
    }
  }

  I.fwd.resize(static_cast<std::size_t>(I.V));
  I.bwd.resize(static_cast<std::size_t>(I.V));
  I.bwd_b.resize(static_cast<std::size_t>(I.V));
  I.stash_names.resize(static_cast<std::size_t>(I.V));
  I.sumsq.resize(static_cast<std::size_t>(I.V));
  I.update.resize(static_cast<std::size_t>(I.V));
  I.state_of.resize(static_cast<std::size_t>(I.V));
  I.param_dev.resize(static_cast<std::size_t>(I.V));
  for (int64_t vs = 0; vs < I.V; ++vs) {
    if (!I.local(vs)) continue;
    PipelineStage& st = I.stages[static_cast<std::size_t>(vs)];
    Runtime& rt = *I.runtimes[static_cast<std::size_t>(vs % I.P)];
    const Mesh& stage_mesh = stage_meshes[static_cast<std::size_t>(vs % I.P)];
    st.forward.mesh = stage_mesh;
    st.backward.mesh = stage_mesh;
    // Each parameter's layouts: its own (the forward's annotation, else replicated) and ZeRO's
    // (split over data where a dim divides). ZeRO-3 stores the parameter in ZeRO's layout too.
    std::map<std::string, std::pair<Sharding, Sharding>> layouts;
    for (const std::string& n : st.params) {
      const int id = st.forward.find(n);
      auto ann = st.forward.annotations.find(id);
      const Shape& shape = st.forward.values[static_cast<std::size_t>(id)].shape;
      Sharding base = ann != st.forward.annotations.end() ? ann->second.sharding.closed_copy()
                                                          : Sharding::replicated(static_cast<int>(shape.size()));
      Sharding zl = I.o.zero >= 1 ? zero_layout(base, shape, stage_mesh, I.o.data_axis) : base;
      if (I.o.zero >= 3) base = zl;
      layouts.emplace(n, std::make_pair(std::move(base), std::move(zl)));
    }
    if (I.o.zero >= 3)  // ZeRO-3: the forward and backward take each parameter split, gathered per use
      for (const std::string& n : st.params)
        for (Graph* g : {&st.forward, &st.backward}) {
          const int id = g->find(n);
          if (id < 0) continue;
          g->annotate(id, layouts.at(n).first);
          g->expect_gathers(g->tensor(id));
        }
    I.fwd[static_cast<std::size_t>(vs)].emplace(load_program(st.forward, stage_mesh, rt));
    if (I.o.zero >= 2)  // ZeRO-2: the accumulators split like the moments
      for (const std::string& n : st.params) {
        const Sharding& zl = layouts.at(n).second;
        st.backward.annotate(st.backward.find("grad.acc." + n), zl);
        st.backward.annotate(st.backward.find("next.grad.acc." + n), zl);
      }
    LoadOptions donate;
    for (const std::string& n : st.params) donate.donate.emplace_back("grad.acc." + n, "next.grad.acc." + n);
    if (I.schedule.split_backward()) {
      SplitBackward sb = split_backward(st);
      sb.weight_grad.mesh = stage_mesh;
      sb.input_grad.mesh = stage_mesh;
      I.bwd[static_cast<std::size_t>(vs)].emplace(load_program(sb.weight_grad, stage_mesh, rt, donate));
      if (!sb.input_grad.outputs.empty())
        I.bwd_b[static_cast<std::size_t>(vs)].emplace(load_program(sb.input_grad, stage_mesh, rt));
      I.stash_names[static_cast<std::size_t>(vs)] = std::move(sb.stash);
    } else {
      I.bwd[static_cast<std::size_t>(vs)].emplace(load_program(st.backward, stage_mesh, rt, donate));
    }

    // The sum of squares of the stage's mean gradients (its share of the global norm), and the
    // update of the parameters it owns: AdamW on grad.acc scaled by gscale (1/M times the
    // clipping factor), as add_train_step.
    const std::vector<std::string>& own = I.owned[static_cast<std::size_t>(vs)];
    if (own.empty()) continue;
    Graph sq, up;
    Tensor total;
    Tensor lr = input(up, "adam.lr", DType::f32, {});
    Tensor bc1 = input(up, "adam.bc1", DType::f32, {});
    Tensor bc2 = input(up, "adam.bc2", DType::f32, {});
    Tensor gscale = input(up, "gscale", DType::f32, {});
    Tensor mean = input(sq, "mean", DType::f32, {});
    LoadOptions upd;
    std::vector<Tensor> outs;
    for (const std::string& n : own) {
      const Value& v = st.forward.values[static_cast<std::size_t>(st.forward.find(n))];
      const Sharding& base = layouts.at(n).first;
      const Sharding& zl = layouts.at(n).second;
      Tensor acc = input(sq, "grad.acc." + n, DType::f32, v.shape);
      Tensor gm = mul(acc, mean);
      std::vector<int64_t> all;
      for (std::size_t d = 0; d < v.shape.size(); ++d) all.push_back(static_cast<int64_t>(d));
      Tensor part = all.empty() ? mul(gm, gm) : reduce_sum(mul(gm, gm), all);
      total = total.anchor ? add(total, part) : part;
      Tensor p = input(up, n, v.dtype, v.shape);
      Tensor g = input(up, "grad.acc." + n, DType::f32, v.shape);
      Tensor m = input(up, "adam.m." + n, DType::f32, v.shape);
      Tensor vv = input(up, "adam.v." + n, DType::f32, v.shape);
      const Sharding& acc_layout = I.o.zero >= 2 ? zl : base;
      sq.annotate(acc, acc_layout);
      up.annotate(g, acc_layout);
      up.annotate(p, base);
      up.annotate(m, zl);
      up.annotate(vv, zl);
      AdamWResults r = adamw(p, g, m, vv, lr, bc1, bc2, gscale, a.beta1, a.beta2, a.eps,
                             v.shape.size() >= 2 ? a.weight_decay : 0.0);
      Tensor p2 = r.param.named("next." + n);
      up.annotate(p2, base);
      // ZeRO 1-2: each device updates its block (as the moments') and the blocks are all-gathered
      // into the stored parameter, by design.
      if (I.o.zero >= 1) up.expect_gathers(p2);
      up.annotate(r.m, zl);
      up.annotate(r.v, zl);
      outs.push_back(p2);
      outs.push_back(r.m.named("next.adam.m." + n));
      outs.push_back(r.v.named("next.adam.v." + n));
      upd.donate.emplace_back("adam.m." + n, "next.adam.m." + n);
      upd.donate.emplace_back("adam.v." + n, "next.adam.v." + n);
    }
    sq.mark_output(total.named("sumsq"));
    for (const Tensor& t : outs) up.mark_output(t);
    sq.mesh = stage_mesh;
    up.mesh = stage_mesh;
    I.sumsq[static_cast<std::size_t>(vs)].emplace(load_program(sq, stage_mesh, rt));
    I.update[static_cast<std::size_t>(vs)].emplace(load_program(up, stage_mesh, rt, upd));
    LoadedExecutable& u = I.update[static_cast<std::size_t>(vs)]->loaded;
    for (const std::string& n : own) {
      const HostTensor zero(DType::f32, I.params.at(n).shape());
      I.state_of[static_cast<std::size_t>(vs)].emplace("adam.m." + n, u.to_device("adam.m." + n, zero));
      I.state_of[static_cast<std::size_t>(vs)].emplace("adam.v." + n, u.to_device("adam.v." + n, zero));
    }
  }
}

PipelineTrainer::~PipelineTrainer() = default;

const Schedule& PipelineTrainer::schedule() const { return p_->schedule; }

std::map<std::string, HostTensor> PipelineTrainer::params() const { return p_->gather_owned(false); }

std::map<std::string, HostTensor> PipelineTrainer::state() const { return p_->gather_owned(true); }

std::map<std::string, Sharding> PipelineTrainer::state_shardings() const {
  std::map<std::string, Sharding> out;
  for (int64_t vs = 0; vs < p_->V; ++vs) {
    const auto u = static_cast<std::size_t>(vs);
    if (!p_->local(vs)) continue;
    for (const std::string& n : p_->owned[u])
      for (const std::string& name : {n, "adam.m." + n, "adam.v." + n})
        out.emplace(name, p_->update[u]->loaded.input_sharding(name));
  }
  return out;
}

void PipelineTrainer::set_state(const std::map<std::string, HostTensor>& values) {
  Impl& I = *p_;
  std::map<std::string, HostTensor> params;
  std::vector<Arrays> state(static_cast<std::size_t>(I.V));
  std::size_t used = 0;
  auto take = [&](const std::string& name, DType dt, const Shape& shape) -> const HostTensor& {
    auto it = values.find(name);
    if (it == values.end()) throw Error(fmt::format("PipelineTrainer::set_state: the state has no '{}'", name));
    if (it->second.dtype() != dt || it->second.shape() != shape)
      throw Error(fmt::format("PipelineTrainer::set_state: '{}' is {}; the model's is {}", name,
                              type_str(it->second.dtype(), it->second.shape()), type_str(dt, shape)));
    ++used;
    return it->second;
  };
  for (int64_t vs = 0; vs < I.V; ++vs) {
    const auto u = static_cast<std::size_t>(vs);
    for (const std::string& n : I.owned[u]) {
      const HostTensor& now = I.params.at(n);  // (its type: a stale value has the same)
      params[n] = take(n, now.dtype(), now.shape());
      for (const std::string& mv : {"adam.m." + n, "adam.v." + n}) {
        const HostTensor& h = take(mv, DType::f32, now.shape());
        if (I.local(vs)) state[u].emplace(mv, I.update[u]->loaded.to_device(mv, h));
      }
    }
  }
  if (used != values.size())
    for (const auto& [name, v] : values)
      if (!params.count(name) && name.rfind("adam.", 0) != 0)
        throw Error(fmt::format("PipelineTrainer::set_state: '{}' is not part of the training state", name));
  if (used != values.size())
    throw Error(fmt::format("PipelineTrainer::set_state: {} values given, the state has {}", values.size(), used));
  I.params = std::move(params);
  I.stale.clear();
  for (Arrays& a : I.param_dev) a.clear();  // the next step sends the new values
  I.state_of = std::move(state);
}

PipelineStepReport PipelineTrainer::step(const std::vector<std::map<std::string, HostTensor>>& micro_batches,
                                         double lr, int64_t t) {
  Impl& I = *p_;
  const int64_t M = I.o.micro;
  if (static_cast<int64_t>(micro_batches.size()) != M)
    throw Error(fmt::format("PipelineTrainer::step: {} micro-batches given; the schedule runs {}", micro_batches.size(),
                            M));
  if (t < 1) throw Error(fmt::format("PipelineTrainer::step: step {} (steps count from 1)", t));
  for (int64_t vs = 0; vs < I.V; ++vs)
    for (const std::string& n : I.stages[static_cast<std::size_t>(vs)].data)
      for (int64_t m = 0; m < M; ++m)
        if (!micro_batches[static_cast<std::size_t>(m)].count(n))
          throw Error(fmt::format("PipelineTrainer::step: micro-batch {} has no '{}' (stage {} reads it)", m, n, vs));

  // Per virtual stage: the parameters on its forward's and backward's devices, zero accumulators.
  std::vector<Arrays> fparams(static_cast<std::size_t>(I.V)), bparams(static_cast<std::size_t>(I.V)),
      bbparams(static_cast<std::size_t>(I.V)), acc(static_cast<std::size_t>(I.V));
  // A parameter the stage owns is on its devices already (the last update's result); the others
  // (a tied parameter another stage owns, or the first step's values) come from the host, with
  // the zero accumulators, in one transfer per program.
  for (int64_t vs = 0; vs < I.V; ++vs) {
    if (!I.local(vs)) continue;
    const auto u = static_cast<std::size_t>(vs);
    std::map<std::string, HostTensor> zeros;
    for (const std::string& n : I.stages[u].params)
      zeros.emplace("grad.acc." + n, HostTensor(DType::f32, I.params.at(n).shape()));
    fparams[u] = I.forward_params(vs);
    for (const auto& [n, f] : fparams[u]) {
      if (takes(I.bwd[u]->loaded, n)) bparams[u].emplace(n, carry(I.fwd[u]->loaded, f, I.bwd[u]->loaded, n));
      if (I.bwd_b[u] && takes(I.bwd_b[u]->loaded, n))
        bbparams[u].emplace(n, carry(I.fwd[u]->loaded, f, I.bwd_b[u]->loaded, n));
    }
    acc[u] = I.bwd[u]->loaded.to_device(zeros);
  }

  detail::StageLinks& mail = *I.links;
  mail.begin_step(++I.steps_run);
  std::vector<double> losses(static_cast<std::size_t>(M), 0.0);
  PipelineStepReport rep;
  rep.busy_s.assign(static_cast<std::size_t>(I.P), 0.0);
  rep.peak_in_flight.assign(static_cast<std::size_t>(I.P), 0);
  rep.peak_kept_bytes.assign(static_cast<std::size_t>(I.P), 0);
  std::vector<double> first(static_cast<std::size_t>(I.P), 0.0), last(static_cast<std::size_t>(I.P), 0.0);
  std::mutex err_mu;
  std::string error;

  auto run_stage = [&](int64_t s) {
    // Stash: each (virtual stage, micro-batch)'s forward inputs until its backward (a split
    // schedule: until its W).
    std::map<std::pair<int64_t, int64_t>, Arrays> stash;
    // A split schedule's B results W reads (B's arrays by name) and the gradients it received
    // (on the host), from its B to its W.
    struct ForW {
      Arrays from_b;
      Hosts grads;
    };
    std::map<std::pair<int64_t, int64_t>, ForW> for_w;
    int64_t in_flight = 0, kept_bytes = 0;
    auto bytes_of = [](const Arrays& arrays) {  // per device
      int64_t b = 0;
      for (const auto& [n, arr] : arrays) b += num_elements(arr.local_shape()) * static_cast<int64_t>(dtype_size(arr.dtype()));
      return b;
    };
    const PipeOp* at = nullptr;
    try {
      bool started = false;
      for (const PipeOp& op : I.schedule.order[static_cast<std::size_t>(s)]) {
        at = &op;
        const int64_t vs = op.chunk * I.P + s, m = op.micro;
        const auto u = static_cast<std::size_t>(vs);
        const PipelineStage& st = I.stages[u];
        Hosts recv;
        if (op.forward && vs > 0) recv = mail.take(0, vs, m);
        if (!op.forward && !op.weight && vs + 1 < I.V) recv = mail.take(1, vs, m);
        const double t0 = now_s();
        if (!started) first[static_cast<std::size_t>(s)] = t0;
        started = true;
        if (op.forward) {
          LoadedExecutable& f = I.fwd[u]->loaded;
          Arrays in = fparams[u];
          std::map<std::string, HostTensor> send;  // the micro-batch's data and the received values, at once
          for (const std::string& n : st.data) send.emplace(n, micro_batches[static_cast<std::size_t>(m)].at(n));
          for (const std::string& n : st.recv) send.emplace(n, recv.at(n));
          Arrays keep = f.to_device(send);
          in.insert(keep.begin(), keep.end());
          RunResult r = f.run_named(in);
          for (const std::string& n : st.saved) keep.emplace(n, f.output(r, n));  // kept activations
          Hosts out;
          for (const std::string& n : st.send) out.emplace(n, f.to_host(f.output(r, n)));
          if (!st.loss.empty()) losses[static_cast<std::size_t>(m)] = f.to_host(f.output(r, st.loss)).get(0);
          kept_bytes += bytes_of(keep);
          stash.emplace(std::make_pair(vs, m), std::move(keep));
          rep.peak_in_flight[static_cast<std::size_t>(s)] =
              std::max(rep.peak_in_flight[static_cast<std::size_t>(s)], ++in_flight);
          rep.peak_kept_bytes[static_cast<std::size_t>(s)] =
              std::max(rep.peak_kept_bytes[static_cast<std::size_t>(s)], kept_bytes);
          if (vs + 1 < I.V) mail.put(0, vs + 1, m, std::move(out));
        } else if (I.schedule.split_backward() && !op.weight) {
          // B: the gradients of the received values, sent back at once; what W needs kept.
          ForW keep_w;
          for (const std::string& n : st.send) keep_w.grads.emplace("grad." + n, recv.at("grad." + n));
          Hosts out;
          if (I.bwd_b[u]) {
            LoadedExecutable& b = I.bwd_b[u]->loaded;
            Arrays in = bbparams[u];
            for (auto& [n, arr] : stash.at({vs, m}))
              if (takes(b, n)) in.emplace(n, carry(I.fwd[u]->loaded, arr, b, n));
            std::map<std::string, HostTensor> grads;
            for (const auto& [n, h] : keep_w.grads)
              if (takes(b, n)) grads.emplace(n, h);
            for (auto& [n, arr] : b.to_device(grads)) in.emplace(n, std::move(arr));
            RunResult r = b.run_named(in);
            for (const std::string& n : st.recv)
              if (st.backward.find("grad." + n) >= 0) out.emplace("grad." + n, b.to_host(b.output(r, "grad." + n)));
            for (const std::string& n : I.stash_names[u]) keep_w.from_b.emplace(n, b.output(r, n));
            kept_bytes += bytes_of(keep_w.from_b);
            rep.peak_kept_bytes[static_cast<std::size_t>(s)] =
                std::max(rep.peak_kept_bytes[static_cast<std::size_t>(s)], kept_bytes);
          }
          for_w.emplace(std::make_pair(vs, m), std::move(keep_w));
          --in_flight;
          if (vs > 0) mail.put(1, vs - 1, m, std::move(out));
        } else if (op.weight) {
          // W: the weights' gradients into the accumulators, from what B kept and the forward's inputs.
          LoadedExecutable& w = I.bwd[u]->loaded;
          auto kept = stash.find({vs, m});
          auto fw = for_w.find({vs, m});
          Arrays in = bparams[u];
          for (auto& [n, arr] : kept->second)
            if (takes(w, n)) in.emplace(n, carry(I.fwd[u]->loaded, arr, w, n));
          for (auto& [n, arr] : fw->second.from_b) in.emplace(n, carry(I.bwd_b[u]->loaded, arr, w, n));
          std::map<std::string, HostTensor> grads;
          for (const auto& [n, h] : fw->second.grads)
            if (takes(w, n)) grads.emplace(n, h);
          for (auto& [n, arr] : w.to_device(grads)) in.emplace(n, std::move(arr));
          for (auto& [n, arr] : acc[u]) in.emplace(n, arr);
          RunResult r = w.run_named(in);
          for (const std::string& n : st.params) acc[u].at("grad.acc." + n) = w.output(r, "next.grad.acc." + n);
          kept_bytes -= bytes_of(kept->second) + bytes_of(fw->second.from_b);
          stash.erase(kept);
          for_w.erase(fw);
        } else {
          LoadedExecutable& b = I.bwd[u]->loaded;
          Arrays in = bparams[u];
          // The forward's inputs, kept on the devices (copied only where the backward lays one
          // out otherwise).
          auto kept = stash.find({vs, m});
          for (auto& [n, arr] : kept->second)
            if (takes(b, n)) in.emplace(n, carry(I.fwd[u]->loaded, arr, b, n));
          kept_bytes -= bytes_of(kept->second);
          stash.erase(kept);
          --in_flight;
          std::map<std::string, HostTensor> grads;
          for (const std::string& n : st.send) grads.emplace("grad." + n, recv.at("grad." + n));
          for (auto& [n, arr] : b.to_device(grads)) in.emplace(n, std::move(arr));
          for (auto& [n, arr] : acc[u]) in.emplace(n, arr);
          RunResult r = b.run_named(in);
          for (const std::string& n : st.params) acc[u].at("grad.acc." + n) = b.output(r, "next.grad.acc." + n);
          if (vs > 0) {
            Hosts out;
            for (const std::string& n : st.recv)
              if (st.backward.find("grad." + n) >= 0)
                out.emplace("grad." + n, b.to_host(b.output(r, "grad." + n)));
            mail.put(1, vs - 1, m, std::move(out));
          }
        }
        const double t1 = now_s();
        rep.busy_s[static_cast<std::size_t>(s)] += t1 - t0;
        last[static_cast<std::size_t>(s)] = t1;
      }
    } catch (const std::exception& e) {
      std::string what;
      {
        std::lock_guard<std::mutex> l(err_mu);
        what = at ? fmt::format("pipeline stage {}, the {} of micro-batch {} (chunk {}): {}", s,
                                at->forward                      ? "forward"
                                : at->weight                     ? "weight backward (W)"
                                : I.schedule.split_backward()    ? "input backward (B)"
                                                                 : "backward",
                                at->micro, at->chunk, e.what())
                  : fmt::format("pipeline stage {}: {}", s, e.what());
        if (error.empty() || error.find("another stage failed") != std::string::npos) error = what;
      }
      mail.fail(what);
    }
  };
  // Every process starts the schedule together: each measures its stages' first and last op from
  // here, and the span is from the earliest first to the latest last.
  I.where.gather(std::string());
  const double t_start = now_s();
  std::vector<std::thread> threads;
  for (int64_t s = 0; s < I.P; ++s)
    if (I.where.local(s)) threads.emplace_back(run_stage, s);
  for (std::thread& th : threads) th.join();
  // Across processes every process learns whether any stage failed, and rethrows the cause (not
  // a stage that stopped for another's failure).
  {
    std::string cause;
    for (const std::string& e : I.where.gather(error))
      if (!e.empty() && (cause.empty() || cause.find("another stage failed") != std::string::npos)) cause = e;
    if (!cause.empty()) throw Error(cause);
  }
  // The report: each stage's figures (the losses from the last), gathered from its process.
  double begin = std::numeric_limits<double>::infinity(), end = 0;
  {
    std::vector<double> mine;  // per local stage: s, busy, in flight, kept bytes, start, end, then the losses
    for (int64_t s = 0; s < I.P; ++s) {
      if (!I.where.local(s)) continue;
      const auto u = static_cast<std::size_t>(s);
      mine.insert(mine.end(), {static_cast<double>(s), rep.busy_s[u], static_cast<double>(rep.peak_in_flight[u]),
                               static_cast<double>(rep.peak_kept_bytes[u]), first[u] - t_start, last[u] - t_start});
      if (s == I.P - 1) mine.insert(mine.end(), losses.begin(), losses.end());
    }
    for (const std::string& b : I.where.gather(I.where.leader() ? detail::pack_doubles(mine) : std::string())) {
      const std::vector<double> v = detail::unpack_doubles(b, "pipeline: the gathered step report");
      for (std::size_t i = 0; i + 6 <= v.size();) {
        const int64_t s = static_cast<int64_t>(v[i]);
        const auto u = static_cast<std::size_t>(s);
        rep.busy_s[u] = v[i + 1];
        rep.peak_in_flight[u] = static_cast<int64_t>(v[i + 2]);
        rep.peak_kept_bytes[u] = static_cast<int64_t>(v[i + 3]);
        begin = std::min(begin, v[i + 4]);
        end = std::max(end, v[i + 5]);
        i += 6;
        if (s == I.P - 1) {
          if (v.size() < i + static_cast<std::size_t>(M))
            throw Error("pipeline: the gathered step report lacks the last stage's losses");
          std::copy(v.begin() + static_cast<std::ptrdiff_t>(i), v.begin() + static_cast<std::ptrdiff_t>(i) + M,
                    losses.begin());
          i += static_cast<std::size_t>(M);
        }
      }
    }
  }
  rep.span_s = end > begin ? end - begin : 0.0;
  double busy = 0;
  for (double b : rep.busy_s) busy += b;
  rep.bubble = rep.span_s > 0 ? 1.0 - busy / (static_cast<double>(I.P) * rep.span_s) : 0.0;
  for (double l : losses) rep.loss += l / static_cast<double>(M);

  // The update: a tied parameter's gradients summed into its owner's, one global norm, AdamW.
  const double t_up = now_s();
  std::map<std::string, int> holders;
  for (int64_t vs = 0; vs < I.V; ++vs)
    for (const std::string& n : I.stages[static_cast<std::size_t>(vs)].params) ++holders[n];
  Hosts shared_sum;  // parameter -> the sum of its holders' accumulators (every process's)
  {
    Hosts mine;
    for (int64_t vs = 0; vs < I.V; ++vs) {
      if (!I.local(vs)) continue;
      const auto u = static_cast<std::size_t>(vs);
      for (const std::string& n : I.stages[u].params) {
        if (holders.at(n) < 2) continue;
        HostTensor h = I.bwd[u]->loaded.to_host(acc[u].at("grad.acc." + n));
        auto it = mine.find(n);
        if (it == mine.end()) {
          mine.emplace(n, std::move(h));
        } else {
          add_into(it->second, h);
        }
      }
    }
    if (!I.where.processes) {
      shared_sum = std::move(mine);
    } else {
      bool any = false;
      for (const auto& [n, k] : holders) any = any || k >= 2;
      if (any)
        for (const std::string& b : I.where.gather(I.where.leader() ? detail::pack_hosts(mine) : std::string()))
          for (auto& [n, h] : detail::unpack_hosts(b, "pipeline: the gathered tied gradients")) {
            auto it = shared_sum.find(n);
            if (it == shared_sum.end()) {
              shared_sum.emplace(n, std::move(h));
            } else {
              add_into(it->second, h);
            }
          }
    }
  }
  const HostTensor mean = [&] {
    HostTensor x(DType::f32, {});
    x.set(0, 1.0 / static_cast<double>(M));
    return x;
  }();
  std::vector<Arrays> upd_acc(static_cast<std::size_t>(I.V));
  double sumsq = 0;
  for (int64_t vs = 0; vs < I.V; ++vs) {
    const auto u = static_cast<std::size_t>(vs);
    if (!I.local(vs) || !I.sumsq[u]) continue;
    LoadedExecutable& q = I.sumsq[u]->loaded;
    LoadedExecutable& up = I.update[u]->loaded;
    Arrays in;
    in.emplace("mean", q.to_device("mean", mean));
    for (const std::string& n : I.owned[u]) {
      const std::string a = "grad.acc." + n;
      if (shared_sum.count(n)) {  // a tied parameter: its holders' sum, from the host
        in.emplace(a, q.to_device(a, shared_sum.at(n)));
        upd_acc[u].emplace(a, up.to_device(a, shared_sum.at(n)));
      } else {
        in.emplace(a, carry(I.bwd[u]->loaded, acc[u].at(a), q, a));
        upd_acc[u].emplace(a, carry(I.bwd[u]->loaded, acc[u].at(a), up, a));
      }
    }
    sumsq += q.to_host(q.output(q.run_named(in), "sumsq")).get(0);
  }
  if (I.where.processes) {  // the global norm: every stage's share, summed
    double total = 0;
    for (const std::string& b : I.where.gather(I.where.leader() ? detail::pack_doubles({sumsq}) : std::string()))
      for (double x : detail::unpack_doubles(b, "pipeline: the gathered sums of squares")) total += x;
    sumsq = total;
  }
  rep.grad_norm = std::sqrt(sumsq);
  // A non-finite loss or norm (the same on every process: both are gathered) updates nothing.
  if (!std::isfinite(rep.loss) || !std::isfinite(rep.grad_norm)) {
    rep.applied = false;
    rep.update_s = now_s() - t_up;
    return rep;
  }
  const AdamWConfig& a = I.o.adamw;
  double clip = 1.0;
  if (a.clip_norm > 0 && rep.grad_norm > a.clip_norm) clip = a.clip_norm / (rep.grad_norm + 1e-6);
  auto scalar = [](double v) {
    HostTensor x(DType::f32, {});
    x.set(0, v);
    return x;
  };
  for (int64_t vs = 0; vs < I.V; ++vs) {
    const auto u = static_cast<std::size_t>(vs);
    if (!I.local(vs) || !I.update[u]) continue;
    LoadedExecutable& up = I.update[u]->loaded;
    Arrays in = upd_acc[u];
    std::map<std::string, HostTensor> send;  // the scalars and the parameters not on the devices, at once
    send.emplace("adam.lr", scalar(lr));
    send.emplace("adam.bc1", scalar(1.0 / (1.0 - std::pow(a.beta1, static_cast<double>(t)))));
    send.emplace("adam.bc2", scalar(1.0 / (1.0 - std::pow(a.beta2, static_cast<double>(t)))));
    send.emplace("gscale", scalar(clip / static_cast<double>(M)));
    for (const std::string& n : I.owned[u]) {
      auto it = I.param_dev[u].find(n);
      if (it != I.param_dev[u].end()) in.emplace(n, it->second);
      else send.emplace(n, I.host_param(n));
    }
    for (auto& [n, arr] : up.to_device(send)) in.emplace(n, std::move(arr));
    for (auto& [n, arr] : I.state_of[u]) in.emplace(n, arr);
    RunResult r = up.run_named(in);
    for (const std::string& n : I.owned[u]) {
      I.param_dev[u][n] = up.output(r, "next." + n);
      if (I.tied.count(n)) I.params.at(n) = up.to_host(I.param_dev[u][n]);  // the other holders read it
      else I.stale.insert(n);
      I.state_of[u].at("adam.m." + n) = up.output(r, "next.adam.m." + n);
      I.state_of[u].at("adam.v." + n) = up.output(r, "next.adam.v." + n);
    }
  }
  if (I.where.processes && !shared_sum.empty()) {
    // A tied parameter's new value, from its owner's process to the other holders'.
    Hosts mine;
    for (int64_t vs = 0; vs < I.V; ++vs)
      if (I.local(vs))
        for (const std::string& n : I.owned[static_cast<std::size_t>(vs)])
          if (shared_sum.count(n)) mine.emplace(n, I.params.at(n));
    for (const std::string& b : I.where.gather(I.where.leader() ? detail::pack_hosts(mine) : std::string()))
      for (auto& [n, h] : detail::unpack_hosts(b, "pipeline: the gathered tied parameters")) I.params.at(n) = std::move(h);
  }
  rep.update_s = now_s() - t_up;
  return rep;
}

double PipelineTrainer::evaluate(const std::map<std::string, HostTensor>& micro_batch) {
  Impl& I = *p_;
  for (int64_t vs = 0; vs < I.V; ++vs)
    for (const std::string& n : I.stages[static_cast<std::size_t>(vs)].data)
      if (!micro_batch.count(n))
        throw Error(fmt::format("PipelineTrainer::evaluate: the batch has no '{}' (stage {} reads it)", n, vs));
  detail::StageLinks& mail = *I.links;
  mail.begin_step(++I.steps_run);
  double loss = std::nan("");
  std::string error;
  // The virtual stages in order, each in its process: a stage waits for the one before it.
  for (int64_t vs = 0; vs < I.V && error.empty(); ++vs) {
    if (!I.local(vs)) continue;
    const auto u = static_cast<std::size_t>(vs);
    const PipelineStage& st = I.stages[u];
    try {
      Hosts recv;
      if (vs > 0) recv = mail.take(0, vs, 0);
      LoadedExecutable& f = I.fwd[u]->loaded;
      Arrays in = I.forward_params(vs);
      std::map<std::string, HostTensor> send;
      for (const std::string& n : st.data) send.emplace(n, micro_batch.at(n));
      for (const std::string& n : st.recv) send.emplace(n, recv.at(n));
      for (auto& [n, arr] : f.to_device(send)) in.emplace(n, std::move(arr));
      RunResult r = f.run_named(in);
      if (!st.loss.empty()) loss = f.to_host(f.output(r, st.loss)).get(0);
      if (vs + 1 < I.V) {
        Hosts out;
        for (const std::string& n : st.send) out.emplace(n, f.to_host(f.output(r, n)));
        mail.put(0, vs + 1, 0, std::move(out));
      }
    } catch (const std::exception& e) {
      error = fmt::format("pipeline stage {}, the forward of PipelineTrainer::evaluate (virtual stage {}): {}", vs % I.P,
                          vs, e.what());
      mail.fail(error);
    }
  }
  std::string cause;
  for (const std::string& e : I.where.gather(error))
    if (!e.empty() && (cause.empty() || cause.find("another stage failed") != std::string::npos)) cause = e;
  if (!cause.empty()) throw Error(cause);
  // The last stage's process has the loss: every process takes it.
  const bool last = I.local(I.V - 1);
  for (const std::string& b : I.where.gather(last && I.where.leader() ? detail::pack_doubles({loss}) : std::string()))
    for (double x : detail::unpack_doubles(b, "pipeline: the gathered evaluation loss")) loss = x;
  return loss;
}

}  // namespace tessel
