// Device executor: enqueues one device's program on its compute and communication streams.
//
// Stream discipline (the contract CUDA + NCCL will rely on):
//   - kernels and shard slices run on `compute`; collectives, with their packing/unpacking
//     block copies and scratch buffers, on `comm`;
//   - before collective i, start_[i] is recorded on compute and waited on by comm, so the
//     collective sees every value compute produced before it (PyTorch's ProcessGroupNCCL does
//     the same); after it, done_[i] is recorded on comm;
//   - compute waits for done_[k] before it reads a value collective k produced, or releases a
//     value collective k read; comm events complete in order, so one wait covers every
//     collective up to k;
//   - a buffer is released (stream-ordered) on the stream of its last use.
// Allocation is immediate and release stream-ordered, so memory is never handed out while an
// enqueued operation may still use it.
#include "tessel/runtime/executor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "tessel/ops.hpp"

namespace tessel {
namespace {

// Product of the dims before `d`: 1 means the dim is "leading" and its blocks are
// contiguous, so no packing is needed.
int64_t outer(const Shape& s, int d) {
  int64_t n = 1;
  for (int i = 0; i < d; ++i) n *= s[i];
  return n;
}

std::vector<int64_t> offset_at(std::size_t rank, int dim, int64_t at) {
  std::vector<int64_t> off(rank, 0);
  if (dim >= 0 && static_cast<std::size_t>(dim) < rank) off[static_cast<std::size_t>(dim)] = at;
  return off;
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

std::vector<int64_t> zeros(std::size_t n) { return std::vector<int64_t>(n, 0); }

std::vector<std::string> all_axes(const Mesh& m) {
  std::vector<std::string> all;
  for (const auto& a : m.axes()) all.push_back(a.name);
  return all;
}

std::string instr_name(const Instr& in) {
  if (in.kind == InstrKind::Kernel) return op_name(in.op);
  if (in.kind == InstrKind::ShardSlice) return "shard_slice";
  return collective_name(in.collective);
}

constexpr int kCompute = 0, kComm = 1, kNone = -1;

}  // namespace

std::vector<std::vector<std::string>> communicator_axes(const Program& p) {
  std::set<std::vector<std::string>> s;
  for (const Instr& in : p.instrs) {
    if (in.kind != InstrKind::Collective) continue;
    s.insert(in.collective == CollectiveKind::CollectivePermute ? all_axes(p.mesh) : in.axes);
  }
  return {s.begin(), s.end()};
}

struct DeviceExecutor::RunState {
  const DeviceRunOptions& opts;
  std::vector<std::shared_ptr<Buffer>> buf;
  std::vector<int> producer_stream;  // kCompute, kComm, kNone (an input: ready before the run)
  std::vector<int> producer_instr;
  std::vector<int> comm_reader;      // last collective that read the value, -1: none
  int compute_waited = -1;           // highest collective compute has waited for
  std::vector<std::shared_ptr<Buffer>> donated;  // per output: a donated input buffer
  std::vector<int> donated_stream;
  std::vector<double> t0;            // trace: start time per instruction
  int64_t live = 0, peak = 0;

  RunState(const DeviceRunOptions& o, std::size_t values, std::size_t outputs, std::size_t instrs)
      : opts(o), buf(values), producer_stream(values, kNone), producer_instr(values, -1),
        comm_reader(values, -1), donated(outputs), donated_stream(outputs, kNone),
        t0(o.trace ? instrs : 0, 0.0) {}
};

DeviceExecutor::DeviceExecutor(const Program& program, int64_t position, DeviceContext ctx)
    : p_(program), pos_(position), ctx_(std::move(ctx)), last_use_(program.last_use()) {
  labels_.reserve(p_.instrs.size());
  kernel_args_.resize(p_.instrs.size());
  start_.resize(p_.instrs.size());
  done_.resize(p_.instrs.size());
  for (std::size_t i = 0; i < p_.instrs.size(); ++i) {
    const Instr& in = p_.instrs[i];
    labels_.push_back(fmt::format("device {} instruction #{} (%{} = {})", pos_, i,
                                  p_.values[in.out].name, instr_name(in)));
    if (in.kind == InstrKind::Kernel) {
      KernelArgs& a = kernel_args_[i];
      a.kind = in.op;
      a.attrs = &in.attrs;
      // Kernels that read positions (OpDef::needs_offsets) get their blocks' global offsets
      // and the global shapes.
      const bool needs_offsets = op_def(in.op).needs_offsets;
      for (int v : in.in) {
        const LocalValue& lv = p_.values[v];
        a.in.push_back(nullptr);
        a.in_shapes.push_back(lv.shape);
        a.in_dtypes.push_back(lv.dtype);
        if (needs_offsets) {
          a.in_offsets.push_back(lv.sharding.local_offset(p_.mesh, lv.global_shape, pos_));
          a.in_global_shapes.push_back(lv.global_shape);
        } else {
          a.in_offsets.emplace_back();
        }
      }
      const LocalValue& o = p_.values[in.out];
      a.out_shape = o.shape;
      a.out_dtype = o.dtype;
      if (needs_offsets) {
        a.out_offset = o.sharding.local_offset(p_.mesh, o.global_shape, pos_);
        a.out_global_shape = o.global_shape;
      }
    } else if (in.kind == InstrKind::Collective) {
      start_[i] = ctx_.backend->create_event();
      done_[i] = ctx_.backend->create_event();
      const auto axes = in.collective == CollectiveKind::CollectivePermute ? all_axes(p_.mesh) : in.axes;
      if (!ctx_.comms.count(axes))
        throw RuntimeError(fmt::format("device {}: no communicator for axis group {{{}}} (load creates one "
                                       "per group of communicator_axes(program))", pos_, join(axes, ",")));
    }
  }
  for (std::size_t o = 0; o < p_.outputs.size(); ++o) donate_events_.push_back(ctx_.backend->create_event());
}

DeviceExecutor::~DeviceExecutor() = default;

void DeviceExecutor::kernel(RunState& st, std::size_t i) {
  const Instr& in = p_.instrs[i];
  KernelArgs a = kernel_args_[i];
  for (std::size_t j = 0; j < in.in.size(); ++j) a.in[j] = st.buf[in.in[j]]->data();
  a.out = st.buf[in.out]->data();
  ctx_.backend->run_kernel(a, *ctx_.compute);
}

void DeviceExecutor::shard_slice(RunState& st, std::size_t i) {
  const Instr& in = p_.instrs[i];
  const LocalValue& src = p_.values[in.in[0]];
  const LocalValue& dst = p_.values[in.out];
  int64_t idx = in.axes.empty() ? 0 : p_.mesh.index_in_group(pos_, in.axes);
  int64_t at = idx == 0 ? 0 : idx * dst.shape[static_cast<std::size_t>(in.dim)];
  ctx_.backend->copy_block(*st.buf[in.out], *st.buf[in.in[0]],
                           block_copy(src.shape, offset_at(src.shape.size(), in.dim, at), 0, dst.shape,
                                      zeros(dst.shape.size()), 0, dst.shape, dtype_size(dst.dtype)),
                           *ctx_.compute);
}

void DeviceExecutor::collective(RunState& st, std::size_t i) {
  const Instr& in = p_.instrs[i];
  Backend& be = *ctx_.backend;
  Stream& s = *ctx_.comm;
  const LocalValue& src = p_.values[in.in[0]];
  const LocalValue& dst = p_.values[in.out];
  Buffer& inb = *st.buf[in.in[0]];
  Buffer& out = *st.buf[in.out];
  const std::size_t elem = dtype_size(dst.dtype);
  // Scratch lives on comm: allocated now, released in comm's order after its last use.
  auto scratch = [&](std::size_t bytes) {
    std::shared_ptr<Buffer> b = be.allocate(bytes);
    st.live += static_cast<int64_t>(bytes);
    st.peak = std::max(st.peak, st.live);
    return b;
  };
  auto drop = [&](std::shared_ptr<Buffer>& b) {
    st.live -= static_cast<int64_t>(b->bytes());
    be.release(std::move(b), s);
  };
  switch (in.collective) {
    case CollectiveKind::AllReduce: {
      ctx_.comms.at(in.axes)->all_reduce(inb.data(), out.data(), static_cast<std::size_t>(num_elements(dst.shape)),
                                        dst.dtype, in.reduce, s);
      break;
    }
    case CollectiveKind::AllGather: {
      Communicator& c = *ctx_.comms.at(in.axes);
      const std::size_t blk = static_cast<std::size_t>(src.bytes());
      if (outer(src.shape, in.dim) == 1) {
        c.all_gather(inb.data(), out.data(), blk, s);
      } else {
        auto tmp = scratch(blk * static_cast<std::size_t>(c.size()));
        c.all_gather(inb.data(), tmp->data(), blk, s);
        for (int r = 0; r < c.size(); ++r)
          be.copy_block(out, *tmp,
                        block_copy(src.shape, zeros(src.shape.size()), r * blk, dst.shape,
                                   offset_at(dst.shape.size(), in.dim, r * src.shape[in.dim]), 0,
                                   src.shape, elem),
                        s);
        drop(tmp);
      }
      break;
    }
    case CollectiveKind::ReduceScatter: {
      Communicator& c = *ctx_.comms.at(in.axes);
      const std::size_t count = static_cast<std::size_t>(num_elements(dst.shape));
      if (outer(src.shape, in.dim) == 1) {
        c.reduce_scatter(inb.data(), out.data(), count, dst.dtype, ReduceOp::Sum, s);
      } else {
        const std::size_t blk = static_cast<std::size_t>(dst.bytes());
        auto tmp = scratch(blk * static_cast<std::size_t>(c.size()));
        for (int r = 0; r < c.size(); ++r)
          be.copy_block(*tmp, inb,
                        block_copy(src.shape, offset_at(src.shape.size(), in.dim, r * dst.shape[in.dim]), 0,
                                   dst.shape, zeros(dst.shape.size()), r * blk, dst.shape, elem),
                        s);
        c.reduce_scatter(tmp->data(), out.data(), count, dst.dtype, ReduceOp::Sum, s);
        drop(tmp);
      }
      break;
    }
    case CollectiveKind::AllToAll: {
      Communicator& c = *ctx_.comms.at(in.axes);
      const int n = c.size();
      const int split = in.dim, cat = in.dim2;
      Shape block = src.shape;
      block[split] /= n;
      const std::size_t blk = static_cast<std::size_t>(num_elements(block)) * elem;
      const void* send = inb.data();
      std::shared_ptr<Buffer> packed, recv;
      if (outer(src.shape, split) != 1) {
        packed = scratch(blk * n);
        for (int r = 0; r < n; ++r)
          be.copy_block(*packed, inb,
                        block_copy(src.shape, offset_at(src.shape.size(), split, r * block[split]), 0, block,
                                   zeros(block.size()), r * blk, block, elem),
                        s);
        send = packed->data();
      }
      if (outer(dst.shape, cat) == 1) {
        c.all_to_all(send, out.data(), blk, s);
      } else {
        recv = scratch(blk * n);
        c.all_to_all(send, recv->data(), blk, s);
        for (int r = 0; r < n; ++r)
          be.copy_block(out, *recv,
                        block_copy(block, zeros(block.size()), r * blk, dst.shape,
                                   offset_at(dst.shape.size(), cat, r * block[cat]), 0, block, elem),
                        s);
        drop(recv);
      }
      if (packed) drop(packed);
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

DeviceRunResult DeviceExecutor::run(const std::vector<std::shared_ptr<Buffer>>& inputs,
                                    const DeviceRunOptions& opts) {
  RunState st(opts, p_.values.size(), p_.outputs.size(), p_.instrs.size());
  Backend& be = *ctx_.backend;
  Stream* streams[2] = {ctx_.compute, ctx_.comm};

  auto wait_comm = [&](int k) {
    if (k > st.compute_waited) {
      done_[static_cast<std::size_t>(k)]->wait(*ctx_.compute);
      st.compute_waited = k;
    }
  };
  // Donation: per output, the input donated to it.
  std::vector<int> donor_of_output(p_.outputs.size(), -1);
  for (std::size_t i = 0; i < opts.donate.size() && i < p_.inputs.size(); ++i)
    if (opts.donate[i] >= 0) donor_of_output[static_cast<std::size_t>(opts.donate[i])] = static_cast<int>(i);
  std::vector<int> producer_of(p_.values.size(), -1);
  for (std::size_t i = 0; i < p_.instrs.size(); ++i) producer_of[p_.instrs[i].out] = static_cast<int>(i);

  auto release = [&](int v, int stream) {
    if (!st.buf[v]) return;
    if (stream == kCompute && st.comm_reader[v] >= 0) wait_comm(st.comm_reader[v]);
    // A donated input whose output is still to be produced keeps its buffer for it.
    for (std::size_t o = 0; o < p_.outputs.size(); ++o) {
      const int donor = donor_of_output[o];
      if (donor < 0 || p_.inputs[static_cast<std::size_t>(donor)] != v || st.donated[o]) continue;
      const int out_v = p_.outputs[o];
      if (out_v != v && producer_of[out_v] >= 0 && st.producer_stream[out_v] == kNone &&
          p_.values[out_v].bytes() == static_cast<int64_t>(st.buf[v]->bytes())) {
        st.donated[o] = std::move(st.buf[v]);
        st.donated_stream[o] = stream;
        return;
      }
    }
    st.live -= static_cast<int64_t>(st.buf[v]->bytes());
    be.release(std::move(st.buf[v]), *streams[stream]);
  };
  auto alloc = [&](int v, int stream) {
    const LocalValue& lv = p_.values[v];
    for (std::size_t o = 0; o < p_.outputs.size(); ++o) {
      if (p_.outputs[o] != v || !st.donated[o]) continue;
      if (st.donated_stream[o] != stream) {  // the donor's last use must finish first
        donate_events_[o]->record(*streams[st.donated_stream[o]]);
        donate_events_[o]->wait(*streams[stream]);
      }
      st.buf[v] = std::move(st.donated[o]);
      break;
    }
    if (!st.buf[v]) {
      st.buf[v] = be.allocate(static_cast<std::size_t>(lv.bytes()));
      st.live += lv.bytes();
      st.peak = std::max(st.peak, st.live);
    }
    if (opts.poison) be.poison(*st.buf[v], lv.dtype, *streams[stream]);
    st.producer_stream[v] = stream;
  };

  std::exception_ptr error;
  try {
    for (std::size_t i = 0; i < p_.inputs.size(); ++i) {
      const int v = p_.inputs[i];
      if (!inputs.at(i)) throw RuntimeError(fmt::format("device {}: input #{} has no buffer", pos_, i));
      st.buf[v] = inputs[i];
      st.live += static_cast<int64_t>(inputs[i]->bytes());
    }
    st.peak = st.live;
    for (std::size_t i = 0; i < p_.instrs.size(); ++i) {
      if (opts.cancelled && opts.cancelled->load(std::memory_order_acquire))
        throw RuntimeError(fmt::format("device {}: the run was cancelled", pos_));
      const Instr& in = p_.instrs[i];
      const int stream = in.kind == InstrKind::Collective ? kComm : kCompute;
      Stream& s = *streams[stream];
      s.set_label(labels_[i].c_str());
      if (stream == kComm) {
        start_[i]->record(*ctx_.compute);
        start_[i]->wait(s);
      } else {
        for (int v : in.in)
          if (st.producer_stream[v] == kComm) wait_comm(st.producer_instr[v]);
      }
      if (opts.trace) {
        double* t0 = &st.t0[i];
        Trace* tr = opts.trace;
        be.launch_host_func(s, [t0, tr] { *t0 = tr->now_us(); });
      }
      alloc(in.out, stream);
      st.producer_instr[in.out] = static_cast<int>(i);
      switch (in.kind) {
        case InstrKind::Kernel: kernel(st, i); break;
        case InstrKind::ShardSlice: shard_slice(st, i); break;
        case InstrKind::Collective: collective(st, i); break;
      }
      if (stream == kComm) {
        for (int v : in.in) st.comm_reader[v] = static_cast<int>(i);
        done_[i]->record(s);
      }
      if (opts.trace) {
        const LocalValue& o = p_.values[in.out];
        TraceEvent e;
        e.name = instr_name(in);
        e.category = in.kind == InstrKind::Kernel ? "kernel" : in.kind == InstrKind::ShardSlice ? "slice" : "collective";
        e.device = pos_;
        e.args = fmt::format("\"value\": \"%{}\", \"shape\": \"{}\", \"sharding\": \"{}\", \"stream\": \"{}\"", o.name,
                             type_str(o.dtype, o.shape), o.sharding.to_string(), stream == kComm ? "comm" : "compute");
        if (in.kind == InstrKind::Collective)
          e.args += fmt::format(", \"bytes\": {}, \"axes\": \"{}\"", in.bytes, join(in.axes, ","));
        if (in.kind == InstrKind::Kernel) e.args += fmt::format(", \"flops\": {}", in.flops);
        const double* t0 = &st.t0[i];
        Trace* tr = opts.trace;
        be.launch_host_func(s, [e = std::move(e), t0, tr]() mutable {
          e.start_us = *t0;
          e.dur_us = tr->now_us() - *t0;
          tr->add(std::move(e));
        });
      }
      for (int v : in.in)
        if (last_use_[v] == static_cast<int>(i)) release(v, stream);
      // A value nobody reads (and that is not an output) is released at once.
      if (last_use_[in.out] < 0) release(in.out, stream);
    }
    ctx_.compute->set_label(nullptr);
    ctx_.comm->set_label(nullptr);
    ctx_.compute->synchronize();
    ctx_.comm->synchronize();
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
    for (Stream* s : streams) {  // drain: nothing may still use the run's buffers
      try {
        s->synchronize();
      } catch (...) {
      }
    }
    std::rethrow_exception(error);
  }
  DeviceRunResult res;
  for (int v : p_.outputs) res.outputs.push_back(st.buf[v]);
  res.peak_bytes = st.peak;
  return res;
}

}  // namespace tessel
