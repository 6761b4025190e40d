// load() and LoadedExecutable: per-device executors and communicators made once; runs on the
// runtime's persistent device threads; explicit host transfers; donation; cancel.
#include "tessel/runtime/loaded_executable.hpp"

#include <fmt/format.h>

#include <algorithm>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "tessel/ops/registry.hpp"
#include "tessel/passes/program_passes.hpp"
#include "tessel/ir/program_verify.hpp"
#include "tessel/runtime/block_copy.hpp"
#include "tessel/runtime/device_threads.hpp"
#include "tessel/runtime/executor.hpp"
#include "tessel/runtime/trace.hpp"
#include "program_fingerprint.hpp"
#include "runtime_lifetime.hpp"

namespace tessel {

// ---- ShardedArray ------------------------------------------------------------------------

ShardedArray::ShardedArray(std::string name, DType dtype, Shape global_shape, Sharding sharding,
                           Shape local_shape, std::vector<std::shared_ptr<Buffer>> shards)
    : name_(std::move(name)), dtype_(dtype), shape_(std::move(global_shape)), sharding_(std::move(sharding)),
      local_shape_(std::move(local_shape)), storage_(std::make_shared<Storage>()) {
  devices_.resize(shards.size());
  for (std::size_t d = 0; d < devices_.size(); ++d) devices_[d] = static_cast<int64_t>(d);
  storage_->shards = std::move(shards);
}

ShardedArray::ShardedArray(std::string name, DType dtype, Shape global_shape, Sharding sharding, Shape local_shape,
                           std::vector<std::shared_ptr<Buffer>> shards, std::vector<int64_t> devices)
    : name_(std::move(name)), dtype_(dtype), shape_(std::move(global_shape)), sharding_(std::move(sharding)),
      local_shape_(std::move(local_shape)), devices_(std::move(devices)), storage_(std::make_shared<Storage>()) {
  if (devices_.size() != shards.size())
    throw RuntimeError(fmt::format("ShardedArray %{}: {} shards but {} device positions", name_, shards.size(),
                                   devices_.size()));
  storage_->shards = std::move(shards);
}

ShardedArray::ShardedArray(std::string name, DType dtype, Shape global_shape, Sharding sharding, Shape local_shape,
                           std::vector<std::shared_ptr<Buffer>> shards, std::vector<int64_t> devices, Mesh mesh)
    : ShardedArray(std::move(name), dtype, std::move(global_shape), std::move(sharding), std::move(local_shape),
                   std::move(shards), std::move(devices)) {
  mesh_ = std::move(mesh);
}

namespace {
// "donated" or "empty" error of an array that cannot be used by `what`.
std::string unusable(const std::string& what, const std::string& name, bool deleted) {
  return deleted ? fmt::format("{}: array %{} was donated to a run and deleted (another run took its buffers); use "
                               "the run's output, or to_device again",
                               what, name)
                 : fmt::format("{}: the array is empty (default-constructed)", what);
}
}  // namespace

std::shared_ptr<Buffer> ShardedArray::shard(int64_t device) const {
  if (!storage_) throw RuntimeError(unusable("ShardedArray::shard", name_, false));
  std::lock_guard<std::mutex> lk(storage_->mu);
  if (storage_->deleted.load(std::memory_order_relaxed))
    throw RuntimeError(unusable("ShardedArray::shard", name_, true));
  const std::size_t n = devices_.size();
  if (device >= 0 && static_cast<std::size_t>(device) < n && devices_[static_cast<std::size_t>(device)] == device)
    return storage_->shards[static_cast<std::size_t>(device)];  // every device local: position = index
  for (std::size_t i = 0; i < n; ++i)
    if (devices_[i] == device) return storage_->shards[i];
  throw RuntimeError(fmt::format("ShardedArray %{}: no shard for device {} (this process holds devices {})", name_,
                                 device, shape_str(devices_)));
}

ShardedArray::Reading ShardedArray::read(const std::string& what) const {
  if (!storage_) throw RuntimeError(unusable(what, name_, false));
  std::lock_guard<std::mutex> lk(storage_->mu);
  if (storage_->deleted.load(std::memory_order_relaxed)) throw RuntimeError(unusable(what, name_, true));
  ++storage_->readers;
  return Reading(storage_, storage_->shards);
}

ShardedArray::Reading::~Reading() {
  if (!storage_) return;
  std::lock_guard<std::mutex> lk(storage_->mu);
  if (--storage_->readers == 0) storage_->cv.notify_all();
}

std::string ShardedArray::to_string() const {
  return fmt::format("{} {} (%{}, {} shards{})", type_str(dtype_, shape_), sharding_.to_string(), name_, num_shards(),
                     deleted() ? ", deleted" : "");
}

std::vector<std::shared_ptr<Buffer>> ShardedArray::take_shards(const std::string& what) const {
  if (!storage_) throw RuntimeError(unusable(what, name_, false));
  std::unique_lock<std::mutex> lk(storage_->mu);
  // Reads in flight (a to_host, a run reading it on another thread) end before the buffers
  // may be overwritten in place.
  storage_->cv.wait(lk, [&] { return storage_->readers == 0; });
  if (storage_->deleted.load(std::memory_order_relaxed)) throw RuntimeError(unusable(what, name_, true));
  storage_->deleted.store(true, std::memory_order_release);
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
  Runtime* rt = nullptr;
  DeviceThreads* local = nullptr;  // rt->local(): local device i runs mesh position positions[i]
  // The lifetime of *rt (runtime.hpp), which owns *local: every use of them enters it.
  std::shared_ptr<detail::RuntimeLifetime> rt_life;

  // The calls in flight on this program (runs, transfers, cancel): the destructor waits for
  // them, and a call that starts while it runs throws.
  std::mutex calls_mu;
  std::condition_variable calls_cv;
  int calls = 0;
  bool closing = false;

  // One call of a public operation: the program is not being destroyed, the runtime is alive.
  // A cancel (`what` == nullptr) is counted only: it may stop a run the destructor waits for,
  // and it needs nothing of the runtime.
  class Call {
   public:
    Call(Impl& im, const char* what) : im_(&im) {
      {
        std::lock_guard<std::mutex> lk(im.calls_mu);
        if (im.closing && what)
          throw RuntimeError(fmt::format("{}: the LoadedExecutable is being destroyed (by another thread); a program "
                                         "must outlive the calls on it",
                                         what));
        ++im.calls;
      }
      if (!what) return;
      try {
        rt_use_.emplace(im.rt_life->enter(what));
      } catch (...) {
        leave();
        throw;
      }
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    ~Call() {
      rt_use_.reset();
      leave();
    }

   private:
    void leave() {
      std::lock_guard<std::mutex> lk(im_->calls_mu);
      if (--im_->calls == 0) im_->calls_cv.notify_all();
    }
    Impl* im_;
    std::optional<detail::RuntimeLifetime::Use> rt_use_;
  };
  std::vector<int64_t> positions;
  Program program;
  std::vector<std::string> input_names, output_names;
  std::vector<Shape> user_input_shapes;   // the user's (unpadded) input shapes (uneven.hpp)
  std::vector<Shape> user_output_shapes;  // the user's (unpadded) output shapes
  // The user's shape of input / output i (the program's global shape when not padded).
  const Shape& user_in_shape(std::size_t i) const {
    return i < user_input_shapes.size() ? user_input_shapes[i] : in_value(i).global_shape;
  }
  const Shape& user_out_shape(std::size_t o) const {
    return o < user_output_shapes.size() ? user_output_shapes[o] : out_value(o).global_shape;
  }
  LoadOptions options;
  std::vector<int> donate;  // per input: output index or -1
  std::vector<std::vector<std::string>> axes;
  std::vector<std::unique_ptr<DeviceExecutor>> executors;
  bool inline_run = false;  // runs_inline()

  std::mutex run_mu;    // one run at a time
  std::mutex state_mu;  // guards world/comms replacement against cancel(), in_flight
  std::unique_ptr<CollectiveWorld> world;
  std::vector<std::map<std::vector<std::string>, std::unique_ptr<Communicator>>> comms;  // per local device
  bool in_flight = false;
  std::atomic<bool> cancelled{false};
  std::string cancel_reason;  // guarded by state_mu
  int64_t runs = 0;           // runs started (guarded by run_mu): RunOptions::check_finite's run number

  // A fresh world and communicators for every group (at load, and after an abort).
  void make_world() {
    const int64_t n = static_cast<int64_t>(positions.size());
    // Communicators die before the world they point into.
    for (auto& m : comms) m.clear();
    world.reset();
    world = rt->make_world(program.mesh, axes, options.collective_timeout_s);
    // An inline program's collectives run on the device threads alone: they may spin as long
    // as those threads have cores (the runtime's budget counts its stream workers too). A world
    // whose members do not spin (across processes, on a GPU) ignores it.
    if (inline_run) world->set_wait_budget_us(local->inline_spin_us());
    comms.resize(static_cast<std::size_t>(n));
    for (int64_t d = 0; d < n; ++d) {
      for (const auto& a : axes) comms[d][a] = world->communicator(positions[static_cast<std::size_t>(d)], a);
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
  {
    // Runs and transfers in flight on other threads end first; later calls throw.
    std::unique_lock<std::mutex> lk(impl_->calls_mu);
    impl_->closing = true;
    impl_->calls_cv.wait(lk, [&] { return impl_->calls == 0; });
  }
  // Executors (events) first, then communicators, then the world.
  impl_->executors.clear();
  impl_->comms.clear();
  impl_->world.reset();
}

const Program& LoadedExecutable::program() const { return impl_->program; }
const Mesh& LoadedExecutable::mesh() const { return impl_->program.mesh; }
Runtime& LoadedExecutable::runtime() const {
  if (!impl_->rt_life->alive())
    throw RuntimeError("LoadedExecutable::runtime: the runtime this program was loaded on was destroyed");
  return *impl_->rt;
}
const std::vector<int64_t>& LoadedExecutable::local_devices() const { return impl_->positions; }
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

// The device buffer of input %name's shard on mesh position `position`; an allocation
// failure names the input, its bytes per device and the device.
std::shared_ptr<Buffer> allocate_input(Backend& be, std::size_t bytes, const std::string& name, const LocalValue& lv,
                                       int64_t position) {
  try {
    return be.allocate(bytes);
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(fmt::format("device {}: cannot allocate input %{} {} ({} bytes, {:.4g} GiB per device, "
                                       "sharding {}): {}; shard it over more devices",
                                       position, name, type_str(lv.dtype, lv.shape), bytes,
                                       static_cast<double>(bytes) / (1u << 30), lv.sharding.to_string(), e.what()),
                           e.bytes());
  }
}

// Bytes per device moved by the collectives that can overlap with other work. A collective on
// stream S overlaps when, at its start, another stream has work enqueued that S has not
// waited for, or when another stream is given work after its start and before that stream
// waits for S. The rest sit on the critical path — the tensor-parallel all-reduce between two
// einsums: compute waits for it before its next kernel — so the stream workers could only add
// hand-offs to them.
int64_t overlappable_comm_bytes(const Program& p) {
  std::set<std::string> streams;
  for (const Instr& in : p.instrs) streams.insert(in.stream);
  // unwaited[S]: the streams with work enqueued that S has not waited for since.
  std::map<std::string, std::set<std::string>> unwaited;
  struct Started {
    std::string stream;
    int64_t bytes;
    std::set<std::string> waited_by;  // the other streams that have waited for it
  };
  std::vector<Started> open;  // collectives not yet overlapped nor waited for by every stream
  int64_t total = 0;
  for (const Instr& in : p.instrs) {
    if (in.kind == InstrKind::Wait) {
      unwaited[in.stream].erase(in.wait_for);
      for (Started& c : open)
        if (c.stream == in.wait_for) c.waited_by.insert(in.stream);
    } else if (in.kind != InstrKind::CollectiveDone) {
      // Work on this stream: it runs beside every collective of another stream it has not
      // waited for.
      for (Started& c : open)
        if (c.stream != in.stream && !c.waited_by.count(in.stream)) {
          total += c.bytes;
          c.bytes = 0;
        }
      if (in.kind == InstrKind::Collective || in.kind == InstrKind::CollectiveStart) {
        const std::set<std::string>& pending = unwaited[in.stream];
        const bool beside = std::any_of(pending.begin(), pending.end(), [&](const std::string& t) { return t != in.stream; });
        if (beside) total += in.bytes;
        else open.push_back(Started{in.stream, in.bytes, {}});
      }
      for (const std::string& t : streams)
        if (t != in.stream) unwaited[t].insert(in.stream);
    }
    open.erase(std::remove_if(open.begin(), open.end(),
                              [&](const Started& c) { return c.bytes == 0 || c.waited_by.size() + 1 >= streams.size(); }),
               open.end());
  }
  return total;
}
}  // namespace

bool LoadedExecutable::runs_inline() const { return impl_->inline_run; }

std::size_t LoadedExecutable::input_index(const std::string& name) const {
  return index_of(impl_->input_names, name, "input");
}
std::size_t LoadedExecutable::output_index(const std::string& name) const {
  return index_of(impl_->output_names, name, "output");
}
const Sharding& LoadedExecutable::input_sharding(const std::string& name) const {
  const Program& p = impl_->program;
  return p.values[static_cast<std::size_t>(p.inputs.at(input_index(name)))].sharding;
}

ProgramPassOptions lowering_for(Runtime& rt, ProgramPassOptions lowering) {
  DeviceThreads& lr = rt.local();
  for (int64_t d = 0; d < lr.num_devices(); ++d) {
    const Backend& be = lr.backend(d);
    // fuse-elementwise is the only pass that makes these three kinds: without their kernels
    // the program runs unfused (the ops it would have fused have kernels of their own).
    if (!be.has_kernel(OpKind::FusedElementwise) || !be.has_kernel(OpKind::FusedSoftmax))
      lowering.fuse_elementwise = false;
    if (!be.has_kernel(OpKind::FusedEinsum)) lowering.fuse_einsum_epilogue = false;
  }
  // CPU device threads share the machine's cores: the collective-matmul gate prices compute
  // at devices / cores of a core each (CostModel::compute_sharing), unless the caller set it.
  CostModel& cost = lowering.collective_matmul.cost;
  if (cost.compute_sharing == 1 && lr.num_devices() > 0 && lr.backend(0).name().rfind("cpu", 0) == 0)
    cost.compute_sharing = compute_sharing(lr.num_devices(), static_cast<int64_t>(std::thread::hardware_concurrency()));
  return lowering;
}

void check_program_kernels(const Program& program, const Backend& backend, int64_t device) {
  for (std::size_t i = 0; i < program.instrs.size(); ++i) {
    const Instr& in = program.instrs[i];
    if (in.kind != InstrKind::Kernel || backend.has_kernel(in.op)) continue;
    const std::string out = in.out >= 0 ? "%" + program.values[static_cast<std::size_t>(in.out)].name : "(no result)";
    throw RuntimeError(fmt::format("load: instruction #{} ({} = {}) of local device {}: {}", i, out, op_name(in.op),
                                   device, missing_kernel_message(in.op, backend.name())));
  }
}

LoadedExecutable load(const CompiledProgram& exe, Runtime& rt, const LoadOptions& options) {
  auto impl = std::make_unique<LoadedExecutable::Impl>();
  impl->rt = &rt;
  const double t = options.collective_timeout_s;
  if (std::isnan(t) || t < 0)
    throw RuntimeError(fmt::format("load: collective_timeout_s must be >= 0 seconds (0 or inf: no timeout), got {}", t));
  impl->positions = rt.devices_for(exe.mesh);  // throws on a runtime that cannot run this mesh
  impl->local = &rt.local();
  impl->rt_life = rt.lifetime();
  // Lowered for the local backends: no pass makes a kernel one of them lacks.
  impl->program = lower_program(exe.program, /*verify=*/false, lowering_for(rt, options.lowering));
  verify_program(impl->program);
  impl->options = options;
  const Program& p = impl->program;
  for (int64_t d = 0; d < impl->local->num_devices(); ++d) check_program_kernels(p, impl->local->backend(d), d);
  impl->input_names = exe.input_names;
  impl->user_input_shapes = exe.user_input_shapes;
  impl->user_output_shapes = exe.user_output_shapes;
  impl->output_names = exe.output_names;
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
  // The plan counts an output written into its donor's buffer once.
  plan_donations(impl->program, impl->donate);
  impl->axes = communicator_axes(p);
  const int64_t n = static_cast<int64_t>(impl->positions.size());
  DeviceThreads& lr = *impl->local;
  // Nothing to overlap (every instruction on compute, or every collective on the critical
  // path), or too little communication that could overlap for it to pay for the hand-offs to
  // the stream workers: run on the device thread itself.
  const bool serial = lr.settings().inline_serial_programs &&
                      (std::all_of(p.instrs.begin(), p.instrs.end(), [](const Instr& in) {
                         return in.stream == "compute" && in.kind != InstrKind::Wait;
                       }) ||
                       (lr.settings().inline_max_comm_bytes > 0 &&
                        overlappable_comm_bytes(p) <= lr.settings().inline_max_comm_bytes));
  impl->inline_run = serial && lr.settings().stream_mode == StreamMode::Async;
  // Every process loads the same program, or none does. Only after every check of this
  // process passed: a process that fails one never comes to the exchange, and the others
  // time out naming it, instead of waiting in the communicator creation below.
  detail::check_same_program(rt, exe.mesh, impl->program);
  impl->make_world();
  for (int64_t d = 0; d < n; ++d) {
    DeviceContext ctx;
    ctx.backend = &lr.backend(d);
    ctx.compute = serial ? &lr.inline_stream(d) : &lr.compute_stream(d);
    ctx.comm = serial ? &lr.inline_stream(d) : &lr.comm_stream(d);
    for (auto& kv : impl->comms[d]) ctx.comms[kv.first] = kv.second.get();
    impl->executors.push_back(
        std::make_unique<DeviceExecutor>(impl->program, impl->positions[static_cast<std::size_t>(d)], std::move(ctx)));
  }
  return LoadedExecutable(std::move(impl));
}

// ---- transfers -------------------------------------------------------------------------------

// Enqueues the copies of input `input` on the transfer streams; `staged` keeps the host blocks
// alive until the caller synchronises them.
namespace {

// Runs `enqueue` (host -> device copies put on the transfer streams of `local`, reading host
// memory the caller owns) and, when it throws, waits for the copies it had already enqueued
// before the error leaves: the host tensors and staged blocks they read die with the caller's
// frame (a Trainer step whose batch was mistyped freed its scalars under a copy still in flight:
// ASan, heap-use-after-free). A transfer that itself failed is not reported over the first error.
template <class F>
auto settle_on_error(DeviceThreads& local, F&& enqueue) -> decltype(enqueue()) {
  try {
    return enqueue();
  } catch (...) {
    for (int64_t d = 0; d < local.num_devices(); ++d) {
      try {
        local.transfer_stream(d).synchronize();
      } catch (...) {
      }
    }
    throw;
  }
}

}  // namespace

ShardedArray LoadedExecutable::enqueue_to_device(std::size_t input, const HostTensor& user_global,
                                                 std::deque<HostTensor>& staged) const {
  impl_->check_input(input, "to_device");
  const LocalValue& lv = impl_->in_value(input);
  const std::string& name = impl_->input_names[input];
  // An input padded for an uneven sharding takes the user's shape, padded here with zeros.
  const bool user_shape = input < impl_->user_input_shapes.size() &&
                          user_global.shape() == impl_->user_input_shapes[input];
  if (user_global.dtype() != lv.dtype || (user_global.shape() != lv.global_shape && !user_shape))
    throw RuntimeError(fmt::format("to_device: input #{} %{} expects {} but got {}", input, name,
                                   type_str(lv.dtype, input < impl_->user_input_shapes.size()
                                                          ? impl_->user_input_shapes[input] : lv.global_shape),
                                   type_str(user_global.dtype(), user_global.shape())));
  // Padded into a staged copy only when padding is needed: the caller's tensor outlives the
  // copies otherwise (every caller synchronises the transfer streams before returning).
  const HostTensor* padded = &user_global;
  if (user_global.shape() != lv.global_shape) {
    staged.push_back(pad_host(user_global, lv.global_shape));
    padded = &staged.back();
  }
  const HostTensor& global = *padded;
  DeviceThreads& lr = *impl_->local;
  const auto& pos = impl_->positions;
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<std::shared_ptr<Buffer>> bufs;
  std::vector<HostTensor> blocks;  // this process's blocks (the whole tensor when replicated)
  if (lv.shape != lv.global_shape) {
    for (int64_t d = 0; d < n; ++d) {
      HostTensor t(global.dtype(), lv.shape);
      const Shape& ls = lv.shape;
      copy_block(global.data(), global.shape(), lv.sharding.local_offset(mesh(), global.shape(), pos[d]), t.data(), ls,
                 std::vector<int64_t>(ls.size(), 0), ls, dtype_size(global.dtype()));
      blocks.push_back(std::move(t));
    }
  }
  // The blocks go to `staged` (the caller's, alive until its copies are done) before any copy
  // reads them; the device buffers are held outside the copies' loop, and a failure there waits
  // for the copies already enqueued before they are freed.
  const std::size_t first = staged.size();
  for (HostTensor& t : blocks) staged.push_back(std::move(t));
  bufs.reserve(static_cast<std::size_t>(n));
  settle_on_error(lr, [&] {
    for (int64_t d = 0; d < n; ++d) {
      const HostTensor& src = blocks.empty() ? global : staged[first + static_cast<std::size_t>(d)];
      Backend& be = lr.backend(d);
      bufs.push_back(allocate_input(be, src.bytes(), name, lv, pos[d]));
      be.copy_from_host(*bufs.back(), src.data(), src.bytes(), lr.transfer_stream(d));
    }
  });
  ShardedArray a(name, lv.dtype, lv.global_shape, lv.sharding, lv.shape, std::move(bufs), pos, impl_->program.mesh);
  a.set_user_shape(impl_->user_in_shape(input));
  return a;
}

ShardedArray LoadedExecutable::to_device(std::size_t input, const HostTensor& global) const {
  Impl::Call call(*impl_, "to_device");
  std::deque<HostTensor> staged;  // a deque: staged blocks never move while copies read them
  ShardedArray a = settle_on_error(*impl_->local, [&] { return enqueue_to_device(input, global, staged); });
  for (int64_t d = 0; d < impl_->local->num_devices(); ++d) impl_->local->transfer_stream(d).synchronize();
  return a;
}

std::vector<ShardedArray> LoadedExecutable::to_device(const std::vector<HostTensor>& globals) const {
  Impl::Call call(*impl_, "to_device");
  if (globals.size() != impl_->input_names.size())
    throw RuntimeError(fmt::format("to_device: the program has {} inputs but {} tensors were given",
                                   impl_->input_names.size(), globals.size()));
  // Every copy enqueued first, one synchronisation per device at the end: a wait per input
  // costs a hand-off to each transfer stream's worker and back (about 10-30 us on a shared core).
  std::deque<HostTensor> staged;  // a deque: staged blocks never move while copies read them
  std::vector<ShardedArray> out;
  settle_on_error(*impl_->local, [&] {
    for (std::size_t i = 0; i < globals.size(); ++i) out.push_back(enqueue_to_device(i, globals[i], staged));
  });
  for (int64_t d = 0; d < impl_->local->num_devices(); ++d) impl_->local->transfer_stream(d).synchronize();
  return out;
}

std::map<std::string, ShardedArray> LoadedExecutable::to_device(const std::map<std::string, HostTensor>& named) const {
  Impl::Call call(*impl_, "to_device");
  std::vector<std::size_t> index;
  for (const auto& [name, t] : named) index.push_back(input_index(name));  // every name checked first
  std::deque<HostTensor> staged;
  std::map<std::string, ShardedArray> out;
  std::size_t k = 0;
  settle_on_error(*impl_->local, [&] {
    for (const auto& [name, t] : named) out.emplace(name, enqueue_to_device(index[k++], t, staged));
  });
  for (int64_t d = 0; d < impl_->local->num_devices(); ++d) impl_->local->transfer_stream(d).synchronize();
  return out;
}

ShardedArray LoadedExecutable::to_device(const std::string& input, const HostTensor& global) const {
  return to_device(input_index(input), global);
}

Shape LoadedExecutable::input_shape(std::size_t input) const {
  impl_->check_input(input, "input_shape");
  return impl_->user_in_shape(input);
}

Shape LoadedExecutable::output_shape(std::size_t output) const {
  if (output >= impl_->output_names.size())
    throw RuntimeError(fmt::format("output_shape: output #{} does not exist (the program has {} outputs)", output,
                                   impl_->output_names.size()));
  return impl_->user_out_shape(output);
}

ShardedArray LoadedExecutable::shards_to_device(std::size_t input, const std::vector<HostTensor>& shards) const {
  Impl::Call call(*impl_, "shards_to_device");
  impl_->check_input(input, "shards_to_device");
  const LocalValue& lv = impl_->in_value(input);
  const std::string& name = impl_->input_names[input];
  const int64_t n = static_cast<int64_t>(impl_->positions.size());
  if (static_cast<int64_t>(shards.size()) != n)
    throw RuntimeError(fmt::format("shards_to_device: input #{} %{} has {} shards but {} devices of the mesh {} are "
                                   "here (pass one shard per local device, local_devices() order)",
                                   input, name, shards.size(), n, mesh().to_string()));
  for (const auto& t : shards)
    if (t.dtype() != lv.dtype || t.shape() != lv.shape)
      throw RuntimeError(fmt::format("shards_to_device: input #{} %{} with sharding {} expects local shards {} but got {}",
                                     input, name, lv.sharding.to_string(), type_str(lv.dtype, lv.shape),
                                     type_str(t.dtype(), t.shape())));
  DeviceThreads& lr = *impl_->local;
  std::vector<std::shared_ptr<Buffer>> bufs;
  bufs.reserve(static_cast<std::size_t>(n));
  settle_on_error(lr, [&] {
    for (int64_t d = 0; d < n; ++d) {
      Backend& be = lr.backend(d);
      bufs.push_back(allocate_input(be, shards[d].bytes(), name, lv, impl_->positions[d]));
      be.copy_from_host(*bufs.back(), shards[d].data(), shards[d].bytes(), lr.transfer_stream(d));
    }
  });
  for (int64_t d = 0; d < n; ++d) lr.transfer_stream(d).synchronize();
  ShardedArray a(name, lv.dtype, lv.global_shape, lv.sharding, lv.shape, std::move(bufs), impl_->positions,
                 impl_->program.mesh);
  a.set_user_shape(impl_->user_in_shape(input));
  return a;
}

ShardedArray LoadedExecutable::allocate_input_array(std::size_t input) const {
  Impl::Call call(*impl_, "allocate_input_array");
  impl_->check_input(input, "allocate_input_array");
  const LocalValue& lv = impl_->in_value(input);
  const std::string& name = impl_->input_names[input];
  DeviceThreads& lr = *impl_->local;
  const std::size_t bytes = static_cast<std::size_t>(num_elements(lv.shape)) * dtype_size(lv.dtype);
  std::vector<std::shared_ptr<Buffer>> bufs;
  for (std::size_t d = 0; d < impl_->positions.size(); ++d)
    bufs.push_back(allocate_input(lr.backend(static_cast<int64_t>(d)), bytes, name, lv, impl_->positions[d]));
  ShardedArray a(name, lv.dtype, lv.global_shape, lv.sharding, lv.shape, std::move(bufs), impl_->positions,
                 impl_->program.mesh);
  a.set_user_shape(impl_->user_in_shape(input));
  return a;
}

void LoadedExecutable::write_to_shards(const ShardedArray& a, const std::vector<std::size_t>& locals,
                                       const std::vector<int64_t>& start, const HostTensor& box) const {
  Impl::Call call(*impl_, "write_to_shards");
  const ShardedArray::Reading held = a.read("write_to_shards");
  const Shape& local = a.local_shape();
  bool inside = a.devices() == impl_->positions && box.dtype() == a.dtype() && start.size() == local.size() &&
                box.shape().size() == local.size();
  for (std::size_t d = 0; inside && d < local.size(); ++d)
    inside = start[d] >= 0 && box.shape()[d] >= 0 && start[d] + box.shape()[d] <= local[d];
  for (std::size_t i : locals) inside = inside && i < impl_->positions.size();
  if (!inside)
    throw RuntimeError(fmt::format("write_to_shards: {}{} at {} into array {} (local shards {}, {} local devices): "
                                   "outside the array's shards here",
                                   dtype_name(box.dtype()), shape_str(box.shape()), shape_str(start), a.to_string(),
                                   shape_str(local), impl_->positions.size()));
  if (box.numel() == 0) return;
  DeviceThreads& lr = *impl_->local;
  BlockCopy c;
  c.src_shape = box.shape();
  c.src_offset.assign(local.size(), 0);
  c.dst_shape = local;
  c.dst_offset = start;
  c.block = box.shape();
  c.elem_bytes = dtype_size(box.dtype());
  std::vector<std::shared_ptr<Buffer>> staging;
  settle_on_error(lr, [&] {
    for (std::size_t i : locals) {
      const int64_t d = static_cast<int64_t>(i);
      Backend& be = lr.backend(d);
      staging.push_back(be.allocate_host(box.bytes()));
      be.copy_from_host(*staging.back(), box.data(), box.bytes(), lr.transfer_stream(d));
      be.copy_block(*held.local(i), *staging.back(), c, lr.transfer_stream(d));
    }
  });
  for (std::size_t i : locals) lr.transfer_stream(static_cast<int64_t>(i)).synchronize();
}

std::vector<HostTensor> LoadedExecutable::shards_to_host(const ShardedArray& a) const {
  Impl::Call call(*impl_, "to_host");
  const auto& pos = impl_->positions;
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<HostTensor> out;
  {
    // Held until the copies are done: a donating run on another thread waits for them.
    const ShardedArray::Reading held = a.read("to_host");
    if (a.devices() != pos)
      throw RuntimeError(fmt::format("to_host: array {} is not an array of the devices {} of mesh {} held here",
                                     a.to_string(), shape_str(pos), mesh().to_string()));
    DeviceThreads& lr = *impl_->local;
    out.reserve(static_cast<std::size_t>(n));  // a tensor is in `out` before its copy: alive until settled
    settle_on_error(lr, [&] {  // the copies write into `out`'s tensors
      for (int64_t d = 0; d < n; ++d) {
        out.emplace_back(a.dtype(), a.local_shape());
        HostTensor& t = out.back();
        lr.backend(d).copy_to_host(t.data(), *held.local(static_cast<std::size_t>(d)), t.bytes(), lr.transfer_stream(d));
      }
    });
    for (int64_t d = 0; d < n; ++d) lr.transfer_stream(d).synchronize();
  }
  return impl_->rt->allgather_shards(mesh(), std::move(out));
}

HostTensor LoadedExecutable::shard_to_host(const ShardedArray& a, std::size_t local) const {
  Impl::Call call(*impl_, "shard_to_host");
  const ShardedArray::Reading held = a.read("shard_to_host");
  if (a.devices() != impl_->positions)
    throw RuntimeError(fmt::format("shard_to_host: array {} is not an array of the devices {} of mesh {} held here",
                                   a.to_string(), shape_str(impl_->positions), mesh().to_string()));
  if (local >= impl_->positions.size())
    throw RuntimeError(fmt::format("shard_to_host: local device {} of array {}: this process holds {} devices", local,
                                   a.to_string(), impl_->positions.size()));
  DeviceThreads& lr = *impl_->local;
  const int64_t d = static_cast<int64_t>(local);
  HostTensor t(a.dtype(), a.local_shape());
  lr.backend(d).copy_to_host(t.data(), *held.local(local), t.bytes(), lr.transfer_stream(d));
  lr.transfer_stream(d).synchronize();
  return t;
}

HostTensor LoadedExecutable::to_host(const ShardedArray& a, bool check_replicas) const {
  Impl::Call call(*impl_, "to_host");
  if (a.local_shape() == a.shape() && !check_replicas && a.devices() == impl_->positions &&
      !impl_->positions.empty()) {
    HostTensor t(a.dtype(), a.shape());  // replicated: one local copy is the tensor
    const ShardedArray::Reading held = a.read("to_host");
    DeviceThreads& lr = *impl_->local;
    lr.backend(0).copy_to_host(t.data(), *held.local(0), t.bytes(), lr.transfer_stream(0));
    lr.transfer_stream(0).synchronize();
    return trim_host(t, a.user_shape());
  }
  auto shards = shards_to_host(a);
  return trim_host(gather_host(mesh(), a.sharding(), a.dtype(), a.shape(), shards, check_replicas, a.name()),
                   a.user_shape());
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
  Impl::Call call(*impl_, nullptr);
  std::lock_guard<std::mutex> lk(impl_->state_mu);
  if (!impl_->in_flight) return false;
  impl_->cancel_reason = reason;
  impl_->cancelled.store(true, std::memory_order_release);
  impl_->world->abort("the run was cancelled: " + reason);
  return true;
}

RunResult LoadedExecutable::run(const std::vector<ShardedArray>& inputs_in, const RunOptions& opts) {
  Impl::Call call(*impl_, "run");
  Impl& im = *impl_;
  const Program& p = im.program;
  const int64_t n = static_cast<int64_t>(im.positions.size());
  if (inputs_in.size() != p.inputs.size())
    throw RuntimeError(fmt::format("run: the program has {} inputs but {} arrays were given", p.inputs.size(),
                                   inputs_in.size()));
  for (std::size_t i = 0; i < inputs_in.size(); ++i) {
    const ShardedArray& a = inputs_in[i];
    const LocalValue& lv = im.in_value(i);
    if (!a.valid())
      throw RuntimeError(fmt::format("run: input #{} %{} is {}", i, im.input_names[i],
                                     a.deleted() ? "a deleted array (it was donated to an earlier run)" : "an empty array"));
    // The same sharding text on a mesh with the same axes in another order (or other device
    // ids) places the blocks on other devices: an array made for another mesh is refused.
    if (a.mesh() && !(*a.mesh() == p.mesh))
      throw RuntimeError(fmt::format(
          "run: input #{} %{} was made for mesh {} but this program runs on mesh {}: its blocks sit on other "
          "devices there; move it with to_host and to_device of this program, or compile the program on the "
          "array's mesh",
          i, im.input_names[i], a.mesh()->to_string(), p.mesh.to_string()));
    if (a.dtype() != lv.dtype || a.shape() != lv.global_shape || !(a.sharding() == lv.sharding) ||
        a.local_shape() != lv.shape || a.devices() != im.positions)
      throw RuntimeError(fmt::format("run: input #{} %{} expects {} {} on devices {} but got {}", i,
                                     im.input_names[i], type_str(lv.dtype, lv.global_shape), lv.sharding.to_string(),
                                     shape_str(im.positions), a.to_string()));
  }
  // A donated array is taken by the run and overwritten in place: given for a second input
  // too, that input would read it while it is written (or find it deleted).
  for (std::size_t i = 0; i < inputs_in.size(); ++i) {
    if (im.donate[i] < 0) continue;
    for (std::size_t j = 0; j < inputs_in.size(); ++j)
      if (j != i && inputs_in[j].shares_storage(inputs_in[i]))
        throw RuntimeError(fmt::format(
            "run: the array given for input #{} %{} is donated (to output %{}), but the same array is also given for "
            "input #{} %{}: the run overwrites a donated array in place; give input #{} a copy of its own (to_device "
            "again); nothing was run",
            i, im.input_names[i], im.output_names[static_cast<std::size_t>(im.donate[i])], j, im.input_names[j], j));
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
  const int64_t run_index = ++im.runs;
  const char* finite_env = std::getenv("TESSEL_CHECK_FINITE");
  const bool check_finite = opts.check_finite || (finite_env && std::string(finite_env) == "1");
  // Per-device input buffers. Donated inputs are taken out of their arrays (deleted) first,
  // each waiting for the reads of it in flight on other threads; then the others are held
  // against a donation elsewhere until the run is done (taking before holding: a run never
  // waits for a donation while it holds an array another run may wait for).
  std::vector<std::vector<std::shared_ptr<Buffer>>> by_input(inputs_in.size());
  std::vector<ShardedArray::Reading> held;
  for (std::size_t i = 0; i < inputs_in.size(); ++i)
    if (im.donate[i] >= 0)
      by_input[i] = inputs_in[i].take_shards(fmt::format("run: input #{} %{} (donated)", i, im.input_names[i]));
  for (std::size_t i = 0; i < inputs_in.size(); ++i)
    if (im.donate[i] < 0) {
      held.push_back(inputs_in[i].read(fmt::format("run: input #{} %{}", i, im.input_names[i])));
      for (int64_t d = 0; d < n; ++d) by_input[i].push_back(held.back().local(static_cast<std::size_t>(d)));
    }
  std::vector<std::vector<std::shared_ptr<Buffer>>> per(static_cast<std::size_t>(n));
  for (auto& bufs : by_input)
    for (int64_t d = 0; d < n; ++d) per[d].push_back(std::move(bufs[static_cast<std::size_t>(d)]));
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
  CollectiveWorld* world = im.world.get();
  auto t0 = std::chrono::steady_clock::now();
  auto errors = im.local->run_on_devices(
      [&](int64_t d) {
    DeviceRunOptions dopts;
    dopts.poison = opts.poison;
    dopts.check_finite = check_finite;
    dopts.run_index = run_index;
    dopts.trace = trace_path.empty() ? nullptr : &trace;
    dopts.cancelled = &im.cancelled;
    dopts.donate = im.donate;
    dopts.on_error = [&, d](const std::string& msg) {
      if (!world->aborted()) {
        root_cause[d] = 1;
        world->abort(fmt::format("device {} failed: {}", im.positions[d], msg));
      }
    };
    results[d] = im.executors[d]->run(per[d], dopts);
      },
      im.inline_run);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string cancel_reason;
  {
    std::lock_guard<std::mutex> lk(im.state_mu);
    im.in_flight = false;
    if (im.cancelled.load(std::memory_order_acquire)) cancel_reason = im.cancel_reason;
  }
  per.clear();
  held.clear();
  if (!trace_path.empty()) trace.write(trace_path);
  bool failed = false;
  for (const auto& e : errors) failed = failed || e;
  if (failed && !cancel_reason.empty())
    throw RuntimeError(fmt::format("run: cancelled ({}); every device stopped", cancel_reason));
  // check_finite: the earliest instruction (an input first) any device found NaN or infinity in.
  {
    int64_t best = -1, order = 0;
    for (int64_t d = 0; d < n; ++d)
      if (errors[d]) try {
          std::rethrow_exception(errors[d]);
        } catch (const NonFiniteError& e) {
          if (best < 0 || e.instruction() < order) best = d, order = e.instruction();
        } catch (...) {
        }
    if (best >= 0) std::rethrow_exception(errors[best]);
  }
  // Report the device that failed first (the others only saw the abort).
  for (int64_t d = 0; d < n; ++d)
    if (errors[d] && root_cause[d]) {
      try {
        std::rethrow_exception(errors[d]);
      } catch (const Error& e) {
        throw RuntimeError(e.what());
      } catch (const std::exception& e) {
        throw RuntimeError(fmt::format("device {} failed: {}", im.positions[d], e.what()));
      }
    }
  for (int64_t d = 0; d < n; ++d)
    if (errors[d]) std::rethrow_exception(errors[d]);
  // Every device finished, but the world was aborted meanwhile (a collective watchdog, a peer
  // process, a cancel): an aborted NCCL communicator stops its kernels without a CUDA error,
  // so the outputs cannot be trusted (issue 22, finding 9).
  if (world->aborted())
    throw RuntimeError(fmt::format("run: the collective world was aborted during the run ({}) although every device "
                                   "finished: its outputs cannot be trusted; the next run makes a new world",
                                   cancel_reason.empty() ? world->abort_reason() : "cancelled: " + cancel_reason));
  RunResult r;
  r.stats.seconds = seconds;
  r.stats.planned_peak_bytes = p.memory.peak_bytes();
  for (int64_t d = 0; d < n; ++d) {
    r.stats.measured_peak_bytes.push_back(results[d].measured_peak_bytes);
    r.stats.measured_host_peak_bytes.push_back(results[d].measured_host_peak_bytes);
  }
  for (std::size_t o = 0; o < p.outputs.size(); ++o) {
    const LocalValue& lv = im.out_value(o);
    std::vector<std::shared_ptr<Buffer>> bufs;
    for (int64_t d = 0; d < n; ++d) bufs.push_back(std::move(results[d].outputs[o]));
    r.outputs.emplace_back(im.output_names[o], lv.dtype, lv.global_shape, lv.sharding, lv.shape, std::move(bufs),
                           im.positions, p.mesh);
    r.outputs.back().set_user_shape(im.user_out_shape(o));
  }
  return r;
}

}  // namespace tessel
