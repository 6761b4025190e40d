// Device executor: enqueues one device's lowered program (Program IR v2) on its streams.
//
// Stream discipline (the contract CUDA + NCCL will rely on) is the program's: every
// instruction runs on the stream it names, and a `wait T @S` instruction records an event on
// T and makes S wait for it; the verifier checked that every cross-stream read and every
// reuse of arena bytes across streams is ordered by such a wait. A done is a point in the
// comm stream's order (the collective was enqueued by its start). Buffers: intermediate
// values are views into the device's arena (allocated once, in the constructor), views are
// views, outputs are allocated per run (or take a donated input's buffer when the input is
// dead, ordered after every stream's work so far), inputs are the caller's; the run drops
// its references after both streams are synchronised.
#include "tessel/runtime/executor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>

#include "tessel/ops/registry.hpp"
#include "tessel/passes/program_passes.hpp"

namespace tessel {

KernelArgs kernel_args_of(const Program& p, std::size_t i, int64_t pos) {
  const Instr& in = p.instrs.at(i);
  if (in.kind != InstrKind::Kernel)
    throw Error(fmt::format("kernel_args_of: instruction #{} ({}) is not a kernel", i, op_name(in.op)));
  KernelArgs a;
  a.kind = in.op;
  a.attrs = &in.attrs;
  // Kernels that read positions (OpDef::needs_offsets) get their blocks' global offsets and the
  // global shapes.
  const bool needs_offsets = op_def(in.op).needs_offsets;
  for (int v : in.in) {
    const LocalValue& lv = p.values[static_cast<std::size_t>(v)];
    a.in.push_back(nullptr);
    a.in_shapes.push_back(lv.shape);
    a.in_dtypes.push_back(lv.dtype);
    if (needs_offsets) {
      a.in_offsets.push_back(lv.sharding.local_offset(p.mesh, lv.global_shape, pos));
      a.in_global_shapes.push_back(lv.global_shape);
    } else {
      a.in_offsets.emplace_back();
    }
  }
  const LocalValue& o = p.values[static_cast<std::size_t>(in.out)];
  a.out_shape = o.shape;
  a.out_dtype = o.dtype;
  for (int e : in.extra_out) {
    const LocalValue& ev = p.values[static_cast<std::size_t>(e)];
    a.extra_out.push_back(nullptr);
    a.extra_out_shapes.push_back(ev.shape);
    a.extra_out_dtypes.push_back(ev.dtype);
  }
  if (needs_offsets) {
    a.out_offset = o.sharding.local_offset(p.mesh, o.global_shape, pos);
    a.out_global_shape = o.global_shape;
  }
  return a;
}

namespace {

// Product of the dims before `d`: 1 means the dim is "leading" and its blocks are
// contiguous, so no packing is needed.
int64_t outer(const Shape& s, int d) {
  int64_t n = 1;
  for (int i = 0; i < d; ++i) n *= s[i];
  return n;
}

BlockCopy block_copy(const Shape& src_shape, std::vector<int64_t> src_off, std::size_t src_byte,
                     const Shape& dst_shape, std::vector<int64_t> dst_off, std::size_t dst_byte,
                     const Shape& block, std::size_t elem) {
  BlockCopy c;
  c.src_shape = src_shape;
  c.src_offset = std::move(src_off);
  c.src_byte_offset = src_byte;
  c.dst_shape = dst_shape;
  c.dst_offset = std::move(dst_off);
  c.dst_byte_offset = dst_byte;
  c.block = block;
  c.elem_bytes = elem;
  return c;
}

std::vector<std::string> all_axes(const Mesh& m) {
  std::vector<std::string> all;
  for (const auto& a : m.axes()) all.push_back(a.name);
  return all;
}

std::string instr_name(const Instr& in) {
  switch (in.kind) {
    case InstrKind::Kernel: return op_name(in.op);
    case InstrKind::ShardSlice: return "shard_slice";
    case InstrKind::Copy: return "copy";
    case InstrKind::View: return "view";
    case InstrKind::CollectiveStart: return collective_start_name(in.collective);
    default: return collective_name(in.collective);
  }
}

constexpr int kCompute = 0, kComm = 1;

}  // namespace

std::vector<std::vector<std::string>> communicator_axes(const Program& p) {
  std::set<std::vector<std::string>> s;
  for (const Instr& in : p.instrs) {
    if (in.kind != InstrKind::Collective && in.kind != InstrKind::CollectiveStart) continue;
    s.insert(collective_info(in.collective).over_pairs ? all_axes(p.mesh) : in.axes);
  }
  return {s.begin(), s.end()};
}

namespace {

// Bytes [offset, offset + size) of another buffer.
class ViewBuffer : public Buffer {
 public:
  ViewBuffer(std::shared_ptr<Buffer> base, std::size_t offset, std::size_t size)
      : base_(std::move(base)), offset_(offset), size_(size) {}
  void* data() override { return static_cast<char*>(base_->data()) + offset_; }
  const void* data() const override { return static_cast<const char*>(base_->data()) + offset_; }
  std::size_t bytes() const override { return size_; }

 private:
  std::shared_ptr<Buffer> base_;
  std::size_t offset_, size_;
};

}  // namespace

// NaN hunting (DeviceRunOptions::check_finite): the first non-finite value a run met, written
// by the host functions enqueued after each instruction (on either stream).
struct FirstNonFinite {
  std::mutex mu;
  bool found = false;
  std::string what;
  int64_t instruction = -1;  // -1: an input
};

namespace {

// An instruction whose results hold -infinity by design: causal_mask (alone, or in a fused
// expression) masks with it. check_finite then reports only NaN in them.
bool writes_infinity(const Instr& in) {
  if (in.kind != InstrKind::Kernel) return false;
  if (in.op == OpKind::CausalMask) return true;
  return (in.op == OpKind::FusedElementwise || in.op == OpKind::FusedEinsum) &&
         (in.attrs.equation.find("causal_mask") != std::string::npos ||
          in.attrs.epilogue.find("causal_mask") != std::string::npos);
}

// Index of the first NaN (or, unless allow_inf, infinity) among n values of float dtype t at
// p, or -1; `kind` says which.
int64_t first_non_finite(const unsigned char* p, int64_t n, DType t, bool allow_inf, const char*& kind) {
  for (int64_t i = 0; i < n; ++i) {
    bool bad = false, nan = false;
    if (t == DType::f32) {
      uint32_t b;
      std::memcpy(&b, p + 4 * i, 4);
      bad = (b & 0x7f800000u) == 0x7f800000u;
      nan = bad && (b & 0x007fffffu);
    } else {
      uint16_t b;
      std::memcpy(&b, p + 2 * i, 2);
      const uint16_t exp = t == DType::bf16 ? 0x7f80 : 0x7c00;
      bad = (b & exp) == exp;
      nan = bad && (b & static_cast<uint16_t>(~exp & 0x7fff));
    }
    if (bad && (nan || !allow_inf)) {
      kind = nan ? "NaN" : "infinity";
      return i;
    }
  }
  return -1;
}

}  // namespace

struct DeviceExecutor::RunState {
  const DeviceRunOptions& opts;
  std::vector<std::shared_ptr<Buffer>> buf;
  std::vector<double> t0;  // trace: start time per instruction
  std::shared_ptr<FirstNonFinite> non_finite;
  RunState(const DeviceRunOptions& o, std::size_t values, std::size_t instrs)
      : opts(o), buf(values), t0(o.trace ? instrs : 0, 0.0),
        non_finite(o.check_finite ? std::make_shared<FirstNonFinite>() : nullptr) {}
};

std::string DeviceExecutor::finite_source(std::size_t i) const {
  const std::string& l = labels_[i];
  std::string src = l.substr(std::min(l.find("instruction"), l.size()));
  if (p_.instrs[i].graph_op >= 0) src += fmt::format(" for op #{} of the graph", p_.instrs[i].graph_op);
  return src;
}

void DeviceExecutor::check_finite(RunState& st, int value, Stream& s, const std::string& source, bool allow_inf,
                                  int64_t instruction) {
  const LocalValue& lv = p_.values[static_cast<std::size_t>(value)];
  if (lv.dtype == DType::i32 || lv.host || lv.bytes() == 0) return;
  auto host = std::make_shared<std::vector<unsigned char>>(static_cast<std::size_t>(lv.bytes()));
  Backend& be = *ctx_.backend;
  be.copy_to_host(host->data(), *st.buf[static_cast<std::size_t>(value)], host->size(), s);
  std::shared_ptr<FirstNonFinite> nf = st.non_finite;
  const int64_t pos = pos_, run = st.opts.run_index;
  const int64_t n = num_elements(lv.shape);
  be.launch_host_func(s, [nf, host, n, allow_inf, instruction, dtype = lv.dtype, source, pos, run, name = lv.name,
                          type = type_str(lv.dtype, lv.shape), sharding = lv.sharding.to_string()] {
    if (nf->found) return;
    const char* kind = "";
    const int64_t at = first_non_finite(host->data(), n, dtype, allow_inf, kind);
    if (at < 0) return;
    std::lock_guard<std::mutex> lk(nf->mu);
    if (nf->found) return;
    nf->found = true;
    nf->instruction = instruction;
    nf->what = fmt::format("run {}, device {}: {} at element {} of %{} {} (local block of {}), written by {}; it is the "
                           "first non-finite value this device met in the run (RunOptions::check_finite)",
                           run, pos, kind, at, name, type, sharding, source);
  });
}

DeviceExecutor::DeviceExecutor(const Program& program, int64_t position, DeviceContext ctx)
    : p_(program), pos_(position), ctx_(std::move(ctx)) {
  if (!p_.memory.planned)
    throw RuntimeError("executor: the program has no memory plan; lower it first (lower_program in "
                       "tessel/passes/program_passes.hpp; load() does)");
  streams_[kCompute] = ctx_.compute;
  streams_[kComm] = ctx_.comm;
  const std::size_t n = p_.instrs.size(), nv = p_.values.size();
  labels_.reserve(n);
  kernel_args_.resize(n);
  copies_.resize(n);
  events_.resize(n);
  stream_of_.assign(n, kCompute);
  output_of_.assign(nv, -1);
  for (std::size_t o = 0; o < p_.outputs.size(); ++o) output_of_[static_cast<std::size_t>(p_.outputs[o])] = static_cast<int>(o);
  auto stream_index = [&](const std::string& name, std::size_t i) {
    if (name == "compute") return kCompute;
    if (name == "comm") return kComm;
    throw RuntimeError(fmt::format("device {} instruction #{}: stream '{}' is not one the executor has (compute, comm)",
                                   pos_, i, name));
  };
  // The arena, and a view of it for every value placed there. None for a program without
  // intermediates in device memory (the backends count what they allocate: no byte for nothing).
  bool placed = false;
  for (std::size_t v = 0; v < nv && v < p_.memory.offset.size(); ++v) placed = placed || (p_.memory.offset[v] >= 0 && !p_.values[v].host);
  try {
    if (placed) arena_ = ctx_.backend->allocate(static_cast<std::size_t>(std::max<int64_t>(p_.memory.arena_bytes, 1)));
  } catch (const OutOfMemoryError& e) {
    const MemoryPlan& m = p_.memory;
    throw OutOfMemoryError(
        fmt::format("device {}: cannot allocate the arena of the program's intermediates, {} bytes "
                    "({:.4g} GiB; peak_bytes_per_device={} = arena {} + inputs {} + outputs {}): {}; "
                    "shard the largest values over more mesh axes or use more devices",
                    pos_, m.arena_bytes, static_cast<double>(m.arena_bytes) / (1u << 30), m.peak_bytes(),
                    m.arena_bytes, m.input_bytes, m.output_bytes, e.what()),
        e.bytes());
  }
  // The host pool of offloaded activations (pinned memory on CUDA; see Backend::allocate_host).
  if (p_.memory.host_bytes > 0) host_pool_ = ctx_.backend->allocate_host(static_cast<std::size_t>(p_.memory.host_bytes));
  arena_views_.resize(nv);
  for (std::size_t v = 0; v < nv && v < p_.memory.offset.size(); ++v)
    if (p_.memory.offset[v] >= 0)
      arena_views_[v] = std::make_shared<ViewBuffer>(p_.values[v].host ? host_pool_ : arena_,
                                                     static_cast<std::size_t>(p_.memory.offset[v]),
                                                     static_cast<std::size_t>(p_.values[v].bytes()));
  // Last instruction touching each input's storage (donation: reuse only when dead).
  input_last_ = input_last_use(p_);
  for (std::size_t i = 0; i < n; ++i) {
    const Instr& in = p_.instrs[i];
    stream_of_[i] = stream_index(in.stream, i);
    std::string what;
    if (in.kind == InstrKind::Wait) what = fmt::format("wait {} @{}", in.wait_for, in.stream);
    else if (in.kind == InstrKind::CollectiveDone) what = fmt::format("done %{}", p_.values[static_cast<std::size_t>(in.in[0])].name);
    else what = fmt::format("%{} = {}", p_.values[static_cast<std::size_t>(in.out)].name, instr_name(in));
    labels_.push_back(fmt::format("device {} instruction #{} ({})", pos_, i, what));
    switch (in.kind) {
      case InstrKind::Kernel: {
        KernelArgs& a = kernel_args_[i];
        a = kernel_args_of(p_, i, pos_);
        // Load does the expensive once-per-shape work now (the CPU backend: oneDNN
        // primitives), not the first run.
        try {
          ctx_.backend->prepare_kernel(a);
        } catch (const Error& e) {
          throw RuntimeError(fmt::format("{}: {}", labels_[i], e.what()));
        }
        break;
      }
      case InstrKind::Copy: {
        const LocalValue& dst = p_.values[static_cast<std::size_t>(in.out)];
        for (const CopyBlock& c : in.copies) {
          const LocalValue& src = p_.values[static_cast<std::size_t>(in.in[static_cast<std::size_t>(c.input)])];
          std::vector<int64_t> so, doff;
          for (const auto& e : c.src) so.push_back(e.eval(p_.mesh, pos_));
          for (const auto& e : c.dst) doff.push_back(e.eval(p_.mesh, pos_));
          copies_[i].push_back(block_copy(src.shape, so, 0, dst.shape, doff, 0, in.block, dtype_size(dst.dtype)));
        }
        break;
      }
      case InstrKind::Collective:
      case InstrKind::CollectiveStart: {
        const auto axes = collective_info(in.collective).over_pairs ? all_axes(p_.mesh) : in.axes;
        if (!ctx_.comms.count(axes))
          throw RuntimeError(fmt::format("device {}: no communicator for axis group {{{}}} (load creates one "
                                         "per group of communicator_axes(program))", pos_, join(axes, ",")));
        const Shape& xs = p_.values[static_cast<std::size_t>(in.in[0])].shape;
        const Shape& os = p_.values[static_cast<std::size_t>(in.out)].shape;
        const bool contiguous =
            (in.collective != CollectiveKind::AllGather && in.collective != CollectiveKind::ReduceScatter &&
             in.collective != CollectiveKind::AllToAll) ||
            (in.collective == CollectiveKind::AllToAll ? outer(xs, in.dim) == 1 && outer(os, in.dim2) == 1
                                                       : outer(xs, in.dim) == 1);
        if (!contiguous)
          throw RuntimeError(fmt::format("{}: the collective moves a non-contiguous dim; run the pack pass first",
                                         labels_[i]));
        break;
      }
      case InstrKind::Wait:
        stream_index(in.wait_for, i);
        events_[i] = ctx_.backend->create_event();
        break;
      case InstrKind::ShardSlice:
        throw RuntimeError(fmt::format("{}: shard_slice is the partitioner's form; run the pack pass first", labels_[i]));
      default: break;
    }
  }
  for (int s = 0; s < 2; ++s) donate_events_.push_back(ctx_.backend->create_event());
  pair_permutes();
}

// Two collective-permutes on one stream with nothing between them on that stream but dones,
// and nothing between them that waits for that stream or communicates, are issued as one
// communicator group where the communicator runs grouped permutes concurrently: the two
// directions of a bidirectional ring step then share the time of one. Never when the second
// sends what the first receives (a chain of reshards): the group would send it unreceived.
void DeviceExecutor::pair_permutes() {
  const std::size_t n = p_.instrs.size();
  permute_partner_.assign(n, -1);
  auto is_permute = [&](const Instr& in) {
    return (in.kind == InstrKind::Collective || in.kind == InstrKind::CollectiveStart) &&
           in.collective == CollectiveKind::CollectivePermute;
  };
  const auto all = all_axes(p_.mesh);
  auto it = ctx_.comms.find(all);
  if (it == ctx_.comms.end() || !it->second->groups_permutes()) return;
  for (std::size_t i = 0; i < n; ++i) {
    if (!is_permute(p_.instrs[i]) || permute_partner_[i] >= 0) continue;
    const std::string& s = p_.instrs[i].stream;
    for (std::size_t j = i + 1; j < n; ++j) {
      const Instr& q = p_.instrs[j];
      if (q.kind == InstrKind::CollectiveDone && q.stream == s) continue;
      if (q.kind == InstrKind::Wait && (q.stream == s || q.wait_for == s)) break;
      if (q.kind == InstrKind::Collective || q.kind == InstrKind::CollectiveStart) {
        const int first_out = p_.instrs[i].out;
        if (is_permute(q) && q.stream == s && q.kind == p_.instrs[i].kind &&
            std::find(q.in.begin(), q.in.end(), first_out) == q.in.end()) {
          permute_partner_[i] = static_cast<int>(j);
          permute_partner_[j] = static_cast<int>(i);
        }
        break;
      }
      if (q.stream == s) break;
    }
  }
}

DeviceExecutor::~DeviceExecutor() = default;

void DeviceExecutor::collective(RunState& st, std::size_t i) {
  const Instr& in = p_.instrs[i];
  Backend& be = *ctx_.backend;
  Stream& s = stream(i);
  const LocalValue& src = p_.values[static_cast<std::size_t>(in.in[0])];
  const LocalValue& dst = p_.values[static_cast<std::size_t>(in.out)];
  Buffer& inb = *st.buf[static_cast<std::size_t>(in.in[0])];
  Buffer& out = *st.buf[static_cast<std::size_t>(in.out)];
  switch (in.collective) {
    case CollectiveKind::AllReduce:
      ctx_.comms.at(in.axes)->all_reduce(inb.data(), out.data(), static_cast<std::size_t>(num_elements(dst.shape)),
                                        dst.dtype, in.reduce, s);
      break;
    case CollectiveKind::AllGather:
      ctx_.comms.at(in.axes)->all_gather(inb.data(), out.data(), static_cast<std::size_t>(src.bytes()), s);
      break;
    case CollectiveKind::ReduceScatter:
      ctx_.comms.at(in.axes)->reduce_scatter(inb.data(), out.data(), static_cast<std::size_t>(num_elements(dst.shape)),
                                            dst.dtype, in.reduce, s);
      break;
    case CollectiveKind::AllToAll: {
      Communicator& c = *ctx_.comms.at(in.axes);
      c.all_to_all(inb.data(), out.data(), static_cast<std::size_t>(src.bytes()) / static_cast<std::size_t>(c.size()), s);
      break;
    }
    case CollectiveKind::CollectivePermute: {
      int send_to = -1, recv_from = -1;
      for (const auto& pr : in.pairs) {
        if (pr.first == pos_) send_to = static_cast<int>(pr.second);
        if (pr.second == pos_) recv_from = static_cast<int>(pr.first);
      }
      const std::size_t bytes = static_cast<std::size_t>(dst.bytes());
      if (recv_from < 0) be.copy(out, 0, inb, 0, bytes, s);  // my block does not move
      ctx_.comms.at(all_axes(p_.mesh))->collective_permute(inb.data(), send_to, out.data(), recv_from, bytes, s);
      break;
    }
  }
}

DeviceRunResult DeviceExecutor::run(const std::vector<std::shared_ptr<Buffer>>& inputs, const DeviceRunOptions& opts) {
  RunState st(opts, p_.values.size(), p_.instrs.size());
  Backend& be = *ctx_.backend;
  // The measurement of this run starts from the bytes in use now (the arena, the inputs, and
  // whatever else the device holds).
  be.device_memory().reset_high_water();
  be.host_memory().reset_high_water();
  // Donation: per output, the input whose buffer it takes (the rule the plan counts with).
  const std::vector<int> donor_of_output = donated_outputs(p_, opts.donate, input_last_);

  // Storage for value `value`, defined by instruction i.
  auto storage = [&](std::size_t i, int value) {
    const Instr& in = p_.instrs[i];
    const std::size_t v = static_cast<std::size_t>(value);
    const LocalValue& lv = p_.values[v];
    Stream& s = stream(i);
    if (in.kind == InstrKind::View) {
      st.buf[v] = std::make_shared<ViewBuffer>(st.buf[static_cast<std::size_t>(in.in[0])],
                                               static_cast<std::size_t>(in.view_offset), static_cast<std::size_t>(lv.bytes()));
      return;
    }
    if (arena_views_[v]) {
      st.buf[v] = arena_views_[v];
    } else {
      const int o = output_of_[v];
      const int donor = o >= 0 ? donor_of_output[static_cast<std::size_t>(o)] : -1;
      if (donor >= 0 &&
          st.buf[static_cast<std::size_t>(p_.inputs[static_cast<std::size_t>(donor)])]->bytes() == static_cast<std::size_t>(lv.bytes())) {
        // The donor is dead (or read in place): order this write after every stream's work so
        // far (its readers).
        const int mine = stream_of_[i];
        const int other = 1 - mine;
        donate_events_[static_cast<std::size_t>(other)]->record(*streams_[other]);
        donate_events_[static_cast<std::size_t>(other)]->wait(*streams_[mine]);
        st.buf[v] = st.buf[static_cast<std::size_t>(p_.inputs[static_cast<std::size_t>(donor)])];
      } else {

        try {
          st.buf[v] = be.allocate_on(static_cast<std::size_t>(lv.bytes()), *streams_[static_cast<std::size_t>(stream_of_[i])]);
        } catch (const OutOfMemoryError& e) {
          throw OutOfMemoryError(
              fmt::format("device {}: cannot allocate output %{} {} ({} bytes, {:.4g} GiB per device, "
                          "sharding {}): {}; shard it over more devices",
                          pos_, lv.name, type_str(lv.dtype, lv.shape), lv.bytes(),
                          static_cast<double>(lv.bytes()) / (1u << 30), lv.sharding.to_string(), e.what()),
              e.bytes());
        }
      }
    }
    if (opts.poison) be.poison(*st.buf[v], lv.dtype, s);
  };

  std::exception_ptr error;
  try {
    for (std::size_t i = 0; i < p_.inputs.size(); ++i) {
      if (!inputs.at(i)) throw RuntimeError(fmt::format("device {}: input #{} has no buffer", pos_, i));
      st.buf[static_cast<std::size_t>(p_.inputs[i])] = inputs[i];
      if (st.non_finite)
        check_finite(st, p_.inputs[i], *ctx_.compute, fmt::format("nothing: input #{} held it when the run started", i));
    }
    for (std::size_t i = 0; i < p_.instrs.size(); ++i) {
      if (opts.cancelled && opts.cancelled->load(std::memory_order_acquire))
        throw RuntimeError(fmt::format("device {}: the run was cancelled", pos_));
      const Instr& in = p_.instrs[i];
      Stream& s = stream(i);
      if (in.kind == InstrKind::Wait) {
        Stream& from = *streams_[in.wait_for == "comm" ? kComm : kCompute];
        events_[i]->record(from);
        events_[i]->wait(s);
        continue;
      }
      if (in.kind == InstrKind::CollectiveDone) {  // a point in comm's order
        if (st.non_finite) check_finite(st, in.in[0], s, finite_source(i), false, static_cast<int64_t>(i));
        continue;
      }
      s.set_label(labels_[i].c_str());
      storage(i, in.out);
      for (int e : in.extra_out) storage(i, e);
      if (in.kind == InstrKind::View) continue;
      if (opts.trace) {
        double* t0 = &st.t0[i];
        Trace* tr = opts.trace;
        be.launch_host_func(s, [t0, tr] { *t0 = tr->now_us(); });
      }
      switch (in.kind) {
        case InstrKind::Kernel: {
          KernelArgs a = kernel_args_[i];
          for (std::size_t j = 0; j < in.in.size(); ++j) a.in[j] = st.buf[static_cast<std::size_t>(in.in[j])]->data();
          a.out = st.buf[static_cast<std::size_t>(in.out)]->data();
          for (std::size_t r = 0; r < in.extra_out.size(); ++r)
            a.extra_out[r] = st.buf[static_cast<std::size_t>(in.extra_out[r])]->data();
          be.run_kernel(a, s);
          break;
        }
        case InstrKind::Copy:
          for (std::size_t c = 0; c < copies_[i].size(); ++c) {
            const int src = in.in[static_cast<std::size_t>(in.copies[c].input)];
            be.copy_block(*st.buf[static_cast<std::size_t>(in.out)], *st.buf[static_cast<std::size_t>(src)], copies_[i][c], s);
          }
          break;
        case InstrKind::Collective:
        case InstrKind::CollectiveStart: {
          const int partner = permute_partner_[i];
          Communicator* grouped = partner >= 0 ? ctx_.comms.at(all_axes(p_.mesh)) : nullptr;
          if (grouped && partner > static_cast<int>(i)) grouped->group_start();
          collective(st, i);
          if (grouped && partner < static_cast<int>(i)) grouped->group_end();
          break;
        }
        default: break;
      }
      if (st.non_finite && in.kind != InstrKind::CollectiveStart)
        for (int v : in.defs()) check_finite(st, v, s, finite_source(i), writes_infinity(in), static_cast<int64_t>(i));
      if (opts.trace) {
        const LocalValue& o = p_.values[static_cast<std::size_t>(in.out)];
        TraceEvent e;
        e.name = instr_name(in);
        const bool coll = in.kind == InstrKind::Collective || in.kind == InstrKind::CollectiveStart;
        e.category = in.kind == InstrKind::Kernel ? "kernel" : in.kind == InstrKind::Copy ? "copy" : "collective";
        e.device = pos_;
        e.stream = in.stream;
        e.args = fmt::format("\"value\": \"%{}\", \"shape\": \"{}\", \"sharding\": \"{}\", \"stream\": \"{}\"", o.name,
                             type_str(o.dtype, o.shape), o.sharding.to_string(), in.stream);
        if (coll) e.args += fmt::format(", \"bytes\": {}, \"axes\": \"{}\"", in.bytes, join(in.axes, ","));
        if (in.kind == InstrKind::Kernel) e.args += fmt::format(", \"flops\": {}", in.flops);
        const double* t0 = &st.t0[i];
        Trace* tr = opts.trace;
        be.launch_host_func(s, [e = std::move(e), t0, tr]() mutable {
          e.start_us = *t0;
          e.dur_us = tr->now_us() - *t0;
          tr->add(std::move(e));
        });
      }
    }
    ctx_.compute->set_label(nullptr);
    ctx_.comm->set_label(nullptr);
    ctx_.compute->synchronize();
    ctx_.comm->synchronize();
    if (st.non_finite && st.non_finite->found)
      throw NonFiniteError(st.non_finite->what, st.non_finite->instruction);
  } catch (...) {
    error = std::current_exception();
  }
  if (error) {
    if (opts.on_error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        opts.on_error(e.what());
      } catch (...) {
        opts.on_error("unknown exception");
      }
    }
    ctx_.compute->set_label(nullptr);
    ctx_.comm->set_label(nullptr);
    for (Stream* s : streams_) {  // drain: nothing may still use the run's buffers
      try {
        s->synchronize();
      } catch (...) {
      }
    }
    // A NaN found before the failure (often its cause, or another device's abort) is the news.
    if (st.non_finite && st.non_finite->found)
      throw NonFiniteError(st.non_finite->what, st.non_finite->instruction);
    std::rethrow_exception(error);
  }
  DeviceRunResult res;
  for (int v : p_.outputs) res.outputs.push_back(st.buf[static_cast<std::size_t>(v)]);
  res.measured_peak_bytes = be.device_memory().high_water();  // both streams are done: nothing more to come
  res.measured_host_peak_bytes = be.host_memory().high_water();
  return res;
}

}  // namespace tessel
