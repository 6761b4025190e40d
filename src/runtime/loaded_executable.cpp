// load() and LoadedExecutable: per-device executors and communicators made once; runs on the
// runtime's persistent device threads; explicit host transfers; donation; cancel.
#include "tessel/runtime/loaded_executable.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>

#include "tessel/executable.hpp"
#include "tessel/program_passes.hpp"
#include "tessel/program_verify.hpp"
#include "tessel/runtime/block_copy.hpp"
#include "tessel/runtime/executor.hpp"
#include "tessel/runtime/thread_communicator.hpp"
#include "tessel/runtime/trace.hpp"

namespace tessel {

// ---- ShardedArray ------------------------------------------------------------------------

ShardedArray::ShardedArray(std::string name, DType dtype, Shape global_shape, Sharding sharding,
                           Shape local_shape, std::vector<std::shared_ptr<Buffer>> shards)
    : name_(std::move(name)), dtype_(dtype), shape_(std::move(global_shape)), sharding_(std::move(sharding)),
      local_shape_(std::move(local_shape)), storage_(std::make_shared<Storage>()) {
  storage_->shards = std::move(shards);
}

const std::shared_ptr<Buffer>& ShardedArray::shard(int64_t device) const {
  if (!storage_) throw RuntimeError("ShardedArray: the array is empty (default-constructed)");
  if (storage_->deleted)
    throw RuntimeError(fmt::format("ShardedArray %{}: the array was donated to a run and deleted", name_));
  if (device < 0 || device >= num_shards())
    throw RuntimeError(fmt::format("ShardedArray %{}: no shard for device {} ({} shards)", name_, device, num_shards()));
  return storage_->shards[static_cast<std::size_t>(device)];
}

std::string ShardedArray::to_string() const {
  return fmt::format("{} {} (%{}, {} shards{})", type_str(dtype_, shape_), sharding_.to_string(), name_, num_shards(),
                     deleted() ? ", deleted" : "");
}

std::vector<std::shared_ptr<Buffer>> ShardedArray::take_shards() const {
  if (!valid()) throw RuntimeError(fmt::format("ShardedArray %{}: cannot donate an empty or deleted array", name_));
  storage_->deleted = true;
  return std::move(storage_->shards);
}

std::vector<HostTensor> scatter_host(const Mesh& mesh, const Sharding& sharding, const Shape& local_shape,
                                     const HostTensor& global) {
  std::vector<HostTensor> out;
  out.reserve(static_cast<std::size_t>(mesh.num_devices()));
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    HostTensor t(global.dtype(), local_shape);
    copy_block(global.data(), global.shape(), sharding.local_offset(mesh, global.shape(), d), t.data(), local_shape,
               std::vector<int64_t>(local_shape.size(), 0), local_shape, dtype_size(global.dtype()));
    out.push_back(std::move(t));
  }
  return out;
}

HostTensor gather_host(const Mesh& mesh, const Sharding& sharding, DType dtype, const Shape& global_shape,
                       const std::vector<HostTensor>& shards, bool check, const std::string& name) {
  HostTensor g(dtype, global_shape);
  g.poison();
  std::map<std::vector<int64_t>, int64_t> first;
  for (int64_t d = 0; d < static_cast<int64_t>(shards.size()); ++d) {
    auto off = sharding.local_offset(mesh, global_shape, d);
    auto it = first.find(off);
    const Shape& ls = shards[d].shape();
    if (it == first.end()) {
      first[off] = d;
      copy_block(shards[d].data(), ls, std::vector<int64_t>(ls.size(), 0), g.data(), global_shape, off, ls,
                 dtype_size(dtype));
    } else if (check) {
      const HostTensor& a = shards[it->second];
      const HostTensor& b = shards[d];
      if (a.bytes() != b.bytes() || std::memcmp(a.data(), b.data(), a.bytes()) != 0)
        throw RuntimeError(fmt::format("gather: output %{} has replicas that disagree: devices {} and {} "
                                       "hold the same block {} but different data",
                                       name, it->second, d, shape_str(off)));
    }
  }
  return g;
}

// ---- LoadedExecutable ----------------------------------------------------------------------

struct LoadedExecutable::Impl {
  ThreadRuntime* rt = nullptr;
  Program program;
  std::vector<std::string> input_names, output_names;
  LoadOptions options;
  std::vector<int> donate;  // per input: output index or -1
  std::vector<std::vector<std::string>> axes;
  std::vector<std::unique_ptr<DeviceExecutor>> executors;

  std::mutex run_mu;    // one run at a time
  std::mutex state_mu;  // guards world/comms replacement against cancel(), in_flight
  std::unique_ptr<ThreadWorld> world;
  std::vector<std::map<std::vector<std::string>, std::unique_ptr<Communicator>>> comms;  // per device
  bool in_flight = false;
  std::atomic<bool> cancelled{false};
  std::string cancel_reason;  // guarded by state_mu

  // A fresh world and communicators for every group (at load, and after an abort).
  void make_world() {
    ThreadWorldOptions wo;
    wo.timeout_seconds = options.collective_timeout_s;
    const int64_t n = program.mesh.num_devices();
    // Communicators die before the world they point into.
    for (auto& m : comms) m.clear();
    world = std::make_unique<ThreadWorld>(program.mesh, wo);
    comms.resize(static_cast<std::size_t>(n));
    for (int64_t d = 0; d < n; ++d) {
      for (const auto& a : axes) comms[d][a] = world->communicator(d, a);
      if (d < static_cast<int64_t>(executors.size())) {
        auto& ctx = executors[d]->context().comms;
        for (auto& kv : comms[d]) ctx[kv.first] = kv.second.get();
      }
    }
  }

  const LocalValue& in_value(std::size_t i) const { return program.values[program.inputs.at(i)]; }
  const LocalValue& out_value(std::size_t o) const { return program.values[program.outputs.at(o)]; }

  void check_input(std::size_t i, const char* what) const {
    if (i >= program.inputs.size())
      throw RuntimeError(fmt::format("{}: input #{} does not exist ({} inputs)", what, i, program.inputs.size()));
  }
};

LoadedExecutable::LoadedExecutable(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LoadedExecutable::LoadedExecutable(LoadedExecutable&&) noexcept = default;
LoadedExecutable& LoadedExecutable::operator=(LoadedExecutable&&) noexcept = default;
LoadedExecutable::~LoadedExecutable() {
  if (!impl_) return;
  // Executors (events) first, then communicators, then the world.
  impl_->executors.clear();
  impl_->comms.clear();
  impl_->world.reset();
}

const Program& LoadedExecutable::program() const { return impl_->program; }
const Mesh& LoadedExecutable::mesh() const { return impl_->program.mesh; }
ThreadRuntime& LoadedExecutable::runtime() const { return *impl_->rt; }
const std::vector<std::string>& LoadedExecutable::input_names() const { return impl_->input_names; }
const std::vector<std::string>& LoadedExecutable::output_names() const { return impl_->output_names; }

namespace {
std::size_t index_of(const std::vector<std::string>& names, const std::string& name, const char* kind) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return i;
  std::vector<std::string> quoted;
  for (const auto& n : names) quoted.push_back("%" + n);
  throw RuntimeError(fmt::format("the program has no {} %{} (its {}s: {})", kind, name, kind, join(quoted, ", ")));
}
}  // namespace

std::size_t LoadedExecutable::input_index(const std::string& name) const {
  return index_of(impl_->input_names, name, "input");
}
std::size_t LoadedExecutable::output_index(const std::string& name) const {
  return index_of(impl_->output_names, name, "output");
}

LoadedExecutable load(const Executable& exe, ThreadRuntime& rt, const LoadOptions& options) {
  auto impl = std::make_unique<LoadedExecutable::Impl>();
  impl->rt = &rt;
  impl->program = lower_program(exe.program());
  verify_program(impl->program);
  impl->options = options;
  const Program& p = impl->program;
  const double t = options.collective_timeout_s;
  if (std::isnan(t) || t < 0)
    throw RuntimeError(fmt::format("load: collective_timeout_s must be >= 0 seconds (0 or inf: no timeout), got {}", t));
  if (rt.num_devices() != p.mesh.num_devices())
    throw RuntimeError(fmt::format("load: the program is partitioned for mesh {} ({} devices) but the runtime has {} "
                                   "devices; make the ThreadRuntime with mesh.num_devices()",
                                   p.mesh.to_string(), p.mesh.num_devices(), rt.num_devices()));
  for (int v : exe.graph().inputs) impl->input_names.push_back(exe.graph().values[v].name);
  for (int v : exe.graph().outputs) impl->output_names.push_back(exe.graph().values[v].name);
  impl->donate.assign(p.inputs.size(), -1);
  for (const auto& [in_name, out_name] : options.donate) {
    const std::size_t i = index_of(impl->input_names, in_name, "input");
    const std::size_t o = index_of(impl->output_names, out_name, "output");
    const LocalValue& a = impl->in_value(i);
    const LocalValue& b = impl->out_value(o);
    if (a.dtype != b.dtype || a.global_shape != b.global_shape || !(a.sharding == b.sharding))
      throw RuntimeError(fmt::format("load: input %{} ({} {}) cannot be donated to output %{} ({} {}): donation needs "
                                     "the same global type and sharding",
                                     in_name, type_str(a.dtype, a.global_shape), a.sharding.to_string(), out_name,
                                     type_str(b.dtype, b.global_shape), b.sharding.to_string()));
    if (impl->donate[i] >= 0)
      throw RuntimeError(fmt::format("load: input %{} is donated twice", in_name));
    for (int other : impl->donate)
      if (other == static_cast<int>(o))
        throw RuntimeError(fmt::format("load: output %{} receives two donations", out_name));
    impl->donate[i] = static_cast<int>(o);
  }
  impl->axes = communicator_axes(p);
  impl->make_world();
  const int64_t n = p.mesh.num_devices();
  for (int64_t d = 0; d < n; ++d) {
    DeviceContext ctx;
    ctx.backend = &rt.backend(d);
    ctx.compute = &rt.compute_stream(d);
    ctx.comm = &rt.comm_stream(d);
    for (auto& kv : impl->comms[d]) ctx.comms[kv.first] = kv.second.get();
    impl->executors.push_back(std::make_unique<DeviceExecutor>(impl->program, d, std::move(ctx)));
  }
  return LoadedExecutable(std::move(impl));
}

// ---- transfers -------------------------------------------------------------------------------

ShardedArray LoadedExecutable::to_device(std::size_t input, const HostTensor& global) const {
  impl_->check_input(input, "to_device");
  const LocalValue& lv = impl_->in_value(input);
  const std::string& name = impl_->input_names[input];
  if (global.dtype() != lv.dtype || global.shape() != lv.global_shape)
    throw RuntimeError(fmt::format("to_device: input #{} %{} expects {} but got {}", input, name,
                                   type_str(lv.dtype, lv.global_shape), type_str(global.dtype(), global.shape())));
  if (lv.shape == lv.global_shape) {  // replicated: every device copies the whole tensor
    const int64_t n = mesh().num_devices();
    std::vector<std::shared_ptr<Buffer>> bufs;
    for (int64_t d = 0; d < n; ++d) {
      Backend& be = impl_->rt->backend(d);
      std::shared_ptr<Buffer> b = be.allocate(global.bytes());
      be.copy_from_host(*b, global.data(), global.bytes(), impl_->rt->transfer_stream(d));
      bufs.push_back(std::move(b));
    }
    for (int64_t d = 0; d < n; ++d) impl_->rt->transfer_stream(d).synchronize();
    return ShardedArray(name, lv.dtype, lv.global_shape, lv.sharding, lv.shape, std::move(bufs));
  }
  return shards_to_device(input, scatter_host(mesh(), lv.sharding, lv.shape, global));
}

ShardedArray LoadedExecutable::to_device(const std::string& input, const HostTensor& global) const {
  return to_device(input_index(input), global);
}

ShardedArray LoadedExecutable::shards_to_device(std::size_t input, const std::vector<HostTensor>& shards) const {
  impl_->check_input(input, "shards_to_device");
  const LocalValue& lv = impl_->in_value(input);
  const std::string& name = impl_->input_names[input];
  const int64_t n = mesh().num_devices();
  if (static_cast<int64_t>(shards.size()) != n)
    throw RuntimeError(fmt::format("shards_to_device: input #{} %{} has {} shards but the mesh {} has {} devices", input,
                                   name, shards.size(), mesh().to_string(), n));
  for (const auto& t : shards)
    if (t.dtype() != lv.dtype || t.shape() != lv.shape)
      throw RuntimeError(fmt::format("shards_to_device: input #{} %{} with sharding {} expects local shards {} but got {}",
                                     input, name, lv.sharding.to_string(), type_str(lv.dtype, lv.shape),
                                     type_str(t.dtype(), t.shape())));
  std::vector<std::shared_ptr<Buffer>> bufs;
  for (int64_t d = 0; d < n; ++d) {
    Backend& be = impl_->rt->backend(d);
    std::shared_ptr<Buffer> b = be.allocate(shards[d].bytes());
    be.copy_from_host(*b, shards[d].data(), shards[d].bytes(), impl_->rt->transfer_stream(d));
    bufs.push_back(std::move(b));
  }
  for (int64_t d = 0; d < n; ++d) impl_->rt->transfer_stream(d).synchronize();
  return ShardedArray(name, lv.dtype, lv.global_shape, lv.sharding, lv.shape, std::move(bufs));
}

std::vector<HostTensor> LoadedExecutable::shards_to_host(const ShardedArray& a) const {
  const int64_t n = mesh().num_devices();
  if (a.num_shards() != n || !a.valid())
    throw RuntimeError(fmt::format("to_host: array {} is not an array of the {} devices of mesh {}", a.to_string(), n,
                                   mesh().to_string()));
  std::vector<HostTensor> out;
  for (int64_t d = 0; d < n; ++d) {
    HostTensor t(a.dtype(), a.local_shape());
    const Buffer& b = *a.shard(d);
    impl_->rt->backend(d).copy_to_host(t.data(), b, t.bytes(), impl_->rt->transfer_stream(d));
    out.push_back(std::move(t));
  }
  for (int64_t d = 0; d < n; ++d) impl_->rt->transfer_stream(d).synchronize();
  return out;
}

HostTensor LoadedExecutable::to_host(const ShardedArray& a, bool check_replicas) const {
  if (a.valid() && a.local_shape() == a.shape() && !check_replicas && a.num_shards() == mesh().num_devices()) {
    HostTensor t(a.dtype(), a.shape());  // replicated: one copy is the tensor
    impl_->rt->backend(0).copy_to_host(t.data(), *a.shard(0), t.bytes(), impl_->rt->transfer_stream(0));
    impl_->rt->transfer_stream(0).synchronize();
    return t;
  }
  auto shards = shards_to_host(a);
  return gather_host(mesh(), a.sharding(), a.dtype(), a.shape(), shards, check_replicas, a.name());
}

// ---- run --------------------------------------------------------------------------------------

const ShardedArray& LoadedExecutable::output(const RunResult& r, const std::string& name) const {
  return r.outputs.at(output_index(name));
}

RunResult LoadedExecutable::run_named(const std::map<std::string, ShardedArray>& inputs, const RunOptions& opts) {
  std::vector<ShardedArray> ordered(impl_->input_names.size());
  std::vector<bool> given(ordered.size(), false);
  for (const auto& [name, arr] : inputs) {
    const std::size_t i = input_index(name);
    ordered[i] = arr;
    given[i] = true;
  }
  for (std::size_t i = 0; i < given.size(); ++i)
    if (!given[i]) throw RuntimeError(fmt::format("run: input %{} was not given", impl_->input_names[i]));
  return run(ordered, opts);
}

bool LoadedExecutable::cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lk(impl_->state_mu);
  if (!impl_->in_flight) return false;
  impl_->cancel_reason = reason;
  impl_->cancelled.store(true, std::memory_order_release);
  impl_->world->abort("the run was cancelled: " + reason);
  return true;
}

RunResult LoadedExecutable::run(const std::vector<ShardedArray>& inputs_in, const RunOptions& opts) {
  Impl& im = *impl_;
  const Program& p = im.program;
  const int64_t n = p.mesh.num_devices();
  if (inputs_in.size() != p.inputs.size())
    throw RuntimeError(fmt::format("run: the program has {} inputs but {} arrays were given", p.inputs.size(),
                                   inputs_in.size()));
  for (std::size_t i = 0; i < inputs_in.size(); ++i) {
    const ShardedArray& a = inputs_in[i];
    const LocalValue& lv = im.in_value(i);
    if (!a.valid())
      throw RuntimeError(fmt::format("run: input #{} %{} is {}", i, im.input_names[i],
                                     a.deleted() ? "a deleted array (it was donated to an earlier run)" : "an empty array"));
    if (a.dtype() != lv.dtype || a.shape() != lv.global_shape || !(a.sharding() == lv.sharding) ||
        a.local_shape() != lv.shape || a.num_shards() != n)
      throw RuntimeError(fmt::format("run: input #{} %{} expects {} {} on {} devices but got {}", i, im.input_names[i],
                                     type_str(lv.dtype, lv.global_shape), lv.sharding.to_string(), n, a.to_string()));
  }
  std::string trace_path = opts.trace_path;
  if (trace_path.empty())
    if (const char* e = std::getenv("TESSEL_TRACE")) trace_path = e;
  if (!trace_path.empty()) {  // fail before the run, not after it
    std::ofstream f(trace_path);
    if (!f)
      throw RuntimeError(fmt::format("run: cannot write the trace file '{}' (does its folder exist?); nothing was run",
                                     trace_path));
  }

  std::lock_guard<std::mutex> run_lock(im.run_mu);
  // Per-device input buffers; donated inputs are taken out of their arrays (deleted).
  std::vector<std::vector<std::shared_ptr<Buffer>>> per(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < inputs_in.size(); ++i) {
    std::vector<std::shared_ptr<Buffer>> bufs;
    if (im.donate[i] >= 0) {
      bufs = inputs_in[i].take_shards();
    } else {
      for (int64_t d = 0; d < n; ++d) bufs.push_back(inputs_in[i].shard(d));
    }
    for (int64_t d = 0; d < n; ++d) per[d].push_back(std::move(bufs[d]));
  }
  {
    std::lock_guard<std::mutex> lk(im.state_mu);
    if (im.world->aborted()) im.make_world();  // the previous run failed or was cancelled
    im.cancelled.store(false, std::memory_order_release);
    im.cancel_reason.clear();
    im.in_flight = true;
  }
  Trace trace;
  std::vector<DeviceRunResult> results(static_cast<std::size_t>(n));
  std::vector<char> root_cause(static_cast<std::size_t>(n), 0);
  ThreadWorld* world = im.world.get();
  auto t0 = std::chrono::steady_clock::now();
  auto errors = im.rt->run_on_devices([&](int64_t d) {
    DeviceRunOptions dopts;
    dopts.poison = opts.poison;
    dopts.trace = trace_path.empty() ? nullptr : &trace;
    dopts.cancelled = &im.cancelled;
    dopts.donate = im.donate;
    dopts.on_error = [&, d](const std::string& msg) {
      if (!world->aborted()) {
        root_cause[d] = 1;
        world->abort(fmt::format("device {} failed: {}", d, msg));
      }
    };
    results[d] = im.executors[d]->run(per[d], dopts);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string cancel_reason;
  {
    std::lock_guard<std::mutex> lk(im.state_mu);
    im.in_flight = false;
    if (im.cancelled.load(std::memory_order_acquire)) cancel_reason = im.cancel_reason;
  }
  per.clear();
  if (!trace_path.empty()) trace.write(trace_path);
  bool failed = false;
  for (const auto& e : errors) failed = failed || e;
  if (failed && !cancel_reason.empty())
    throw RuntimeError(fmt::format("run: cancelled ({}); every device stopped", cancel_reason));
  // Report the device that failed first (the others only saw the abort).
  for (int64_t d = 0; d < n; ++d)
    if (errors[d] && root_cause[d]) {
      try {
        std::rethrow_exception(errors[d]);
      } catch (const Error& e) {
        throw RuntimeError(e.what());
      } catch (const std::exception& e) {
        throw RuntimeError(fmt::format("device {} failed: {}", d, e.what()));
      }
    }
  for (int64_t d = 0; d < n; ++d)
    if (errors[d]) std::rethrow_exception(errors[d]);
  RunResult r;
  r.stats.seconds = seconds;
  r.stats.peak_bytes.assign(static_cast<std::size_t>(n), 0);
  for (int64_t d = 0; d < n; ++d) r.stats.peak_bytes[d] = results[d].peak_bytes;
  for (std::size_t o = 0; o < p.outputs.size(); ++o) {
    const LocalValue& lv = im.out_value(o);
    std::vector<std::shared_ptr<Buffer>> bufs;
    for (int64_t d = 0; d < n; ++d) bufs.push_back(std::move(results[d].outputs[o]));
    r.outputs.emplace_back(im.output_names[o], lv.dtype, lv.global_shape, lv.sharding, lv.shape, std::move(bufs));
  }
  return r;
}

}  // namespace tessel
